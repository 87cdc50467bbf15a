//! GPU-timed durations match the work, and collecting them never stalls a
//! stream.

mod support;

use cuda_streams_profiler::StreamProfiler;
use driver::Stream;
use std::time::Duration;
use support::{Gate, ctx, fill, kernel, on_gpu, spin};

/// The least a scope holding a spin of `length` may read when its start is
/// shared with the previous scope's end and the stream may have gone idle in
/// between. The start is then the host's enqueue instant mapped onto the GPU
/// clock, late by up to the submission latency (see the profiler guide): a
/// few µs on a GPU; on the software driver a CPU thread waking up, which on a
/// loaded machine is milliseconds (a 20 ms spin was read as 17.2 ms with four
/// CPU-bound processes on two cores).
fn least_after_idle(on_a_gpu: bool, length: Duration) -> Duration {
    if on_a_gpu {
        length.mul_f64(0.9)
    } else {
        length / 2
    }
}

#[test]
fn spin_kernels_are_timed_at_their_length() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();

    // The host may fall behind between scopes, so the stream may go idle.
    let lengths = [10u64, 25, 50, 15, 40].map(Duration::from_millis);
    for length in lengths {
        let _scope = profiler.scope(&stream, format!("spin {length:?}")).unwrap();
        spin(&stream, &spin_kernel, length);
    }
    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.operation_count, lengths.len() as u64);
    for length in lengths {
        let stats = report.operations[&format!("spin {length:?}")];
        assert_eq!(stats.count, 1);
        // The kernel runs at least as long as asked, on both drivers.
        assert!(
            stats.total >= least_after_idle(ctx.is_gpu(), length),
            "a {length:?} spin was timed at {:?}",
            stats.total
        );
        // Loose on the software driver: a sleeping thread on a loaded machine.
        assert!(
            stats.total <= length * 4 + Duration::from_millis(50),
            "a {length:?} spin was timed at {:?}",
            stats.total
        );
        if on_gpu(&ctx, "spin timed within [0.9x, 1.5x]") {
            assert!(
                stats.total <= length.mul_f64(1.5),
                "a {length:?} spin was timed at {:?} on the GPU",
                stats.total
            );
        }
    }
    // Sequential on one stream: the busy time is the sum, within the gaps.
    let sum: Duration = lengths.iter().sum();
    assert!(report.busy_time >= sum.mul_f64(0.9), "{report}");
    assert_eq!(report.total_time, report.busy_time);
    assert_eq!(report.kernel_launches, lengths.len() as u64);
}

#[test]
fn overlapping_streams_show_in_overlap_and_concurrency() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let streams: Vec<_> = (0..4).map(|_| Stream::new(&ctx).unwrap()).collect();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    const LENGTH: Duration = Duration::from_millis(40);
    // Hold every stream at a gate so the spins start together when it opens.
    let gates: Vec<Gate> = streams.iter().map(|s| Gate::close(s)).collect();
    for stream in &streams {
        profiler
            .time(stream, "spin", |s| spin(s, &spin_kernel, LENGTH))
            .unwrap();
    }
    gates.into_iter().for_each(Gate::open);

    let report = profiler.get_comprehensive_report();
    assert_eq!(report.total_streams, 4);
    for s in &report.streams {
        assert!(s.busy_time >= LENGTH.mul_f64(0.9), "{report}");
    }
    // Busy 4 x 40 ms within a span well under 4 x 40 ms.
    assert!(report.overlap_efficiency > 1.5, "{report}");
    assert!(report.max_concurrency >= 2, "{report}");
    let histogram_total: Duration = report.concurrency.iter().sum();
    let diff = histogram_total.abs_diff(report.wall_span);
    assert!(diff <= Duration::from_micros(1), "{report}");
    if on_gpu(&ctx, "four spins run side by side") {
        assert_eq!(report.max_concurrency, 4, "{report}");
        assert!(report.overlap_efficiency > 3.0, "{report}");
    }
}

