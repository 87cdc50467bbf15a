//! Stream-ordered reuse, proven with data, on both backends; per-stream reuse
//! without driver calls; dead handles; dependencies; statistics; bad sizes.

mod common;

use common::{Kernels, XorShift, backends, copy_out, ctx};
use cuda_streams_allocator::driver::{DeviceBuffer, Event, Stream};
use cuda_streams_allocator::{Backend, Error, SMALL_SEGMENT, StreamOrderedAllocator};
use std::sync::Arc;
use std::time::Duration;

const SLOW: Duration = Duration::from_millis(150);

/// Whether `stream` still has work queued. Checked *after* a step, it shows
/// the stream was busy throughout that step. On the GPU another test's
/// `cuMemFree` can synchronise the whole device and stall this thread until a
/// "slow" kernel has finished; the early-reuse assertions are then skipped
/// (with a line saying so) and the data checks still run.
fn still_busy(stream: &Stream) -> bool {
    let busy = !stream.query().unwrap();
    if !busy {
        eprintln!(
            "stream {} finished early (a device-wide sync elsewhere): pointer check skipped",
            stream.id()
        );
    }
    busy
}

/// A slow kernel on A reads a block after A's fill; A frees it while that is
/// still queued; B allocates the same size at once and writes it. Had B been
/// given A's block, A's read-out (after B's write) would hold B's value.
#[test]
fn cross_stream_free_is_never_reused_early() {
    let ctx = ctx();
    let k = Kernels::load(&ctx);
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let n = (1 << 20) / 4;
        let (out_a, out_b) = (
            DeviceBuffer::<u32>::new(&ctx, n).unwrap(),
            DeviceBuffer::<u32>::new(&ctx, n).unwrap(),
        );
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let (value_a, value_b) = (rng.next_u64() as u32 | 1, rng.next_u64() as u32 | 2);

        let mut x = alloc.allocate_for_stream(&a, n * 4).unwrap();
        let x_ptr = x.device_ptr().unwrap();
        k.fill(&a, &mut x, value_a);
        k.spin(&a, SLOW);
        copy_out(&a, &x, &out_a);
        drop(x); // stream-ordered: A still has the spin and the read queued

        let mut y = alloc.allocate_for_stream(&b, n * 4).unwrap();
        if backend == Backend::Caching && still_busy(&a) {
            assert_ne!(
                y.device_ptr().unwrap(),
                x_ptr,
                "{backend:?}: A's block went to B early"
            );
        }
        k.spin(&b, SLOW / 5);
        k.fill(&b, &mut y, value_b);
        copy_out(&b, &y, &out_b);

        assert!(
            out_a.to_vec(&a).unwrap().iter().all(|&v| v == value_a),
            "{backend:?}: A clobbered"
        );
        assert!(
            out_b.to_vec(&b).unwrap().iter().all(|&v| v == value_b),
            "{backend:?}: B clobbered"
        );
        drop(y);
        a.synchronize().unwrap();
        b.synchronize().unwrap();
    }
}

/// Once both streams are idle, a third stream gets their memory without a
/// new driver allocation.
#[test]
fn memory_moves_between_streams_once_proven() {
    let ctx = ctx();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let k = Kernels::load(&ctx);
    let x = alloc.allocate_for_stream(&a, 3 << 20).unwrap();
    let x_ptr = x.device_ptr().unwrap();
    k.spin(&a, SLOW);
    drop(x);
    // A is busy: B cannot have A's segment.
    let y = alloc.allocate_for_stream(&b, 3 << 20).unwrap();
    if still_busy(&a) {
        assert_ne!(y.device_ptr().unwrap(), x_ptr);
        assert_eq!(alloc.stats().driver_alloc_calls, 2);
    }
    let calls = alloc.stats().driver_alloc_calls;
    drop(y);
    a.synchronize().unwrap();
    let c = Stream::new(&ctx).unwrap();
    let z = alloc.allocate_for_stream(&c, 3 << 20).unwrap();
    let stats = alloc.stats();
    assert_eq!(
        stats.driver_alloc_calls, calls,
        "C reused A's or B's segment"
    );
    assert!(stats.cross_stream_handoffs >= 1);
    drop(z);
}

#[test]
fn same_stream_reuse_makes_no_driver_call() {
    let ctx = ctx();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let s = Stream::new(&ctx).unwrap();
    let mut rng = XorShift(77);
    let first = alloc.allocate_for_stream(&s, 1 << 20).unwrap();
    let ptr = first.device_ptr().unwrap();
    drop(first);
    for _ in 0..1000 {
        let a = alloc.allocate_for_stream(&s, 1 << 20).unwrap();
        assert_eq!(a.device_ptr().unwrap(), ptr);
        let small = alloc
            .allocate_for_stream(&s, 1 + rng.below(64 << 10) as usize)
            .unwrap();
        drop((a, small));
    }
    let stats = alloc.stats();
    // 1 MiB is still a small request: one 2 MiB segment serves everything.
    assert_eq!(stats.driver_alloc_calls, 1, "{stats:#?}");
    assert_eq!(stats.driver_free_calls, 0);
    assert_eq!((stats.cache_hits, stats.cache_misses), (2000, 1));
}

