//! Copies, memsets and prefetches: lengths checked, zero sizes rejected, and
//! host access to pinned/unified memory waits for the copies that use it.

mod support;

use cuda_streams_driver::{DeviceBuffer, Error, PinnedBuffer, Stream, UnifiedBuffer};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{XorShift, ctx};

fn assert_size_mismatch(result: cuda_streams_driver::Result<()>, expected: usize, actual: usize) {
    match result {
        Err(err @ Error::SizeMismatch { .. }) => {
            let Error::SizeMismatch {
                expected: e,
                actual: a,
                ..
            } = err
            else {
                unreachable!()
            };
            assert_eq!((e, a), (expected, actual));
            let text = err.to_string();
            assert!(
                text.contains(&expected.to_string()) && text.contains(&actual.to_string()),
                "{text}"
            );
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
}

#[test]
fn copies_with_mismatched_lengths_are_rejected_naming_both() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stream, 12).unwrap();
    let mut other = DeviceBuffer::<u32>::new_async(&stream, 13).unwrap();
    let mut pinned = PinnedBuffer::<u32>::new(&ctx, 10).unwrap();
    let mut unified = UnifiedBuffer::<u32>::new(&ctx, 11).unwrap();
    let before = stream.metrics().operations_count;

    assert_size_mismatch(stream.copy_from_host_async(&mut device, &pinned), 12, 10);
    assert_size_mismatch(stream.copy_to_host_async(&mut pinned, &device), 10, 12);
    assert_size_mismatch(
        stream.copy_device_to_device_async(&mut other, &device),
        13,
        12,
    );
    assert_size_mismatch(stream.copy_from_host_async(&mut unified, &pinned), 11, 10);
    assert_size_mismatch(stream.copy_from_host(&mut device, &[1u32; 3]), 12, 3);
    let mut short = [0u32; 5];
    assert_size_mismatch(stream.copy_to_host(&mut short, &device), 5, 12);

    assert_eq!(
        stream.metrics().operations_count,
        before,
        "nothing was enqueued"
    );
    assert_eq!(unified.as_mut_slice().unwrap(), &[0; 11]);
}

#[test]
fn zero_and_overflowing_sizes_are_rejected() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let zero_errors = [
        DeviceBuffer::<f32>::new(&ctx, 0).unwrap_err(),
        DeviceBuffer::<f32>::new_async(&stream, 0).unwrap_err(),
        DeviceBuffer::<f32>::from_slice(&stream, &[]).unwrap_err(),
        PinnedBuffer::<u8>::new(&ctx, 0).unwrap_err(),
        UnifiedBuffer::<u64>::new(&ctx, 0).unwrap_err(),
    ];
    for err in zero_errors {
        assert!(matches!(err, Error::ZeroSize { len: 0, .. }), "{err:?}");
        assert!(
            err.to_string()
                .ends_with("would be empty: zero-length buffers are refused (docs/architecture.md#empty-buffers)"),
            "{err}"
        );
    }
    let huge = usize::MAX / 4;
    let err = DeviceBuffer::<u64>::new_async(&stream, huge).unwrap_err();
    assert!(matches!(err, Error::SizeOverflow { .. }), "{err:?}");
    assert!(err.to_string().contains(&huge.to_string()), "{err}");
    let err = PinnedBuffer::<u32>::new(&ctx, huge).unwrap_err();
    assert!(matches!(err, Error::SizeOverflow { .. }), "{err:?}");
    assert_eq!(stream.metrics().current_memory, 0);
}

