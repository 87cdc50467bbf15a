//! The allocator across SM partitions: a block freed on one partition's
//! stream while that stream still has work reading it is not handed to
//! another partition's stream, on either backend (proven with data, not
//! timing), and a block used on another partition's stream waits for its
//! home stream first.

mod common;

use common::{Kernels, backends, copy_out, ctx, serial};
use cuda_streams_allocator::driver::{DeviceBuffer, Sms, StreamPriority};
use cuda_streams_allocator::{Backend, StreamOrderedAllocator};
use test_support::Gate;

/// A's fill of its block runs, then A is held at a gate with its read-out
/// of the block still queued, and A frees the block. B (another partition)
/// allocates the same size at once, fills it and finishes. Had B been
/// given A's block, A's read-out (after the gate) would hold B's value.
#[test]
fn a_block_freed_in_one_partition_is_not_reused_early_in_another() {
    let _serial = serial();
    let ctx = ctx();
    let k = Kernels::load(&ctx);
    let split = ctx.partition(&[Sms(8), Sms(8)]).unwrap();
    let a = split.partitions[0].stream(StreamPriority::Normal).unwrap();
    let b = split.partitions[1].stream(StreamPriority::Normal).unwrap();
    for backend in backends(&ctx) {
        let alloc = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let n = (1 << 20) / 4;
        let (out_a, out_b) = (
            DeviceBuffer::<u32>::new(&ctx, n).unwrap(),
            DeviceBuffer::<u32>::new(&ctx, n).unwrap(),
        );
        let (value_a, value_b) = (0xa5a5_0001, 0x5a5a_0002);

        let mut x = alloc.allocate_for_stream(&a, n * 4).unwrap();
        let x_ptr = x.device_ptr().unwrap();
        k.fill(&a, &mut x, value_a);
        let gate = Gate::close(&a);
        copy_out(&a, &x, &out_a);
        drop(x); // stream-ordered: A still has the read-out queued

        let mut y = alloc.allocate_for_stream(&b, n * 4).unwrap();
        if backend == Backend::Caching && gate.still_held() {
            assert_ne!(
                y.device_ptr().unwrap(),
                x_ptr,
                "{backend:?}: A's block went to B's partition while A was held"
            );
        }
        k.fill(&b, &mut y, value_b);
        copy_out(&b, &y, &out_b);
        b.synchronize().unwrap();
        gate.open();

        assert!(
            out_a.to_vec(&a).unwrap().iter().all(|&v| v == value_a),
            "{backend:?}: A's block was written by B's partition before A read it"
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

/// A block homed on A's partition stream and first used on B's waits
/// for A's work so far: A is held at a gate (which opens itself) before
/// its fill of 7, and B fills 9. Had B not waited, its 9 would land while A
/// was held and A's 7 after it.
#[test]
fn a_first_use_in_another_partition_waits_for_the_home_stream() {
    let _serial = serial();
    let ctx = ctx();
    let k = Kernels::load(&ctx);
    let split = ctx.partition(&[Sms(8), Sms(8)]).unwrap();
    let a = split.partitions[0].stream(StreamPriority::Normal).unwrap();
    let b = split.partitions[1].stream(StreamPriority::Normal).unwrap();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let n = 4096;
    let out = DeviceBuffer::<u32>::new(&ctx, n).unwrap();
    let mut x = alloc.allocate_for_stream(&a, n * 4).unwrap();
    // Nothing here opens it: B's synchronize returns after it opened
    // itself only if B waits for A.
    let _gate = Gate::close_within(&a, std::time::Duration::from_millis(300));
    k.fill(&a, &mut x, 7);
    k.fill(&b, &mut x, 9);
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    copy_out(&b, &x, &out);
    assert!(
        out.to_vec(&b).unwrap().iter().all(|&v| v == 9),
        "A's fill landed after B's: the first use on B did not wait for A"
    );
    drop(x);
    a.synchronize().unwrap();
}
