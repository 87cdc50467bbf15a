//! The coordinator as a view on the engine's operation graph: its
//! dependencies, barriers, parallel work and callbacks are the graph's, and
//! builder operations mix with them.

mod support;

use cuda_streams_stream_pool::driver::{Context, DeviceBuffer, EventPool, Stream};
use cuda_streams_stream_pool::engine::{OperationGraph, OperationType};
use cuda_streams_stream_pool::{Error, MultiStreamCoordinator, StreamPool};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Gate, HANG, ctx, fill, kernel, saxpy, spin, spin_kernel};

const N: usize = 4099;
/// Long enough that, without ordering, the reader would run first.
const SLOW: Duration = Duration::from_millis(300);

/// A zeroed buffer of `N` floats homed on an idle stream of its own.
fn zeroed(ctx: &Arc<Context>) -> DeviceBuffer<f32> {
    test_support::zeroed_elsewhere(ctx, N)
}

#[test]
fn a_coordinator_dependency_orders_builder_operations() {
    let ctx = ctx();
    let (spinner, filler) = (
        spin_kernel(&ctx),
        kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32"),
    );
    let pool = StreamPool::new(&ctx, 2).unwrap();
    let mut coordinator = pool.coordinator();
    let [a, b] = [0, 1].map(|i| Arc::clone(&coordinator.streams()[i]));
    coordinator.add_dependency(&b, &a).unwrap();
    let graph = Arc::clone(coordinator.graph().expect("it has streams"));
    assert_eq!(graph.stream_dependencies(), [(b.id(), a.id())]);

    let mut x = zeroed(&ctx);
    for round in 1..=3 {
        let value = round as f32 * 1.25;
        let write = graph
            .op(&a)
            .label("write")
            .run(|s| {
                spin(s, &spinner, SLOW);
                fill(s, &filler, value, &mut x);
                Ok(())
            })
            .unwrap();
        // No `after`: only the standing dependency orders the read.
        coordinator.apply_dependencies().unwrap();
        let mut host = vec![0.0; N];
        let read = graph
            .op(&b)
            .label("read")
            .run(|s| {
                host = x.to_vec(s)?;
                Ok(())
            })
            .unwrap();
        read.wait().unwrap();
        assert!(write.is_done().unwrap());
        assert_eq!(host, vec![value; N], "round {round}: b waited for a");
    }
}

#[test]
fn views_on_one_graph_share_its_dependencies_and_refuse_a_cycle_through_both() {
    let ctx = ctx();
    let [a, b, c] = [(); 3].map(|_| Stream::new(&ctx).unwrap());
    let graph = Arc::new(OperationGraph::for_context(&ctx));
    let mut first = MultiStreamCoordinator::with_graph(&graph, [a.clone(), b.clone()]);
    let mut second = MultiStreamCoordinator::with_graph(&graph, [b.clone(), c.clone()]);
    first.add_dependency(&b, &a).unwrap();
    second.add_dependency(&c, &b).unwrap();
    // The third edge closes a cycle only through both views.
    let mut third = MultiStreamCoordinator::with_graph(&graph, [a.clone(), c.clone()]);
    let err = third.add_dependency(&a, &c).unwrap_err();
    let (ai, bi, ci) = (a.id(), b.id(), c.id());
    assert!(
        matches!(&err, Error::Cycle { path } if *path == [ai, ci, bi, ai]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "dependency would close a cycle: stream {ai} -> stream {ci} -> stream {bi} -> stream {ai}"
        )
    );
    // Refused: the graph keeps the two accepted edges, exactly.
    let mut kept = third.dependencies();
    kept.sort_unstable();
    let mut accepted = vec![(bi, ai), (ci, bi)];
    accepted.sort_unstable();
    assert_eq!(kept, accepted);
    assert!(first.remove_dependency(&b, &a));
    assert_eq!(second.dependencies(), [(ci, bi)]);
    // Now it closes none.
    third.add_dependency(&a, &c).unwrap();

    // A coordinator without streams has no graph, and nothing to do.
    let mut empty = MultiStreamCoordinator::new([]);
    assert!(empty.graph().is_none());
    assert!(empty.dependencies().is_empty());
    empty.create_barrier().unwrap();
    empty.apply_dependencies().unwrap();
    empty.add_stream(a.clone());
    assert!(empty.graph().is_some());
}

