//! A per-thread memo of the last slot a thread allocated on, so that repeated
//! allocations on one stream skip the slot map (a shard lock, its release and
//! a reference count: three atomic operations of the hit path's dozen).
//!
//! The memo is keyed by the allocator's process-unique id and the stream's id
//! (also unique) and holds a `Weak`, so it never keeps an allocator's memory
//! alive after the allocator and its allocations are gone. While the allocator
//! lives, its map keeps the slot, so the upgrade succeeds and the slot is the
//! map's.
//!
//! [`Shared::slot`], the lookup every allocation makes, is here with the memo
//! it asks first; the slot map it falls back on is the shared state's.

use crate::error::Result;
use crate::shared::{Shared, Slot};
use driver::Stream;
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
fn get(allocator: u64, stream: u64) -> Option<Arc<Slot>> {
    LAST.try_with(|last| match &*last.borrow() {
        Some(last) if last.allocator == allocator && last.stream == stream => last.slot.upgrade(),
        _ => None,
    })
    .ok()
    .flatten()
}

/// Remember `slot` as this thread's last.
fn set(allocator: u64, stream: u64, slot: &Arc<Slot>) {
    let last = Last {
        allocator,
        stream,
        slot: Arc::downgrade(slot),
    };
    // During thread teardown the memo is gone; the map serves instead.
    let _ = LAST.try_with(|cell| cell.replace(Some(last)));
}

impl Shared {
    /// The slot of `stream`, created on first use.
    #[inline]
    pub(crate) fn slot(self: &Arc<Self>, stream: &Stream) -> Result<Arc<Slot>> {
        if let Some(slot) = get(self.id, stream.id()) {
            return Ok(slot);
        }
        let slot = self.map_slot(stream)?;
        set(self.id, stream.id(), &slot);
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use crate::{SMALL_SEGMENT, StreamOrderedAllocator};
    use driver::{Context, Stream};
    use std::sync::Mutex;

    /// These tests read the device's free memory; one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn the_memo_keeps_allocators_and_streams_apart() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let ctx = Context::new(0).unwrap();
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let x = StreamOrderedAllocator::new(&ctx).unwrap();
        let y = StreamOrderedAllocator::new(&ctx).unwrap();
        let mut live = Vec::new();
        for _ in 0..3 {
            for (allocator, other, stream) in
                [(&x, &y, &s1), (&y, &x, &s1), (&x, &y, &s2), (&y, &x, &s2)]
            {
                let a = allocator.allocate_for_stream(stream, 4096).unwrap();
                assert_eq!(a.stream_id(), stream.id());
                // Refused when the allocation is another allocator's.
                allocator.record_stream(&a, stream).unwrap();
                assert!(other.record_stream(&a, stream).is_err());
                live.push(a);
            }
        }
        for allocator in [&x, &y] {
            let stats = allocator.stats();
            assert_eq!(stats.live_allocations, 6);
            let per_stream: Vec<_> = stats
                .per_stream
                .iter()
                .map(|s| s.live_allocations)
                .collect();
            assert_eq!(per_stream, [3, 3]);
        }
        drop(live);
        drop(x);
        // A new allocator never meets the dropped one's slot.
        let z = StreamOrderedAllocator::new(&ctx).unwrap();
        let a = z.allocate_for_stream(&s1, 4096).unwrap();
        z.record_stream(&a, &s1).unwrap();
        assert_eq!(z.stats().live_allocations, 1);
        assert_eq!(y.stats().live_allocations, 0);
    }

    #[test]
    fn allocations_outlive_the_allocator_then_give_its_memory_back() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let ctx = Context::new(0).unwrap();
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let free_before = ctx.memory_info().unwrap().0;
        let allocator = StreamOrderedAllocator::new(&ctx).unwrap();
        let a = allocator.allocate_for_stream(&s1, 1 << 20).unwrap();
        let b = allocator.allocate_for_stream(&s2, 1 << 20).unwrap();
        drop(allocator);
        a.memset_u32_async(0x1234_5678).unwrap();
        let mut host = vec![0u32; (1 << 20) / 4];
        a.copy_to_host(&mut host).unwrap();
        assert!(host.iter().all(|&word| word == 0x1234_5678));
        drop(a);
        let held = ctx.memory_info().unwrap().0;
        drop(b);
        let after = ctx.memory_info().unwrap().0;
        if ctx.is_gpu() {
            eprintln!("skipped on the GPU: exact free-memory figures (other users of the device)");
            return;
        }
        assert!(
            held + 2 * SMALL_SEGMENT <= free_before,
            "both segments are kept while an allocation lives"
        );
        assert_eq!(after, free_before, "every segment is given back at the end");
    }
}
