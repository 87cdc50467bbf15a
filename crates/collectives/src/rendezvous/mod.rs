//! The rendezvous of ranks across processes and hosts, the way `torchrun`, `mpirun` and
//! `srun` do: each process reads its rank from the environment, rank 0
//! publishes NCCL's unique id over a small TCP store at
//! `MASTER_ADDR:MASTER_PORT`, and the others fetch it after both sides
//! proved they hold the job's secret. Only the 128-byte id travels over
//! this socket; NCCL moves the data.

mod auth;
mod env;
mod store;
#[cfg(test)]
mod tests;

pub use auth::LaunchSecret;
#[allow(deprecated, reason = "the old name, kept for users' code")]
pub use env::Launch;
pub use env::{
    LAUNCH_INSECURE, LAUNCH_TIMEOUT, LAUNCH_TOKEN, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, RANK,
    Rendezvous, WORLD_SIZE,
};
pub use store::Store;

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::types::UniqueId;
use driver::{Context, DriverKind};
use std::time::Instant;

impl Communicator {
    /// This process's rank of the communicator its launcher describes
    /// ([`Rendezvous::from_env`]), on device `LOCAL_RANK`: rank 0 makes NCCL's
    /// unique id and publishes it at `MASTER_ADDR:MASTER_PORT`, the others
    /// fetch it, every rank joins.
    ///
    /// The same program runs under `torchrun --nproc-per-node=2`,
    /// `mpirun -np 2`, `srun`, or with the variables set by hand (see
    /// `docs/multi-gpu.md`). One deadline, `CUDA_STREAMS_LAUNCH_TIMEOUT_S`
    /// (300 s) from the call, bounds the store and NCCL's initialisation
    /// together: a rank that cannot reach rank 0's store gets
    /// [`Error::StoreTimeout`], as does rank 0 when not every rank came,
    /// and a rank whose peers never join NCCL gets [`Error::JoinTimeout`].
    ///
    /// The software NCCL spans the threads of one process: on the software
    /// driver the ranks are threads, each with its own variables
    /// ([`Communicator::from_launch`] with [`Rendezvous::from_vars`]); ranks in
    /// two processes get [`Error::SoftNcclAcrossProcesses`].
    pub fn from_env() -> Result<Communicator> {
        Self::from_launch(&Rendezvous::from_env()?)
    }

    /// [`Communicator::from_env`] for the rank `launch` describes. Rank 0
    /// binds `MASTER_ADDR:MASTER_PORT`; to choose the port first (port 0,
    /// the OS's choice) bind a [`Store`] and use
    /// [`Communicator::from_launch_with_store`].
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, Rendezvous, Store};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// use cuda_streams_collectives::ReduceOp;
    /// let n = Context::device_count().unwrap() as usize;
    /// // Rank 0's store, on a port the OS picks.
    /// let store = Store::bind("127.0.0.1:0").unwrap();
    /// let port = store.port();
    /// let vars = move |rank: usize| {
    ///     move |name: &str| match name {
    ///         "RANK" | "LOCAL_RANK" => Some(rank.to_string()),
    ///         "WORLD_SIZE" => Some(n.to_string()),
    ///         "MASTER_PORT" => Some(port.to_string()),
    ///         _ => None,
    ///     }
    /// };
    /// let rank_main = |comm: Communicator| {
    ///     let stream = Stream::new(comm.context()).unwrap();
    ///     let mut x = DeviceBuffer::from_slice(&stream, &[1u32; 4]).unwrap();
    ///     comm.all_reduce_in_place(&stream, &mut x, ReduceOp::Sum).unwrap();
    ///     assert_eq!(x.to_vec(&stream).unwrap(), [n as u32; 4]);
    /// };
    /// std::thread::scope(|s| {
    ///     for rank in 1..n {
    ///         s.spawn(move || {
    ///             let launch = Rendezvous::from_vars(vars(rank)).unwrap();
    ///             rank_main(Communicator::from_launch(&launch).unwrap());
    ///         });
    ///     }
    ///     let launch = Rendezvous::from_vars(vars(0)).unwrap();
    ///     rank_main(Communicator::from_launch_with_store(&launch, store).unwrap());
    /// });
    /// ```
    pub fn from_launch(launch: &Rendezvous) -> Result<Communicator> {
        let deadline = Instant::now() + launch.timeout;
        let store = if launch.rank == 0 && launch.world_size > 1 {
            Some(Store::bind(&launch.store_addr())?)
        } else {
            None
        };
        join(launch, store, deadline)
    }

    /// [`Communicator::from_launch`] for rank 0, publishing the id at
    /// `store` (bound already, e.g. to port 0, whose port the other ranks
    /// were given) instead of binding `MASTER_ADDR:MASTER_PORT`. A `launch`
    /// of another rank is [`Error::InvalidRank`].
    pub fn from_launch_with_store(launch: &Rendezvous, store: Store) -> Result<Communicator> {
        if launch.rank != 0 {
            return Err(Error::InvalidRank {
                rank: launch.rank,
                nranks: 1,
            });
        }
        join(launch, Some(store), Instant::now() + launch.timeout)
    }
}

/// Meet the other ranks (rank 0 through `store`) and join NCCL, all by
/// `deadline`.
fn join(launch: &Rendezvous, store: Option<Store>, deadline: Instant) -> Result<Communicator> {
    let ordinal = i32::try_from(launch.local_rank).unwrap_or(i32::MAX);
    let ctx = Context::new(ordinal)?;
    // The software NCCL cannot join ranks of two processes: find out at the
    // store, before anyone waits in NCCL for a rank that can never come.
    let one_process = ctx.kind() == DriverKind::Soft;
    let here = std::process::id();
    let id = match store {
        Some(store) => {
            let id = UniqueId::new()?;
            let served = store.serve(launch, &id, deadline)?;
            if let Some(other) = served
                .iter()
                .find(|s| s.pid != here)
                .filter(|_| one_process)
            {
                tracing::warn!(
                    rank = other.rank,
                    "a rank of the software NCCL is in another process"
                );
                return Err(Error::SoftNcclAcrossProcesses {
                    rank: 0,
                    here,
                    other: other.pid,
                });
            }
            id
        }
        None if launch.world_size == 1 => UniqueId::new()?,
        None => {
            let fetched = launch.fetch(deadline)?;
            if one_process && fetched.rank0_pid != here {
                return Err(Error::SoftNcclAcrossProcesses {
                    rank: launch.rank,
                    here,
                    other: fetched.rank0_pid,
                });
            }
            fetched.id
        }
    };
    tracing::debug!(
        rank = launch.rank,
        world_size = launch.world_size,
        device = ordinal,
        "joining the NCCL communicator"
    );
    let left = deadline.saturating_duration_since(Instant::now());
    Communicator::init_rank_within(&ctx, launch.world_size, &id, launch.rank, left)
}
