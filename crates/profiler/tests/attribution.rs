//! A scope's GPU time is its own work: not the waits that order it on other
//! streams, not work enqueued before it, and a copy is timed as the copy.
//!
//! Each test puts a long piece of foreign time (another stream's spin, or
//! unscoped work) right before a scope holding a kernel of known length or a
//! copy of known size, and checks the scope reports the latter. The software
//! driver times with host clocks on a shared machine, so the bounds are
//! relative and generous; the foreign time is far above them.

mod support;

use cuda_streams_profiler::StreamProfiler;
use driver::{DeviceBuffer, PinnedBuffer, Stream};
use std::time::Duration;
use support::{ctx, kernel, on_gpu, spin};

/// The foreign time: long against the work and against host noise.
const FOREIGN: Duration = Duration::from_millis(300);
/// The scoped kernel's length.
const OWN: Duration = Duration::from_millis(5);

/// `own` is a plausible measurement of a kernel of length `OWN`.
fn assert_own_length(own: Duration, what: &str) {
    assert!(
        own >= OWN.mul_f64(0.9),
        "{what}: {own:?} for a {OWN:?} kernel"
    );
    assert!(
        own < FOREIGN / 3,
        "{what}: {own:?} for a {OWN:?} kernel: the foreign {FOREIGN:?} was counted"
    );
}

#[test]
fn waits_on_other_streams_inside_a_scope_are_not_counted() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let (other, stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();

    spin(&other, &spin_kernel, FOREIGN);
    let done = other.record_event().unwrap();
    {
        let _scope = profiler.scope(&stream, "after a wait").unwrap();
        // The stream waits FOREIGN for the other stream, then runs OWN.
        stream.wait_event(&done).unwrap();
        spin(&stream, &spin_kernel, OWN);
    }
    // A second scope shares the first's end as its start: still its own.
    profiler
        .time(&stream, "next", |s| spin(s, &spin_kernel, OWN))
        .unwrap();

    let report = profiler.get_comprehensive_report();
    let own = report.stream(stream.id()).unwrap();
    assert_own_length(own.operations["after a wait"].total, "after a wait");
    assert_own_length(own.operations["next"].total, "the next scope");
    // And the scope sits after the other stream's work on the timeline.
    assert_eq!(report.max_concurrency, 1, "{report}");
    if on_gpu(&ctx, "a waited scope within 1.5x of its kernel") {
        let total = own.operations["after a wait"].total;
        assert!(total <= OWN.mul_f64(1.5), "{total:?}");
    }
}

#[test]
fn a_copy_after_waiting_for_its_buffer_is_timed_as_the_copy() {
    const BYTES: usize = 16 << 20;
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let (home, stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut host = PinnedBuffer::<u8>::new(&ctx, BYTES).unwrap();
    host.as_mut_slice().unwrap().fill(7);
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();

    // Allocated on `home` behind a long kernel: its first use on `stream`
    // waits for that (the driver layer's ordering, not the caller's). `home`
    // also writes it first, so the scoped copy is not the first touch of
    // fresh pages, which on a loaded machine running the software driver can
    // take many times a copy.
    spin(&home, &spin_kernel, FOREIGN);
    let mut device = DeviceBuffer::<u8>::new_async(&home, BYTES).unwrap();
    home.copy_from_host_async(&mut device, &host).unwrap();
    profiler
        .time(&stream, "upload after a wait", |s| {
            s.copy_from_host_async(&mut device, &host)
        })
        .unwrap()
        .unwrap();
    // The same copy with nothing to wait for: the reference.
    profiler
        .time(&stream, "upload", |s| {
            s.copy_from_host_async(&mut device, &host)
        })
        .unwrap()
        .unwrap();

    let report = profiler.get_stream_report(&stream).unwrap();
    let waited = report.operations["upload after a wait"].total;
    let reference = report.operations["upload"].total;
    assert_eq!(report.bytes_transferred, 2 * BYTES as u64);
    // Not the wait.
    assert!(
        waited < FOREIGN / 3,
        "the copy was timed at {waited:?}: the {FOREIGN:?} wait was counted"
    );
    // Not nothing: no copy moves 16 MiB at more than 1 TB/s.
    let floor = Duration::from_secs_f64(BYTES as f64 / 1e12);
    assert!(
        waited >= floor && reference >= floor,
        "{waited:?} {reference:?}"
    );
    // Like the same copy unhindered (host clocks on a shared machine, hence
    // the margin; it stays under the bound above).
    assert!(
        waited <= reference * 10 + Duration::from_millis(40),
        "{waited:?} against {reference:?}"
    );
    if on_gpu(&ctx, "the waited copy within 1.5x of the same copy") {
        assert!(
            waited <= reference.mul_f64(1.5) + Duration::from_micros(50),
            "{waited:?} against {reference:?}"
        );
    }
}

#[test]
fn work_enqueued_before_a_scope_is_not_counted_in_it() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let stream = Stream::new(&ctx).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();

    profiler
        .time(&stream, "first", |s| spin(s, &spin_kernel, OWN))
        .unwrap();
    // Outside any scope, right after the first one's end boundary.
    spin(&stream, &spin_kernel, FOREIGN);
    profiler
        .time(&stream, "second", |s| spin(s, &spin_kernel, OWN))
        .unwrap();
    // And after a scope: its end is before this.
    spin(&stream, &spin_kernel, FOREIGN);

    let report = profiler.get_stream_report(&stream).unwrap();
    assert_own_length(report.operations["first"].total, "first");
    assert_own_length(report.operations["second"].total, "second");
    // The unscoped kernels are on no scope's account: the busy time is the two.
    assert!(
        report.busy_time < FOREIGN / 2,
        "busy {:?}: the unscoped {FOREIGN:?} was counted",
        report.busy_time
    );
}

#[test]
fn a_scope_with_only_waits_is_empty() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let (other, stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    spin(&other, &spin_kernel, FOREIGN);
    profiler
        .time(&stream, "wait only", |s| s.wait_stream(&other))
        .unwrap()
        .unwrap();
    profiler
        .time(&stream, "after", |s| spin(s, &spin_kernel, OWN))
        .unwrap();
    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.operations["wait only"].count, 1);
    assert_eq!(report.operations["wait only"].total, Duration::ZERO);
    assert_own_length(report.operations["after"].total, "after");
}

#[test]
fn work_of_scopes_a_sampler_skips_is_on_no_timed_scope() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let stream = Stream::new(&ctx).unwrap();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    let sampler = profiler.sampler("spin", 2).unwrap();
    // Timed, skipped (the long one), timed.
    for length in [OWN, FOREIGN, OWN] {
        sampler
            .time(&stream, |s| spin(s, &spin_kernel, length))
            .unwrap();
    }
    let stats = profiler.get_stream_report(&stream).unwrap().operations["spin"];
    assert_eq!((stats.count, stats.timed), (3, 2));
    assert_own_length(stats.max, "the longest timed spin");
    assert_own_length(stats.min, "the shortest timed spin");
}
