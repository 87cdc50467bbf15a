//! Per-stream counters kept by the stream's own methods with relaxed atomics.

use crate::ground::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A snapshot of a stream's counters ([`crate::Stream::metrics`]).
///
/// `operations_count` counts every piece of work enqueued through the stream's
/// methods (copies, memsets, prefetches, kernel launches, callbacks, event
/// waits) plus what callers report with `record_kernel_launch` /
/// `record_memory_transfer`. Latency comes from timing events: each
/// [`crate::Stream::timed`] section, once the GPU has passed it, and each
/// [`crate::Stream::record_latency`] call.
///
/// ```
/// use cuda_streams_driver::{Context, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// stream.record_kernel_launch();
/// stream.record_memory_transfer(4096);
/// let m = stream.metrics();
/// assert_eq!((m.operations_count, m.kernel_launches, m.bytes_transferred), (2, 1, 4096));
/// assert_eq!(m.average_latency, None);
/// // One line for logs and reports:
/// assert_eq!(
///     m.to_string(),
///     format!("stream {}: operations 2, kernel launches 1, transfers 1 (4.00 KiB), \
///         callbacks 0, graph launches 0, memory 0 B (peak 0 B), no timed operations", stream.id()),
/// );
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamMetrics {
    /// The stream's id.
    pub stream_id: u64,
    /// Work items enqueued (see the type's docs).
    pub operations_count: u64,
    /// Copies and prefetches.
    pub memory_transfers: u64,
    /// Bytes moved by those transfers.
    pub bytes_transferred: u64,
    /// Kernel launches.
    pub kernel_launches: u64,
    /// Host callbacks enqueued.
    pub callbacks: u64,
    /// Replays of executable CUDA graphs ([`crate::GraphExec::launch`]),
    /// each counted as one operation.
    pub graph_launches: u64,
    /// The nodes those replays ran, summed.
    pub graph_nodes: u64,
    /// Host callbacks that panicked (the panic was caught).
    pub callback_panics: u64,
    /// Bytes of stream-ordered device memory currently allocated with this
    /// stream as home.
    pub current_memory: u64,
    /// The most `current_memory` has been, or the largest value given to
    /// `update_peak_memory`.
    pub peak_memory: u64,
    /// Operations whose GPU time was measured.
    pub timed_operations: u64,
    /// Their total GPU time.
    pub total_latency: Duration,
    /// `total_latency / timed_operations`, `None` before the first measurement.
    pub average_latency: Option<Duration>,
}

/// Panics of callbacks not reported yet: the number of the newest callback
/// among them, how many, and the newest one's message.
struct Unreported {
    seq: u64,
    count: u64,
    message: String,
}

/// At most this many entries wait to be reported; beyond it a panic merges
/// into the newest entry (reported with it, never before its own callback's
/// point), so a stream whose callbacks keep panicking unobserved stays small.
const UNREPORTED_ENTRIES: usize = 64;

/// The live counters behind [`StreamMetrics`]; shared with callbacks in flight.
#[derive(Default)]
pub(crate) struct Counters {
    /// Operations of no kind counted below (a wait, a memset, ...). The
    /// operations count is the sum of this and the per-kind counts: one
    /// atomic add per enqueue, not two, since every enqueue pays for it.
    other_operations: AtomicU64,
    memory_transfers: AtomicU64,
    bytes_transferred: AtomicU64,
    kernel_launches: AtomicU64,
    callbacks: AtomicU64,
    graph_launches: AtomicU64,
    graph_nodes: AtomicU64,
    callback_panics: AtomicU64,
    /// Numbers the callbacks in enqueue order, so a future reports only the
    /// panics of callbacks enqueued before its point.
    callback_seq: AtomicU64,
    panic_reported: AtomicBool,
    /// Panics not reported yet, oldest first.
    unreported: Mutex<VecDeque<Unreported>>,
    current_memory: AtomicU64,
    peak_memory: AtomicU64,
    timed_operations: AtomicU64,
    total_latency_ns: AtomicU64,
}

