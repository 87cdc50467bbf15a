//! Events: query and synchronize follow the stream, elapsed time needs timing
//! events, and `wait_event` orders work across streams.

mod support;

use cuda_streams_driver::{
    DeviceBuffer, Error, Event, EventFlags, KernelArg, LaunchConfig, Stream,
};
use std::time::Duration;
use support::{GATE_LIMIT, Gate, ctx, kernel, serial, spin};

#[test]
fn an_event_completes_when_the_stream_passes_it() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let event = Event::plain(&ctx).unwrap();
    assert!(
        event.query().unwrap(),
        "never recorded: complete, as in CUDA"
    );
    let gate = Gate::close_within(&stream, GATE_LIMIT);
    spin(&stream, &spin_kernel, Duration::from_millis(100));
    event.record(&stream).unwrap();
    let passed = event.query().unwrap();
    if gate.still_held() {
        assert!(!passed, "the stream is held before the event");
    }
    gate.open();
    event.synchronize().unwrap();
    assert!(event.query().unwrap());
    // Re-recording moves the mark.
    let gate = Gate::close_within(&stream, GATE_LIMIT);
    event.record(&stream).unwrap();
    let passed = event.query().unwrap();
    if gate.still_held() {
        assert!(!passed, "the new mark is behind the gate");
    }
    gate.open();
    stream.synchronize().unwrap();
    assert!(event.query().unwrap());
}

#[test]
fn elapsed_time_needs_recorded_timing_events() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let plain = Event::new(&ctx, EventFlags::PLAIN).unwrap();
    let (start, end) = (Event::timing(&ctx).unwrap(), Event::timing(&ctx).unwrap());
    assert!(matches!(
        Event::elapsed(&start, &end),
        Err(Error::EventNotRecorded { which: "start" })
    ));
    start.record(&stream).unwrap();
    spin(&stream, &spin_kernel, Duration::from_millis(50));
    end.record(&stream).unwrap();
    plain.record(&stream).unwrap();
    end.synchronize().unwrap();

    let elapsed = Event::elapsed(&start, &end).unwrap();
    assert!(elapsed >= Duration::from_millis(40), "{elapsed:?}");
    let err = Event::elapsed(&start, &plain).unwrap_err();
    assert!(
        matches!(err, Error::NotTimingEvent { which: "end" }),
        "{err:?}"
    );
    assert!(err.to_string().contains("without timing"), "{err}");
}

#[test]
fn wait_event_orders_work_across_streams() {
    let _serial = serial();
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    const N: usize = 4096;
    // Plain allocations, so nothing but the event orders B after A.
    let mut shared = DeviceBuffer::<u32>::new(&ctx, N).unwrap();
    b.memset_u32_async(&mut shared, 1).unwrap();
    b.synchronize().unwrap();
    let mut seen = DeviceBuffer::<u32>::new(&ctx, N).unwrap();

    spin(&a, &spin_kernel, Duration::from_millis(200));
    let args = [KernelArg::from(N as u64), 7u32.into(), (&mut shared).into()];
    a.launch(&fill, LaunchConfig::for_num_elems(N as u32), &args)
        .unwrap();
    let filled = a.record_event().unwrap();
    b.wait_event(&filled).unwrap();
    b.copy_device_to_device_async(&mut seen, &shared).unwrap();

    assert!(
        seen.to_vec(&b).unwrap().iter().all(|&v| v == 7),
        "B copied after A's fill"
    );
}

#[test]
fn events_from_another_context_are_refused() {
    let _serial = serial();
    // Only one device may exist; the check itself is visible with a second driver.
    let ctx = ctx();
    let other_kind = match ctx.kind() {
        cuda_streams_driver::DriverKind::Cuda => cuda_streams_driver::DriverChoice::Soft,
        cuda_streams_driver::DriverKind::Soft => {
            eprintln!("skipped: needs a second driver (run with CUDA_STREAMS_DRIVER=cuda)");
            return;
        }
    };
    let other = cuda_streams_driver::Context::with_driver(
        cuda_streams_driver::select(other_kind).unwrap(),
        0,
    )
    .unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let foreign = Event::plain(&other).unwrap();
    assert!(matches!(
        foreign.record(&stream),
        Err(Error::ContextMismatch { .. })
    ));
}

/// `is_known_complete` says what a host wait or a query saw, without a
/// driver call, and only until the event is recorded again.
#[test]
fn an_event_is_known_complete_only_from_a_wait_or_query_since_its_latest_record() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let event = Event::plain(&ctx).unwrap();
    assert!(
        event.is_known_complete(),
        "never recorded: complete, as in CUDA"
    );

    let gate = Gate::close_within(&stream, GATE_LIMIT);
    event.record(&stream).unwrap();
    assert!(!event.is_known_complete(), "recorded since: not known");
    let passed = event.query().unwrap();
    if gate.still_held() {
        assert!(!passed);
        assert!(!event.is_known_complete(), "a query that found it pending");
    }
    gate.open();
    // The stream's own wait does not go through the event: still not known.
    stream.synchronize().unwrap();
    assert!(!event.is_known_complete());
    event.synchronize().unwrap();
    assert!(event.is_known_complete(), "after its host wait");

    event.record(&stream).unwrap();
    assert!(!event.is_known_complete(), "a new record");
    stream.synchronize().unwrap();
    assert!(event.query().unwrap());
    assert!(
        event.is_known_complete(),
        "after a query that found it complete"
    );
}
