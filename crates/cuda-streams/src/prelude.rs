//! The commonly used types of every enabled module: `use cuda_streams::prelude::*;`.
//!
//! Error types are left out (each crate has its own `Error`): use
//! [`cuda_streams::Error`](crate::Error), which converts from each, so `?`
//! works across crates.

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
pub use events::{
    AsyncEventWaiter, CrossStreamBarrier, EventPool, EventPriority, OperationCoordinator,
    OperationId, OperationType, PooledEvent,
};

#[cfg(feature = "events")]
#[cfg_attr(docsrs, doc(cfg(feature = "events")))]
pub use engine::{Op, OperationGraph};

#[cfg(feature = "allocator")]
#[cfg_attr(docsrs, doc(cfg(feature = "allocator")))]
pub use allocator::{Allocation, Backend, StreamOrderedAllocator};

#[cfg(feature = "profiler")]
#[cfg_attr(docsrs, doc(cfg(feature = "profiler")))]
pub use profiler::{ComprehensiveReport, StreamProfiler};

#[cfg(feature = "pipeline")]
#[cfg_attr(docsrs, doc(cfg(feature = "pipeline")))]
pub use pipeline::{
    ArraySpec, AsyncCoordinator, BatchUploader, BufferId, GpuPipelineStage, GpuTripleBuffer,
    ManagedGpuContext, PipelineStageManager, PlannerConfig, StageArg, StageId, StepConfig,
    Telemetry, plan_transfers,
};
