//! Statistics: live atomics for the process-wide figures, snapshots for users.

use crate::config::Backend;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One stream's figures, from [`crate::StreamOrderedAllocator::stream_stats`]
/// or [`AllocatorStats::per_stream`].
///
/// ```
/// use cuda_streams_allocator::{SMALL_SEGMENT, StreamOrderedAllocator};
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// let _block = allocator.allocate_for_stream(&stream, 1000)?;
/// let stats = allocator.stream_stats(&stream).expect("the allocator has seen the stream");
/// assert_eq!(stats.stream_id, stream.id());
/// assert_eq!((stats.requested_bytes, stats.allocated_bytes), (1000, 1024)); // 512-byte granules
/// assert_eq!((stats.live_allocations, stats.segments), (1, 1));
/// assert_eq!(stats.reserved_bytes, SMALL_SEGMENT); // small requests share 2 MiB segments
/// assert_eq!((stats.cache_hits, stats.cache_misses), (0, 1));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// The stream's id.
    pub stream_id: u64,
    /// Bytes of its live blocks (rounded sizes).
    pub allocated_bytes: usize,
    /// Bytes its live allocations asked for.
    pub requested_bytes: usize,
    /// Its live allocations.
    pub live_allocations: usize,
    /// Bytes of the segments it holds (caching backend; 0 for the driver pool).
    pub reserved_bytes: usize,
    /// Free bytes in those segments, reusable by this stream at once.
    pub free_bytes: usize,
    /// The largest free block in its lists.
    pub largest_free: usize,
    /// Segments it holds.
    pub segments: usize,
    /// Freed blocks waiting for events (other streams' uses, dependencies)
    /// before they can be reused.
    pub pending_frees: usize,
    /// Allocations served from its own free lists.
    pub cache_hits: u64,
    /// Allocations that had to look further (shared cache, other streams, driver).
    pub cache_misses: u64,
    /// Dependencies registered with `add_stream_dependency`.
    pub dependencies: usize,
}

/// A snapshot of the whole allocator, from
/// [`crate::StreamOrderedAllocator::stats`].
///
/// ```
/// use cuda_streams_allocator::{Backend, SMALL_SEGMENT, StreamOrderedAllocator};
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// drop(allocator.allocate_for_stream(&stream, 4096)?);
/// let stats = allocator.stats();
/// assert_eq!(stats.backend, Backend::Caching);
/// assert_eq!((stats.allocated_bytes, stats.peak_allocated_bytes), (0, 4096));
/// // The segment stays cached for the next allocation.
/// assert_eq!(stats.reserved_bytes, SMALL_SEGMENT);
/// assert_eq!(stats.cached_bytes, stats.reserved_bytes);
/// assert_eq!((stats.driver_alloc_calls, stats.driver_free_calls), (1, 0));
/// assert_eq!(stats.per_stream[0].stream_id, stream.id());
/// // A summary, then one line per stream:
/// let text = stats.to_string();
/// assert!(text.starts_with("allocator (caching): 0 B in use (peak 4.00 KiB) in 0 allocation(s), \
///     2.00 MiB reserved (peak 2.00 MiB), 2.00 MiB cached"), "{text}");
/// let stream_line = format!("\n  stream {}: 0 B in use in 0 allocation(s), 2.00 MiB reserved", stream.id());
/// assert!(text.contains(&stream_line), "{text}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AllocatorStats {
    /// The backend.
    pub backend: Backend,
    /// Bytes of live blocks (rounded sizes).
    pub allocated_bytes: usize,
    /// The most `allocated_bytes` has been (since construction or `reset_peaks`).
    pub peak_allocated_bytes: usize,
    /// Bytes live allocations asked for.
    pub requested_bytes: usize,
    /// Bytes held from the driver: segments (caching), or the pool's
    /// reservation (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, driver pool).
    pub reserved_bytes: usize,
    /// The most `reserved_bytes` has been (`RESERVED_MEM_HIGH` for the pool).
    pub peak_reserved_bytes: usize,
    /// Reserved but not allocated.
    pub cached_bytes: usize,
    /// Segments held (caching backend).
    pub segments: usize,
    /// Fully free segments proven unused, waiting in the shared cache.
    pub shared_cache_segments: usize,
    /// The largest free block in any stream's lists or the shared cache.
    pub largest_free_block: usize,
    /// `1 - largest free block / free bytes` (0 when nothing is free): how
    /// badly free memory is scattered.
    pub fragmentation: f64,
    /// Live allocations.
    pub live_allocations: usize,
    /// `cuMemAlloc` / `cuMemAllocAsync` calls.
    pub driver_alloc_calls: u64,
    /// `cuMemFree` / `cuMemFreeAsync` calls.
    pub driver_free_calls: u64,
    /// Allocations served from the stream's own free lists (caching backend).
    pub cache_hits: u64,
    /// Allocations that were not.
    pub cache_misses: u64,
    /// Segments handed from one stream to the shared cache after an event or
    /// an idle stream proved the old stream had passed their frees.
    pub cross_stream_handoffs: u64,
    /// Out-of-memory failures recovered from by releasing the cache and retrying.
    pub oom_recoveries: u64,
    /// Per stream, by stream id.
    pub per_stream: Vec<StreamStats>,
}

