//! What the profiler reports: per stream and across streams.

use crate::stats::{self, OperationStats};
use crate::timed_op::TimedOp;
use crate::timeline::{Counts, StreamState};
use std::collections::BTreeMap;
use std::time::Duration;

/// One stream's profile ([`crate::StreamProfiler::get_stream_report`]).
///
/// Times are GPU times from timing events, except durations given to
/// [`crate::StreamProfiler::record_operation`], which count as reported.
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
/// use std::time::Duration;
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::<u32>::new_async(&stream, 1024)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// profiler.enable();
/// profiler.time(&stream, "clear", |s| s.memset_u32_async(&mut buf, 0))??;
/// profiler.record_operation(&stream, "host prep", Duration::from_micros(50));
/// let report = profiler.get_stream_report(&stream).expect("the stream was profiled");
/// assert_eq!((report.stream_id, report.operation_count), (stream.id(), 2));
/// // Only the timed operation is on the GPU timeline; the recorded one adds to the total.
/// assert_eq!(report.total_time, report.busy_time + Duration::from_micros(50));
/// assert!(report.first_start.is_some() && report.first_start <= report.last_end);
/// assert_eq!(report.unresolved, 0);
/// # Ok(())
/// # }
/// ```
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
    /// to `record_kernel_launch`. A stream dropped before the report counts
    /// up to the end of its last scope: the profiler holds it weakly and
    /// reads its counters as each scope closes.
    pub kernel_launches: u64,
    /// Memory transfers, counted the same way.
    pub memory_transfers: u64,
    /// Bytes moved by those transfers.
    pub bytes_transferred: u64,
    /// CUDA graph replays on the stream while profiling was enabled; a scope
    /// around a replay times it as one operation.
    pub graph_launches: u64,
    /// The nodes those replays ran, summed.
    pub graph_nodes: u64,
    /// Timed operations whose end the GPU had not reached when the report was
    /// made (only when resolving failed; normally 0).
    pub unresolved: u64,
    /// Whether a GPU timed the operations. `false` on the software driver,
    /// whose timing events read the host's clock while CPU threads run the
    /// work: its times show the order and overlap of the work, not how long
    /// it takes on a GPU, and the text report does not call them GPU time.
    pub timed_by_gpu: bool,
}

/// All streams together ([`crate::StreamProfiler::get_comprehensive_report`]).
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
/// use std::time::Duration;
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let (a, b) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let profiler = StreamProfiler::new(&ctx)?;
/// profiler.enable();
/// for stream in [&a, &b] {
///     let mut buf = DeviceBuffer::<u32>::new_async(stream, 1 << 16)?;
///     profiler.time(stream, "clear", |s| s.memset_u32_async(&mut buf, 0))??;
/// }
/// let report = profiler.get_comprehensive_report();
/// assert_eq!((report.total_streams, report.total_operations), (2, 2));
/// assert_eq!(report.stream(b.id()).unwrap().operations["clear"].count, 1);
/// // Every instant of the wall span has some number of streams busy.
/// assert_eq!(report.concurrency.iter().sum::<Duration>(), report.wall_span);
/// assert!(report.max_concurrency <= 2);
/// # Ok(())
/// # }
/// ```
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
    /// the whole time. 0 when nothing was timed. The text report gives
    /// [`busy_fraction`](Self::busy_fraction) instead, a share that cannot
    /// exceed 100%; [`concurrency`](Self::concurrency) says how the busy
    /// time divides by the number of streams busy at once.
    pub overlap_efficiency: f64,
    /// `concurrency[k]`: time within the wall span with exactly `k` streams
    /// busy (`concurrency[0]` is time with none busy).
    pub concurrency: Vec<Duration>,
    /// The most streams busy at once.
    pub max_concurrency: usize,
    /// Errors met while recording (e.g. a scope whose end could not be
    /// recorded); see [`crate::StreamProfiler::error_count`].
    pub errors: u64,
    /// Whether a GPU timed the operations ([`StreamReport::timed_by_gpu`]).
    pub timed_by_gpu: bool,
    /// The tracked allocators' memory while profiling was enabled: `Some`
    /// once [`crate::StreamProfiler::track_memory`] was called.
    pub memory: Option<crate::memory_report::MemoryReport>,
}

impl StreamReport {
    /// Build a report from a stream's resolved state.
    pub(crate) fn build(
        id: u64,
        state: &StreamState,
        counts: Counts,
        skipped: &[(String, u64)],
        timed_by_gpu: bool,
    ) -> (Self, Vec<(u64, u64)>) {
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
        let mut operations: BTreeMap<String, OperationStats> = by_name
            .into_iter()
            .filter_map(|(name, mut ns)| Some((name, stats::operation_stats(&mut ns)?)))
            .collect();
        for (name, skipped) in skipped.iter().filter(|(_, n)| *n > 0) {
            operations.entry(name.clone()).or_default().count += skipped;
        }
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
            graph_launches: counts.graph_launches,
            graph_nodes: counts.graph_nodes,
            unresolved: state.pending_len() as u64,
            timed_by_gpu,
        };
        (report, busy)
    }
}

impl ComprehensiveReport {
    /// Combine stream reports with each stream's merged busy intervals.
    pub(crate) fn build(
        mut parts: Vec<(StreamReport, Vec<(u64, u64)>)>,
        errors: u64,
        timed_by_gpu: bool,
        memory: Option<crate::memory_report::MemoryReport>,
    ) -> Self {
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
            timed_by_gpu,
            memory,
        }
    }

    /// The share of the wall span in which at least one stream was busy:
    /// 1.0 when some stream always had timed work running, 0 when nothing
    /// was timed. This is the report's one overlap figure: how well the
    /// streams kept the device busy between them.
    ///
    /// ```
    /// use cuda_streams_profiler::ComprehensiveReport;
    /// assert_eq!(ComprehensiveReport::default().busy_fraction(), 0.0);
    /// ```
    pub fn busy_fraction(&self) -> f64 {
        if self.wall_span.is_zero() {
            return 0.0;
        }
        let idle = self.concurrency.first().copied().unwrap_or_default();
        self.wall_span.saturating_sub(idle).as_secs_f64() / self.wall_span.as_secs_f64()
    }

    /// The report of stream `id`, if it was profiled.
    pub fn stream(&self, id: u64) -> Option<&StreamReport> {
        self.streams.iter().find(|s| s.stream_id == id)
    }
}
