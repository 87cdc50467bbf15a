//! Telling observers (a profiler's memory timeline) about every allocation
//! and free, with the allocator's totals right after it.

use crate::allocator::StreamOrderedAllocator;
use crate::config::Backend;
use crate::shared::{Shared, Slot, SlotState};
use driver::sys::CUmemPool_attribute as PoolAttr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Whether a [`MemoryEvent`] is an allocation or a free.
///
/// Not exhaustive: other events (a trim, an out-of-memory recovery) may be
/// reported later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryEventKind {
    /// [`StreamOrderedAllocator::allocate_for_stream`] returned a block.
    Alloc,
    /// A block was freed (its handle dropped, or `free_for_stream`): it is
    /// free in stream order, or pending until other streams' uses complete.
    Free,
}

/// One allocation or free, with the figures right after it: what a memory
/// timeline plots ([`MemoryObserver`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryEvent {
    /// Allocation or free.
    pub kind: MemoryEventKind,
    /// The device ordinal of the allocator's context.
    pub device: i32,
    /// The stream the block belongs to.
    pub stream_id: u64,
    /// The block's device address.
    pub address: u64,
    /// The block's size (the request rounded up).
    pub bytes: usize,
    /// Bytes live on the stream afterwards (block sizes).
    pub stream_allocated_bytes: usize,
    /// Bytes the stream holds afterwards: its segments (caching backend), or
    /// its live bytes (driver pool, which does not split its reservation by
    /// stream).
    pub stream_reserved_bytes: usize,
    /// Bytes live in the allocator afterwards.
    pub allocated_bytes: usize,
    /// Bytes the allocator holds from the driver afterwards (segments, or the
    /// pool's reservation).
    pub reserved_bytes: usize,
}

/// Told about every allocation and free of a [`StreamOrderedAllocator`]
/// ([`StreamOrderedAllocator::add_observer`]).
///
/// Called on the thread that allocates or frees, with that stream's
/// allocator lock held: it must be quick, and must not call the allocator.
/// A panic is caught and logged.
pub trait MemoryObserver: Send + Sync {
    /// One allocation or free.
    fn on_memory_event(&self, event: &MemoryEvent);
}

/// The observers of one allocator.
#[derive(Default)]
pub(crate) struct Observers {
    /// Whether `list` may be non-empty: the only cost without observers.
    any: AtomicBool,
    list: RwLock<Vec<Arc<dyn MemoryObserver>>>,
}

impl Observers {
    #[inline]
    fn watched(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    fn notify(&self, event: &MemoryEvent) {
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        for observer in list.iter() {
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                observer.on_memory_event(event)
            }));
            if called.is_err() {
                tracing::warn!(
                    "a memory observer panicked on stream {}'s {:?} (caught)",
                    event.stream_id,
                    event.kind
                );
            }
        }
    }
}

impl Shared {
    /// After an allocation on `slot` (locks it, only when observed).
    #[inline]
    pub(crate) fn observe_alloc(&self, slot: &Slot, address: u64, bytes: usize) {
        if self.observers.watched() {
            let st = slot.lock();
            self.observe(slot, &st, MemoryEventKind::Alloc, address, bytes);
        }
    }

    /// After a free attempt on `slot`; `before` is the stream's live bytes
    /// before it (a dead handle frees nothing and reports nothing).
    #[inline]
    pub(crate) fn observe_free(&self, slot: &Slot, st: &SlotState, address: u64, before: usize) {
        if self.observers.watched() && st.counts.allocated < before {
            let bytes = before - st.counts.allocated;
            self.observe(slot, st, MemoryEventKind::Free, address, bytes);
        }
    }

    #[cold]
    fn observe(
        &self,
        slot: &Slot,
        st: &SlotState,
        kind: MemoryEventKind,
        address: u64,
        bytes: usize,
    ) {
        let allocated = self.counters.allocated.load(Ordering::Relaxed);
        let (stream_reserved, reserved) = match self.backend {
            Backend::Caching => (
                st.arena.reserved,
                self.counters.reserved.load(Ordering::Relaxed),
            ),
            Backend::DriverPool { .. } => (
                st.counts.allocated,
                self.pool_attribute(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            ),
        };
        self.observers.notify(&MemoryEvent {
            kind,
            device: self.ctx.ordinal(),
            stream_id: slot.stream.id(),
            address,
            bytes,
            stream_allocated_bytes: st.counts.allocated,
            stream_reserved_bytes: stream_reserved,
            allocated_bytes: allocated,
            reserved_bytes: reserved,
        });
    }
}

impl StreamOrderedAllocator {
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
        let observers = &self.shared().observers;
        let mut list = observers.list.write().unwrap_or_else(|p| p.into_inner());
        list.push(observer);
        observers.any.store(true, Ordering::Release);
    }

    /// Stop telling `observer` (the same `Arc`); whether it was there.
    pub fn remove_observer(&self, observer: &Arc<dyn MemoryObserver>) -> bool {
        let observers = &self.shared().observers;
        let mut list = observers.list.write().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|o| !Arc::ptr_eq(o, observer));
        observers.any.store(!list.is_empty(), Ordering::Release);
        list.len() < before
    }
}