/// The process-wide figures, updated without locks.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) allocated: AtomicUsize,
    pub(crate) peak_allocated: AtomicUsize,
    pub(crate) reserved: AtomicUsize,
    pub(crate) peak_reserved: AtomicUsize,
    pub(crate) driver_allocs: AtomicU64,
    pub(crate) driver_frees: AtomicU64,
    pub(crate) handoffs: AtomicU64,
    pub(crate) oom_recoveries: AtomicU64,
}

fn raise(peak: &AtomicUsize, now: usize) {
    if now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

impl Counters {
    /// Only the allocated total is process-wide (its peak needs it); request
    /// sizes and counts are summed from the streams when asked for.
    #[inline]
    pub(crate) fn allocated(&self, bytes: usize) {
        let now = self.allocated.fetch_add(bytes, Ordering::Relaxed) + bytes;
        raise(&self.peak_allocated, now);
    }

    #[inline]
    pub(crate) fn freed(&self, bytes: usize) {
        self.allocated.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub(crate) fn reserved(&self, bytes: usize) {
        let now = self.reserved.fetch_add(bytes, Ordering::Relaxed) + bytes;
        raise(&self.peak_reserved, now);
        self.driver_allocs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn released(&self, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        self.driver_frees.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn reset_peaks(&self) {
        self.peak_allocated
            .store(self.allocated.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak_reserved
            .store(self.reserved.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// One stream's running figures, kept under its lock.
#[derive(Default)]
pub(crate) struct StreamCounts {
    pub(crate) allocated: usize,
    pub(crate) requested: usize,
    pub(crate) live: usize,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl StreamCounts {
    #[inline]
    pub(crate) fn add(&mut self, bytes: usize, requested: usize) {
        self.allocated += bytes;
        self.requested += requested;
        self.live += 1;
    }

    #[inline]
    pub(crate) fn sub(&mut self, bytes: usize, requested: usize) {
        self.allocated -= bytes;
        self.requested -= requested;
        self.live -= 1;
    }
}

impl std::fmt::Display for StreamStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use driver::format_bytes as b;
        write!(
            f,
            "stream {}: {} in use in {} allocation(s), {} reserved in {} segment(s) \
             ({} free, largest {}), {} pending free(s), cache {} hit(s) / {} miss(es)",
            self.stream_id,
            b(self.allocated_bytes as u64),
            self.live_allocations,
            b(self.reserved_bytes as u64),
            self.segments,
            b(self.free_bytes as u64),
            b(self.largest_free as u64),
            self.pending_frees,
            self.cache_hits,
            self.cache_misses,
        )
    }
}

impl std::fmt::Display for AllocatorStats {
    /// A summary line, a line of driver and cache counts, then one line
    /// per stream.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use driver::format_bytes as b;
        write!(
            f,
            "allocator ({}): {} in use (peak {}) in {} allocation(s), {} reserved (peak {}), \
             {} cached, fragmentation {:.2}",
            self.backend,
            b(self.allocated_bytes as u64),
            b(self.peak_allocated_bytes as u64),
            self.live_allocations,
            b(self.reserved_bytes as u64),
            b(self.peak_reserved_bytes as u64),
            b(self.cached_bytes as u64),
            self.fragmentation,
        )?;
        write!(
            f,
            "\n  driver calls: {} alloc, {} free; cache {} hit(s) / {} miss(es); \
             {} cross-stream hand-off(s); {} out-of-memory recover(ies)",
            self.driver_alloc_calls,
            self.driver_free_calls,
            self.cache_hits,
            self.cache_misses,
            self.cross_stream_handoffs,
            self.oom_recoveries,
        )?;
        for stream in &self.per_stream {
            write!(f, "\n  {stream}")?;
        }
        Ok(())
    }
}