#[test]
fn closing_scopes_never_waits_for_the_gpu() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut buf = driver::DeviceBuffer::<f32>::new_async(&stream, 256).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();

    let gate = Gate::close(&stream);
    // More than one resolve batch, all behind the gate.
    for i in 0..200 {
        let _scope = profiler.scope(&stream, "fill").unwrap();
        fill(&stream, &fill_kernel, i as f32, &mut buf);
    }
    // Had any scope synchronized, this thread would still be blocked at the
    // gate; the stream has not even reached the first fill.
    assert!(
        !stream.query().unwrap(),
        "the stream was drained by the profiler"
    );
    gate.open();

    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.operations["fill"].count, 200);
    assert_eq!(report.kernel_launches, 200);
    assert_eq!(report.unresolved, 0);
    assert_eq!(buf.to_vec(&stream).unwrap(), vec![199.0; 256]);
    // Back-to-back scopes share their boundary events, and resolved events go
    // back to the pool: far fewer than 400 events were ever needed.
    let usage = profiler.pool().utilization();
    let (free, in_use) = (usage.available_timing, usage.in_use);
    assert!(free + in_use <= 260, "{:?}", profiler.pool().utilization());
}

#[test]
fn times_are_on_one_timeline_across_streams() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();

    profiler
        .time(&a, "first", |s| {
            spin(s, &spin_kernel, Duration::from_millis(30))
        })
        .unwrap();
    // b waits for a with an event, so b's work starts after a's ends.
    let done = a.record_event().unwrap();
    b.wait_event(&done).unwrap();
    profiler
        .time(&b, "second", |s| {
            spin(s, &spin_kernel, Duration::from_millis(5))
        })
        .unwrap();

    let report = profiler.get_comprehensive_report();
    let ra = report.stream(a.id()).unwrap();
    let rb = report.stream(b.id()).unwrap();
    assert!(
        rb.first_start.unwrap() >= ra.last_end.unwrap(),
        "b started at {:?}, before a ended at {:?}",
        rb.first_start,
        ra.last_end
    );
    assert!(report.overlap_efficiency <= 1.01, "{report}");
    assert_eq!(report.max_concurrency, 1, "{report}");
}

#[test]
fn idle_time_before_a_scope_is_not_counted_in_it() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    // Long against the submission latency (`least_after_idle`), short
    // against the idle gap.
    const LENGTH: Duration = Duration::from_millis(20);
    const IDLE: Duration = Duration::from_millis(150);
    profiler
        .time(&stream, "first", |s| spin(s, &spin_kernel, LENGTH))
        .unwrap();
    // The stream passes the first scope's end and sits idle while the host
    // does something else (the sleep *is* that something: it makes the gap).
    stream.synchronize().unwrap();
    std::thread::sleep(IDLE);
    // Nothing was enqueued since the first scope's end, but the stream went
    // idle: the second scope must start where its own work starts.
    profiler
        .time(&stream, "second", |s| spin(s, &spin_kernel, LENGTH))
        .unwrap();
    let report = profiler.get_stream_report(&stream).unwrap();
    let second = report.operations["second"];
    assert!(
        second.total >= least_after_idle(ctx.is_gpu(), LENGTH),
        "the second spin was timed at {:?}",
        second.total
    );
    assert!(
        second.total < IDLE / 2,
        "the second scope counted the idle gap before it: {:?}",
        second.total
    );
    // Back-to-back on a busy stream, the end of one is still the start of the
    // next (the GPU goes straight from one to the other).
    let gate = Gate::close(&stream);
    for name in ["third", "fourth"] {
        profiler
            .time(&stream, name, |s| spin(s, &spin_kernel, LENGTH))
            .unwrap();
    }
    gate.open();
    let report = profiler.get_stream_report(&stream).unwrap();
    for name in ["third", "fourth"] {
        let stats = report.operations[name];
        assert!(
            stats.total >= LENGTH.mul_f64(0.9),
            "{name}: {:?}",
            stats.total
        );
        assert!(stats.total < IDLE / 2, "{name}: {:?}", stats.total);
    }
}
