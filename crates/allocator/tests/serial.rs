//! Tests that change or measure device memory as a whole: out-of-memory
//! recovery (software driver, small capacity) and trimming (cuMemGetInfo).
//! They run one at a time, in their own test binary, so no other test's
//! allocations move the numbers.

mod common;

use common::{Kernels, backends, ctx, serial, skip_on_gpu};
use cuda_streams_allocator::driver::Stream;
use cuda_streams_allocator::{Backend, Error, StreamOrderedAllocator};
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Sets the software device's capacity to what is in use plus `headroom`,
/// and restores the old capacity on drop (also when the test fails).
struct Capacity(usize);

impl Capacity {
    fn headroom(headroom: usize) -> Self {
        let old = soft_driver::capacity();
        soft_driver::set_capacity(soft_driver::memory_in_use() + headroom);
        Self(old)
    }
}

impl Drop for Capacity {
    fn drop(&mut self) {
        soft_driver::set_capacity(self.0);
    }
}

#[test]
fn out_of_memory_releases_the_cache_retries_and_stays_usable() {
    let _serial = serial();
    let ctx = ctx();
    if skip_on_gpu(&ctx, "needs the software driver's adjustable capacity") {
        return;
    }
    let k = Kernels::load(&ctx);
    for backend in backends(&ctx) {
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let _capacity = Capacity::headroom(64 * MIB);

        // 40 MiB freed on a busy stream: not reusable elsewhere without waiting.
        let x = alloc.allocate_for_stream(&s1, 40 * MIB).unwrap();
        k.spin(&s1, Duration::from_millis(200));
        drop(x);
        let y = alloc.allocate_for_stream(&s2, 40 * MIB).unwrap();
        let stats = alloc.stats();
        assert_eq!(stats.oom_recoveries, 1, "{backend:?}: {stats:#?}");
        assert!(
            s1.query().unwrap(),
            "{backend:?}: the recovery waited for s1"
        );
        y.memset_u32_async(7).unwrap();

        // More than can ever fit next to y: a clear error naming the numbers.
        let err = alloc.allocate_for_stream(&s2, 48 * MIB).unwrap_err();
        match &err {
            Error::OutOfMemory {
                requested, free, ..
            } => {
                assert_eq!(*requested, 48 * MIB);
                assert!(*free < 48 * MIB, "{err}");
            }
            other => panic!("{backend:?}: expected OutOfMemory, got {other}"),
        }
        let text = err.to_string();
        assert!(
            text.contains(&(48 * MIB).to_string()) && text.contains("free"),
            "{text}"
        );
        assert_eq!(alloc.stats().live_allocations, 1);

        // Still usable: once y is gone, 48 MiB fits.
        drop(y);
        let z = alloc.allocate_for_stream(&s2, 48 * MIB).unwrap();
        z.memset_u8_async(1).unwrap();
        let mut back = vec![0u8; 48 * MIB];
        z.copy_to_host(&mut back).unwrap();
        assert!(back.iter().all(|&b| b == 1));
        drop(z);
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
        alloc.trim(0).unwrap();
    }
}

#[test]
fn injected_allocation_failure_is_recovered() {
    let _serial = serial();
    let ctx = ctx();
    if skip_on_gpu(&ctx, "fault injection is a software-driver feature") {
        return;
    }
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let s = Stream::new(&ctx).unwrap();
        soft_driver::faults::fail_next_allocations(1);
        let a = alloc.allocate_for_stream(&s, 3 * MIB).unwrap();
        assert_eq!(soft_driver::faults::pending_allocation_failures(), 0);
        assert_eq!(alloc.stats().oom_recoveries, 1, "{backend:?}");
        soft_driver::faults::fail_next_allocations(2);
        let err = alloc.allocate_for_stream(&s, 30 * MIB).unwrap_err();
        assert!(
            matches!(err, Error::OutOfMemory { requested, .. } if requested == 30 * MIB),
            "{err}"
        );
        soft_driver::faults::fail_next_allocations(0);
        drop(a);
        s.synchronize().unwrap();
    }
}

/// Freed memory stays cached (no driver call, no change in free memory) until
/// `trim`, which gives it back: cuMemGetInfo shows it.
#[test]
fn trim_returns_memory_to_the_device() {
    let _serial = serial();
    let ctx = ctx();
    let slack = if ctx.is_gpu() { 16 * MIB } else { 0 };
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let s = Stream::new(&ctx).unwrap();
        alloc.trim(0).unwrap();
        let (free_start, _) = ctx.memory_info().unwrap();
        let blocks: Vec<_> = (0..4)
            .map(|_| alloc.allocate_for_stream(&s, 64 * MIB).unwrap())
            .collect();
        for b in &blocks {
            b.memset_u8_async(0xAB).unwrap();
        }
        let (free_live, _) = ctx.memory_info().unwrap();
        assert!(free_live + 256 * MIB <= free_start + slack, "{backend:?}");
        drop(blocks);
        s.synchronize().unwrap();
        // Cached, not returned: the release threshold keeps the pool's
        // memory across the synchronisation too.
        let (free_cached, _) = ctx.memory_info().unwrap();
        assert!(
            free_cached + 256 * MIB <= free_start + slack,
            "{backend:?}: released early"
        );
        let stats = alloc.stats();
        assert!(stats.cached_bytes >= 256 * MIB, "{backend:?}: {stats:#?}");

        if backend == Backend::Caching {
            // Keep 128 MiB: two of the four segments go.
            let released = alloc.trim(128 * MIB).unwrap();
            assert_eq!(released, 128 * MIB);
            assert_eq!(alloc.stats().reserved_bytes, 128 * MIB);
        }
        let released = alloc.trim(0).unwrap();
        assert!(released >= 128 * MIB, "{backend:?}: {released}");
        let (free_end, _) = ctx.memory_info().unwrap();
        assert!(
            free_end + slack >= free_start,
            "{backend:?}: {free_end} < {free_start}"
        );
        assert!(free_end >= free_cached + 256 * MIB - slack, "{backend:?}");
        let stats = alloc.stats();
        assert_eq!(stats.reserved_bytes, 0, "{backend:?}: {stats:#?}");
        if backend == Backend::Caching {
            assert_eq!(stats.driver_free_calls, 4);
        }
    }
}
