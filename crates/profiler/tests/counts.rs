//! Counts match the work done; disabled profiling records nothing; durations
//! recorded by hand give exact statistics.

mod support;

use cuda_streams_profiler::StreamProfiler;
use driver::EventPool;
use driver::{DeviceBuffer, PinnedBuffer, Stream};
use std::sync::Arc;
use std::time::Duration;
use support::{XorShift, ctx, fill, kernel};

#[test]
fn launches_and_transfers_through_the_driver_layer_are_counted() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut buf = DeviceBuffer::<f32>::new_async(&stream, 1000).unwrap();
    let host = PinnedBuffer::from_slice(&ctx, &[1.5f32; 1000]).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();

    // Before the profiler is enabled and has seen the stream: not counted.
    fill(&stream, &fill_kernel, 1.0, &mut buf);
    profiler.enable();
    // Some inside scopes, some not: all counted.
    profiler
        .time(&stream, "upload", |s| {
            s.copy_from_host_async(&mut buf, &host)
        })
        .unwrap()
        .unwrap();
    for i in 0..7 {
        if i % 2 == 0 {
            let _scope = profiler.scope(&stream, "fill").unwrap();
            fill(&stream, &fill_kernel, i as f32, &mut buf);
        } else {
            fill(&stream, &fill_kernel, i as f32, &mut buf);
        }
    }
    let mut back = PinnedBuffer::<f32>::new(&ctx, 1000).unwrap();
    stream.copy_to_host_async(&mut back, &buf).unwrap();
    // Work outside our API, reported by hand.
    profiler.record_kernel_launch(&stream);
    profiler.record_memory_transfer(&stream, 64);

    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.stream_id, stream.id());
    assert_eq!(report.kernel_launches, 7 + 1);
    assert_eq!(report.memory_transfers, 2 + 1);
    assert_eq!(report.bytes_transferred, 2 * 4000 + 64);
    assert_eq!(report.operations["fill"].count, 4);
    assert_eq!(report.operations["upload"].count, 1);
    assert_eq!(report.operation_count, 5);
    assert_eq!(back.as_slice().unwrap(), &[6.0f32; 1000][..]);
}

#[test]
fn disabled_profiling_records_nothing() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut buf = DeviceBuffer::<f32>::new_async(&stream, 64).unwrap();
    let pool = Arc::new(EventPool::new(&ctx, 0, 4).unwrap());
    let profiler = StreamProfiler::with_pool(Arc::clone(&pool));
    assert!(!profiler.is_enabled(), "a new profiler starts disabled");

    for i in 0..10 {
        let scope = profiler.scope(&stream, "fill").unwrap();
        assert!(!scope.is_active());
        fill(&stream, &fill_kernel, i as f32, &mut buf);
    }
    let value = profiler
        .time(&stream, "closure", |_| 42)
        .expect("an inert scope cannot fail");
    assert_eq!(value, 42);
    profiler.record_operation(&stream, "op", Duration::from_millis(1));
    profiler.record_kernel_launch(&stream);
    profiler.record_memory_transfer(&stream, 100);

    assert!(profiler.get_stream_report(&stream).is_none());
    let report = profiler.get_comprehensive_report();
    assert_eq!(report.total_streams, 0);
    assert_eq!(report.total_operations, 0);
    assert!(!profiler.to_chrome_trace().unwrap().contains(r#""ph":"X""#));
    // No event was taken from the pool, none was created.
    let usage = pool.utilization();
    assert_eq!((usage.available_timing, usage.in_use), (4, 0));
    assert_eq!(pool.growth_count(), 0);
    stream.synchronize().unwrap();
}

#[test]
fn only_enabled_periods_are_counted() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut buf = DeviceBuffer::<f32>::new_async(&stream, 64).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();

    profiler.enable();
    profiler
        .time(&stream, "a", |s| fill(s, &fill_kernel, 1.0, &mut buf))
        .unwrap();
    profiler.disable();
    for _ in 0..5 {
        profiler
            .time(&stream, "b", |s| fill(s, &fill_kernel, 2.0, &mut buf))
            .unwrap();
    }
    profiler.record_kernel_launch(&stream);
    profiler.enable();
    fill(&stream, &fill_kernel, 3.0, &mut buf);
    fill(&stream, &fill_kernel, 4.0, &mut buf);

    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.kernel_launches, 1 + 2, "{report}");
    assert_eq!(report.operation_count, 1);
    assert!(!report.operations.contains_key("b"));
}

