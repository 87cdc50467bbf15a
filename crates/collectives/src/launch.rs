//! Launching across processes and hosts the way `torchrun`, `mpirun` and
//! `srun` do: each process reads its rank from the environment, rank 0
//! publishes NCCL's unique id over a small TCP store at
//! `MASTER_ADDR:MASTER_PORT`, and the others fetch it. Only the 128-byte id
//! travels over this socket; NCCL moves the data.

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::types::UniqueId;
use driver::Context;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
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

/// What sets this header apart from anything else listening on the port.
const MAGIC: &[u8; 16] = b"cuda-streams-id1";

/// One process's place in a launch, as the launcher's variables say.
///
/// ```
/// use cuda_streams_collectives::Launch;
/// let vars = |name: &str| match name {
///     "OMPI_COMM_WORLD_RANK" => Some("1".to_string()),
///     "OMPI_COMM_WORLD_SIZE" => Some("2".to_string()),
///     "OMPI_COMM_WORLD_LOCAL_RANK" => Some("1".to_string()),
///     "MASTER_ADDR" => Some("10.0.0.1".to_string()),
///     _ => None,
/// };
/// let launch = Launch::from_vars(vars).unwrap();
/// assert_eq!((launch.rank, launch.world_size, launch.local_rank), (1, 2, 1));
/// assert_eq!((launch.master_addr.as_str(), launch.master_port), ("10.0.0.1", 29500));
/// // A rank outside the world names the variable and the value.
/// let bad = |name: &str| match name { "RANK" => Some("2".into()), "WORLD_SIZE" => Some("2".into()), _ => None };
/// let err = Launch::from_vars(bad).unwrap_err();
/// assert!(err.to_string().contains("RANK=\"2\""), "{err}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
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
    /// How long a rank waits for the others at the store.
    pub timeout: Duration,
}

impl Launch {
    /// Read the process environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, `MASTER_PORT`, or Open MPI's and Slurm's names).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Launch::from_env`] with the variables read through `vars` (for
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
        Ok(Self {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            timeout,
        })
    }

    /// `master_addr:master_port`.
    pub fn store_addr(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

impl Communicator {
    /// This process's rank of the communicator its launcher describes
    /// ([`Launch::from_env`]), on device `LOCAL_RANK`: rank 0 makes NCCL's
    /// unique id and publishes it at `MASTER_ADDR:MASTER_PORT`, the others
    /// fetch it, every rank joins (`ncclCommInitRank`).
    ///
    /// The same program runs under `torchrun --nproc-per-node=2`,
    /// `mpirun -np 2`, `srun`, or with the variables set by hand (see
    /// `docs/multi-gpu.md`). A rank that cannot reach rank 0's store within
    /// `CUDA_STREAMS_LAUNCH_TIMEOUT_S` (300 s) gets [`Error::StoreTimeout`],
    /// as does rank 0 when not every rank came.
    ///
    /// The software NCCL spans the threads of one process: on the software
    /// driver the ranks are threads, each with its own variables
    /// ([`Communicator::from_launch`] with [`Launch::from_vars`]).
    pub fn from_env() -> Result<Communicator> {
        Self::from_launch(&Launch::from_env()?)
    }

    /// [`Communicator::from_env`] for the rank `launch` describes.
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, Launch};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// use cuda_streams_collectives::ReduceOp;
    /// let n = Context::device_count().unwrap() as usize;
    /// // A free port for rank 0's store.
    /// let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    /// std::thread::scope(|s| {
    ///     for rank in 0..n {
    ///         s.spawn(move || {
    ///             let vars = |name: &str| match name {
    ///                 "RANK" | "LOCAL_RANK" => Some(rank.to_string()),
    ///                 "WORLD_SIZE" => Some(n.to_string()),
    ///                 "MASTER_PORT" => Some(port.to_string()),
    ///                 _ => None,
    ///             };
    ///             let comm = Communicator::from_launch(&Launch::from_vars(vars).unwrap()).unwrap();
    ///             let stream = Stream::new(comm.context()).unwrap();
    ///             let mut x = DeviceBuffer::from_slice(&stream, &[1u32; 4]).unwrap();
    ///             comm.all_reduce_in_place(&stream, &mut x, ReduceOp::Sum).unwrap();
    ///             assert_eq!(x.to_vec(&stream).unwrap(), [n as u32; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn from_launch(launch: &Launch) -> Result<Communicator> {
        let ordinal = i32::try_from(launch.local_rank).unwrap_or(i32::MAX);
        let ctx = Context::new(ordinal)?;
        let id = if launch.rank == 0 {
            publish(launch)?
        } else {
            fetch(launch)?
        };
        tracing::debug!(
            rank = launch.rank,
            world_size = launch.world_size,
            device = ordinal,
            "joining the NCCL communicator"
        );
        Communicator::init_rank(&ctx, launch.world_size, &id, launch.rank)
    }
}

