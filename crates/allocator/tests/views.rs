//! Typed views: the allocator's memory through the driver layer's traits,
//! so its copies, memsets and launches are counted, ordered and kept alive
//! like any buffer's.

mod common;

use common::{Kernels, ctx};
use cuda_streams_allocator::driver::{LaunchConfig, PinnedBuffer, Stream};
use cuda_streams_allocator::{Error, StreamOrderedAllocator};
use test_support::Gate;

#[test]
fn copies_and_memsets_are_counted_by_the_stream() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let data = alloc.allocate_for_stream(&stream, 16384).unwrap();
    let before = stream.metrics();
    let host: Vec<u32> = (0..4096).collect();
    data.copy_from_host(&host).unwrap();
    let mut back = vec![0u32; 4096];
    data.copy_to_host(&mut back).unwrap();
    assert_eq!(back, host);
    data.memset_u32_async(5).unwrap();
    let after = stream.metrics();
    assert_eq!(after.memory_transfers - before.memory_transfers, 2);
    assert_eq!(after.bytes_transferred - before.bytes_transferred, 32768);
    assert_eq!(after.operations_count - before.operations_count, 3);
    data.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&w| w == 5));
}

#[test]
fn a_view_keeps_the_block_through_free_for_stream() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let mut data = alloc.allocate_for_stream(&stream, 4096).unwrap();
    let ptr = data.device_ptr().unwrap();
    let mut view = data.as_device_mut::<u32>().unwrap();
    assert_eq!(view.len(), 1024);
    assert_eq!(alloc.free_for_stream(&stream).unwrap(), 1);
    assert_eq!(alloc.free_for_stream(&stream).unwrap(), 0, "counted once");
    // The block is still the view's: no new allocation gets it...
    let other = alloc.allocate_for_stream(&stream, 4096).unwrap();
    assert_ne!(other.device_ptr().unwrap(), ptr);
    // ...and work through the view still runs on it.
    let fill = test_support::kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    stream
        .launch(
            &fill,
            LaunchConfig::for_num_elems(1024),
            &[1024u64.into(), 9u32.into(), (&mut view).into()],
        )
        .unwrap();
    let mut back = vec![0u32; 1024];
    stream.copy_to_host(&mut back, &view).unwrap();
    assert!(back.iter().all(|&w| w == 9));
    drop(view);
    // The handle is dead; the block went back when the view did.
    assert!(!data.is_live());
    assert!(matches!(
        data.as_device::<u32>(),
        Err(Error::DeadAllocation { .. })
    ));
    assert_eq!(alloc.stats().live_allocations, 1, "only `other`");
    drop((data, other));
    assert_eq!(alloc.stats().live_allocations, 0);
}

#[test]
fn a_use_on_another_stream_waits_for_the_home_stream_and_is_declared() {
    let ctx = ctx();
    let k = Kernels::load(&ctx);
    let (home, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let mut data = alloc.allocate_for_stream(&home, 1 << 16).unwrap();
    // The home stream fills behind a gate; the read on `other` must wait
    // for the fill, not read the block before it.
    let home_gate = Gate::close(&home);
    k.fill(&home, &mut data, 0x5EED);
    let view = data.as_device::<u32>().unwrap();
    let mut back = PinnedBuffer::<u32>::new(&ctx, 1 << 14).unwrap();
    other.copy_to_host_async(&mut back, &view).unwrap();
    if home_gate.still_held() {
        assert!(!other.query().unwrap(), "`other` waits for the home stream");
    }
    home_gate.open();
    assert!(
        back.as_slice().unwrap().iter().all(|&w| w == 0x5EED),
        "ordered after the home stream"
    );
    drop(view);
    // The use on `other` was declared: freeing waits for it like record_stream.
    // The gate holds the copy queued on `other` until the test opens it.
    let gate = Gate::close(&other);
    let ptr = data.device_ptr().unwrap();
    let view = data.as_device::<u32>().unwrap();
    let mut sink = cuda_streams_allocator::driver::DeviceBuffer::<u32>::new(&ctx, 1 << 14).unwrap();
    other.copy_device_to_device_async(&mut sink, &view).unwrap();
    drop(view);
    drop(data);
    let next = alloc.allocate_for_stream(&home, 1 << 16).unwrap();
    if gate.still_held() {
        assert_ne!(
            next.device_ptr().unwrap(),
            ptr,
            "the block waits for `other`"
        );
    }
    gate.open();
    other.synchronize().unwrap();
    // Once `other` has passed the copy, the block is reused on its home
    // stream (settled on the allocation path): the wait above was for
    // `other`, not a block kept for ever.
    let again = alloc.allocate_for_stream(&home, 1 << 16).unwrap();
    assert_eq!(again.device_ptr().unwrap(), ptr, "the block came back");
    drop((next, again));
}

#[test]
fn views_need_whole_elements() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let data = alloc.allocate_for_stream(&stream, 10).unwrap();
    let err = data.as_device::<u32>().unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                expected: 10,
                actual: 8,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(data.as_device::<u16>().unwrap().len(), 5);
}

#[test]
fn a_block_freed_while_another_stream_used_it_comes_back_once_that_stream_is_done() {
    let ctx = ctx();
    let (home, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let size = 1 << 16;
    let mut sink =
        cuda_streams_allocator::driver::DeviceBuffer::<u32>::new(&ctx, size / 4).unwrap();
    let x = alloc.allocate_for_stream(&home, size).unwrap();
    let x_ptr = x.device_ptr().unwrap();
    // `other` reads x late: its copy waits behind a gate.
    let gate = Gate::close(&other);
    other
        .copy_device_to_device_async(&mut sink, &x.as_device::<u32>().unwrap())
        .unwrap();
    drop(x);
    // While `other` may still read it, the home stream gets other blocks.
    let y = alloc.allocate_for_stream(&home, size).unwrap();
    if gate.still_held() {
        assert_ne!(y.device_ptr().unwrap(), x_ptr);
    }
    drop(y);
    gate.open();
    other.synchronize().unwrap();
    // `other` is done: the very next allocation of the size gets x's block
    // (before the fix it came back only after the free lists ran dry).
    let z = alloc.allocate_for_stream(&home, size).unwrap();
    assert_eq!(z.device_ptr().unwrap(), x_ptr);
    assert_eq!(alloc.stream_stats(&home).unwrap().pending_frees, 0);
}
