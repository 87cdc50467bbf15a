//! Event coordination on top of the safe driver layer:
//!
//! - [`EventPool`]: reusable plain and timing events; acquiring and releasing
//!   one makes no driver call.
//! - [`OperationCoordinator`]: operations with dependencies across streams,
//!   turned into `cuStreamWaitEvent`s on pooled completion events; completion
//!   callbacks at GPU time; deadlock detection over dependency and
//!   stream-order edges; a priority-ordered ready list; retirement of finished
//!   operations.
//! - [`CrossStreamBarrier`]: a host-blocking or device-side barrier over
//!   several streams.
//! - [`AsyncEventWaiter`]: one background thread running callbacks when events
//!   complete.
//!
//! See `docs/event-coord.md` for a walk-through.

mod barrier;
mod waiter;

pub use barrier::{BarrierStats, CrossStreamBarrier};
/// The seed's event pool, which lives in the driver layer: every context has
/// one ([`driver::Context::event_pool`]), and [`EventPool::new`] makes more.
pub use driver::{EventPool, EventPoolUtilization, PooledEvent};
/// The seed's operation coordinator is the workspace's one operation graph
/// under its seed name: registering, beginning and completing operations,
/// callbacks, retirement and deadlock detection all live in
/// `cuda_streams_engine`.
pub use engine::OperationGraph as OperationCoordinator;
pub use engine::{
    Barrier, CoordinatorMetrics, Error, EventMetadata, EventPriority, Op, OpBuilder, OperationId,
    OperationState, OperationType, Result,
};
/// The examples of `docs/event-coord.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/event-coord.md")]
mod docs_examples {}

/// The safe driver layer this crate builds on (contexts, streams, buffers),
/// so examples can name it through this crate.
pub use driver;
pub use waiter::{AsyncEventWaiter, WaitError, WaitEvent, WaitId, WaiterMetrics};
