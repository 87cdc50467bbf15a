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
//!
//! Your own kernels need nothing more: [`kernel!`](crate::driver::kernel)
//! declares one and [`Program`] compiles it (`docs/kernels.md`).
//!
//! ```
//! use cuda_streams::prelude::*;
//!
//! const SOURCE: &str = r#"
//! extern "C" __global__ void scale(unsigned long long n, float a, float* y) {
//!     unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) y[i] = a * y[i];
//! }"#;
//!
//! kernel! {
//!     /// `y = a·y`
//!     pub struct Scale: fn scale(n: u64, a: f32, y: &mut [f32; n]);
//!     twin = per_thread(|t, n, a, y| {
//!         let i = t.global_x();
//!         if (i as u64) < n {
//!             y[i] = a * y[i];
//!         }
//!     });
//! }
//!
//! # fn main() -> Result<(), cuda_streams::Error> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! // SAFETY: scale touches y[i] for i < n only.
//! let program = unsafe { Program::new(SOURCE).declare::<Scale>() };
//! let scale: Scale = program.compile_for(&ctx)?.kernel()?;
//! let mut y = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0, 3.0])?;
//! scale.launch(&stream, LaunchConfig::for_num_elems(3), 3, 2.0, &mut y)?;
//! assert_eq!(y.to_vec(&stream)?, [2.0, 4.0, 6.0]);
//! # Ok(())
//! # }
//! ```

pub use driver::{
    Context, DeviceBuffer, DriverKind, Event, Kernel, KernelArg, LaunchConfig, Module,
    PinnedBuffer, Program, Stream, StreamPriority, UnifiedBuffer, kernel,
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
