//! The driver layer's per-stream metrics, gathered over the pool.

use crate::pool::StreamPool;
use driver::StreamMetrics;
use std::time::Duration;

/// Every shared stream's [`StreamMetrics`] and their sums, from
/// [`StreamPool::metrics`].
///
/// ```
/// use cuda_streams_stream_pool::StreamPool;
/// use cuda_streams_stream_pool::driver::Context;
/// use std::sync::mpsc;
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let pool = StreamPool::new(&ctx, 2)?;
/// let stream = pool.get_stream();
/// let (tx, rx) = mpsc::channel();
/// stream.add_callback(move || tx.send(()).unwrap())?;
/// rx.recv().unwrap();
/// stream.synchronize()?;
/// let metrics = pool.metrics();
/// assert_eq!(metrics.streams.len(), 2);
/// assert_eq!((metrics.callbacks, metrics.callback_panics), (1, 0));
/// assert_eq!(metrics.idle_streams, 2);
/// assert_eq!(metrics.average_latency, None); // no operation timed yet
/// // A summary line, then one line per stream:
/// let text = metrics.to_string();
/// assert!(text.starts_with("stream pool: 2 stream(s) (2 idle), operations "), "{text}");
/// assert_eq!(text.lines().count(), 3, "{text}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolMetrics {
    /// One entry per shared stream, in pool order.
    pub streams: Vec<StreamMetrics>,
    /// Operations enqueued, all streams.
    pub operations_count: u64,
    /// Copies and prefetches, all streams.
    pub memory_transfers: u64,
    /// Bytes moved, all streams.
    pub bytes_transferred: u64,
    /// Kernel launches, all streams.
    pub kernel_launches: u64,
    /// Host callbacks enqueued, all streams.
    pub callbacks: u64,
    /// Callbacks that panicked (caught), all streams.
    pub callback_panics: u64,
    /// Stream-ordered device memory allocated now, all streams.
    pub current_memory: u64,
    /// The largest single stream's peak (peaks of different streams need not
    /// coincide, so they are not added).
    pub peak_memory: u64,
    /// Operations whose GPU time was measured, all streams.
    pub timed_operations: u64,
    /// Their total GPU time.
    pub total_latency: Duration,
    /// `total_latency / timed_operations`; `None` before the first.
    pub average_latency: Option<Duration>,
    /// Streams that were idle when the metrics were taken (`cuStreamQuery`).
    pub idle_streams: usize,
}

impl StreamPool {
    /// Gather [`driver::Stream::metrics`] over the shared streams (the
    /// exclusive reserve is not included) and whether each is idle now.
    ///
    /// ```
    /// use cuda_streams_stream_pool::driver::Context;
    /// use cuda_streams_stream_pool::StreamPool;
    /// let ctx = Context::new(0).unwrap();
    /// let pool = StreamPool::new(&ctx, 3).unwrap();
    /// pool.get_stream().record_kernel_launch();
    /// pool.get_stream().record_memory_transfer(256);
    /// let m = pool.metrics();
    /// assert_eq!((m.streams.len(), m.kernel_launches, m.bytes_transferred), (3, 1, 256));
    /// assert_eq!(m.operations_count, 2);
    /// ```
    pub fn metrics(&self) -> PoolMetrics {
        let mut total = PoolMetrics::default();
        for stream in self.streams() {
            let m = stream.metrics();
            total.operations_count += m.operations_count;
            total.memory_transfers += m.memory_transfers;
            total.bytes_transferred += m.bytes_transferred;
            total.kernel_launches += m.kernel_launches;
            total.callbacks += m.callbacks;
            total.callback_panics += m.callback_panics;
            total.current_memory += m.current_memory;
            total.peak_memory = total.peak_memory.max(m.peak_memory);
            total.timed_operations += m.timed_operations;
            total.total_latency += m.total_latency;
            if stream.query().unwrap_or(false) {
                total.idle_streams += 1;
            }
            total.streams.push(m);
        }
        total.average_latency = (total.timed_operations > 0).then(|| {
            total.total_latency / u32::try_from(total.timed_operations).unwrap_or(u32::MAX)
        });
        total
    }
}

impl std::fmt::Display for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use driver::{format_bytes, format_duration};
        write!(
            f,
            "stream pool: {} stream(s) ({} idle), operations {}, kernel launches {}, \
             transfers {} ({}), callbacks {}",
            self.streams.len(),
            self.idle_streams,
            self.operations_count,
            self.kernel_launches,
            self.memory_transfers,
            format_bytes(self.bytes_transferred),
            self.callbacks,
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
        if let Some(average) = self.average_latency {
            write!(
                f,
                ", latency {} average over {} timed",
                format_duration(average),
                self.timed_operations
            )?;
        }
        for stream in &self.streams {
            write!(f, "\n  {stream}")?;
        }
        Ok(())
    }
}
