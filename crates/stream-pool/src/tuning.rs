//! Measured workload times, and reshaping the pool from them.

use crate::error::Result;
use crate::kinds::{AllocationStrategy, WorkloadType};
use crate::layout::{Span, proportional_spans};
use crate::pool::StreamPool;
use std::time::Duration;

/// When the slowest workload type's average is this many times the fastest's,
/// operations are too unequal for round-robin.
const SKEW_FOR_LOAD_BALANCING: f64 = 4.0;

/// A workload type is under-provisioned when its share of the measured time is
/// at least this many times its share of the streams.
const UNDER_PROVISIONED: f64 = 2.0;

/// What [`StreamPool::optimize_configuration`] changed.
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{AllocationStrategy, ConfigChange, StreamPool, WorkloadType};
/// use std::time::Duration;
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let pool = StreamPool::new(&ctx, 8)?; // round-robin
/// pool.record_workload_completion(WorkloadType::Compute, Duration::from_millis(1));
/// pool.record_workload_completion(WorkloadType::Memory, Duration::from_millis(10));
/// let changes = pool.optimize_configuration()?;
/// // Operations this unequal are better handed out by live load.
/// let (from, to) = (AllocationStrategy::RoundRobin, AllocationStrategy::LoadBalanced);
/// assert!(changes.contains(&ConfigChange::Strategy { from, to }));
/// // Memory took most of the time, so it gets more streams.
/// let memory = changes.iter().find_map(|change| match change {
///     ConfigChange::WorkloadStreams { workload: WorkloadType::Memory, before, after } => {
///         Some((before.len(), after.len()))
///     }
///     _ => None,
/// });
/// let (before, after) = memory.expect("memory was under-provisioned");
/// assert!(after > before);
/// assert!(pool.optimize_configuration()?.is_empty()); // nothing new to change
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigChange {
    /// A workload type is now served by other streams (ids, in pool order).
    WorkloadStreams {
        /// The workload type.
        workload: WorkloadType,
        /// The stream ids serving it before.
        before: Vec<u64>,
        /// The stream ids serving it now.
        after: Vec<u64>,
    },
    /// `get_stream` now uses another strategy.
    Strategy {
        /// The strategy before.
        from: AllocationStrategy,
        /// The strategy now.
        to: AllocationStrategy,
    },
}

impl StreamPool {
    /// Record that a `workload` operation took `elapsed` (ideally GPU time
    /// from timing events, e.g. `Event::elapsed`).
    pub fn record_workload_completion(&self, workload: WorkloadType, elapsed: Duration) {
        self.stats.record(workload, elapsed);
    }

    /// The mean of the times recorded for `workload`; `None` before the first.
    pub fn average_workload_time(&self, workload: WorkloadType) -> Option<Duration> {
        let (count, total) = self.workload_totals(workload);
        (count > 0).then(|| total / u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// How many completions were recorded for `workload`, and their total time.
    pub fn workload_totals(&self, workload: WorkloadType) -> (u64, Duration) {
        self.stats.totals(workload)
    }

    /// Reshape the pool from the recorded times and say what changed.
    ///
    /// - **Streams per workload type.** A type whose share of the total
    ///   recorded time is at least twice its share of the streams is
    ///   under-provisioned; then every type is given a contiguous run of
    ///   streams in proportion to its time (at least one each, most urgent
    ///   types first, so `Compute` keeps the High class). Needs at least four
    ///   streams.
    /// - **Strategy.** Under `RoundRobin`, when the slowest type's average is
    ///   at least four times the fastest's, operations are too unequal to hand
    ///   out in turn, and the strategy becomes `LoadBalanced`.
    ///
    /// Getters keep running without a lock meanwhile: each workload's streams
    /// are replaced with one atomic store. Calling it again with no new skew
    /// changes nothing.
    pub fn optimize_configuration(&self) -> Result<Vec<ConfigChange>> {
        let _serial = self.tuning.lock().unwrap_or_else(|p| p.into_inner());
        let mut changes = Vec::new();
        let totals = WorkloadType::ALL.map(|w| self.workload_totals(w));
        let loads = totals.map(|(_, total)| total.as_secs_f64());
        let sum: f64 = loads.iter().sum();
        let current = WorkloadType::ALL.map(|w| self.workload_spans[w.index()].load());
        let under_provisioned = sum > 0.0
            && WorkloadType::ALL.iter().any(|w| {
                let load_share = loads[w.index()] / sum;
                let stream_share = f64::from(current[w.index()].len) / self.len() as f64;
                load_share >= UNDER_PROVISIONED * stream_share
            });
        let reshaped = under_provisioned
            .then(|| proportional_spans(self.len(), loads))
            .flatten();
        if let Some(spans) = reshaped {
            for workload in WorkloadType::ALL {
                let (before, after) = (current[workload.index()], spans[workload.index()]);
                if before != after {
                    self.workload_spans[workload.index()].store(after);
                    changes.push(ConfigChange::WorkloadStreams {
                        workload,
                        before: self.span_ids(before),
                        after: self.span_ids(after),
                    });
                }
            }
        }
        let averages: Vec<f64> = totals
            .iter()
            .filter(|(count, _)| *count > 0)
            .map(|(count, total)| total.as_secs_f64() / *count as f64)
            .collect();
        let (fastest, slowest) = averages
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &a| {
                (lo.min(a), hi.max(a))
            });
        let skewed = averages.len() >= 2 && slowest >= SKEW_FOR_LOAD_BALANCING * fastest;
        if skewed && self.strategy() == AllocationStrategy::RoundRobin {
            self.set_strategy(AllocationStrategy::LoadBalanced);
            changes.push(ConfigChange::Strategy {
                from: AllocationStrategy::RoundRobin,
                to: AllocationStrategy::LoadBalanced,
            });
        }
        Ok(changes)
    }

    fn span_ids(&self, span: Span) -> Vec<u64> {
        span.indices().map(|i| self.slots[i].stream.id()).collect()
    }
}