#[test]
fn driver_pool_calls_the_driver_every_time() {
    let ctx = ctx();
    if !ctx.info().memory_pools_supported {
        eprintln!("no memory pools on this device");
        return;
    }
    let alloc = StreamOrderedAllocator::with_backend(&ctx, Backend::driver_pool()).unwrap();
    let s = Stream::new(&ctx).unwrap();
    for _ in 0..10 {
        drop(alloc.allocate_for_stream(&s, 1 << 20).unwrap());
    }
    let stats = alloc.stats();
    assert_eq!(
        (stats.driver_alloc_calls, stats.driver_free_calls),
        (10, 10)
    );
    s.synchronize().unwrap();
}

/// A use on another stream declared with record_stream holds the block until
/// that stream has passed it.
#[test]
fn record_stream_holds_the_block_for_the_other_stream() {
    let ctx = ctx();
    let k = Kernels::load(&ctx);
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let n = (256 << 10) / 4;
        let out = DeviceBuffer::<u32>::new(&ctx, n).unwrap();
        let mut x = alloc.allocate_for_stream(&a, n * 4).unwrap();
        let x_ptr = x.device_ptr().unwrap();
        k.fill(&a, &mut x, 0xA11CE);
        a.synchronize().unwrap();
        // B reads x late.
        k.spin(&b, SLOW);
        copy_out(&b, &x, &out);
        alloc.record_stream(&x, &b).unwrap();
        drop(x);
        // A allocates and writes at once; it must not get x's block.
        let mut y = alloc.allocate_for_stream(&a, n * 4).unwrap();
        if backend == Backend::Caching && still_busy(&b) {
            assert_ne!(y.device_ptr().unwrap(), x_ptr);
            assert_eq!(alloc.stream_stats(&a).unwrap().pending_frees, 1);
        }
        k.fill(&a, &mut y, 0xB0B);
        assert!(
            out.to_vec(&b).unwrap().iter().all(|&v| v == 0xA11CE),
            "{backend:?}"
        );
        drop(y);
        if backend == Backend::Caching {
            // B has passed: the next miss settles the pending block.
            let z = alloc.allocate_for_stream(&a, 4 << 20).unwrap();
            assert_eq!(alloc.stream_stats(&a).unwrap().pending_frees, 0);
            drop(z);
        }
        a.synchronize().unwrap();
    }
}

#[test]
fn dependencies_are_tracked_and_delay_reuse() {
    let ctx = ctx();
    let k = Kernels::load(&ctx);
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        assert!(
            alloc.dependencies_satisfied(&a).unwrap(),
            "no dependencies yet"
        );
        let n = (64 << 10) / 4;
        let out = DeviceBuffer::<u32>::new(&ctx, n).unwrap();
        let mut x = alloc.allocate_for_stream(&a, n * 4).unwrap();
        let x_ptr = x.device_ptr().unwrap();
        k.fill(&a, &mut x, 0xD00D);
        a.synchronize().unwrap();
        k.spin(&b, SLOW);
        copy_out(&b, &x, &out);
        let done = Arc::new(Event::plain(&ctx).unwrap());
        done.record(&b).unwrap();
        alloc.add_stream_dependency(&a, Arc::clone(&done)).unwrap();
        let satisfied = alloc.dependencies_satisfied(&a).unwrap();
        drop(x);
        let mut y = alloc.allocate_for_stream(&a, n * 4).unwrap();
        if still_busy(&b) {
            // B was busy throughout, so the dependency was unmet at each step.
            assert!(!satisfied);
            if backend == Backend::Caching {
                assert_ne!(y.device_ptr().unwrap(), x_ptr, "x waits for the dependency");
            }
        }
        k.fill(&a, &mut y, 0xBAD);
        assert!(
            out.to_vec(&b).unwrap().iter().all(|&v| v == 0xD00D),
            "{backend:?}"
        );
        assert!(alloc.dependencies_satisfied(&a).unwrap());
        assert_eq!(alloc.clear_dependencies(&a), 1);
        assert_eq!(alloc.clear_dependencies(&a), 0);
        drop(y);
        a.synchronize().unwrap();
    }
}

