//! The reactor stands on its context: the first wait starts its thread, and
//! releasing the context shuts it down (the context's service slot tells it
//! once the context's work is done), so no reactor thread outlives its
//! context.
//!
//! One test in its own binary: it counts the process's reactor threads, and
//! the context must really be released, which another test holding the same
//! device's context would prevent.

use cuda_streams_driver::{Context, Stream};
use std::path::Path;
use std::time::Instant;
use test_support::HANG;

/// The threads of this process named as the reactor's thread is
/// (`cuda-streams-reactor`, which Linux cuts to 15 bytes).
fn reactor_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| task.ok())
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.trim_end() == "cuda-streams-re")
        })
        .count()
}

#[test]
fn releasing_the_context_shuts_its_reactor_down() {
    if !Path::new("/proc/self/task").is_dir() {
        eprintln!("skipped: no /proc/self/task to count the reactor's threads");
        return;
    }
    assert_eq!(reactor_threads(), 0, "no reactor before the first wait");
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    stream.completion().unwrap().wait().unwrap();
    assert_eq!(reactor_threads(), 1, "the first wait started the reactor");
    // A second context handle shares the reactor, and keeps it running.
    let again = Context::new(0).unwrap();
    drop(stream);
    drop(ctx);
    assert_eq!(reactor_threads(), 1, "a handle still holds the context");
    drop(again);
    let start = Instant::now();
    while reactor_threads() != 0 {
        assert!(
            start.elapsed() < HANG,
            "the reactor thread outlived its context"
        );
        std::thread::yield_now();
    }
}
