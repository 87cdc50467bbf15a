//! The multi-process loader: worker processes fill batches into a shared,
//! pinned host region; the GPU process uploads them in order, runs a GPU
//! step on each and hands them on, three in flight.
//!
//! - [`ProcessLoader`] (GPU process) and its [`ProcessLoaderBuilder`];
//! - [`serve_if_worker`] and [`Fill`] (worker process), started by a
//!   [`WorkerCommand`];
//! - `shared_slots` (the memfd region), `wire` (the frames and the
//!   environment between the two), `workers` (children, sockets, reader
//!   threads), `slot_returns` (slots waiting for their uploads).
//!
//! `docs/host-memory.md#loading-batches-from-worker-processes` is the guide.

mod builder;
mod command;
mod loader;
mod plan;
mod serve;
mod shared_slots;
mod slot_returns;
mod wire;
mod workers;

pub use builder::{DEFAULT_DEADLINE, ProcessLoaderBuilder};
pub use command::WorkerCommand;
pub use loader::{LoadedBatch, ProcessLoader};
pub use plan::GpuStep;
pub use serve::{Fill, serve_if_worker};
pub use workers::WorkerId;
