//! Ready streams are idle streams, asked of the driver; waiting parks
//! until the context's reactor sees a stream pass.

mod support;

use cuda_streams_stream_pool::StreamPool;
use std::time::{Duration, Instant};
use support::{HANG, ctx, serial, spin, spin_kernel};

#[test]
fn wait_for_any_ready_returns_the_idle_stream_while_the_others_spin() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new(&ctx, 4).unwrap();
    let streams: Vec<_> = pool.streams().cloned().collect();
    assert!(pool.has_ready_streams().unwrap(), "a fresh pool is idle");
    for busy in [&streams[0], &streams[1], &streams[3]] {
        spin(busy, &spinner, Duration::from_millis(500));
    }
    for _ in 0..10 {
        let ready = pool
            .wait_for_any_ready(Some(HANG))
            .unwrap()
            .expect("one is idle");
        assert_eq!(ready.id(), streams[2].id());
    }
    assert_eq!(
        pool.ready_streams()
            .unwrap()
            .iter()
            .map(|s| s.id())
            .collect::<Vec<_>>(),
        [streams[2].id()]
    );
    for stream in &streams {
        stream.synchronize().unwrap();
    }
}

#[test]
fn wait_for_any_ready_gives_none_at_its_timeout_then_some_when_work_ends() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new(&ctx, 3).unwrap();
    let busy_for = Duration::from_millis(800);
    let start = Instant::now();
    for stream in pool.streams() {
        spin(stream, &spinner, busy_for);
    }
    assert!(
        !pool.has_ready_streams().unwrap(),
        "every stream is spinning"
    );
    let timeout = Duration::from_millis(60);
    let waited = Instant::now();
    assert!(pool.wait_for_any_ready(Some(timeout)).unwrap().is_none());
    let took = waited.elapsed();
    assert!(
        took >= timeout,
        "returned None after {took:?}, before the timeout"
    );
    assert!(
        start.elapsed() < busy_for,
        "None came while the streams were still busy"
    );
    assert!(
        pool.wait_for_any_ready(Some(Duration::ZERO))
            .unwrap()
            .is_none()
    );

    let ready = pool
        .wait_for_any_ready(None)
        .unwrap()
        .expect("no timeout: Some");
    assert!(
        start.elapsed() >= busy_for / 2,
        "ready only once its spin had run"
    );
    assert!(ready.query().unwrap());
    assert!(pool.has_ready_streams().unwrap());
}

/// CPU time of the calling thread, from the kernel's scheduler statistics.
#[cfg(target_os = "linux")]
fn thread_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[cfg(target_os = "linux")]
#[test]
fn waiting_does_not_hold_a_core() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new(&ctx, 2).unwrap();
    for stream in pool.streams() {
        spin(stream, &spinner, Duration::from_millis(900));
    }
    let Some(cpu_before) = thread_cpu_time() else {
        println!("skipped: /proc/thread-self/schedstat is not readable here");
        return;
    };
    let wall = Instant::now();
    assert!(
        pool.wait_for_any_ready(Some(Duration::from_millis(300)))
            .unwrap()
            .is_none()
    );
    let wall = wall.elapsed();
    let cpu = thread_cpu_time().unwrap() - cpu_before;
    assert!(
        cpu < wall / 4,
        "waiting {wall:?} used {cpu:?} of CPU: it should sleep between queries"
    );
    for stream in pool.streams() {
        stream.synchronize().unwrap();
    }
}

#[test]
fn waiting_goes_through_the_reactor() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new(&ctx, 2).unwrap();
    let streams: Vec<_> = pool.streams().cloned().collect();
    spin(&streams[0], &spinner, Duration::from_millis(600));
    spin(&streams[1], &spinner, Duration::from_millis(100));
    let before = ctx.reactor().stats();
    let ready = pool
        .wait_for_any_ready(Some(HANG))
        .unwrap()
        .expect("one ends within the timeout");
    assert_eq!(ready.id(), streams[1].id(), "the shorter spin ends first");
    let after = ctx.reactor().stats();
    // One wait per busy stream: the one that woke the thread completed, the
    // other was dropped (cancelled) when the call returned.
    assert!(
        after.completed > before.completed,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.cancelled > before.cancelled,
        "{before:?} -> {after:?}"
    );
    for stream in &streams {
        stream.synchronize().unwrap();
    }
}
