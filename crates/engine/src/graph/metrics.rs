//! The coordinator's counters and the snapshot it hands out.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of [`crate::OperationGraph::metrics`].
///
/// ```
/// use cuda_streams_engine::{EventPool, EventPriority, OperationGraph, OperationType};
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 2, 0)?));
/// let (kind, priority) = (OperationType::Kernel, EventPriority::Normal);
/// let done = coordinator.register_operation(kind, priority, &stream, vec![], "done")?;
/// coordinator.register_operation(kind, priority, &stream, vec![done], "waiting")?;
/// coordinator.begin_operation(done, &stream)?;
/// coordinator.complete_operation(done)?;
/// stream.synchronize()?;
/// assert_eq!(coordinator.retire_completed(), 1);
/// let metrics = coordinator.metrics();
/// assert_eq!((metrics.total_operations, metrics.completed_operations), (2, 1));
/// assert_eq!((metrics.retired_operations, metrics.in_flight), (1, 1));
/// assert_eq!(metrics.deadlock_detections, 0);
/// let line = metrics.to_string(); // one line for logs and reports
/// assert!(line.starts_with("operation graph: 2 registered, 1 completed, 1 retired, 1 in flight"), "{line}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoordinatorMetrics {
    /// Operations registered.
    pub total_operations: u64,
    /// Operations whose `complete_operation` succeeded.
    pub completed_operations: u64,
    /// Host time spent inside `register_operation`, `begin_operation` and
    /// `complete_operation` (driver calls included), divided by
    /// `total_operations`. Builder operations ([`crate::OperationGraph::op`])
    /// are sampled: one in sixteen is timed and stands for the others, since
    /// reading the clock would be a sizeable part of their cost.
    pub average_coordination_time: Duration,
    /// Cycles reported by `detect_deadlocks`, summed over its calls.
    pub deadlock_detections: u64,
    /// Operations dropped after the GPU passed their completion event.
    pub retired_operations: u64,
    /// Operations the coordinator still holds (not yet retired).
    pub in_flight: usize,
    /// Completion callbacks that panicked (the panics were caught).
    pub callback_panics: u64,
}

/// Shared with the completion host functions, which count panics. The
/// operation counts live in the graph's table, under its lock.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) coordination_ns: AtomicU64,
    pub(crate) deadlocks: AtomicU64,
    pub(crate) callback_panics: AtomicU64,
}

impl Counters {
    pub(crate) fn add_time(&self, elapsed: Duration) {
        self.add_sampled_time(elapsed, 1);
    }

    /// Time one operation in `every`: the sample stands for all of them.
    pub(crate) fn add_sampled_time(&self, elapsed: Duration, every: u64) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.coordination_ns
            .fetch_add(ns.saturating_mul(every), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(
        &self,
        in_flight: usize,
        total: u64,
        completed: u64,
        retired: u64,
    ) -> CoordinatorMetrics {
        let ns = self.coordination_ns.load(Ordering::Relaxed);
        CoordinatorMetrics {
            total_operations: total,
            completed_operations: completed,
            average_coordination_time: Duration::from_nanos(ns / total.max(1)),
            deadlock_detections: self.deadlocks.load(Ordering::Relaxed),
            retired_operations: retired,
            in_flight,
            callback_panics: self.callback_panics.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn panicked(&self, what: &str, payload: &(dyn Any + Send)) {
        self.callback_panics.fetch_add(1, Ordering::Relaxed);
        let message = driver::panic_message(payload);
        tracing::error!("a completion callback of {what} panicked: {message}");
    }
}

impl std::fmt::Display for CoordinatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "operation graph: {} registered, {} completed, {} retired, {} in flight; \
             {} average coordination per operation; {} deadlock(s) detected",
            self.total_operations,
            self.completed_operations,
            self.retired_operations,
            self.in_flight,
            driver::format_duration(self.average_coordination_time),
            self.deadlock_detections,
        )?;
        if self.callback_panics > 0 {
            write!(f, "; {} callback panic(s)", self.callback_panics)?;
        }
        Ok(())
    }
}