#[test]
fn free_for_stream_kills_handles_without_double_free() {
    let ctx = ctx();
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let (s, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let held: Vec<_> = (1..=3)
            .map(|i| alloc.allocate_for_stream(&s, i * 4096).unwrap())
            .collect();
        let keep = alloc.allocate_for_stream(&other, 4096).unwrap();
        assert_eq!(alloc.free_for_stream(&s).unwrap(), 3);
        assert_eq!(alloc.free_for_stream(&s).unwrap(), 0);
        let stats = alloc.stats();
        assert_eq!(
            (stats.live_allocations, stats.allocated_bytes),
            (1, keep.block_size())
        );
        for dead in &held {
            assert!(!dead.is_live());
            let err = dead.device_ptr().unwrap_err();
            assert!(matches!(err, Error::DeadAllocation { .. }), "{err}");
            assert!(err.to_string().contains("free_for_stream"), "{err}");
            assert!(dead.memset_u8_async(1).is_err());
        }
        // The freed blocks are handed out again; dropping the dead handles
        // afterwards must not free the new owners' memory.
        let again: Vec<_> = (1..=3)
            .map(|i| alloc.allocate_for_stream(&s, i * 4096).unwrap())
            .collect();
        drop(held);
        for a in &again {
            assert!(a.is_live());
            a.memset_u32_async(0x1234_5678).unwrap();
        }
        let mut back = vec![0u32; 4096 / 4];
        again[0].copy_to_host(&mut back).unwrap();
        assert!(back.iter().all(|&v| v == 0x1234_5678));
        assert_eq!(alloc.stats().live_allocations, 4);
        drop((again, keep));
        assert_eq!(alloc.stats().live_allocations, 0);
        s.synchronize().unwrap();
    }
}

#[test]
fn bad_sizes_are_refused_and_change_nothing() {
    let ctx = ctx();
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let s = Stream::new(&ctx).unwrap();
        let _live = alloc.allocate_for_stream(&s, 1000).unwrap();
        let before = alloc.stats();
        let zero = alloc.allocate_for_stream(&s, 0).unwrap_err();
        assert!(matches!(zero, Error::ZeroSize { .. }), "{zero}");
        assert!(zero.to_string().contains("0 bytes"), "{zero}");
        let total = ctx.info().total_memory;
        for huge in [total + 1, usize::MAX, usize::MAX - 100] {
            let err = alloc.allocate_for_stream(&s, huge).unwrap_err();
            assert!(matches!(err, Error::TooLarge { .. }), "{err}");
            assert!(err.to_string().contains(&huge.to_string()), "{err}");
        }
        let after = alloc.stats();
        assert_eq!(before.allocated_bytes, after.allocated_bytes);
        assert_eq!(before.driver_alloc_calls, after.driver_alloc_calls);
        assert_eq!(before.live_allocations, after.live_allocations);
        if backend == Backend::Caching {
            assert_eq!(before.reserved_bytes, after.reserved_bytes);
        }
    }
}

#[test]
fn statistics_add_up() {
    let ctx = ctx();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let streams: Vec<_> = (0..3).map(|_| Stream::new(&ctx).unwrap()).collect();
    let mut rng = XorShift(0xfeed);
    let mut live = Vec::new();
    let mut requested = 0;
    for i in 0..60 {
        let bytes = 1 + rng.below(12 << 20) as usize;
        requested += bytes;
        live.push(alloc.allocate_for_stream(&streams[i % 3], bytes).unwrap());
    }
    let stats = alloc.stats();
    assert_eq!(stats.requested_bytes, requested);
    assert_eq!(stats.live_allocations, 60);
    let blocks: usize = live.iter().map(|a| a.block_size()).sum();
    assert_eq!(stats.allocated_bytes, blocks);
    assert!(live.iter().all(|a| a.block_size() >= a.size()));
    let per: usize = stats.per_stream.iter().map(|s| s.allocated_bytes).sum();
    assert_eq!(per, stats.allocated_bytes);
    let per_reserved: usize = stats.per_stream.iter().map(|s| s.reserved_bytes).sum();
    assert_eq!(
        per_reserved, stats.reserved_bytes,
        "no segment is in the shared cache yet"
    );
    let per_free: usize = stats.per_stream.iter().map(|s| s.free_bytes).sum();
    assert_eq!(stats.allocated_bytes + per_free, stats.reserved_bytes);
    assert_eq!(stats.cached_bytes, per_free);
    assert_eq!(stats.cache_hits + stats.cache_misses, 60);
    assert_eq!(stats.driver_alloc_calls as usize, stats.segments);
    assert!((0.0..=1.0).contains(&stats.fragmentation));
    assert!(stats.peak_allocated_bytes >= stats.allocated_bytes);
    assert!(stats.peak_reserved_bytes >= stats.reserved_bytes);
    let peak = stats.allocated_bytes;
    // Free every other one: fragmentation appears, peaks stay.
    let mut keep = Vec::new();
    for (i, a) in live.into_iter().enumerate() {
        if i % 2 == 0 {
            keep.push(a);
        }
    }
    let mid = alloc.stats();
    assert!(mid.allocated_bytes < peak);
    assert_eq!(mid.peak_allocated_bytes, peak);
    assert_eq!(mid.live_allocations, 30);
    drop(keep);
    let end = alloc.stats();
    assert_eq!(
        (
            end.allocated_bytes,
            end.requested_bytes,
            end.live_allocations
        ),
        (0, 0, 0)
    );
    assert_eq!(end.cached_bytes, end.reserved_bytes);
    assert_eq!(end.fragmentation, {
        let free = end.reserved_bytes as f64;
        1.0 - end.largest_free_block as f64 / free
    });
    alloc.reset_peaks();
    assert_eq!(alloc.stats().peak_allocated_bytes, 0);
    assert!(end.segments >= 3 && end.reserved_bytes >= 3 * SMALL_SEGMENT);
}