#[test]
fn recorded_durations_give_exact_statistics() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    let mut rng = XorShift::new(0x9e37_79b9);
    let mut durations: Vec<u64> = (0..1000).map(|_| rng.range(1_000, 5_000_000)).collect();
    for &ns in &durations {
        profiler.record_operation(&stream, "matmul", Duration::from_nanos(ns));
    }
    profiler.record_operation(&stream, "other", Duration::from_micros(3));

    let report = profiler.get_stream_report(&stream).unwrap();
    durations.sort_unstable();
    let s = report.operations["matmul"];
    let total: u64 = durations.iter().sum();
    assert_eq!(s.count, 1000);
    assert_eq!(s.total, Duration::from_nanos(total));
    assert_eq!(s.mean, Duration::from_nanos(total / 1000));
    assert_eq!(s.min, Duration::from_nanos(durations[0]));
    assert_eq!(s.max, Duration::from_nanos(durations[999]));
    // Nearest rank: the 500th and 990th smallest.
    assert_eq!(s.p50, Duration::from_nanos(durations[499]));
    assert_eq!(s.p99, Duration::from_nanos(durations[989]));
    assert_eq!(report.operation_count, 1001);
    assert_eq!(report.total_time, Duration::from_nanos(total + 3_000));
    // Recorded durations have no place on the timeline.
    assert_eq!(report.busy_time, Duration::ZERO);
    assert_eq!(report.first_start, None);
}

#[test]
fn many_threads_profile_their_own_streams_at_once() {
    let ctx = ctx();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    let streams: Vec<_> = (0..6).map(|_| Stream::new(&ctx).unwrap()).collect();
    std::thread::scope(|scope| {
        for (t, stream) in streams.iter().enumerate() {
            let (profiler, fill_kernel) = (&profiler, &fill_kernel);
            scope.spawn(move || {
                let mut buf = DeviceBuffer::<f32>::new_async(stream, 128).unwrap();
                for i in 0..(50 + 10 * t) {
                    let _outer = profiler.scope(stream, "outer").unwrap();
                    let _inner = profiler.scope(stream, "inner").unwrap();
                    fill(stream, fill_kernel, i as f32, &mut buf);
                }
            });
        }
    });
    let report = profiler.get_comprehensive_report();
    assert_eq!(report.total_streams, 6);
    assert_eq!(report.errors, 0);
    for (t, stream) in streams.iter().enumerate() {
        let r = report.stream(stream.id()).unwrap();
        let n = 50 + 10 * t as u64;
        assert_eq!(r.kernel_launches, n);
        assert_eq!(r.operations["outer"].count, n);
        assert_eq!(r.operations["inner"].count, n);
        // Nothing is enqueued between the scopes' boundaries, so they share
        // them, unless a thread was held up between opening the two (six
        // threads here on however many cores): then the outer one starts
        // earlier. Either way it contains the inner one.
        assert!(
            r.operations["outer"].total >= r.operations["inner"].total,
            "{r}"
        );
    }
}

#[test]
fn a_capped_pool_is_enough_for_many_scopes() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut buf = DeviceBuffer::<f32>::new_async(&stream, 64).unwrap();
    let pool = Arc::new(EventPool::with_capacity_limit(&ctx, 0, 2, 6).unwrap());
    let profiler = StreamProfiler::with_pool(Arc::clone(&pool));
    profiler.enable();
    for i in 0..100 {
        let _scope = profiler.scope(&stream, "fill").unwrap();
        fill(&stream, &fill_kernel, i as f32, &mut buf);
    }
    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.operations["fill"].count, 100);
    assert_eq!(profiler.error_count(), 0);
}

