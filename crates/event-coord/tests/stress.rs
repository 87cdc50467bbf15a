//! 8 threads registering, beginning and completing 100k operations across 16
//! streams, each with a completion callback that must run exactly once.

mod support;

use cuda_streams_event_coord as events;
use events::{EventPool, EventPriority, OperationCoordinator, OperationId, OperationType};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use support::{ctx, streams};

const THREADS: usize = 8;
const STREAMS: usize = 16;
const TOTAL: usize = 100_000;

#[test]
fn eight_threads_one_hundred_thousand_operations() {
    let ctx = ctx();
    let s = streams(&ctx, STREAMS);
    let pool = Arc::new(EventPool::new(&ctx, 256, 0).unwrap());
    let coordinator = Arc::new(OperationCoordinator::new(pool));
    let runs: Arc<Vec<AtomicU8>> = Arc::new((0..TOTAL).map(|_| AtomicU8::new(0)).collect());
    let per_thread = TOTAL / THREADS;
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (coordinator, runs, s) = (Arc::clone(&coordinator), Arc::clone(&runs), &s);
            scope.spawn(move || {
                let mut previous: Option<OperationId> = None;
                for i in 0..per_thread {
                    // Streams are shared between threads; each step depends on
                    // the thread's previous one, on another stream.
                    let stream = &s[(t + i) % STREAMS];
                    let priority = events::EventPriority::ALL[i % 5];
                    let id = coordinator
                        .register_operation(
                            OperationType::ALL[i % 7],
                            priority,
                            stream,
                            previous.into_iter().collect(),
                            "stress",
                        )
                        .unwrap();
                    let slot = t * per_thread + i;
                    let runs = Arc::clone(&runs);
                    coordinator
                        .add_completion_callback(id, move || {
                            runs[slot].fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap();
                    coordinator.begin_operation(id, stream).unwrap();
                    coordinator.complete_operation(id).unwrap();
                    previous = Some(id);
                }
            });
        }
    });
    let _ = EventPriority::Critical;
    for stream in &s {
        stream.synchronize().unwrap();
    }
    let missing = runs
        .iter()
        .filter(|r| r.load(Ordering::Relaxed) == 0)
        .count();
    let repeated = runs
        .iter()
        .filter(|r| r.load(Ordering::Relaxed) > 1)
        .count();
    assert_eq!(
        (missing, repeated),
        (0, 0),
        "every callback ran exactly once"
    );
    coordinator.retire_completed();
    let m = coordinator.metrics();
    assert_eq!(m.total_operations, TOTAL as u64);
    assert_eq!(m.completed_operations, TOTAL as u64);
    assert_eq!(m.in_flight, 0, "{m:?}");
    assert_eq!(m.retired_operations, TOTAL as u64);
    assert_eq!(m.callback_panics, 0);
    let in_use = coordinator.pool().utilization().in_use;
    assert_eq!(in_use, 0, "every completion event went back to the pool");
}
