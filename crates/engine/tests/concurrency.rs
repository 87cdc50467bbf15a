//! Many threads on one graph: builder operations depending on each other's
//! operations across threads, seed-shaped operations with completion
//! callbacks beside them, and everything retired in the end. The graph's
//! one lock must neither lose nor duplicate an operation, nor deadlock.

use cuda_streams_engine::driver::{DeviceBuffer, Stream};
use cuda_streams_engine::{EventPriority, OperationGraph, OperationId, OperationType};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use test_support::ctx;

const THREADS: usize = 4;
const ROUNDS: usize = 300;

#[test]
fn threads_building_on_each_others_operations_lose_none() {
    let ctx = ctx();
    let graph = Arc::new(OperationGraph::for_context(&ctx));
    let latest: Arc<Mutex<Vec<Option<OperationId>>>> = Arc::new(Mutex::new(vec![None; THREADS]));
    let fired = Arc::new(AtomicUsize::new(0));
    let ids: Vec<Vec<OperationId>> = std::thread::scope(|scope| {
        let builders: Vec<_> = (0..THREADS)
            .map(|t| {
                let (graph, latest, ctx) = (&graph, &latest, &ctx);
                scope.spawn(move || {
                    let stream = Stream::new(ctx).unwrap();
                    let mut buf = DeviceBuffer::<u32>::new(ctx, 256).unwrap();
                    let mut mine = Vec::with_capacity(ROUNDS);
                    for round in 0..ROUNDS {
                        // After this thread's last operation and whatever the
                        // next thread finished last.
                        let neighbour = latest.lock().unwrap()[(t + 1) % THREADS];
                        let after: Vec<OperationId> =
                            mine.last().copied().into_iter().chain(neighbour).collect();
                        let op = graph
                            .op(&stream)
                            .after(&after)
                            .label(format!("thread {t}, round {round}"))
                            .run(|s| s.memset_u32_async(&mut buf, round as u32))
                            .unwrap();
                        latest.lock().unwrap()[t] = Some(op.id());
                        mine.push(op.id());
                    }
                    stream.synchronize().unwrap();
                    mine
                })
            })
            .collect();
        // Seed-shaped operations on a stream of their own, at the same time.
        let seed = {
            let (graph, fired, ctx) = (&graph, &fired, &ctx);
            scope.spawn(move || {
                let stream = Stream::new(ctx).unwrap();
                let mut mine = Vec::with_capacity(ROUNDS);
                for round in 0..ROUNDS {
                    let deps = mine.last().copied().into_iter().collect();
                    let id = graph
                        .register_operation(
                            OperationType::Kernel,
                            EventPriority::Normal,
                            &stream,
                            deps,
                            format!("seed {round}"),
                        )
                        .unwrap();
                    let fired = Arc::clone(fired);
                    graph
                        .add_completion_callback(id, move || {
                            fired.fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap();
                    graph.begin_operation(id, &stream).unwrap();
                    graph.complete_operation(id).unwrap();
                    mine.push(id);
                }
                stream.synchronize().unwrap();
                mine
            })
        };
        builders
            .into_iter()
            .chain([seed])
            .map(|h| h.join().unwrap())
            .collect()
    });
    // Every id issued once.
    let all: HashSet<OperationId> = ids.iter().flatten().copied().collect();
    let total = (THREADS + 1) * ROUNDS;
    assert_eq!(all.len(), total);
    // Every callback fired exactly once: each ran as a host function on the
    // seed stream, which the seed thread synchronized before returning.
    assert_eq!(fired.load(Ordering::Relaxed), ROUNDS);
    graph.retire_completed();
    let m = graph.metrics();
    assert_eq!(m.total_operations, total as u64);
    assert_eq!(m.completed_operations, total as u64);
    assert_eq!(m.retired_operations, total as u64, "{m:?}");
    assert_eq!(m.in_flight, 0);
    for id in all {
        assert_eq!(
            graph.state(id),
            Some(cuda_streams_engine::OperationState::Retired)
        );
    }
}