#[test]
fn sampling_times_every_nth_scope_and_counts_them_all() {
    let ctx = ctx();
    let streams: Vec<_> = (0..4).map(|_| Stream::new(&ctx).unwrap()).collect();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut bufs: Vec<_> = streams
        .iter()
        .map(|s| DeviceBuffer::<f32>::new_async(s, 64).unwrap())
        .collect();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    let sampler = profiler.sampler("fill", 7).unwrap();
    assert_eq!((sampler.name(), sampler.every()), ("fill", 7));

    // Disabled: inert and not counted.
    for i in 0..10 {
        let _scope = sampler.scope(&streams[i % 4]).unwrap();
        fill(&streams[i % 4], &fill_kernel, 0.0, &mut bufs[i % 4]);
    }
    profiler.enable();
    const SCOPES: usize = 1003;
    for i in 0..SCOPES {
        let s = i % 4;
        let scope = sampler.scope(&streams[s]).unwrap();
        fill(&streams[s], &fill_kernel, i as f32, &mut bufs[s]);
        scope.finish().unwrap();
    }
    // A plain scope of the same name counts (and is timed) as one more.
    profiler
        .time(&streams[0], "fill", |s| {
            fill(s, &fill_kernel, 0.5, &mut bufs[0])
        })
        .unwrap();

    let report = profiler.get_comprehensive_report();
    let mut total = 0;
    for (s, stream) in streams.iter().enumerate() {
        let calls = (SCOPES / 4 + usize::from(s < SCOPES % 4)) as u64;
        let timed = calls.div_ceil(7);
        let extra = u64::from(s == 0);
        let stats = report.stream(stream.id()).unwrap().operations["fill"];
        assert_eq!(stats.count, calls + extra, "stream {s}");
        assert_eq!(stats.timed, timed + extra, "stream {s}");
        assert!(stats.total > Duration::ZERO);
        total += stats.count;
        // Every launch was counted too, sampled or not.
        assert_eq!(
            report.stream(stream.id()).unwrap().kernel_launches,
            calls + extra
        );
    }
    assert_eq!(total, SCOPES as u64 + 1);
    assert_eq!(profiler.error_count(), 0);

    let err = profiler.sampler("never", 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"sampler "never": one scope in 0 cannot be timed; every must be at least 1"#
    );
}

/// A stream dropped before the report (a pipeline's, dropped with the
/// pipeline) keeps the launches and transfers of its scopes: the profiler
/// holds streams weakly, so it reads their counters as each scope closes.
#[test]
fn a_stream_dropped_before_the_report_keeps_its_counts() {
    let ctx = ctx();
    let fill_kernel = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let host = PinnedBuffer::from_slice(&ctx, &[1.5f32; 256]).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    let id = {
        let stream = Stream::new(&ctx).unwrap();
        let mut buf = DeviceBuffer::<f32>::new_async(&stream, 256).unwrap();
        for i in 0..3 {
            let _step = profiler.scope(&stream, "step").unwrap();
            stream.copy_from_host_async(&mut buf, &host).unwrap();
            fill(&stream, &fill_kernel, i as f32, &mut buf);
        }
        stream.synchronize().unwrap();
        stream.id()
    };
    let report = profiler.get_comprehensive_report();
    let stream = report
        .stream(id)
        .expect("a dropped stream is still reported");
    assert_eq!(stream.operations["step"].count, 3, "{report}");
    assert_eq!(
        (
            stream.kernel_launches,
            stream.memory_transfers,
            stream.bytes_transferred
        ),
        (3, 3, 3 * 1024),
        "{report}"
    );
}