/// Rank 0: make the id, and hand it to every other rank before joining.
fn publish(launch: &Launch) -> Result<UniqueId> {
    let id = UniqueId::new()?;
    if launch.world_size == 1 {
        return Ok(id);
    }
    let store = format!("0.0.0.0:{}", launch.master_port);
    let listener = TcpListener::bind(&store).map_err(|source| Error::Store {
        rank: 0,
        addr: store.clone(),
        what: "listen",
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| Error::Store {
            rank: 0,
            addr: store.clone(),
            what: "listen",
            source,
        })?;
    let start = Instant::now();
    let mut served = 0;
    let mut pause = Duration::from_millis(1);
    // Accepts are polled so that the deadline holds: std has no accept with
    // a timeout.
    while served + 1 < launch.world_size {
        match listener.accept() {
            Ok((mut socket, _)) => {
                let sent = socket
                    .set_nonblocking(false)
                    .and_then(|()| socket.set_write_timeout(Some(launch.timeout)))
                    .and_then(|()| socket.write_all(MAGIC))
                    .and_then(|()| socket.write_all(&(launch.world_size as u64).to_le_bytes()))
                    .and_then(|()| socket.write_all(&id.to_bytes()));
                match sent {
                    Ok(()) => served += 1,
                    Err(err) => tracing::warn!("a rank connected to the store but left: {err}"),
                }
                pause = Duration::from_millis(1);
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() >= launch.timeout {
                    return Err(Error::StoreTimeout {
                        rank: 0,
                        addr: store,
                        waited: start.elapsed(),
                        missing: launch.world_size - 1 - served,
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(source) => {
                return Err(Error::Store {
                    rank: 0,
                    addr: store,
                    what: "accept",
                    source,
                });
            }
        }
    }
    Ok(id)
}

/// Another rank: fetch the id from rank 0's store, retrying until rank 0
/// listens or the deadline passes.
fn fetch(launch: &Launch) -> Result<UniqueId> {
    let addr = launch.store_addr();
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    let timeout = |waited| Error::StoreTimeout {
        rank: launch.rank,
        addr: addr.clone(),
        waited,
        missing: 1,
    };
    loop {
        let left = launch.timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(timeout(start.elapsed()));
        }
        let targets = addr.to_socket_addrs().map_err(|source| Error::Store {
            rank: launch.rank,
            addr: addr.clone(),
            what: "resolve",
            source,
        })?;
        for target in targets {
            let Ok(mut socket) = TcpStream::connect_timeout(&target, left) else {
                continue;
            };
            let mut header = [0u8; 16 + 8];
            let mut bytes = [0u8; 128];
            let read = socket
                .set_read_timeout(Some(left))
                .and_then(|()| socket.read_exact(&mut header))
                .and_then(|()| socket.read_exact(&mut bytes));
            match read {
                Ok(()) if &header[..16] == MAGIC => {
                    let world = u64::from_le_bytes(header[16..].try_into().unwrap_or_default());
                    if world != launch.world_size as u64 {
                        return Err(Error::WorldSizeMismatch {
                            rank: launch.rank,
                            ours: launch.world_size,
                            rank0: world as usize,
                        });
                    }
                    return UniqueId::from_bytes(&bytes);
                }
                Ok(()) => {
                    return Err(Error::Store {
                        rank: launch.rank,
                        addr,
                        what: "read the id (something else listens there)",
                        source: std::io::ErrorKind::InvalidData.into(),
                    });
                }
                Err(err) => tracing::debug!("reading the id from {target}: {err}"),
            }
        }
        // Rank 0 is not listening yet: try again shortly.
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}