impl Counters {
    /// Every operation counted so far. A sum of counters each only ever
    /// growing, so it never goes down between one thread's reads.
    pub(crate) fn operations(&self) -> u64 {
        self.other_operations.load(Relaxed)
            + self.memory_transfers.load(Relaxed)
            + self.kernel_launches.load(Relaxed)
            + self.graph_launches.load(Relaxed)
            + self.callbacks.load(Relaxed)
    }

    pub(crate) fn operation(&self) {
        self.other_operations.fetch_add(1, Relaxed);
    }

    pub(crate) fn transfer(&self, bytes: usize) {
        self.memory_transfers.fetch_add(1, Relaxed);
        self.bytes_transferred.fetch_add(bytes as u64, Relaxed);
    }

    pub(crate) fn kernel_launch(&self) {
        self.kernel_launches.fetch_add(1, Relaxed);
    }

    pub(crate) fn graph_launch(&self, nodes: usize) {
        self.graph_launches.fetch_add(1, Relaxed);
        self.graph_nodes.fetch_add(nodes as u64, Relaxed);
    }

    pub(crate) fn callback(&self) {
        self.callbacks.fetch_add(1, Relaxed);
    }

    /// The number of a callback about to be enqueued.
    pub(crate) fn next_callback_seq(&self) -> u64 {
        self.callback_seq.fetch_add(1, Relaxed) + 1
    }

    /// The number of the last callback enqueued so far.
    pub(crate) fn last_callback_seq(&self) -> u64 {
        self.callback_seq.load(Relaxed)
    }

    /// A callback without a number of its own panicked (a graph's host node,
    /// at a replay): reported with everything enqueued so far.
    pub(crate) fn callback_panicked(&self, stream: u64, message: String) {
        self.callback_panicked_at(stream, self.last_callback_seq(), message);
    }

    /// Callback number `seq` panicked.
    pub(crate) fn callback_panicked_at(&self, stream: u64, seq: u64, message: String) {
        if !self.panic_reported.swap(true, Relaxed) {
            tracing::warn!(
                "a callback on stream {stream} panicked (caught; reported by the stream's next synchronize, and further panics on this stream are only counted here): {message}"
            );
        }
        let mut unreported = self.unreported.lock().unwrap_or_else(|p| p.into_inner());
        let full = unreported.len() >= UNREPORTED_ENTRIES;
        match unreported.back_mut() {
            Some(newest) if full => {
                newest.seq = newest.seq.max(seq);
                newest.count += 1;
                newest.message = message;
            }
            _ => unreported.push_back(Unreported {
                seq,
                count: 1,
                message,
            }),
        }
        self.callback_panics.fetch_add(1, Relaxed);
    }

    /// [`crate::Error::CallbackPanicked`], naming `stream`, for the panics
    /// not reported yet of the callbacks numbered up to `through`
    /// (`u64::MAX`: all), so each panic is reported once.
    pub(crate) fn report_panics(&self, stream: u64, through: u64) -> Result<()> {
        match self.take_panics_through(through) {
            None => Ok(()),
            Some((count, message)) => Err(Error::CallbackPanicked {
                stream,
                count,
                message,
            }),
        }
    }

    /// The panics not reported yet of the callbacks numbered up to
    /// `through`, with the newest message; each panic is reported once.
    pub(crate) fn take_panics_through(&self, through: u64) -> Option<(u64, String)> {
        let mut unreported = self.unreported.lock().unwrap_or_else(|p| p.into_inner());
        let mut taken: Option<(u64, String)> = None;
        // Callbacks run in stream order, so their panics come in number order
        // (except for callbacks enqueued concurrently from several threads,
        // which are then reported by a later check).
        while unreported
            .front()
            .is_some_and(|oldest| oldest.seq <= through)
        {
            let Some(entry) = unreported.pop_front() else {
                break;
            };
            let count = taken.as_ref().map_or(0, |(count, _)| *count) + entry.count;
            taken = Some((count, entry.message));
        }
        taken
    }

