//! A process's place in a launch, read from the variables `torchrun`,
//! `mpirun` and `srun` set, and the secret its ranks share.

use super::auth::LaunchSecret;
use crate::error::Result;
use std::net::IpAddr;
use std::time::Duration;
use sys::env::{EnvError, Setting};

/// `RANK` (torchrun), `OMPI_COMM_WORLD_RANK` (Open MPI), `SLURM_PROCID` (srun).
pub const RANK: Setting = Setting {
    name: "RANK",
    aliases: &["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"],
    default: "(required)",
    about: "this process's rank among all processes",
};

/// `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `SLURM_NTASKS`.
pub const WORLD_SIZE: Setting = Setting {
    name: "WORLD_SIZE",
    aliases: &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"],
    default: "(required)",
    about: "how many processes (ranks) there are",
};

/// `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`: picks the
/// device.
pub const LOCAL_RANK: Setting = Setting {
    name: "LOCAL_RANK",
    aliases: &[
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ],
    default: "the rank",
    about: "this process's rank on its host, which is its device's ordinal",
};

/// `MASTER_ADDR`: the host of rank 0's store.
pub const MASTER_ADDR: Setting = Setting {
    name: "MASTER_ADDR",
    aliases: &[],
    default: "127.0.0.1",
    about: "the host where rank 0 publishes the NCCL unique id",
};

/// `MASTER_PORT`: the port of rank 0's store.
pub const MASTER_PORT: Setting = Setting {
    name: "MASTER_PORT",
    aliases: &[],
    default: "29500",
    about: "the TCP port where rank 0 publishes the NCCL unique id",
};

/// `CUDA_STREAMS_LAUNCH_TIMEOUT_S`: how long ranks wait for each other at
/// the store.
pub const LAUNCH_TIMEOUT: Setting = Setting {
    name: "CUDA_STREAMS_LAUNCH_TIMEOUT_S",
    aliases: &[],
    default: "300",
    about: "seconds the ranks wait for each other at rank 0's store",
};

/// `CUDA_STREAMS_LAUNCH_TOKEN`: the secret every rank proves it holds at
/// rank 0's store.
pub const LAUNCH_TOKEN: Setting = Setting {
    name: "CUDA_STREAMS_LAUNCH_TOKEN",
    aliases: &[],
    default: "the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID); on loopback, none",
    about: "a secret every rank of the job holds, proved at rank 0's store before it sends the NCCL id",
};

/// `CUDA_STREAMS_LAUNCH_INSECURE`: `1` lets a store off loopback run
/// without a secret.
pub const LAUNCH_INSECURE: Setting = Setting {
    name: "CUDA_STREAMS_LAUNCH_INSECURE",
    aliases: &[],
    default: "0",
    about: "1: a store off loopback runs without a secret, and any host that reaches it may join",
};

/// Launchers' job ids a secret is derived from when no token is set, in
/// order: ranks of one job share them, other jobs do not.
const JOB_IDS: [&str; 2] = ["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"];

/// One process's place in a rendezvous of ranks (PyTorch's word): its rank,
/// the world's size, its device and where rank 0's store is, as the
/// launcher's variables say (torchrun, Slurm, Open MPI).
///
/// ```
/// use cuda_streams_collectives::Rendezvous;
/// let vars = |name: &str| match name {
///     "OMPI_COMM_WORLD_RANK" => Some("1".to_string()),
///     "OMPI_COMM_WORLD_SIZE" => Some("2".to_string()),
///     "OMPI_COMM_WORLD_LOCAL_RANK" => Some("1".to_string()),
///     "MASTER_ADDR" => Some("10.0.0.1".to_string()),
///     "CUDA_STREAMS_LAUNCH_TOKEN" => Some("3f9a61c0d2e4b587".to_string()),
///     _ => None,
/// };
/// let launch = Rendezvous::from_vars(vars).unwrap();
/// assert_eq!((launch.rank, launch.world_size, launch.local_rank), (1, 2, 1));
/// assert_eq!((launch.master_addr.as_str(), launch.master_port), ("10.0.0.1", 29500));
/// assert_eq!(launch.secret.source(), "CUDA_STREAMS_LAUNCH_TOKEN");
/// // Off loopback, a launch without a secret is refused, naming the way out.
/// let open = |name: &str| vars(name).filter(|_| name != "CUDA_STREAMS_LAUNCH_TOKEN");
/// let err = Rendezvous::from_vars(open).unwrap_err();
/// assert!(err.to_string().contains("CUDA_STREAMS_LAUNCH_TOKEN"), "{err}");
/// // A rank outside the world names the variable and the value.
/// let bad = |name: &str| match name { "RANK" => Some("2".into()), "WORLD_SIZE" => Some("2".into()), _ => None };
/// let err = Rendezvous::from_vars(bad).unwrap_err();
/// assert!(err.to_string().contains("RANK=\"2\""), "{err}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// How many ranks there are.
    pub world_size: usize,
    /// The rank on this host: the device's ordinal.
    pub local_rank: usize,
    /// Rank 0's host.
    pub master_addr: String,
    /// Rank 0's store port.
    pub master_port: u16,
    /// How long a rank waits for the others: at the store and in NCCL's
    /// initialisation together.
    pub timeout: Duration,
    /// The secret the ranks prove they hold at the store.
    pub secret: LaunchSecret,
}

