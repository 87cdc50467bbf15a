//! Events through the driver table: cross-stream waits, completion, re-records
//! and elapsed times.

mod common;

use common::*;
use std::time::{Duration, Instant};
use sys::{CUevent_flags, CUresult};

#[test]
fn a_stream_waits_for_an_event_recorded_on_another() {
    let table = table();
    let (producer, consumer) = (Stream::new(table), Stream::new(table));
    let len = 64 * 1024;
    let data = random_bytes(0xE7E7, len);
    let source = Pinned::new(table, len);
    source.fill(&data);
    let dev = DeviceMem::new(table, len);
    let out = Pinned::new(table, len);
    // Start from a known, different content.
    // SAFETY: live allocation.
    ok(unsafe { (table.cuMemsetD8Async)(dev.ptr, 0, len, producer.raw) });
    producer.sync();

    let written = Event::new(table, CUevent_flags::CU_EVENT_DISABLE_TIMING.0);
    let read = Event::new(table, CUevent_flags::CU_EVENT_DISABLE_TIMING.0);
    let mut gate = Gate::block(table, producer.raw);
    // SAFETY: live allocation and pinned buffers of `len` bytes.
    unsafe {
        ok((table.cuMemcpyHtoDAsync)(
            dev.ptr,
            source.void(),
            len,
            producer.raw,
        ));
        written.record(producer.raw);
        ok((table.cuStreamWaitEvent)(consumer.raw, written.raw, 0));
        ok((table.cuMemcpyDtoHAsync)(
            out.void(),
            dev.ptr,
            len,
            consumer.raw,
        ));
    }
    read.record(consumer.raw);
    // The consumer is held by the producer's gate, through the event.
    expect(read.query(), CUresult::CUDA_ERROR_NOT_READY);
    expect(consumer.query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    read.sync();
    ok(written.query());
    assert_eq!(
        out.bytes(),
        &data[..],
        "the consumer read after the producer wrote"
    );
}

#[test]
fn an_event_never_recorded_is_complete_and_waiting_on_it_is_a_no_op() {
    let table = table();
    let event = Event::new(table, 0);
    ok(event.query());
    event.sync();
    let stream = Stream::new(table);
    // SAFETY: live stream and event.
    ok(unsafe { (table.cuStreamWaitEvent)(stream.raw, event.raw, 0) });
    stream.sync();
    let other = Event::new(table, 0);
    other.record(stream.raw);
    other.sync();
    let mut ms = 0.0f32;
    // SAFETY: live events, valid out-pointer.
    let code = unsafe { (table.cuEventElapsedTime)(&mut ms, event.raw, other.raw) };
    expect(code, CUresult::CUDA_ERROR_INVALID_HANDLE);
}

#[test]
fn query_is_not_ready_until_the_stream_passes_the_marker() {
    let table = table();
    let stream = Stream::new(table);
    let event = Event::new(table, 0);
    let mut gate = Gate::block(table, stream.raw);
    event.record(stream.raw);
    expect(event.query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    event.sync();
    ok(event.query());
}

#[test]
fn re_recording_moves_the_event_point() {
    let table = table();
    let stream = Stream::new(table);
    let event = Event::new(table, 0);
    event.record(stream.raw);
    event.sync();
    ok(event.query());
    let mut gate = Gate::block(table, stream.raw);
    event.record(stream.raw);
    expect(event.query(), CUresult::CUDA_ERROR_NOT_READY);
    // A wait issued now refers to the new point.
    let waiter = Stream::new(table);
    let seen = Event::new(table, 0);
    // SAFETY: live stream and event.
    ok(unsafe { (table.cuStreamWaitEvent)(waiter.raw, event.raw, 0) });
    seen.record(waiter.raw);
    expect(seen.query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    seen.sync();
    ok(event.query());
}

fn elapsed(table: &sys::Driver, start: &Event, end: &Event) -> Result<f32, CUresult> {
    let mut ms = f32::NAN;
    // SAFETY: live events, valid out-pointer.
    let code = unsafe { (table.cuEventElapsedTime)(&mut ms, start.raw, end.raw) };
    if code == CUresult::CUDA_SUCCESS {
        Ok(ms)
    } else {
        Err(code)
    }
}

#[test]
fn elapsed_times_are_monotonic_and_plausible() {
    let table = table();
    let stream = Stream::new(table);
    let marks: Vec<Event> = (0..4).map(|_| Event::new(table, 0)).collect();
    marks[0].record(stream.raw);
    for mark in &marks[1..] {
        // A 25 ms operation between consecutive marks.
        host_fn(table, stream.raw, || {
            std::thread::sleep(Duration::from_millis(25))
        });
        mark.record(stream.raw);
    }
    marks[3].sync();
    let mut previous = 0.0;
    for (i, mark) in marks.iter().enumerate().skip(1) {
        let step = elapsed(table, &marks[i - 1], mark).unwrap();
        let total = elapsed(table, &marks[0], mark).unwrap();
        // Plausible: at least the sleep (less a little for clock resolution),
        // and nowhere near a wrong unit (seconds or microseconds).
        assert!((24.0..5_000.0).contains(&step), "mark {i}: step {step} ms");
        assert!(
            total > previous,
            "elapsed time grows: {previous} then {total}"
        );
        previous = total;
    }
    assert_eq!(elapsed(table, &marks[2], &marks[2]).unwrap(), 0.0);
    let backwards = elapsed(table, &marks[3], &marks[0]).unwrap();
    assert!(
        backwards < -70.0,
        "end before start is negative: {backwards}"
    );
}

#[test]
fn elapsed_time_errors_are_cudas() {
    let table = table();
    let stream = Stream::new(table);
    let untimed = Event::new(table, CUevent_flags::CU_EVENT_DISABLE_TIMING.0);
    let (start, end) = (Event::new(table, 0), Event::new(table, 0));
    let before_start = Instant::now();
    start.record(stream.raw);
    untimed.record(stream.raw);
    stream.sync();
    // `start` has passed by now.
    let start_passed = Instant::now();
    expect(
        elapsed(table, &start, &untimed).unwrap_err(),
        CUresult::CUDA_ERROR_INVALID_HANDLE,
    );
    let mut gate = Gate::block(table, stream.raw);
    end.record(stream.raw);
    expect(
        elapsed(table, &start, &end).unwrap_err(),
        CUresult::CUDA_ERROR_NOT_READY,
    );
    // The gate holds `end` back for a while: the time measured is when the
    // stream passed each event, not when it was recorded.
    std::thread::sleep(Duration::from_millis(10));
    let opened = Instant::now();
    gate.open();
    end.sync();
    let end_passed = Instant::now();
    // Once ready, the time lies between what the host saw: at least from
    // `start` having passed to the gate opening, at most from before `start`
    // was recorded to `end` having passed (less/plus the timers' resolution).
    let ms = elapsed(table, &start, &end).unwrap();
    let at_least = opened.duration_since(start_passed).as_secs_f32() * 1000.0;
    let at_most = end_passed.duration_since(before_start).as_secs_f32() * 1000.0;
    assert!(
        (at_least - 0.01..=at_most + 0.01).contains(&ms),
        "elapsed {ms} ms, the host saw between {at_least} and {at_most} ms"
    );
}

#[test]
fn events_order_work_across_many_streams() {
    // A chain: each stream adds one to a counter after waiting for the
    // previous stream's event, so the final value proves every wait held.
    let table = table();
    let streams: Vec<Stream> = (0..8).map(|_| Stream::new(table)).collect();
    let events: Vec<Event> = (0..8)
        .map(|_| Event::new(table, CUevent_flags::CU_EVENT_DISABLE_TIMING.0))
        .collect();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut gate = Gate::block(table, streams[0].raw);
    for (i, stream) in streams.iter().enumerate() {
        if i > 0 {
            // SAFETY: live stream and event.
            ok(unsafe { (table.cuStreamWaitEvent)(stream.raw, events[i - 1].raw, 0) });
        }
        let log = std::sync::Arc::clone(&log);
        host_fn(table, stream.raw, move || log.lock().unwrap().push(i));
        events[i].record(stream.raw);
    }
    expect(events[7].query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    events[7].sync();
    assert_eq!(*log.lock().unwrap(), (0..8).collect::<Vec<_>>());
}
