//! The typed wrappers give the CPU reference's results through whichever
//! driver is selected, and refuse buffers whose lengths do not match.

use cuda_streams_kernels::driver::{Context, DeviceBuffer, Error, Stream, UnifiedBuffer};
use cuda_streams_kernels::reference;
use cuda_streams_kernels::typed::{Compute, Elementwise, Reduce, Timing};
use std::time::Duration;

/// Not a multiple of the block size, so bounds matter.
const N: usize = 4099;

/// Deterministic inputs in [-1, 1), never zero.
fn f32s(seed: u32, n: usize) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let bits = (i ^ seed).wrapping_mul(2_654_435_761) >> 9;
            let v = bits as f32 / (1u32 << 23) as f32 - 1.0;
            if v == 0.0 { 0.5 } else { v }
        })
        .collect()
}

#[test]
fn elementwise_wrappers_match_the_reference() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let k = Elementwise::load(&ctx).unwrap();
    let (x, y) = (f32s(1, N), f32s(2, N));
    let dx = DeviceBuffer::from_slice(&stream, &x).unwrap();
    let mut dy = DeviceBuffer::from_slice(&stream, &y).unwrap();

    k.saxpy(&stream, 0.75, &dx, &mut dy).unwrap();
    let mut expected = y.clone();
    reference::saxpy(0.75, &x, &mut expected);
    assert_eq!(dy.to_vec(&stream).unwrap(), expected);

    let mut out = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    k.scale_add(&stream, 1.5, &dx, -0.25, &dy, &mut out)
        .unwrap();
    let mut expected_out = vec![0.0; N];
    reference::scale_add(1.5, &x, -0.25, &expected, &mut expected_out);
    assert_eq!(out.to_vec(&stream).unwrap(), expected_out);

    k.fill_f32(&stream, 3.5, &mut out).unwrap();
    assert!(out.to_vec(&stream).unwrap().iter().all(|&v| v == 3.5));
    // Unified memory is device memory too; the host reads it after the write.
    let mut words = UnifiedBuffer::<u32>::new(&ctx, N).unwrap();
    k.fill_u32(&stream, 0xABCD, &mut words).unwrap();
    assert!(words.as_slice().unwrap().iter().all(|&v| v == 0xABCD));
}

#[test]
fn mismatched_lengths_are_refused_naming_both() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let k = Elementwise::load(&ctx).unwrap();
    let short = DeviceBuffer::from_slice(&stream, &f32s(3, N - 1)).unwrap();
    let mut y = DeviceBuffer::from_slice(&stream, &f32s(4, N)).unwrap();
    let before = y.to_vec(&stream).unwrap();
    let err = k.saxpy(&stream, 2.0, &short, &mut y).unwrap_err();
    assert!(
        matches!(err, Error::SizeMismatch { expected: N, actual, .. } if actual == N - 1),
        "{err:?}"
    );
    let mut out = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    let err = k
        .scale_add(&stream, 1.0, &y, 1.0, &short, &mut out)
        .unwrap_err();
    assert!(err.to_string().contains("scale_add (y)"), "{err}");
    assert_eq!(y.to_vec(&stream).unwrap(), before, "nothing was launched");
    assert_eq!(stream.metrics().kernel_launches, 0);
}

#[test]
fn checksum_and_compute_wrappers_match_the_reference() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let data: Vec<u32> = (0..N as u32).map(|i| i.wrapping_mul(40_503) | 1).collect();
    let ddata = DeviceBuffer::from_slice(&stream, &data).unwrap();
    let mut sum = DeviceBuffer::<u64>::zeroed_async(&stream, 1).unwrap();
    Reduce::load(&ctx)
        .unwrap()
        .checksum(&stream, &ddata, &mut sum)
        .unwrap();
    assert_eq!(sum.to_vec(&stream).unwrap(), [reference::checksum(&data)]);

    let x = f32s(5, N);
    let dx = DeviceBuffer::from_slice(&stream, &x).unwrap();
    let mut dy = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    Compute::load(&ctx)
        .unwrap()
        .compute(&stream, 17, &dx, &mut dy)
        .unwrap();
    let mut expected = vec![0.0; N];
    reference::compute(17, &x, &mut expected);
    assert_eq!(dy.to_vec(&stream).unwrap(), expected);
}

#[test]
fn spin_keeps_the_stream_busy_for_its_duration() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let start = std::time::Instant::now();
    Timing::load(&ctx)
        .unwrap()
        .spin(&stream, Duration::from_millis(20))
        .unwrap();
    stream.synchronize().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(20));
}
