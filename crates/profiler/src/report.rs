//! What the profiler reports: per stream and across streams.

use crate::stats;
use crate::timeline::{Counts, StreamState, TimedOp};
use std::collections::BTreeMap;
use std::time::Duration;

/// Statistics of one operation name on one stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationStats {
    /// How many times it ran.
    pub count: u64,
    /// Their total duration.
    pub total: Duration,
    /// `total / count`.
    pub mean: Duration,
    /// The shortest.
    pub min: Duration,
    /// The longest.
    pub max: Duration,
    /// Median (nearest rank).
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
}

/// One stream's profile ([`crate::StreamProfiler::get_stream_report`]).
///
/// Times are GPU times from timing events, except durations given to
/// [`crate::StreamProfiler::record_operation`], which count as reported.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct StreamReport {
    /// The stream's id ([`driver::Stream::id`]).
    pub stream_id: u64,
    /// Operations timed or recorded (scopes still open are not counted).
    pub operation_count: u64,
    /// GPU time covered by this stream's timed operations (nested scopes are
    /// not counted twice), plus the durations given to `record_operation`.
    pub total_time: Duration,
    /// GPU time covered by timed operations alone: the stream's busy time on
    /// the timeline.
    pub busy_time: Duration,
    /// When the first timed operation started, after the base event.
    pub first_start: Option<Duration>,
    /// When the last timed operation ended, after the base event.
    pub last_end: Option<Duration>,
    /// Per operation name, in name order.
    pub operations: BTreeMap<String, OperationStats>,
    /// Kernel launches on the stream while profiling was enabled: those made
    /// through the driver layer (from the stream's metrics) plus those given
    /// to `record_kernel_launch`.
    pub kernel_launches: u64,
    /// Memory transfers, counted the same way.
    pub memory_transfers: u64,
    /// Bytes moved by those transfers.
    pub bytes_transferred: u64,
    /// Timed operations whose end the GPU had not reached when the report was
    /// made (only when resolving failed; normally 0).
    pub unresolved: u64,
}

/// All streams together ([`crate::StreamProfiler::get_comprehensive_report`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ComprehensiveReport {
    /// One report per stream, in stream id order.
    pub streams: Vec<StreamReport>,
    /// `streams.len()`.
    pub total_streams: usize,
    /// Operations over all streams.
    pub total_operations: u64,
    /// From the first timed start to the last timed end, over all streams.
    pub wall_span: Duration,
    /// Sum of the streams' busy times over the wall span: 1.0 when streams
    /// took turns, up to the number of streams when all ran side by side
    /// the whole time. 0 when nothing was timed.
    pub overlap_efficiency: f64,
    /// `concurrency[k]`: time within the wall span with exactly `k` streams
    /// busy (`concurrency[0]` is time with none busy).
    pub concurrency: Vec<Duration>,
    /// The most streams busy at once.
    pub max_concurrency: usize,
    /// Errors met while recording (e.g. a scope whose end could not be
    /// recorded); see [`crate::StreamProfiler::error_count`].
    pub errors: u64,
}

impl StreamReport {
    /// Build a report from a stream's resolved state.
    pub(crate) fn build(id: u64, state: &StreamState, counts: Counts) -> (Self, Vec<(u64, u64)>) {
        let mut by_name: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for op in &state.timed {
            by_name
                .entry(op.name.to_string())
                .or_default()
                .push(op.end_ns - op.start_ns);
        }
        for (name, duration) in &state.external {
            let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
            by_name.entry(name.to_string()).or_default().push(ns);
        }
        let operations: BTreeMap<String, OperationStats> = by_name
            .into_iter()
            .filter_map(|(name, mut ns)| Some((name, stats::operation_stats(&mut ns)?)))
            .collect();
        let busy = stats::merge(state.timed.iter().map(TimedOp::interval).collect());
        let busy_time = Duration::from_nanos(stats::covered(&busy));
        let external: Duration = state.external.iter().map(|(_, d)| *d).sum();
        let report = Self {
            stream_id: id,
            operation_count: (state.timed.len() + state.external.len()) as u64,
            total_time: busy_time + external,
            busy_time,
            first_start: busy.first().map(|&(s, _)| Duration::from_nanos(s)),
            last_end: busy.last().map(|&(_, e)| Duration::from_nanos(e)),
            operations,
            kernel_launches: counts.kernel_launches,
            memory_transfers: counts.memory_transfers,
            bytes_transferred: counts.bytes_transferred,
            unresolved: state.pending_len() as u64,
        };
        (report, busy)
    }
}

impl ComprehensiveReport {
    /// Combine stream reports with each stream's merged busy intervals.
    pub(crate) fn build(mut parts: Vec<(StreamReport, Vec<(u64, u64)>)>, errors: u64) -> Self {
        parts.sort_by_key(|(report, _)| report.stream_id);
        let busy: Vec<Vec<(u64, u64)>> = parts.iter().map(|(_, b)| b.clone()).collect();
        let streams: Vec<StreamReport> = parts.into_iter().map(|(r, _)| r).collect();
        let first = busy.iter().filter_map(|b| b.first()).map(|i| i.0).min();
        let last = busy.iter().filter_map(|b| b.last()).map(|i| i.1).max();
        let span_ns = match (first, last) {
            (Some(first), Some(last)) => last.saturating_sub(first),
            _ => 0,
        };
        let busy_ns: u64 = busy.iter().map(|b| stats::covered(b)).sum();
        let concurrency = stats::concurrency(&busy);
        Self {
            total_streams: streams.len(),
            total_operations: streams.iter().map(|s| s.operation_count).sum(),
            wall_span: Duration::from_nanos(span_ns),
            overlap_efficiency: if span_ns > 0 {
                busy_ns as f64 / span_ns as f64
            } else {
                0.0
            },
            max_concurrency: concurrency.iter().rposition(|d| !d.is_zero()).unwrap_or(0),
            concurrency,
            streams,
            errors,
        }
    }

    /// The report of stream `id`, if it was profiled.
    pub fn stream(&self, id: u64) -> Option<&StreamReport> {
        self.streams.iter().find(|s| s.stream_id == id)
    }
}

impl TimedOp {
    pub(crate) fn interval(&self) -> (u64, u64) {
        (self.start_ns, self.end_ns)
    }
}
