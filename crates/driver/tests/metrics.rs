//! Stream metrics count exactly what the stream's methods did.

mod support;

use cuda_streams_driver::{DeviceBuffer, Event, KernelArg, LaunchConfig, PinnedBuffer, Stream};
use std::time::Duration;
use support::{XorShift, ctx, kernel, spin};

#[test]
fn metrics_count_what_was_done() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let data = XorShift::new(21).u32s(256);

    let input = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut output = PinnedBuffer::<u32>::new(&ctx, 256).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stream, 256).unwrap(); // 1 KiB
    let mut second = DeviceBuffer::<u32>::new_async(&stream, 256).unwrap(); // 1 KiB

    stream.copy_from_host_async(&mut device, &input).unwrap(); // transfer 1
    stream
        .copy_device_to_device_async(&mut second, &device)
        .unwrap(); // transfer 2
    stream.copy_to_host_async(&mut output, &second).unwrap(); // transfer 3
    stream.memset_u32_async(&mut device, 0).unwrap(); // operation
    for value in 0..3u32 {
        let args = [KernelArg::from(256u64), value.into(), (&mut device).into()];
        stream
            .launch(&fill, LaunchConfig::for_num_elems(256), &args)
            .unwrap();
    }
    stream.add_callback(|| {}).unwrap();
    stream.add_callback(|| {}).unwrap();
    let event = other.record_event().unwrap();
    stream.wait_event(&event).unwrap();
    stream.record_kernel_launch(); // done outside the API
    stream.record_memory_transfer(100);
    stream.synchronize().unwrap();

    let m = stream.metrics();
    assert_eq!(m.stream_id, stream.id());
    assert_eq!(m.memory_transfers, 4);
    assert_eq!(m.bytes_transferred, 3 * 1024 + 100);
    assert_eq!(m.kernel_launches, 4);
    assert_eq!(m.callbacks, 2);
    assert_eq!(m.callback_panics, 0);
    // 3 copies + memset + 3 launches + 2 callbacks + wait + 2 recorded.
    assert_eq!(m.operations_count, 12);
    assert_eq!((m.current_memory, m.peak_memory), (2048, 2048));
    assert_eq!(
        other.metrics().operations_count,
        0,
        "records are not counted"
    );
    assert_eq!(output.as_slice().unwrap(), &data[..]);

    drop(second);
    stream.update_peak_memory(1000); // below the peak: no change
    let m = stream.metrics();
    assert_eq!((m.current_memory, m.peak_memory), (1024, 2048));
    stream.update_peak_memory(1 << 20);
    assert_eq!(stream.metrics().peak_memory, 1 << 20);
}

#[test]
fn latency_comes_from_timing_events() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    assert_eq!(stream.metrics().average_latency, None);

    const SPIN: Duration = Duration::from_millis(40);
    for _ in 0..2 {
        stream
            .timed(|s| {
                spin(s, &spin_kernel, SPIN);
                Ok(())
            })
            .unwrap();
    }
    stream.synchronize().unwrap();
    let m = stream.metrics();
    assert_eq!(m.timed_operations, 2);
    let average = m.average_latency.unwrap();
    assert!(
        average >= SPIN * 3 / 4,
        "GPU time {average:?} for a {SPIN:?} spin"
    );
    assert!(m.total_latency >= average * 2);

    // Callers with their own timing events add theirs.
    let (start, end) = (Event::timing(&ctx).unwrap(), Event::timing(&ctx).unwrap());
    start.record(&stream).unwrap();
    spin(&stream, &spin_kernel, SPIN);
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    stream.record_latency(Event::elapsed(&start, &end).unwrap());
    assert_eq!(stream.metrics().timed_operations, 3);
}
