//! Completion times recorded per workload type, the input of tuning.

use crate::kinds::WorkloadType;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Default)]
#[repr(align(64))]
struct Stat {
    count: AtomicU64,
    total_ns: AtomicU64,
}

/// Completions recorded per workload type (relaxed atomics: no lock).
#[derive(Default)]
pub(crate) struct WorkloadStats([Stat; 4]);

impl WorkloadStats {
    /// Count one `workload` completion that took `elapsed`.
    pub(crate) fn record(&self, workload: WorkloadType, elapsed: Duration) {
        let stat = &self.0[workload.index()];
        stat.count.fetch_add(1, Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        stat.total_ns.fetch_add(ns, Relaxed);
    }

    /// How many completions were recorded for `workload`, and their total time.
    pub(crate) fn totals(&self, workload: WorkloadType) -> (u64, Duration) {
        let stat = &self.0[workload.index()];
        (
            stat.count.load(Relaxed),
            Duration::from_nanos(stat.total_ns.load(Relaxed)),
        )
    }
}
