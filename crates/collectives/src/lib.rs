//! NCCL communicators and collectives on streams.
//!
//! NCCL spans GPUs, processes and hosts; this crate puts its collectives on
//! the driver layer's streams and buffers, checked before NCCL sees them:
//!
//! - [`Communicator::all_devices`]: one communicator per device of this
//!   process (`ncclCommInitAll`);
//! - [`Communicator::init_rank`] with a [`UniqueId`]: one rank among many
//!   processes or hosts (`ncclGetUniqueId` + `ncclCommInitRank`); the id
//!   travels over the user's own channel ([`UniqueId::to_bytes`]);
//! - AllReduce, Broadcast, Reduce, AllGather and ReduceScatter on typed
//!   buffers ([`NcclType`]), stream-ordered, each buffer tracked like any
//!   copy's so it is not freed before the collective ran;
//! - ranks of one communicator that live in this process checked against
//!   each other (collectives, counts, types, operations, roots) before any
//!   call reaches NCCL, whether each thread makes its collectives alone or
//!   one thread groups them; ranks in other processes cannot be compared
//!   (see [`Communicator`]);
//! - collectives captured into CUDA graphs through the capture
//!   ([`Communicator::captured`]), the graph keeping their buffers and the
//!   communicator alive; the eager calls are refused on a capturing stream
//!   ([`Error::StreamCapturing`]);
//! - [`Group`]: several collectives issued together (`ncclGroupStart` /
//!   `ncclGroupEnd`), which is how one thread drives many devices;
//!   [`Group::end_in`] makes
//!   them operations of an [`engine::OperationGraph`]
//!   (`OperationType::AllReduce`, `Broadcast`, `Reduction`), ordered after
//!   operations on any device.
//!
//! NCCL is loaded at run time (`libnccl.so.2`, or `CUDA_STREAMS_NCCL_LIBRARY`);
//! a machine without it gets [`Error::Load`] saying what to install. On the
//! software driver the software NCCL ([`soft_driver::nccl`]) does the
//! collectives, so every path runs in tests. On GPUs NCCL is loaded only
//! once [`NVLS_ENABLE`] (`NCCL_NVLS_ENABLE`) is set: `0` keeps NVLink
//! SHARP multicast off. NCCL reads it from the environment, which a running
//! program cannot change soundly, so it is set before the program starts.
//!
//! ```
//! use cuda_streams_collectives::{Communicator, Group, ReduceOp};
//! use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
//! # fn main() -> Result<(), cuda_streams_collectives::Error> {
//! let contexts = Context::all()?;
//! let comms = Communicator::all_devices(&contexts)?;
//! let streams = contexts.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
//! // Rank r holds [r + 1; 4]; after the AllReduce every rank holds the sum.
//! let mut buffers = streams
//!     .iter()
//!     .enumerate()
//!     .map(|(r, s)| DeviceBuffer::from_slice(s, &[r as f32 + 1.0; 4]))
//!     .collect::<Result<Vec<_>, _>>()?;
//! let mut group = Group::new();
//! for ((comm, stream), buffer) in comms.iter().zip(&streams).zip(&mut buffers) {
//!     group.all_reduce_in_place(comm, stream, buffer, ReduceOp::Sum)?;
//! }
//! group.end()?;
//! let n = comms.len() as f32;
//! for (stream, buffer) in streams.iter().zip(&buffers) {
//!     assert_eq!(buffer.to_vec(stream)?, [n * (n + 1.0) / 2.0; 4]);
//! }
//! # Ok(())
//! # }
//! ```

/// The examples of `docs/multi-gpu.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/multi-gpu.md")]
mod docs_examples {}

mod calls;
mod captured;
mod collective;
mod communicator;
mod error;
mod group;
mod issue;
mod meeting;
mod one_process;
mod rank_call;
mod rendezvous;
mod shape;
mod table;
mod types;

/// The safe driver layer this crate builds on.
pub use driver;
/// The operation graph collectives join ([`Group::end_in`]).
pub use engine;
/// The software driver, whose NCCL runs the collectives without a GPU.
pub use soft_driver;

pub use captured::CapturedCollectives;
pub use collective::Collective;
pub use communicator::Communicator;
pub use error::{Error, Result};
pub use group::Group;
#[allow(deprecated, reason = "the old name, kept for users' code")]
pub use rendezvous::Launch;
pub use rendezvous::{
    LAUNCH_INSECURE, LAUNCH_TIMEOUT, LAUNCH_TOKEN, LOCAL_RANK, LaunchSecret, MASTER_ADDR,
    MASTER_PORT, RANK, Rendezvous, Store, WORLD_SIZE,
};
pub use table::NVLS_ENABLE;
pub use types::{NcclType, ReduceOp, UniqueId};
