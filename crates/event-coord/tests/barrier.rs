//! The cross-stream barrier: host-blocking and device-side.

mod support;

use cuda_streams_event_coord as events;
use events::{CrossStreamBarrier, Error};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::{Gate, ctx, pool, streams};

#[test]
fn synchronize_returns_only_when_every_stream_got_there() {
    let ctx = ctx();
    let s = streams(&ctx, 4);
    let events = pool(&ctx);
    let barrier = CrossStreamBarrier::new(s.clone(), Arc::clone(&events)).unwrap();
    let reached = Arc::new(AtomicU32::new(0));
    // Different amounts of work per stream: gates that open themselves
    // (nobody else can open them while the host waits), the longest last.
    let longest = Duration::from_millis(40);
    let closed = Instant::now();
    let mut gates = Vec::new();
    for (i, stream) in s.iter().enumerate() {
        gates.push(Gate::close_within(stream, longest / 4 * (i as u32 + 1)));
        let r = Arc::clone(&reached);
        stream
            .add_callback(move || {
                r.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    let called = Instant::now();
    let waited = barrier.synchronize().unwrap();
    let returned = called.elapsed();
    assert_eq!(
        reached.load(Ordering::SeqCst),
        4,
        "every stream's work is done"
    );
    // The host waited for the last gate to open by itself: no less than its
    // limit less what had passed before the call, no more than the call took.
    // (Exact: `synchronize` reads its clock first thing, so only a thread
    // descheduled within a function call could read it late.)
    let at_least = longest.saturating_sub(called - closed);
    assert!(
        at_least <= waited && waited <= returned,
        "waited {waited:?}: at least {at_least:?}, at most {returned:?}"
    );
    let stats = barrier.stats();
    assert_eq!((stats.synchronizations, stats.arrivals), (1, 0));
    assert_eq!(
        stats.total_wait, waited,
        "the stats add up what it returned"
    );
    assert_eq!(
        events.utilization().in_use,
        0,
        "the barrier's events went back to the pool"
    );
}

#[test]
fn arrive_makes_every_stream_wait_for_every_other_without_blocking_the_host() {
    let ctx = ctx();
    let s = streams(&ctx, 3);
    let barrier = CrossStreamBarrier::new(s.clone(), pool(&ctx)).unwrap();
    let gate = Gate::close(&s[1]); // stream 1 cannot reach the barrier yet
    let after = Arc::new(AtomicU32::new(0));
    barrier.arrive().unwrap(); // returns while stream 1 is held
    for stream in &s {
        let a = Arc::clone(&after);
        stream
            .add_callback(move || {
                a.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    // Streams 0 and 2 have nothing but the barrier before their callback,
    // yet they are held: they wait for stream 1.
    assert!(!s[0].query().unwrap() && !s[2].query().unwrap());
    assert_eq!(after.load(Ordering::SeqCst), 0);
    gate.open();
    for stream in &s {
        stream.synchronize().unwrap();
    }
    assert_eq!(after.load(Ordering::SeqCst), 3);
    assert_eq!(barrier.stats().arrivals, 1);
}

#[test]
fn an_empty_barrier_is_an_error() {
    let ctx = ctx();
    assert!(matches!(
        CrossStreamBarrier::new(vec![], pool(&ctx)),
        Err(Error::EmptyBarrier)
    ));
}
