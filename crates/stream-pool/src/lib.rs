//! Stream pool: streams created once and handed out by atomic cursors, real
//! priorities, workload-aware strategies that look at the GPU, live
//! readiness, and multi-stream coordination.
//!
//! Creating a stream costs ~28 µs on an H200 and destroying one can
//! synchronise the device, so a [`StreamPool`] creates its streams once,
//! split across the priority classes ([`driver::StreamPriority`] mapped onto
//! the device's real range), and hands them out:
//!
//! ```
//! use cuda_streams_stream_pool::driver::{Context, StreamPriority};
//! use cuda_streams_stream_pool::{AllocationStrategy, StreamPool, WorkloadType};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
//! let ctx = Context::new(0)?;
//! let pool = StreamPool::new_with_strategy(&ctx, 8, AllocationStrategy::Workload)?;
//! let compute = pool.get_stream_for_workload(WorkloadType::Compute);
//! assert_eq!(compute.priority()?, ctx.priority_range().greatest);
//! let background = pool.get_priority_stream(StreamPriority::Low);
//! assert_eq!(background.priority()?, ctx.priority_range().least);
//!
//! pool.record_workload_completion(WorkloadType::Compute, Duration::from_millis(12));
//! assert_eq!(pool.average_workload_time(WorkloadType::Compute), Some(Duration::from_millis(12)));
//! for change in pool.optimize_configuration()? {
//!     println!("{change:?}");
//! }
//! if let Some(ready) = pool.wait_for_any_ready(Some(Duration::from_millis(10)))? {
//!     println!("stream {} is idle", ready.id());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The pieces
//!
//! - [`StreamPool`] and [`PoolBuilder`]: size (also from
//!   `CUDA_STREAMS_POOL_SIZE`), [`AllocationStrategy`], [`ClassSplit`].
//!   Getters by strategy, [`WorkloadType`], priority class and
//!   [`StreamPurpose`]; the sharing model is documented on [`StreamPool`].
//! - [`ExclusiveStream`]: a stream nobody else is handed until the guard drops.
//! - [`DevicePools`]: one pool per device behind one handle
//!   ([`DevicePools::for_device`]); each pool's
//!   [`StreamPurpose::P2PTransfer`] stream carries peer copies into its device.
//! - Tuning: `record_workload_completion`, `average_workload_time`,
//!   `optimize_configuration` returning [`ConfigChange`]s.
//! - Readiness: `has_ready_streams`, `wait_for_any_ready` (sleeping back-off).
//! - [`PoolMetrics`]: the driver layer's per-stream metrics, summed.
//! - [`MultiStreamCoordinator`]: a view on the engine's operation graph
//!   ([`engine::OperationGraph`], reached with
//!   [`graph`](MultiStreamCoordinator::graph)): its dependencies are the
//!   graph's standing stream dependencies (cycles refused by the engine's one
//!   check), its barrier the graph's barrier node, `execute_parallel` the
//!   graph's parallel node (every error collected) and each completion
//!   callback a host-function operation that fires at GPU time. Builder
//!   operations mix with all of them.
//! - [`QosPool`]: streams by [`ServiceClass`] (urgent, normal, background),
//!   urgent ones on an SM partition of their own (`CUDA_STREAMS_URGENT_SMS`,
//!   [`urgent_sms_for`] to size it from a target latency).
//! - [`Error`]: one enum; driver failures wrapped.
//!
//! The guide, with the specification's examples in this API, is
//! `docs/stream-pool.md`; its code blocks run as doc tests of this crate.
#![forbid(unsafe_code)]

mod config;
mod coordinator;
mod devices;
mod error;
mod exclusive;
mod kinds;
mod layout;
mod live;
mod metrics;
mod pool;
mod probe;
mod qos;
mod reserve;
mod tuning;
mod workload_stats;

/// The safe driver layer this crate builds on (`Context`, `Stream`, ...).
pub use driver;
/// The priority classes, from the driver layer.
pub use driver::StreamPriority;
/// The operation graph, which takes streams from a pool by priority
/// (`OperationGraph::op_from(&pool)`).
pub use engine;

pub use config::{
    DEFAULT_POOL_SIZE, MAX_ENV_POOL_SIZE, POOL_SIZE_ENV, POOL_SIZE_SETTING, PoolBuilder,
    parse_pool_size,
};
pub use coordinator::MultiStreamCoordinator;
pub use devices::DevicePools;
pub use error::{Error, Result, StreamFailure};
pub use exclusive::ExclusiveStream;
pub use kinds::{AllocationStrategy, OperationType, StreamPurpose, WorkloadType};
pub use layout::ClassSplit;
pub use metrics::PoolMetrics;
pub use pool::StreamPool;
pub use qos::{
    DEFAULT_URGENT_SMS, QosPool, QosSettings, ServiceClass, URGENT_SMS_ENV, URGENT_SMS_SETTING,
    urgent_sms_for,
};
pub use tuning::ConfigChange;

/// The guide's examples (`docs/stream-pool.md`), compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/stream-pool.md")]
pub struct StreamPoolGuide;
