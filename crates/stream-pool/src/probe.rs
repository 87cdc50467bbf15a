//! What the pool has learned about one stream's progress from its queries.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the pool has seen a stream pass.
///
/// `passed` is a count of the stream's operations (its
/// `StreamMetrics::operations_count`) known to be finished: set when a query
/// finds the stream idle. Operations enqueued minus `passed` is the live
/// work of a busy stream: the work enqueued since it was last seen idle, an
/// upper bound, learned without enqueueing anything on a stream the caller
/// only meant to look at.
#[derive(Default)]
pub(crate) struct Probe {
    passed: AtomicU64,
}

impl Probe {
    /// Work still ahead on a busy stream that had `enqueued` operations: at
    /// least 1 (the stream is busy).
    pub(crate) fn busy_load(&self, enqueued: u64) -> u64 {
        enqueued.saturating_sub(self.passed.load(Relaxed)).max(1)
    }

    /// The stream was found idle after `enqueued` operations: all of them
    /// have passed.
    pub(crate) fn saw_idle(&self, enqueued: u64) {
        self.passed.fetch_max(enqueued, Relaxed);
    }
}