    /// Every panic not reported yet, with the newest message.
    pub(crate) fn take_panics(&self) -> Option<(u64, String)> {
        self.take_panics_through(u64::MAX)
    }

    pub(crate) fn allocated(&self, bytes: usize) {
        let now = self.current_memory.fetch_add(bytes as u64, Relaxed) + bytes as u64;
        self.peak_memory.fetch_max(now, Relaxed);
    }

    pub(crate) fn freed(&self, bytes: usize) {
        self.current_memory.fetch_sub(bytes as u64, Relaxed);
    }

    pub(crate) fn update_peak(&self, bytes: u64) {
        self.peak_memory.fetch_max(bytes, Relaxed);
    }

    pub(crate) fn latency(&self, elapsed: Duration) {
        self.timed_operations.fetch_add(1, Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.total_latency_ns.fetch_add(ns, Relaxed);
    }

    pub(crate) fn snapshot(&self, stream_id: u64) -> StreamMetrics {
        let timed = self.timed_operations.load(Relaxed);
        let total_ns = self.total_latency_ns.load(Relaxed);
        StreamMetrics {
            stream_id,
            operations_count: self.operations(),
            memory_transfers: self.memory_transfers.load(Relaxed),
            bytes_transferred: self.bytes_transferred.load(Relaxed),
            kernel_launches: self.kernel_launches.load(Relaxed),
            callbacks: self.callbacks.load(Relaxed),
            graph_launches: self.graph_launches.load(Relaxed),
            graph_nodes: self.graph_nodes.load(Relaxed),
            callback_panics: self.callback_panics.load(Relaxed),
            current_memory: self.current_memory.load(Relaxed),
            peak_memory: self.peak_memory.load(Relaxed),
            timed_operations: timed,
            total_latency: Duration::from_nanos(total_ns),
            average_latency: (timed > 0).then(|| Duration::from_nanos(total_ns / timed)),
        }
    }
}

/// A stream's counters, shared with the stream: readable after the stream is
/// dropped (a profiler that holds streams weakly still reports the work of
/// one that is gone, all of it).
///
/// ```
/// use cuda_streams_driver::{Context, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let counters = stream.counters();
/// stream.record_kernel_launch();
/// drop(stream);
/// assert_eq!(counters.metrics().kernel_launches, 1);
/// // Displayed as its metrics now.
/// assert_eq!(counters.to_string(), counters.metrics().to_string());
/// ```
#[derive(Clone)]
pub struct StreamCounters {
    stream_id: u64,
    counters: std::sync::Arc<Counters>,
}

impl StreamCounters {
    pub(crate) fn new(stream_id: u64, counters: std::sync::Arc<Counters>) -> Self {
        Self {
            stream_id,
            counters,
        }
    }

    /// The counters now. Timing sections are folded in by
    /// [`Stream::metrics`](crate::Stream::metrics) only, while the stream lives.
    pub fn metrics(&self) -> StreamMetrics {
        self.counters.snapshot(self.stream_id)
    }
}

impl std::fmt::Debug for StreamCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCounters")
            .field("stream_id", &self.stream_id)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Display for StreamMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::ground::units::{format_bytes, format_duration};
        write!(
            f,
            "stream {}: operations {}, kernel launches {}, transfers {} ({}), callbacks {}, graph launches {}",
            self.stream_id,
            self.operations_count,
            self.kernel_launches,
            self.memory_transfers,
            format_bytes(self.bytes_transferred),
            self.callbacks,
            self.graph_launches,
        )?;
        if self.callback_panics > 0 {
            write!(f, ", callback panics {}", self.callback_panics)?;
        }
        write!(
            f,
            ", memory {} (peak {})",
            format_bytes(self.current_memory),
            format_bytes(self.peak_memory)
        )?;
        match self.average_latency {
            Some(average) => write!(
                f,
                ", latency {} average over {} timed",
                format_duration(average),
                self.timed_operations
            ),
            None => write!(f, ", no timed operations"),
        }
    }
}

impl std::fmt::Display for StreamCounters {
    /// The counters now, as [`StreamMetrics`] displays them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.metrics().fmt(f)
    }
}
