//! Observers see every allocation and free with the allocator's figures
//! right after it, on both backends; a snapshot lists what `stats` counts.

mod common;

use common::{backends, ctx};
use cuda_streams_allocator::driver::Stream;
use cuda_streams_allocator::{
    Backend, BlockState, MemoryEvent, MemoryEventKind, MemoryObserver, StreamOrderedAllocator,
};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Log(Mutex<Vec<MemoryEvent>>);

impl MemoryObserver for Log {
    fn on_memory_event(&self, event: &MemoryEvent) {
        self.0.lock().unwrap().push(*event);
    }
}

#[test]
fn observers_see_every_allocation_and_free_with_the_totals() {
    let ctx = ctx();
    for backend in backends(&ctx) {
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let allocator = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let unseen = allocator.allocate_for_stream(&a, 4096).unwrap();
        let log = Arc::new(Log::default());
        allocator.add_observer(log.clone());

        let sizes = [1000usize, 3 << 20, 512, 70_000];
        let mut live: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let stream = if i % 2 == 0 { &a } else { &b };
                allocator.allocate_for_stream(stream, n).unwrap()
            })
            .collect();
        let after_allocs = allocator.stats();
        drop(live.remove(1)); // a free on b
        let freed = allocator.free_for_stream(&a).unwrap(); // two on a, and `unseen`
        assert_eq!(freed, 3);
        drop(live);
        drop(unseen); // already dead: nothing more to report

        let events = log.0.lock().unwrap().clone();
        let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
        use MemoryEventKind::{Alloc, Free};
        assert_eq!(
            kinds,
            [Alloc, Alloc, Alloc, Alloc, Free, Free, Free, Free, Free],
            "{backend:?}"
        );
        let allocs = &events[..4];
        for (event, &n) in allocs.iter().zip(&sizes) {
            assert!(event.bytes >= n, "{backend:?}: {event:?}");
            assert_eq!(event.device, ctx.ordinal());
        }
        assert_eq!(
            allocs[3].allocated_bytes, after_allocs.allocated_bytes,
            "{backend:?}"
        );
        // Every figure after the last free: nothing live.
        let last = events.last().unwrap();
        assert_eq!(last.allocated_bytes, 0, "{backend:?}");
        assert!(
            events
                .iter()
                .all(|e| e.stream_allocated_bytes <= e.allocated_bytes)
        );
        if backend == Backend::Caching {
            assert!(
                events.iter().all(|e| e.reserved_bytes >= e.allocated_bytes
                    && e.stream_reserved_bytes >= e.stream_allocated_bytes),
                "{events:?}"
            );
        }
        // Frees reported by stream, summing to what was allocated.
        let freed_bytes: usize = events[4..].iter().map(|e| e.bytes).sum();
        let alloc_bytes: usize = allocs.iter().map(|e| e.bytes).sum();
        assert_eq!(freed_bytes, alloc_bytes + 4096usize.next_multiple_of(512));
        assert!(allocator.remove_observer(&(log.clone() as Arc<dyn MemoryObserver>)));
        drop(allocator.allocate_for_stream(&a, 64).unwrap());
        assert_eq!(log.0.lock().unwrap().len(), events.len());
    }
}

#[test]
fn a_panicking_observer_is_caught() {
    struct Panics;
    impl MemoryObserver for Panics {
        fn on_memory_event(&self, _: &MemoryEvent) {
            panic!("observer bug");
        }
    }
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let allocator = StreamOrderedAllocator::new(&ctx).unwrap();
    allocator.add_observer(Arc::new(Panics));
    let block = allocator.allocate_for_stream(&stream, 100).unwrap();
    drop(block);
    assert_eq!(allocator.stats().allocated_bytes, 0);
    assert_eq!(allocator.stats().live_allocations, 0);
}

#[test]
fn a_snapshot_lists_what_stats_count() {
    let ctx = ctx();
    for backend in backends(&ctx) {
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let allocator = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let small = allocator.allocate_for_stream(&a, 3000).unwrap();
        let large = allocator.allocate_for_stream(&b, 5 << 20).unwrap();
        large.record_stream(&a).unwrap();
        let freed_later = allocator.allocate_for_stream(&a, 1 << 20).unwrap();
        drop(freed_later);

        let snapshot = allocator.snapshot();
        let stats = allocator.stats();
        assert_eq!(snapshot.backend, backend);
        assert_eq!(
            snapshot.allocated_bytes, stats.allocated_bytes,
            "{backend:?}"
        );
        assert_eq!(snapshot.streams.len(), 2);
        let live: Vec<_> = snapshot
            .blocks()
            .filter(|(_, b)| b.state == BlockState::Live)
            .collect();
        assert_eq!(live.len(), 2, "{backend:?}: {snapshot:?}");
        let (on_b, block_b) = live
            .iter()
            .find(|(_, b)| b.address == large.device_ptr().unwrap())
            .unwrap();
        assert_eq!(*on_b, b.id());
        assert_eq!(block_b.used_on, vec![a.id()]);
        let (on_a, block_a) = live
            .iter()
            .find(|(_, b)| b.address == small.device_ptr().unwrap())
            .unwrap();
        assert_eq!((*on_a, block_a.requested), (a.id(), 3000));
        for stream in &snapshot.streams {
            let per = allocator
                .stats()
                .per_stream
                .into_iter()
                .find(|s| s.stream_id == stream.stream_id)
                .unwrap();
            assert_eq!(stream.allocated_bytes, per.allocated_bytes);
            if backend == Backend::Caching {
                let segments: usize = stream.segments.iter().map(|s| s.size).sum();
                assert_eq!(segments, per.reserved_bytes);
                for segment in &stream.segments {
                    let blocks: usize = segment.blocks.iter().map(|b| b.size).sum();
                    assert_eq!(blocks, segment.size, "{segment:?}");
                }
            } else {
                assert!(stream.segments.is_empty());
            }
        }
        drop((small, large));
        // The block used on `a` waits for it.
        let pending: usize = allocator
            .snapshot()
            .streams
            .iter()
            .map(|s| s.pending_frees.len())
            .sum();
        assert_eq!(
            pending,
            usize::from(backend == Backend::Caching),
            "{backend:?}"
        );
    }
}
