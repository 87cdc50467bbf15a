//! A per-thread memo of the last slot a thread allocated on, so that repeated
//! allocations on one stream skip the slot map (a shard lock, its release and
//! a reference count: three atomic operations of the hit path's dozen).
//!
//! The memo is keyed by the allocator's process-unique id and the stream's id
//! (also unique) and holds a `Weak`, so it never keeps an allocator's memory
//! alive after the allocator and its allocations are gone. While the allocator
//! lives, its map keeps the slot, so the upgrade succeeds and the slot is the
//! map's.

use crate::shared::Slot;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

struct Last {
    allocator: u64,
    stream: u64,
    slot: Weak<Slot>,
}

thread_local! {
    static LAST: RefCell<Option<Last>> = const { RefCell::new(None) };
}

/// A fresh allocator id (never 0, never reused).
pub(crate) fn next_allocator_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The slot this thread last used, if it is `stream`'s in `allocator`.
#[inline]
pub(crate) fn get(allocator: u64, stream: u64) -> Option<Arc<Slot>> {
    LAST.try_with(|last| match &*last.borrow() {
        Some(last) if last.allocator == allocator && last.stream == stream => last.slot.upgrade(),
        _ => None,
    })
    .ok()
    .flatten()
}

/// Remember `slot` as this thread's last.
pub(crate) fn set(allocator: u64, stream: u64, slot: &Arc<Slot>) {
    let last = Last {
        allocator,
        stream,
        slot: Arc::downgrade(slot),
    };
    // During thread teardown the memo is gone; the map serves instead.
    let _ = LAST.try_with(|cell| cell.replace(Some(last)));
}
