//! Contexts, stream priorities as the driver reports them, and raw-handle interop.

mod support;

use cuda_streams_driver::{Context, Error, Stream, StreamPriority};
use std::sync::Arc;
use support::ctx;

#[test]
fn the_context_is_shared_and_describes_its_device() {
    let a = ctx();
    let b = Context::new(0).unwrap();
    assert!(Arc::ptr_eq(&a, &b), "one live Context per device");
    let info = a.info();
    assert_eq!(info.ordinal, 0);
    assert!(!info.name.is_empty());
    assert!(info.multiprocessor_count > 0);
    assert!(info.total_memory > 0);
    assert!(info.compute_capability.0 >= 1);
    let (free, total) = a.memory_info().unwrap();
    assert!(free <= total && total > 0, "free {free}, total {total}");
}

#[test]
fn a_missing_device_is_an_error_naming_it() {
    let err = Context::new(4096).unwrap_err();
    assert!(
        matches!(err, Error::InvalidDevice { ordinal: 4096, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("4096"), "{err}");
}

#[test]
fn priorities_reach_the_driver_and_match_the_device_range() {
    let ctx = ctx();
    let range = ctx.priority_range();
    assert!(
        range.greatest < range.least,
        "both drivers have several levels: {range:?}"
    );
    let read = |class| {
        Stream::new_with_priority(&ctx, class)
            .unwrap()
            .priority()
            .unwrap()
    };
    let (high, normal, low) = (
        read(StreamPriority::High),
        read(StreamPriority::Normal),
        read(StreamPriority::Low),
    );
    assert_eq!(high, range.greatest);
    assert_eq!(low, range.least);
    assert_eq!(normal, range.value(StreamPriority::Normal));
    assert!(high < normal && normal <= low, "{high} {normal} {low}");
    assert_eq!(Stream::new(&ctx).unwrap().priority().unwrap(), normal);
}

#[test]
fn raw_priorities_are_checked_against_the_range() {
    let ctx = ctx();
    let range = ctx.priority_range();
    let stream = Stream::with_raw_priority(&ctx, range.greatest + 1).unwrap();
    assert_eq!(stream.priority().unwrap(), range.greatest + 1);
    let err = Stream::with_raw_priority(&ctx, range.least + 1).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&(range.least + 1).to_string()) && text.contains(&range.greatest.to_string()),
        "{text}"
    );
}

#[test]
fn streams_are_non_blocking_with_distinct_ids() {
    let ctx = ctx();
    let streams: Vec<_> = (0..8).map(|_| Stream::new(&ctx).unwrap()).collect();
    for stream in &streams {
        assert!(stream.is_non_blocking().unwrap());
        assert!(stream.query().unwrap(), "a new stream is idle");
    }
    let mut ids: Vec<_> = streams.iter().map(|s| s.id()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 8);
}

#[test]
fn raw_stream_handles_round_trip() {
    let ctx = ctx();
    let table = ctx.driver();
    ctx.bind().unwrap();
    let mut raw = std::ptr::null_mut();
    // SAFETY: writes one handle through a valid pointer; the context is current.
    let code = unsafe { (table.cuStreamCreateWithPriority)(&mut raw, 1, 0) };
    code.result().unwrap();

    // Borrowed: dropping the wrapper leaves the handle alive.
    // SAFETY: `raw` is a live stream of `ctx`, destroyed below after the wrapper.
    let borrowed = unsafe { Stream::from_raw(&ctx, raw, false) };
    assert_eq!(borrowed.as_raw(), raw);
    assert!(!borrowed.is_owned());
    assert_eq!(borrowed.priority().unwrap(), 0);
    borrowed.synchronize().unwrap();
    drop(borrowed);
    // SAFETY: the handle is still live; querying it is valid.
    unsafe { (table.cuStreamQuery)(raw) }.result().unwrap();

    // Owned: the wrapper destroys it.
    // SAFETY: `raw` is live and nothing else destroys it.
    let owned = unsafe { Stream::from_raw(&ctx, raw, true) };
    assert!(owned.query().unwrap());
}

#[test]
fn handles_work_from_threads_that_never_bound_the_context() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                // A fresh thread: every method binds on its own.
                stream.synchronize().unwrap();
                let other = Stream::new(&ctx).unwrap();
                assert!(other.query().unwrap());
            });
        }
    });
}
