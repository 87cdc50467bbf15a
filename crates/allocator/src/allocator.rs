//! `StreamOrderedAllocator`: the public face of the allocator.

use crate::allocation::Allocation;
use crate::config::Backend;
use crate::dependency::StreamDependency;
use crate::driver_pool::open_pool;
use crate::error::{ALLOCATE_WHILE_CAPTURING, Error, Result};
use crate::last_slot;
use crate::observer::MemoryObserver;
use crate::shared::{Shared, Slot};
use crate::size::round_request;
use crate::stats::{AllocatorStats, Counters, StreamStats};
use dashmap::DashMap;
use driver::EventPool;
use driver::sys::CUmemPool_attribute as PoolAttr;
use driver::{Context, Stream};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Events the allocator's pool creates up front (for fences and uses on other
/// streams); it grows on demand.
const INITIAL_EVENTS: usize = 8;

/// A stream-ordered device memory allocator, shared by reference between
/// threads (`Send + Sync`; every method takes `&self`).
///
/// ```
/// use cuda_streams_allocator::{Backend, StreamOrderedAllocator};
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let allocator = StreamOrderedAllocator::new(&ctx)?; // Backend::Caching
///
/// let block = allocator.allocate_for_stream(&stream, 1 << 20)?;
/// block.copy_from_host(&vec![7u32; (1 << 20) / 4])?;
/// let first = block.device_ptr()?;
/// drop(block); // freed in stream order: reusable on this stream at once
///
/// let again = allocator.allocate_for_stream(&stream, 1 << 20)?;
/// assert_eq!(again.device_ptr()?, first);
/// let stats = allocator.stats();
/// assert_eq!((stats.driver_alloc_calls, stats.cache_hits), (1, 1));
/// # Ok(())
/// # }
/// ```
pub struct StreamOrderedAllocator {
    shared: Arc<Shared>,
}