#[test]
fn barriers_parallel_work_and_callbacks_are_operations_of_the_graph() {
    let ctx = ctx();
    let (spinner, filler, saxpy_k) = (
        spin_kernel(&ctx),
        kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32"),
        kernel(&ctx, &kernels::ELEMENTWISE, "saxpy"),
    );
    let pool = StreamPool::new(&ctx, 3).unwrap();
    let coordinator = pool.coordinator();
    let graph = Arc::clone(coordinator.graph().unwrap());
    let streams = coordinator.streams().to_vec();
    let before = graph.metrics().total_operations;

    // The coordinator's parallel work, then its barrier: each stream then
    // reads the next stream's buffer.
    let xs: Vec<Mutex<DeviceBuffer<f32>>> =
        streams.iter().map(|_| Mutex::new(zeroed(&ctx))).collect();
    coordinator
        .execute_parallel(|stream| {
            let i = streams.iter().position(|s| s.id() == stream.id()).unwrap();
            // Stream 0 writes at once, the others later: a reader on
            // stream 0 runs first unless the barrier holds it.
            spin(stream, &spinner, SLOW * i as u32);
            fill(stream, &filler, (1 << i) as f32, &mut xs[i].lock().unwrap());
            Ok(())
        })
        .unwrap();
    coordinator.create_barrier().unwrap();
    let xs: Vec<DeviceBuffer<f32>> = xs.into_iter().map(|x| x.into_inner().unwrap()).collect();
    let mut sum = zeroed(&ctx);
    for x in &xs {
        saxpy(&streams[0], &saxpy_k, 1.0, x, &mut sum);
    }
    assert_eq!(sum.to_vec(&streams[0]).unwrap(), vec![7.0; N]);
    // Three parallel branches and the barrier.
    assert_eq!(graph.metrics().total_operations - before, 4);

    // A completion callback is a host-function operation: pending until the
    // GPU passed it.
    let stream = &streams[1];
    let gate = Gate::close(stream);
    let (tx, rx) = mpsc::channel();
    let before = graph.metrics().total_operations;
    coordinator
        .add_completion_callback(stream, move || tx.send(()).unwrap())
        .unwrap();
    assert_eq!(graph.metrics().total_operations - before, 1);
    let pending = coordinator.pending_callbacks(stream).unwrap();
    if gate.still_held() {
        assert_eq!(pending, 1, "pending while the stream is held");
        assert!(rx.try_recv().is_err(), "fired before the stream got there");
    }
    gate.open();
    rx.recv_timeout(HANG).expect("the callback fired");
    stream.synchronize().unwrap();
    assert_eq!(coordinator.pending_callbacks(stream).unwrap(), 0);

    // The graph's own barrier and parallel node give ids to depend on.
    let barrier = graph.barrier(coordinator.streams()).unwrap();
    let run = graph
        .parallel(coordinator.streams())
        .after(&[barrier.id()])
        .kind(OperationType::Kernel)
        .run(|_| Ok::<(), Error>(()));
    assert!(run.is_ok());
    run.wait().unwrap();
}

#[test]
fn finished_callbacks_give_their_events_back_without_being_asked_about() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    // A graph with events of its own, so the count below is only its.
    let events = Arc::new(EventPool::new(&ctx, 0, 0).unwrap());
    let graph = Arc::new(OperationGraph::new(Arc::clone(&events)));
    let coordinator = MultiStreamCoordinator::with_graph(&graph, [Arc::clone(&stream)]);
    for _ in 0..100 {
        coordinator.add_completion_callback(&stream, || {}).unwrap();
    }
    stream.synchronize().unwrap();
    // Nobody asked for `pending_callbacks`: the next callback lets the
    // finished ones go.
    coordinator.add_completion_callback(&stream, || {}).unwrap();
    stream.synchronize().unwrap();
    graph.retire_completed();
    let in_use = events.utilization().in_use;
    assert!(in_use <= 1, "{in_use} events still held");
    assert_eq!(coordinator.pending_callbacks(&stream).unwrap(), 0);
    assert_eq!(events.utilization().in_use, 0);
}