#[test]
fn round_trips_through_every_kind_of_memory() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let data = XorShift::new(11).u32s(50_000);
    let input = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut a = DeviceBuffer::<u32>::new_async(&stream, data.len()).unwrap();
    let mut b = DeviceBuffer::<u32>::new(&ctx, data.len()).unwrap();
    let mut unified = UnifiedBuffer::<u32>::new(&ctx, data.len()).unwrap();
    let mut output = PinnedBuffer::<u32>::new(&ctx, data.len()).unwrap();

    stream.copy_from_host_async(&mut a, &input).unwrap();
    stream.copy_device_to_device_async(&mut b, &a).unwrap();
    stream
        .copy_device_to_device_async(&mut unified, &b)
        .unwrap();
    stream.prefetch_to_device_async(&unified).unwrap();
    stream.copy_to_host_async(&mut output, &unified).unwrap();
    stream.prefetch_to_host_async(&unified).unwrap();

    assert_eq!(output.as_slice().unwrap(), &data[..]);
    assert_eq!(unified.as_slice().unwrap(), &data[..]);
    let mut plain = vec![0u32; data.len()];
    stream.copy_to_host(&mut plain, &b).unwrap();
    assert_eq!(plain, data);
}

#[test]
fn memsets_fill_bytes_and_words() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut words = DeviceBuffer::<u32>::new_async(&stream, 1000).unwrap();
    stream.memset_u32_async(&mut words, 0xDEAD_BEEF).unwrap();
    assert!(
        words
            .to_vec(&stream)
            .unwrap()
            .iter()
            .all(|&w| w == 0xDEAD_BEEF)
    );
    stream.memset_u8_async(&mut words, 0xAB).unwrap();
    assert!(
        words
            .to_vec(&stream)
            .unwrap()
            .iter()
            .all(|&w| w == 0xABAB_ABAB)
    );

    let mut odd = DeviceBuffer::<u8>::new_async(&stream, 7).unwrap();
    let err = stream.memset_u32_async(&mut odd, 1).unwrap_err();
    assert!(
        matches!(err, Error::MisalignedMemset { bytes: 7 }),
        "{err:?}"
    );
    stream.memset_u8_async(&mut odd, 3).unwrap();
    assert_eq!(odd.to_vec(&stream).unwrap(), [3; 7]);
}

/// Holds the stream for `duration` with a host callback; returns a flag set when it ends.
fn hold(stream: &Stream, duration: Duration) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&done);
    stream
        .add_callback(move || {
            std::thread::sleep(duration);
            flag.store(true, Ordering::SeqCst);
        })
        .unwrap();
    done
}

#[test]
fn reading_a_pinned_buffer_waits_for_the_copy_that_writes_it() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let data = XorShift::new(5).u32s(100_000);
    let device = DeviceBuffer::from_slice(&stream, &data).unwrap();
    let mut output = PinnedBuffer::<u32>::new(&ctx, data.len()).unwrap();
    // The copy cannot start before the slow callback is done.
    let held = hold(&stream, Duration::from_millis(150));
    stream.copy_to_host_async(&mut output, &device).unwrap();
    // No synchronize: as_slice must wait for the copy (the buffer starts zeroed).
    assert_eq!(output.as_slice().unwrap(), &data[..]);
    assert!(held.load(Ordering::SeqCst));
}

#[test]
fn writing_a_pinned_buffer_waits_for_the_copy_that_reads_it() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let data = XorShift::new(6).u32s(100_000);
    let mut input = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stream, data.len()).unwrap();
    hold(&stream, Duration::from_millis(150));
    stream.copy_from_host_async(&mut device, &input).unwrap();
    // Reading alongside the copy is fine and does not wait...
    assert_eq!(input.as_slice().unwrap()[0], data[0]);
    // ...but overwriting must wait until the copy has read the old contents.
    input.as_mut_slice().unwrap().fill(0);
    assert_eq!(device.to_vec(&stream).unwrap(), data);
}

#[test]
fn dropping_a_pinned_buffer_waits_for_its_copies() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::from_slice(&stream, &XorShift::new(8).u32s(10_000)).unwrap();
    let mut output = PinnedBuffer::<u32>::new(&ctx, 10_000).unwrap();
    let held = hold(&stream, Duration::from_millis(150));
    stream.copy_to_host_async(&mut output, &device).unwrap();
    drop(output);
    assert!(
        held.load(Ordering::SeqCst),
        "the free waited for the copy, which waited for the callback"
    );
}