impl StreamOrderedAllocator {
    /// A caching allocator ([`Backend::Caching`]) on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        Self::with_backend(ctx, Backend::Caching)
    }

    /// An allocator on `ctx` with the given backend. For
    /// [`Backend::DriverPool`] this sets the default pool's release threshold.
    pub fn with_backend(ctx: &Arc<Context>, backend: Backend) -> Result<Self> {
        let pool = match backend {
            Backend::Caching => None,
            Backend::DriverPool { release_threshold } => Some(open_pool(ctx, release_threshold)?),
        };
        let events = Arc::new(EventPool::new(ctx, INITIAL_EVENTS, 0)?);
        Ok(Self {
            shared: Arc::new(Shared {
                id: last_slot::next_allocator_id(),
                ctx: Arc::clone(ctx),
                backend,
                total_memory: ctx.info().total_memory,
                slots: DashMap::default(),
                retired: Mutex::default(),
                cache: Mutex::default(),
                events,
                counters: Counters::default(),
                pool,
                observers: Default::default(),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The backend chosen at construction.
    pub fn backend(&self) -> Backend {
        self.shared.backend
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.shared.ctx
    }

    /// Allocate `bytes` for use on `stream`.
    ///
    /// Zero bytes is [`Error::ZeroSize`]; more than the device's memory (or a
    /// size whose rounding overflows) is [`Error::TooLarge`]; neither changes
    /// anything. When the driver runs out, cached memory is given back
    /// (waiting for streams if need be) and the allocation retried once before
    /// [`Error::OutOfMemory`].
    pub fn allocate_for_stream(&self, stream: &Stream, bytes: usize) -> Result<Allocation> {
        if bytes == 0 {
            return Err(Error::ZeroSize {
                stream: stream.id(),
            });
        }
        // Captured, a stream-ordered allocation would become a node of the
        // graph (and its address a graph's): graphs allocate their memory
        // with `Capture::alloc`. A snapshot: a cache hit enqueues nothing,
        // and `cuMemAllocAsync` takes the stream's gate.
        stream.check_not_capturing(ALLOCATE_WHILE_CAPTURING)?;
        let too_large = || Error::TooLarge {
            requested: bytes,
            total: self.shared.total_memory,
            stream: stream.id(),
        };
        if bytes > self.shared.total_memory {
            return Err(too_large());
        }
        let rounded = round_request(bytes).ok_or_else(too_large)?;
        let slot = self.shared.slot(stream)?;
        let (ptr, block, id) = match self.shared.backend {
            Backend::Caching => self.shared.caching_allocate(&slot, bytes, rounded)?,
            Backend::DriverPool { .. } => {
                let (ptr, id) = self.shared.pool_allocate(&slot, bytes)?;
                (ptr, bytes, id)
            }
        };
        self.shared.observe_alloc(&slot, ptr, block);
        // SAFETY: the block's last owner's uses are ordered before `stream`'s
        // next work (the same stream, an event settled on this path, or a
        // stream-ordered free and allocation): the stream-order tracker may
        // forget them, so the hand-off is not reported as a race.
        unsafe { stream.context().forget_accesses(ptr, block) };
        Ok(Allocation {
            slot,
            ptr,
            size: bytes,
            block,
            id,
        })
    }

    /// Free every live allocation of `stream`, in stream order, as if each
    /// handle had been dropped. The handles become dead (see [`Allocation`]).
    /// Returns how many were freed.
    pub fn free_for_stream(&self, stream: &Stream) -> Result<usize> {
        self.shared.check_stream(stream)?;
        stream.check_not_capturing("StreamOrderedAllocator::free_for_stream")?;
        let Some(slot) = self.shared.existing_slot(stream) else {
            return Ok(0);
        };
        let mut st = slot.lock();
        let freed = match self.shared.backend {
            Backend::Caching => {
                let live = st.arena.live_blocks();
                let mut freed = 0;
                for &(ptr, id) in &live {
                    // A block with views is freed when its last view goes.
                    if let Some(pins) = st.arena.live_mut(ptr, id).map(|l| &mut l.pins)
                        && pins.views > 0
                    {
                        freed += usize::from(!std::mem::replace(&mut pins.doomed, true));
                        continue;
                    }
                    let before = st.counts.allocated;
                    self.shared.caching_free(&mut st, ptr, id);
                    self.shared.observe_free(&slot, &st, ptr, before);
                    freed += 1;
                }
                freed
            }
            Backend::DriverPool { .. } => {
                let live: Vec<(u64, u64, bool)> = st
                    .pool_live
                    .iter()
                    .map(|(&ptr, l)| (ptr, l.id, l.pins.doomed))
                    .collect();
                let mut freed = 0;
                for &(ptr, id, doomed) in &live {
                    if let Some(live) = st.pool_live.get_mut(&ptr)
                        && live.pins.views > 0
                    {
                        live.pins.doomed = true;
                        freed += usize::from(!doomed);
                        continue;
                    }
                    let before = st.counts.allocated;
                    self.shared.pool_free(&slot, &mut st, ptr, id);
                    self.shared.observe_free(&slot, &st, ptr, before);
                    freed += 1;
                }
                freed
            }
        };
        Ok(freed)
    }

    /// [`Allocation::record_stream`]: declare a use of `allocation` on `stream`.
    pub fn record_stream(&self, allocation: &Allocation, stream: &Stream) -> Result<()> {
        if !Arc::ptr_eq(&allocation.slot.shared, &self.shared) {
            return Err(Error::ForeignAllocation {
                ptr: allocation.ptr,
            });
        }
        allocation.record_stream(stream)
    }

    /// Make `stream`'s frees wait for `event`: until it completes, blocks freed
    /// on `stream` are not reused (caching) or their `cuMemFreeAsync` waits for
    /// it (driver pool). Use it when other streams' work behind `event` reads
    /// memory of `stream`'s. Dependencies that have completed when a free
    /// happens cost nothing but a query.
    pub fn add_stream_dependency(
        &self,
        stream: &Stream,
        event: impl Into<StreamDependency>,
    ) -> Result<()> {
        let dep = event.into();
        let found = dep.event().context().id();
        if found != self.shared.ctx.id() {
            return Err(Error::ContextMismatch {
                what: "the dependency event",
                expected: self.shared.ctx.id(),
                found,
            });
        }
        self.shared.slot(stream)?.lock().deps.push(dep);
        Ok(())
    }

    /// Whether every dependency of `stream` has completed (queries each event;
    /// `true` when there are none).
    pub fn dependencies_satisfied(&self, stream: &Stream) -> Result<bool> {
        let Some(slot) = self.shared.existing_slot(stream) else {
            return Ok(true);
        };
        let deps = slot.lock().deps.clone();
        for dep in deps {
            if !dep.event().query()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Forget `stream`'s dependencies (frees already made keep waiting for
    /// theirs). Returns how many there were.
    pub fn clear_dependencies(&self, stream: &Stream) -> usize {
        self.shared
            .existing_slot(stream)
            .map(|slot| std::mem::take(&mut slot.lock().deps).len())
            .unwrap_or(0)
    }

    /// Tell `observer` about every allocation and free from now on (a
    /// profiler's memory timeline). Without observers this costs one atomic
    /// load per allocation and free.
    ///
    /// ```
    /// use cuda_streams_allocator::{MemoryEvent, MemoryEventKind, MemoryObserver, StreamOrderedAllocator};
    /// use cuda_streams_allocator::driver::{Context, Stream};
    /// use std::sync::{Arc, Mutex};
    ///
    /// #[derive(Default)]
    /// struct Log(Mutex<Vec<MemoryEvent>>);
    /// impl MemoryObserver for Log {
    ///     fn on_memory_event(&self, event: &MemoryEvent) {
    ///         self.0.lock().unwrap().push(*event);
    ///     }
    /// }
    /// # fn main() -> cuda_streams_allocator::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let allocator = StreamOrderedAllocator::new(&ctx)?;
    /// let log = Arc::new(Log::default());
    /// allocator.add_observer(log.clone());
    /// drop(allocator.allocate_for_stream(&stream, 1000)?);
    /// let events = log.0.lock().unwrap().clone();
    /// assert_eq!(events.len(), 2);
    /// assert_eq!((events[0].kind, events[0].bytes), (MemoryEventKind::Alloc, 1024));
    /// assert_eq!((events[1].kind, events[1].allocated_bytes), (MemoryEventKind::Free, 0));
    /// assert!(allocator.remove_observer(&(log.clone() as Arc<dyn MemoryObserver>)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_observer(&self, observer: Arc<dyn MemoryObserver>) {
        self.shared.observers.add(observer);
    }

    /// Stop telling `observer` (the same `Arc`); whether it was there.
    pub fn remove_observer(&self, observer: &Arc<dyn MemoryObserver>) -> bool {
        self.shared.observers.remove(observer)
    }

    /// Give cached memory back to the driver until at most `keep_bytes` remain
    /// cached (reserved but not allocated), without waiting for any stream:
    /// only segments that are fully free and proven unused (their stream idle
    /// or a fence passed) go. Returns the bytes given back. For the driver
    /// pool this is `cuMemPoolTrimTo(keep_bytes)`.
    pub fn trim(&self, keep_bytes: usize) -> Result<usize> {
        match self.shared.backend {
            Backend::Caching => Ok(self.shared.release_cache(false, keep_bytes)),
            Backend::DriverPool { .. } => self.shared.pool_release(false, keep_bytes),
        }
    }

    /// Reset the peaks to the current values (for the driver pool, also the
    /// pool's high watermarks).
    pub fn reset_peaks(&self) {
        self.shared.counters.reset_peaks();
        if self.shared.pool.is_some() {
            self.shared.reset_pool_peaks();
        }
    }

    /// One stream's figures, if the allocator has seen the stream.
    pub fn stream_stats(&self, stream: &Stream) -> Option<StreamStats> {
        self.shared
            .existing_slot(stream)
            .map(|slot| stream_stats(&slot))
    }

    /// A snapshot of every figure. Locks each stream briefly in turn, so under
    /// concurrent use the totals and the per-stream figures may be from
    /// slightly different moments.
    pub fn stats(&self) -> AllocatorStats {
        let shared = &self.shared;
        let c = &shared.counters;
        let mut per_stream: Vec<StreamStats> = shared
            .all_slots()
            .iter()
            .map(|slot| stream_stats(slot))
            .collect();
        per_stream.sort_by_key(|s| s.stream_id);
        let (shared_cache_segments, cache_largest, cache_bytes) = {
            let cache = shared.lock_cache();
            let largest = cache.iter().map(|&(_, size, _)| size).max().unwrap_or(0);
            let bytes: usize = cache.iter().map(|&(_, size, _)| size).sum();
            (cache.len(), largest, bytes)
        };
        let stream_largest = per_stream.iter().map(|s| s.largest_free).max().unwrap_or(0);
        let largest_free_block = stream_largest.max(cache_largest);
        let free_bytes: usize =
            per_stream.iter().map(|s| s.free_bytes).sum::<usize>() + cache_bytes;
        let fragmentation = if free_bytes == 0 {
            0.0
        } else {
            1.0 - largest_free_block as f64 / free_bytes as f64
        };
        let allocated = c.allocated.load(Ordering::Relaxed);
        let (reserved, peak_reserved, cached) = match shared.backend {
            Backend::Caching => {
                let reserved = c.reserved.load(Ordering::Relaxed);
                (
                    reserved,
                    c.peak_reserved.load(Ordering::Relaxed),
                    reserved.saturating_sub(allocated),
                )
            }
            Backend::DriverPool { .. } => {
                let reserved =
                    shared.pool_attribute(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
                let used = shared.pool_attribute(PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
                (
                    reserved,
                    shared.pool_attribute(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
                    reserved.saturating_sub(used),
                )
            }
        };
        AllocatorStats {
            backend: shared.backend,
            allocated_bytes: allocated,
            peak_allocated_bytes: c.peak_allocated.load(Ordering::Relaxed),
            requested_bytes: per_stream.iter().map(|s| s.requested_bytes).sum(),
            reserved_bytes: reserved,
            peak_reserved_bytes: peak_reserved,
            cached_bytes: cached,
            segments: per_stream.iter().map(|s| s.segments).sum::<usize>() + shared_cache_segments,
            shared_cache_segments,
            largest_free_block,
            fragmentation,
            live_allocations: per_stream.iter().map(|s| s.live_allocations).sum(),
            driver_alloc_calls: Counters::get(&c.driver_allocs),
            driver_free_calls: Counters::get(&c.driver_frees),
            cache_hits: per_stream.iter().map(|s| s.cache_hits).sum(),
            cache_misses: per_stream.iter().map(|s| s.cache_misses).sum(),
            cross_stream_handoffs: Counters::get(&c.handoffs),
            oom_recoveries: Counters::get(&c.oom_recoveries),
            per_stream,
        }
    }
}

fn stream_stats(slot: &Slot) -> StreamStats {
    let mut st = slot.lock();
    // Report free memory as it really is, merged.
    st.arena.coalesce();
    StreamStats {
        stream_id: slot.stream.id(),
        allocated_bytes: st.counts.allocated,
        requested_bytes: st.counts.requested,
        live_allocations: st.counts.live,
        reserved_bytes: st.arena.reserved,
        free_bytes: st.arena.free_bytes,
        largest_free: st.arena.largest_free(),
        segments: st.arena.segment_count(),
        pending_frees: st.pending.len(),
        cache_hits: st.counts.hits,
        cache_misses: st.counts.misses,
        dependencies: st.deps.len(),
    }
}

impl Drop for StreamOrderedAllocator {
    /// Break the cycle between the shared state and its slots: each slot now
    /// lives only as long as allocations of its stream do.
    fn drop(&mut self) {
        let slots = self.shared.all_slots();
        self.shared.slots.clear();
        drop(slots);
    }
}

impl fmt::Debug for StreamOrderedAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrderedAllocator")
            .field("backend", &self.shared.backend)
            .field("streams", &self.shared.slots.len())
            .finish()
    }
}
