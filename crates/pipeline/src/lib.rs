//! The async pipeline: a triple buffer over real device buffers, a
//! three-stream coordinator ordered by events, a stage manager that runs
//! real kernels with upload, compute and download overlapped, a managed
//! context with synchronous and asynchronous modes, and a batch transfer
//! planner.
//!
//! Everything here runs the same on the GPU and on the software driver.
//! See `docs/pipeline.md` for a walk-through.
//!
//! - [`GpuTripleBuffer`]: three slots, `Free -> Uploading -> Processing ->
//!   Downloading -> Free`, one atomic byte each, guards that own a stage.
//! - [`AsyncCoordinator`]: upload, compute and download streams; dependencies
//!   through events; [`AsyncCoordinator::poll`] reports what the GPU finished.
//! - [`PipelineStageManager`]: validated stage order (petgraph), three batches
//!   in flight, statistics from timing events; buffers of any [`driver::DeviceCopy`]
//!   element type (`f32` by default), named by [`BufferId`], stages by [`StageId`].
//! - [`ManagedGpuContext`]: sync (one stream) or async (triple-buffered) mode,
//!   running the caller's step kernel over buffers of the caller's element type.
//! - [`BatchUploader`] / [`plan_transfers`]: decide once whether multi-stream
//!   batch upload pays, and assign keys to streams balanced by bytes.

// Only the multi-process loader (shared memory, descriptors passed to
// child processes, pinning the region) uses `unsafe`.
#![deny(unsafe_code)]

mod batch_upload;
mod coordinator;
mod error;
mod graph;
mod ids;
mod managed;
mod manager;
mod planner;
#[allow(
    unsafe_code,
    reason = "memfd, mmap and descriptors inherited by worker processes"
)]
mod process_loader;
mod rotation;
mod slot_state;
mod stage;
mod staging;
/// The atomics the triple buffer's state protocol uses: the workspace's loom
/// shim, loom's only when this crate's own tests run under `--cfg loom`.
mod sync {
    driver::loom_shim!(pub(crate));
}
mod triple_buffer;

pub use batch_upload::BatchUploader;
pub use coordinator::{AsyncCoordinator, CompletedOperation, OperationId};
/// The safe driver layer this crate builds on (contexts, streams, buffers),
/// so examples can name it through this crate.
pub use driver;
pub use error::{Error, Result};
pub use graph::PipelineGraph;
pub use ids::{BufferId, StageId};
pub use managed::{ManagedGpuContext, ManagedGpuContextBuilder, StepOutput, StepResult};
pub use manager::{PipelineStageManager, PipelineStats};
pub use planner::{
    ArraySpec, DEFAULT_MAX_STREAMS, DEFAULT_MIN_BATCH_MB, DEFAULT_MIN_BATCH_SIZE, ENV_MAX_STREAMS,
    ENV_MIN_BATCH_MB, ENV_MIN_BATCH_SIZE, MAX_STREAMS_LIMIT, PLANNER_SETTINGS, PlannerConfig,
    TransferPlan, plan_transfers,
};
/// Stream purposes, from the stream pool.
pub use pool::StreamPurpose;
pub use process_loader::{
    DEFAULT_DEADLINE, Fill, GpuStep, LoadedBatch, ProcessLoader, ProcessLoaderBuilder,
    WorkerCommand, WorkerId, serve_if_worker,
};
pub use rotation::{IterationReport, PIPELINE_DEPTH};
pub use slot_state::SlotState;
pub use stage::{GpuPipelineStage, StageArg, StageBuilder};
pub use triple_buffer::{GpuTripleBuffer, SlotStatus, StageGuard};

/// The guide's examples (`docs/pipeline.md`), compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/pipeline.md")]
pub struct PipelineGuide;
