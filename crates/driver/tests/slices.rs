//! `DeviceBuffer::slice` / `slice_mut`: launches, copies, memsets and the
//! stream-order tracker see exactly the range of a view; the buffer keeps
//! tracking the uses of its views.

mod support;

use cuda_streams_driver::{Context, DeviceBuffer, Error, LaunchConfig, OrderPolicy, Stream, order};
use std::sync::{Arc, Mutex, MutexGuard};
use support::kernel;

/// The tests switch the shared context's ordering policy: one at a time,
/// put back afterwards.
static POLICY: Mutex<()> = Mutex::new(());

struct Policy {
    ctx: Arc<Context>,
    before: OrderPolicy,
    _turn: MutexGuard<'static, ()>,
}

fn policy(ctx: &Arc<Context>, policy: OrderPolicy) -> Policy {
    let turn = POLICY.lock().unwrap_or_else(|p| p.into_inner());
    let before = ctx.ordering();
    ctx.set_ordering(policy).unwrap();
    Policy {
        ctx: Arc::clone(ctx),
        before,
        _turn: turn,
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        // `before` was accepted once; a drop does not panic regardless.
        if let Err(err) = self.ctx.set_ordering(self.before) {
            eprintln!("the policy could not be put back: {err}");
        }
    }
}

#[test]
fn a_batch_of_crops_is_processed_and_copied_one_crop_at_a_time() {
    const CROPS: usize = 16;
    const CROP: usize = 64;
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let mut batch = DeviceBuffer::<u32>::zeroed_async(&stream, CROPS * CROP).unwrap();
    // A launch per crop, told only the crop's length: the checked launch
    // accepts the view because it holds exactly `CROP` elements.
    for crop in 0..CROPS {
        let mut view = batch.slice_mut(crop * CROP..(crop + 1) * CROP).unwrap();
        let n = CROP as u64;
        stream
            .launch(
                &fill,
                LaunchConfig::for_num_elems(CROP as u32),
                &[n.into(), (crop as u32 + 1).into(), (&mut view).into()],
            )
            .unwrap();
    }
    let expected: Vec<u32> = (0..CROPS * CROP).map(|i| (i / CROP) as u32 + 1).collect();
    assert_eq!(batch.to_vec(&stream).unwrap(), expected);
    // Copied out crop by crop, into crops of another buffer, in reverse.
    let mut reversed = DeviceBuffer::<u32>::new_async(&stream, CROPS * CROP).unwrap();
    for crop in 0..CROPS {
        let src = batch.slice(crop * CROP..(crop + 1) * CROP).unwrap();
        let back = CROPS - 1 - crop;
        let mut dst = reversed.slice_mut(back * CROP..(back + 1) * CROP).unwrap();
        stream.copy_device_to_device_async(&mut dst, &src).unwrap();
        let mut host = [0u32; CROP];
        stream.copy_to_host(&mut host, &src).unwrap();
        assert_eq!(host, [crop as u32 + 1; CROP]);
    }
    let expected: Vec<u32> = (0..CROPS * CROP)
        .map(|i| (CROPS - i / CROP) as u32)
        .collect();
    assert_eq!(reversed.to_vec(&stream).unwrap(), expected);
    // A view of a view is relative to its start.
    let view = batch.slice(CROP..3 * CROP).unwrap();
    let inner = view.slice(CROP - 2..CROP + 2).unwrap();
    assert_eq!(inner.range(), 2 * CROP - 2..2 * CROP + 2);
    assert_eq!(inner.to_vec(&stream).unwrap(), [2, 2, 3, 3]);
}

#[test]
fn a_launch_told_more_elements_than_the_view_holds_is_refused() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let mut buffer = DeviceBuffer::<u32>::zeroed_async(&stream, 64).unwrap();
    let mut view = buffer.slice_mut(0..16).unwrap();
    let err = stream
        .launch(
            &fill,
            LaunchConfig::for_num_elems(64),
            &[64u64.into(), 1u32.into(), (&mut view).into()],
        )
        .unwrap_err();
    assert!(matches!(err, Error::ArgumentTooShort { .. }), "{err}");
    assert_eq!(buffer.to_vec(&stream).unwrap(), [0; 64], "nothing ran");
}

#[test]
fn out_of_range_views_are_refused_naming_the_range_and_the_length() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut buffer = DeviceBuffer::<u32>::zeroed_async(&stream, 10).unwrap();
    let err = buffer.slice(8..12).unwrap_err();
    assert!(
        matches!(err, Error::SliceOutOfRange { len: 10, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "slice 8..12 of a buffer of 10 element(s): it ends past the buffer"
    );
    let err = buffer.slice_mut(4..4).unwrap_err();
    assert!(err.to_string().contains("slice 4..4"), "{err}");
    let view = buffer.slice(2..6).unwrap();
    let err = view.slice(3..5).unwrap_err();
    assert!(
        err.to_string()
            .contains("slice 3..5 of a buffer of 4 element(s)"),
        "{err}"
    );
    // The buffer stays usable.
    assert_eq!(buffer.to_vec(&stream).unwrap(), [0; 10]);
}

#[test]
fn the_order_tracker_sees_the_exact_range_of_a_view() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&ctx, OrderPolicy::Check);
    let (left, right) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut data = DeviceBuffer::<u32>::new(&ctx, 256).unwrap();
    // Two streams write the two halves with no edge between them: disjoint
    // bytes, no race.
    order::labelled("left half", || {
        left.memset_u32_async(&mut data.slice_mut(..128).unwrap(), 1)
    })
    .unwrap();
    order::labelled("right half", || {
        right.memset_u32_async(&mut data.slice_mut(128..).unwrap(), 2)
    })
    .unwrap();
    // A read of elements 124..132 on the right stream races the left write
    // over exactly elements 124..128: the first 16 of the view's 32 bytes.
    let mut host = [0u32; 8];
    let err = right
        .copy_to_host(&mut host, &data.slice(124..132).unwrap())
        .unwrap_err();
    let Error::UnorderedAccess(race) = err else {
        panic!("expected an unordered access, got {err}");
    };
    assert_eq!(race.earlier.label.as_deref(), Some("left half"));
    assert_eq!(race.buffer, data.as_device_ptr() + 124 * 4);
    assert_eq!(race.buffer_bytes, 32);
    assert_eq!(race.overlap, 0..16);
    // The right half is ordered on its own stream.
    right
        .copy_to_host(&mut host, &data.slice(128..136).unwrap())
        .unwrap();
    assert_eq!(host, [2; 8]);
    right.wait_stream(&left).unwrap();
    let expected: Vec<u32> = (0..256).map(|i| if i < 128 { 1 } else { 2 }).collect();
    assert_eq!(data.to_vec(&right).unwrap(), expected);
}

#[test]
fn a_view_used_on_another_stream_is_tracked_by_its_buffer() {
    let ctx = Context::new(0).unwrap();
    let (home, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut buffer = DeviceBuffer::<u32>::zeroed_async(&home, 64).unwrap();
    home.synchronize().unwrap();
    assert_eq!(buffer.foreign_stream_count(), 0);
    other
        .memset_u32_async(&mut buffer.slice_mut(8..16).unwrap(), 5)
        .unwrap();
    // The buffer's free waits for `other` (and the first use there waited
    // for the allocation on `home`).
    assert_eq!(buffer.foreign_stream_count(), 1);
    other.synchronize().unwrap();
    let contents = buffer.to_vec(&home).unwrap();
    assert_eq!(&contents[8..16], [5; 8]);
    assert!(contents[..8].iter().chain(&contents[16..]).all(|&v| v == 0));
}
