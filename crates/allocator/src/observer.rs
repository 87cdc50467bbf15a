//! Observers of an allocator's memory (a profiler's memory timeline): the
//! event they are told about every allocation and free, and the list one
//! allocator keeps of them. `memory_events.rs` builds the events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Whether a [`MemoryEvent`] is an allocation or a free.
///
/// Not exhaustive: other events (a trim, an out-of-memory recovery) may be
/// reported later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryEventKind {
    /// [`StreamOrderedAllocator::allocate_for_stream`](crate::StreamOrderedAllocator::allocate_for_stream)
    /// returned a block.
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

/// Told about every allocation and free of a
/// [`StreamOrderedAllocator`](crate::StreamOrderedAllocator)
/// ([`StreamOrderedAllocator::add_observer`](crate::StreamOrderedAllocator::add_observer)).
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
    /// Whether anyone may be listening: one atomic load.
    #[inline]
    pub(crate) fn watched(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Tell `observer` too, from the next event on.
    pub(crate) fn add(&self, observer: Arc<dyn MemoryObserver>) {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        list.push(observer);
        self.any.store(true, Ordering::Release);
    }

    /// Remove `observer` (the same `Arc`); whether it was there.
    pub(crate) fn remove(&self, observer: &Arc<dyn MemoryObserver>) -> bool {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|o| !Arc::ptr_eq(o, observer));
        self.any.store(!list.is_empty(), Ordering::Release);
        list.len() < before
    }

    /// Tell every observer, catching (and logging) a panic.
    pub(crate) fn notify(&self, event: &MemoryEvent) {
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
