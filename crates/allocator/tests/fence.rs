//! A busy stream's free segment moves to another stream once the fence
//! recorded after the free has passed (the stream's completion trail), not
//! only once the whole stream is idle.

mod common;

use common::ctx;
use cuda_streams_allocator::StreamOrderedAllocator;
use cuda_streams_allocator::driver::Stream;
use test_support::Gate;

#[test]
fn a_passed_fence_hands_on_a_busy_streams_segment() {
    let ctx = ctx();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let (a, b, c) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let size = 3 << 20;
    let first = Gate::close(&a);
    let x = alloc.allocate_for_stream(&a, size).unwrap();
    let x_ptr = x.device_ptr().unwrap();
    drop(x); // free in A's order, behind the gate
    // B misses while A is held: A's segment is not proven free, so B gets
    // new memory and A gets a fence after the free.
    let y = alloc.allocate_for_stream(&b, size).unwrap();
    if first.still_held() {
        assert_ne!(
            y.device_ptr().unwrap(),
            x_ptr,
            "A's segment went to B early"
        );
    }
    let calls = alloc.stats().driver_alloc_calls;
    let after_fence = a.record_event().unwrap();
    let second = Gate::close(&a);
    first.open();
    after_fence.synchronize().unwrap();
    // A is busy again (the second gate), but its fence has passed: C gets
    // A's segment without a driver allocation.
    let z = alloc.allocate_for_stream(&c, size).unwrap();
    if second.still_held() {
        assert!(!a.query().unwrap(), "A is still held by the second gate");
        assert_eq!(
            (z.device_ptr().unwrap(), alloc.stats().driver_alloc_calls),
            (x_ptr, calls),
            "C should reuse A's segment, proven by the passed fence"
        );
        assert!(alloc.stats().cross_stream_handoffs >= 1);
    }
    second.open();
    drop((y, z));
}
