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

/// Threads whose operations each depend on one operation of another
/// thread's stream (the builder's single-dependency path, the common one),
/// beside fork/join operations on each thread's stream: every operation's
/// work (a host function that takes a ticket) runs after its dependency's.
#[test]
fn a_single_dependency_on_another_threads_stream_orders_the_work() {
    use std::sync::atomic::AtomicU64;
    let ctx = ctx();
    let graph = OperationGraph::for_context(&ctx);
    let latest: Mutex<Vec<Option<OperationId>>> = Mutex::new(vec![None; THREADS]);
    let ticket = Arc::new(AtomicU64::new(1));
    // (operation, its dependency, the slot its work fills with a ticket).
    type Taken = (OperationId, Option<OperationId>, Arc<AtomicU64>);
    let taken: Vec<Vec<Taken>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (graph, latest, ctx, ticket) = (&graph, &latest, &ctx, &ticket);
                scope.spawn(move || {
                    let stream = Stream::new(ctx).unwrap();
                    let branches = [Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap()];
                    let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
                    let mut mine = Vec::with_capacity(ROUNDS);
                    for round in 0..ROUNDS {
                        let dependency = latest.lock().unwrap()[(t + 1) % THREADS];
                        let slot = Arc::new(AtomicU64::new(0));
                        let (filled, ticket) = (Arc::clone(&slot), Arc::clone(ticket));
                        let op = graph
                            .op(&stream)
                            .after(dependency.as_slice())
                            .run(|s| {
                                s.add_callback(move || {
                                    filled.store(
                                        ticket.fetch_add(1, Ordering::SeqCst),
                                        Ordering::SeqCst,
                                    )
                                })
                            })
                            .unwrap();
                        latest.lock().unwrap()[t] = Some(op.id());
                        mine.push((op.id(), dependency, slot));
                        if round % 16 == 0 {
                            // A fork right after the operation (its latest mark).
                            let _ = graph.op(&stream).fork_join(&refs, |_, _| Ok(())).unwrap();
                        }
                    }
                    stream.synchronize().unwrap();
                    mine
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let tickets: std::collections::HashMap<OperationId, u64> = taken
        .iter()
        .flatten()
        .map(|(id, _, slot)| (*id, slot.load(Ordering::SeqCst)))
        .collect();
    for (id, dependency, _) in taken.iter().flatten() {
        let mine = tickets[id];
        assert_ne!(mine, 0, "{id}'s work never ran");
        if let Some(dependency) = dependency {
            assert!(
                tickets[dependency] < mine,
                "{id} ran before its dependency {dependency}"
            );
        }
    }
}
