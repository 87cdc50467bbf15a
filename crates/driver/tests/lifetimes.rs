//! A buffer used on a second stream is not freed before that stream's work is
//! done, proven with data: stream B reads the buffer slowly (a spin kernel,
//! then the reader) while its home stream A drops it and then allocates and
//! overwrites new memory. A premature free would hand the same memory back to
//! A and B would read the overwrite. A gate (a host callback the test opens)
//! in front of B's work makes "B has not read yet" certain, not a matter of
//! timing.

mod support;

use cuda_streams_driver::{DeviceBuffer, Stream};
use kernels::reference;
use std::sync::Arc;
use std::time::Duration;
use support::{GATE_LIMIT, Gate, XorShift, checksum, ctx, kernel, serial, spin};

const N: usize = 1 << 16;
const SLOW: Duration = Duration::from_millis(300);

/// Allocate buffers like the dropped one on `stream` and overwrite them.
fn clobber(stream: &Arc<Stream>) -> Vec<DeviceBuffer<u32>> {
    (0..8)
        .map(|_| {
            let mut junk = DeviceBuffer::<u32>::new_async(stream, N).unwrap();
            stream.memset_u32_async(&mut junk, 0xDEAD_BEEF).unwrap();
            junk
        })
        .collect()
}

#[test]
fn a_kernel_on_another_stream_keeps_the_buffer_alive() {
    let _serial = serial();
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let checksum_kernel = kernel(&ctx, &kernels::REDUCE, "checksum");
    let data = XorShift::new(0xFEED).u32s(N);

    let input = DeviceBuffer::from_slice(&a, &data).unwrap(); // home: A
    let mut sum = DeviceBuffer::<u64>::zeroed_async(&b, 1).unwrap(); // home: B
    let gate = Gate::close_within(&b, GATE_LIMIT);
    spin(&b, &spin_kernel, SLOW);
    checksum(&b, &checksum_kernel, &input, &mut sum);
    assert_eq!(input.foreign_stream_count(), 1);

    drop(input); // A must wait for B's checksum before freeing.
    let junk = clobber(&a);
    let idle = b.query().unwrap();
    if gate.still_held() {
        assert!(!idle, "B has not read the buffer yet");
    }
    gate.open();

    assert_eq!(sum.to_vec(&b).unwrap(), [reference::checksum(&data)]);
    a.synchronize().unwrap();
    assert!(
        junk[0]
            .to_vec(&a)
            .unwrap()
            .iter()
            .all(|&w| w == 0xDEAD_BEEF)
    );
}

#[test]
fn a_copy_on_another_stream_keeps_the_buffer_alive() {
    let _serial = serial();
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let data = XorShift::new(0xBEEF).u32s(N);

    let source = DeviceBuffer::from_slice(&a, &data).unwrap();
    let mut copy = DeviceBuffer::<u32>::new_async(&b, N).unwrap();
    let gate = Gate::close_within(&b, GATE_LIMIT);
    spin(&b, &spin_kernel, SLOW);
    b.copy_device_to_device_async(&mut copy, &source).unwrap();
    drop(source);
    let _junk = clobber(&a);
    let idle = b.query().unwrap();
    if gate.still_held() {
        assert!(!idle, "B has not copied yet");
    }
    gate.open();
    assert_eq!(copy.to_vec(&b).unwrap(), data);
}

#[test]
fn the_free_waits_for_every_stream_that_used_the_buffer() {
    let _serial = serial();
    let ctx = ctx();
    let home = Stream::new(&ctx).unwrap();
    let users: Vec<_> = (0..3).map(|_| Stream::new(&ctx).unwrap()).collect();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let checksum_kernel = kernel(&ctx, &kernels::REDUCE, "checksum");
    let data = XorShift::new(0xABCD).u32s(N);
    let input = DeviceBuffer::from_slice(&home, &data).unwrap();

    let (mut sums, mut gates) = (Vec::new(), Vec::new());
    for (i, stream) in users.iter().enumerate() {
        let mut sum = DeviceBuffer::<u64>::zeroed_async(stream, 1).unwrap();
        // Each stream reads twice; the free must wait for the second read.
        checksum(stream, &checksum_kernel, &input, &mut sum);
        gates.push(Gate::close_within(stream, GATE_LIMIT));
        spin(stream, &spin_kernel, SLOW * (i as u32 + 1) / 2);
        checksum(stream, &checksum_kernel, &input, &mut sum);
        sums.push(sum);
    }
    assert_eq!(input.foreign_stream_count(), 3);
    drop(input);
    let _junk = clobber(&home);
    let idle = home.query().unwrap();
    if gates[0].still_held() {
        assert!(!idle, "the free waits behind the gates");
    }
    gates.into_iter().for_each(Gate::open);

    let expected = reference::checksum(&data).wrapping_mul(2);
    for (sum, stream) in sums.iter().zip(&users) {
        assert_eq!(sum.to_vec(stream).unwrap(), [expected]);
    }
}

#[test]
fn a_plain_allocation_waits_on_the_host_before_freeing() {
    let _serial = serial();
    let ctx = ctx();
    let b = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let checksum_kernel = kernel(&ctx, &kernels::REDUCE, "checksum");
    let data = XorShift::new(0x1234).u32s(N);

    let mut input = DeviceBuffer::<u32>::new(&ctx, N).unwrap(); // cuMemAlloc: no home stream
    assert!(!input.is_stream_ordered());
    b.copy_from_host(&mut input, &data).unwrap();
    let mut sum = DeviceBuffer::<u64>::zeroed_async(&b, 1).unwrap();
    spin(&b, &spin_kernel, SLOW);
    checksum(&b, &checksum_kernel, &input, &mut sum);
    drop(input);
    assert!(
        b.query().unwrap(),
        "the drop waited on the host for B's last use (after the spin)"
    );
    let junk: Vec<_> = (0..4)
        .map(|_| {
            let mut j = DeviceBuffer::<u32>::new(&ctx, N).unwrap();
            b.memset_u32_async(&mut j, 0xDEAD_BEEF).unwrap();
            j
        })
        .collect();
    assert_eq!(sum.to_vec(&b).unwrap(), [reference::checksum(&data)]);
    drop(junk);
}

#[test]
fn the_home_stream_may_drop_first_and_the_buffer_keeps_it_alive() {
    let _serial = serial();
    let ctx = ctx();
    let b = Stream::new(&ctx).unwrap();
    let data = XorShift::new(77).u32s(1000);
    let buffer = {
        let home = Stream::new(&ctx).unwrap();
        DeviceBuffer::from_slice(&home, &data).unwrap()
    };
    // The home stream lives on inside the buffer.
    assert_eq!(buffer.to_vec(&b).unwrap(), data);
    assert_eq!(Arc::strong_count(buffer.home_stream().unwrap()), 1);
}
