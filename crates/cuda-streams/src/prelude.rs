//! The commonly used types of every enabled module: `use cuda_streams::prelude::*;`.
//!
//! Error types are left out (each crate has its own `Error`): use
//! [`cuda_streams::Error`](crate::Error), which converts from each, so `?`
//! works across crates.
//!
//! Each name here means one thing. Where a type has two names, or two crates
//! use one name, the prelude holds one and the module path the other:
//!
//! - [`OperationGraph`] is here; `cuda_streams::events::OperationCoordinator`
//!   is the same type under the seed's name.
//! - Neither crate's `Backend` is here: write `cuda_streams::allocator::Backend`
//!   (where memory comes from) or `cuda_streams::profiler::Backend` (where
//!   times come from).
//! - The kinds of work: `OperationType` says what an operation does,
//!   `WorkloadType` which class of pool streams runs it, and `StreamPurpose`
//!   which fixed role a stream plays (the pipeline's upload, compute and
//!   download streams among them); `From` maps a purpose to an operation
//!   type and either to a workload type (`docs/stream-pool.md`, "The kinds
//!   of work").

pub use driver::{
    Context, DeviceBuffer, DriverKind, Event, Kernel, KernelArg, LaunchConfig, Module,
    PinnedBuffer, Stream, StreamPriority, UnifiedBuffer,
};

#[cfg(feature = "pool")]
#[cfg_attr(docsrs, doc(cfg(feature = "pool")))]
pub use pool::{
    AllocationStrategy, ExclusiveStream, MultiStreamCoordinator, StreamPool, StreamPurpose,
    WorkloadType,
};

#[cfg(feature = "events")]
#[cfg_attr(docsrs, doc(cfg(feature = "events")))]
pub use events::{AsyncEventWaiter, CrossStreamBarrier};

#[cfg(feature = "engine")]
#[cfg_attr(docsrs, doc(cfg(feature = "engine")))]
pub use engine::{
    EventPool, EventPriority, Op, OperationGraph, OperationId, OperationType, PooledEvent,
};

#[cfg(feature = "allocator")]
#[cfg_attr(docsrs, doc(cfg(feature = "allocator")))]
pub use allocator::{Allocation, StreamOrderedAllocator};

#[cfg(feature = "profiler")]
#[cfg_attr(docsrs, doc(cfg(feature = "profiler")))]
pub use profiler::{ComprehensiveReport, StreamProfiler};

#[cfg(feature = "pipeline")]
#[cfg_attr(docsrs, doc(cfg(feature = "pipeline")))]
pub use pipeline::{
    ArraySpec, AsyncCoordinator, BatchUploader, BufferId, GpuPipelineStage, GpuTripleBuffer,
    ManagedGpuContext, PipelineStageManager, PlannerConfig, StageArg, StageId, StepResult,
    plan_transfers,
};