/// The old name of [`Rendezvous`], which read like a kernel launch.
#[deprecated(since = "0.1.0", note = "renamed `Rendezvous`")]
pub type Launch = Rendezvous;

impl Rendezvous {
    /// Read the process environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, `MASTER_PORT`, or Open MPI's and Slurm's names; the
    /// secret from `CUDA_STREAMS_LAUNCH_TOKEN`, `TORCHELASTIC_RUN_ID` or
    /// `SLURM_JOB_ID`).
    ///
    /// Without any of those three, a `MASTER_ADDR` that is not loopback
    /// (`localhost`, `127.0.0.0/8`, `::1`) is refused unless
    /// `CUDA_STREAMS_LAUNCH_INSECURE=1`: anyone who can reach the store
    /// could otherwise take a rank and read the NCCL id.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Rendezvous::from_env`] with the variables read through `vars` (for
    /// ranks that are threads of one process, and for tests).
    pub fn from_vars(vars: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let required = |setting: &Setting| -> std::result::Result<sys::env::Found, EnvError> {
            setting.lookup(&vars)?.ok_or_else(|| EnvError {
                var: setting.name,
                value: String::new(),
                reason: format!(
                    "it is not set (nor {}): run under torchrun, mpirun or srun, or set RANK, \
                     WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT by hand",
                    setting.aliases.join(", ")
                ),
            })
        };
        let world = required(&WORLD_SIZE)?;
        let world_size = world.parse_int::<usize>(1..=1 << 20)?;
        let rank = required(&RANK)?.parse_int::<usize>(0..world_size)?;
        let local_rank = match LOCAL_RANK.lookup(&vars)? {
            Some(found) => found.parse_int::<usize>(0..4096)?,
            None => rank,
        };
        let master_addr = match MASTER_ADDR.lookup(&vars)? {
            Some(found) if !found.value.trim().is_empty() => found.value.trim().to_string(),
            Some(found) => return Err(found.error("expected a host name or address").into()),
            None => MASTER_ADDR.default.to_string(),
        };
        let master_port = match MASTER_PORT.lookup(&vars)? {
            Some(found) => found.parse_int::<u16>(1..=u16::MAX)?,
            None => 29500,
        };
        let timeout = match LAUNCH_TIMEOUT.lookup(&vars)? {
            Some(found) => Duration::from_secs_f64(found.parse_number(0.001)?),
            None => Duration::from_secs(300),
        };
        let secret = secret(&vars, &master_addr)?;
        Ok(Self {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            timeout,
            secret,
        })
    }

    /// `master_addr:master_port`.
    pub fn store_addr(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// The job's secret: the token, else a launcher's job id, else a public one
/// where that is allowed.
fn secret(
    vars: &impl Fn(&str) -> Option<String>,
    master_addr: &str,
) -> std::result::Result<LaunchSecret, EnvError> {
    if let Some(token) = LAUNCH_TOKEN.lookup(vars)? {
        if token.value.is_empty() {
            return Err(
                token.error("expected a secret shared by every rank (a long random string)")
            );
        }
        return Ok(LaunchSecret::from_token(&token.value));
    }
    for var in JOB_IDS {
        // torchrun's default run id is "none": no id at all.
        if let Some(id) = vars(var).filter(|id| !id.is_empty() && id != "none") {
            return Ok(LaunchSecret::derived(var, &id));
        }
    }
    if is_loopback(master_addr) {
        return Ok(LaunchSecret::public(
            "no token (MASTER_ADDR is loopback: other users of this host can reach the store)",
        ));
    }
    match LAUNCH_INSECURE.lookup(vars)? {
        Some(found) if found.parse_int::<u8>(0..=1)? == 1 => Ok(LaunchSecret::public(
            "no token (CUDA_STREAMS_LAUNCH_INSECURE=1)",
        )),
        _ => Err(EnvError {
            var: LAUNCH_TOKEN.name,
            value: String::new(),
            reason: format!(
                "it is not set (nor {}), and MASTER_ADDR={master_addr} is not a loopback \
                 address: anyone who reaches the store could take a rank and read the NCCL id. \
                 Give every rank the same random CUDA_STREAMS_LAUNCH_TOKEN (or run under \
                 torchrun or srun, whose job id is used), or set CUDA_STREAMS_LAUNCH_INSECURE=1 \
                 on a network you trust",
                JOB_IDS.join(", ")
            ),
        }),
    }
}

/// `localhost`, or an address literal of the loopback interface. A host
/// name that resolves to loopback counts as remote: the safe side.
fn is_loopback(addr: &str) -> bool {
    let bare = addr.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}
