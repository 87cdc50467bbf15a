//! The graph's stream-level nodes, proved with data: standing stream
//! dependencies, the barrier node and the parallel node.
//!
//! Each ordering test puts a slow kernel before a write on one stream and a
//! read on another: without the ordering under test, the read would run
//! first and see the old values.

use cuda_streams_engine::driver::{Context, DeviceBuffer, Kernel, Stream};
use cuda_streams_engine::{BranchError, Error, OperationGraph, OperationType};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use test_support::{Gate, HANG, ctx, fill, kernel, saxpy, spin, spin_kernel};

const N: usize = 4099;
/// Long enough that, without ordering, the reader would run first.
const SLOW: Duration = Duration::from_millis(300);

/// A zeroed buffer of `N` floats homed on an idle stream of its own.
fn zeroed(ctx: &Arc<Context>) -> DeviceBuffer<f32> {
    test_support::zeroed_elsewhere(ctx, N)
}

fn kernels(ctx: &Arc<Context>) -> (Kernel, Kernel, Kernel) {
    (
        spin_kernel(ctx),
        kernel(ctx, &kernels::ELEMENTWISE, "fill_f32"),
        kernel(ctx, &kernels::ELEMENTWISE, "saxpy"),
    )
}

#[test]
fn a_standing_dependency_orders_work_and_is_applied_again_prerequisites_first() {
    let ctx = ctx();
    let (spinner, filler, _) = kernels(&ctx);
    let [a, b, c] = [(); 3].map(|_| Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    let mut x = zeroed(&ctx);

    spin(&a, &spinner, SLOW);
    fill(&a, &filler, 1.5, &mut x);
    graph.add_stream_dependency(&b, &a).unwrap();
    assert_eq!(x.to_vec(&b).unwrap(), vec![1.5; N], "b waited for a");

    // A chain c -> b -> a, applied again for new work in one call: c waits
    // for b only after b waits for a, or c would not wait for a.
    graph.add_stream_dependency(&c, &b).unwrap();
    spin(&a, &spinner, SLOW);
    fill(&a, &filler, 2.5, &mut x);
    graph.apply_stream_dependencies().unwrap();
    assert_eq!(
        x.to_vec(&c).unwrap(),
        vec![2.5; N],
        "c waited for a through b"
    );

    let mut listed = graph.stream_dependencies();
    listed.sort_unstable();
    let mut expected = vec![(b.id(), a.id()), (c.id(), b.id())];
    expected.sort_unstable();
    assert_eq!(listed, expected);

    // Removed: applying again no longer orders c after a (a is held by a
    // gate; c would wait for it until the gate's long limit).
    assert!(graph.remove_stream_dependency(&b, &a));
    assert!(!graph.remove_stream_dependency(&b, &a));
    assert_eq!(graph.stream_dependencies(), [(c.id(), b.id())]);
    let gate = Gate::close(&a);
    graph.apply_stream_dependencies().unwrap();
    c.synchronize().unwrap();
    assert!(gate.still_held(), "removed, yet c waited for a");
    gate.open();
    a.synchronize().unwrap();
}

#[test]
fn a_standing_dependency_that_closes_a_cycle_is_refused_and_named() {
    let ctx = ctx();
    let [a, b, c, d] = [(); 4].map(|_| Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    graph.add_stream_dependency(&b, &a).unwrap();
    graph.add_stream_dependency(&c, &b).unwrap();
    graph.add_stream_dependency(&d, &a).unwrap();
    let err = graph.add_stream_dependency(&a, &c).unwrap_err();
    let (ai, bi, ci) = (a.id(), b.id(), c.id());
    assert!(
        matches!(&err, Error::StreamCycle { path } if *path == [ai, ci, bi, ai]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "dependency would close a cycle: stream {ai} -> stream {ci} -> stream {bi} -> stream {ai}"
        )
    );
    let err = graph.add_stream_dependency(&b, &b).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("dependency would close a cycle: stream {bi} -> stream {bi}")
    );
    // Refused edges change nothing: the three accepted ones, exactly. (No
    // `has_stream_cycles()` here: it is false by construction; the engine's
    // unit test shows it sees a cycle forced past the check.)
    let sorted = |mut edges: Vec<(u64, u64)>| {
        edges.sort_unstable();
        edges
    };
    let di = d.id();
    assert_eq!(
        sorted(graph.stream_dependencies()),
        sorted(vec![(bi, ai), (ci, bi), (di, ai)])
    );
    // A diamond is not a cycle: accepted, and applied in order.
    graph.add_stream_dependency(&c, &d).unwrap();
    assert_eq!(graph.stream_dependencies().len(), 4);
    graph.apply_stream_dependencies().unwrap();
}

#[test]
fn work_after_a_barrier_sees_every_streams_earlier_writes() {
    let ctx = ctx();
    let (spinner, filler, saxpy_k) = kernels(&ctx);
    let streams = [(); 3].map(|_| Stream::new(&ctx).unwrap());
    let outsider = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let values = [1.0f32, 2.0, 4.0];
    let mut xs: Vec<DeviceBuffer<f32>> = streams.iter().map(|_| zeroed(&ctx)).collect();

    // Stream 0 writes at once, stream 2 after SLOW, stream 1 last: each
    // reader below runs before some writer unless the barrier holds it.
    let delays = [Duration::ZERO, 2 * SLOW, SLOW];
    for ((stream, x), (value, delay)) in streams
        .iter()
        .zip(&mut xs)
        .zip(values.into_iter().zip(delays))
    {
        spin(stream, &spinner, delay);
        fill(stream, &filler, value, x);
    }
    let barrier = graph.barrier(&streams).unwrap();

    // A kernel on stream 0 after the barrier reads what 1 and 2 wrote.
    let [x0, x1, x2] = <[_; 3]>::try_from(xs).ok().unwrap();
    let mut sum = x0;
    saxpy(&streams[0], &saxpy_k, 1.0, &x1, &mut sum);
    saxpy(&streams[0], &saxpy_k, 1.0, &x2, &mut sum);
    // Each stream's side of the barrier: 2 reads what 1 wrote.
    assert_eq!(x1.to_vec(&streams[2]).unwrap(), vec![2.0; N]);
    assert_eq!(sum.to_vec(&streams[0]).unwrap(), vec![7.0; N]);

    // A stream outside the barrier, through its id.
    let ids: Vec<u64> = streams.iter().map(|s| s.id()).collect();
    assert_eq!(barrier.streams(), ids);
    let meta = graph.metadata(barrier.id()).expect("not retired yet");
    assert_eq!(meta.operation_type, OperationType::Barrier);
    // Only the last stream is slow: the barrier's operation lives on the
    // first.
    spin(&streams[2], &spinner, SLOW);
    let mut x2 = x2;
    fill(&streams[2], &filler, 8.0, &mut x2);
    let again = graph.barrier(&streams).unwrap();
    let mut out = zeroed(&ctx);
    graph
        .op(&outsider)
        .after(&[again.id()])
        .run(|s| {
            saxpy(s, &saxpy_k, 1.0, &x2, &mut out);
            Ok(())
        })
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out.to_vec(&outsider).unwrap(), vec![8.0; N]);
    again.wait().unwrap();
    assert!(again.is_done().unwrap());

    assert!(matches!(
        graph.barrier::<&Stream>(&[]),
        Err(Error::EmptyBarrier)
    ));
}

#[test]
fn the_parallel_nodes_ids_order_later_operations() {
    let ctx = ctx();
    let (spinner, filler, saxpy_k) = kernels(&ctx);
    let streams = [(); 3].map(|_| Stream::new(&ctx).unwrap());
    let reader = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let xs: Vec<Mutex<DeviceBuffer<f32>>> =
        streams.iter().map(|_| Mutex::new(zeroed(&ctx))).collect();
    let position = |stream: &Stream| streams.iter().position(|s| s.id() == stream.id()).unwrap();

    let run = graph
        .parallel(&streams)
        .label("fill")
        .kind(OperationType::MemoryTransfer)
        .run(|stream| {
            let i = position(stream);
            spin(stream, &spinner, SLOW);
            fill(stream, &filler, (1 << i) as f32, &mut xs[i].lock().unwrap());
            Ok::<(), Error>(())
        });
    assert!(run.is_ok(), "{run:?}");
    let ids = run.ids();
    assert_eq!(ids.len(), 3);
    for (branch, stream) in run.branches.iter().zip(&streams) {
        assert_eq!(branch.stream.id(), stream.id());
        let meta = graph.metadata(branch.op.as_ref().unwrap().id()).unwrap();
        assert_eq!(
            (
                meta.stream_id,
                meta.operation_type,
                meta.description.as_str()
            ),
            (stream.id(), OperationType::MemoryTransfer, "fill")
        );
    }

    // The reader depends on the three branches, nothing else orders it.
    let mut sum = zeroed(&ctx);
    let xs: Vec<DeviceBuffer<f32>> = xs.into_iter().map(|x| x.into_inner().unwrap()).collect();
    let read = graph
        .op(&reader)
        .after(&ids)
        .run(|s| {
            for x in &xs {
                saxpy(s, &saxpy_k, 1.0, x, &mut sum);
            }
            Ok(())
        })
        .unwrap();
    read.wait().unwrap();
    for branch in &run.branches {
        let op = branch.op.as_ref().unwrap();
        assert!(op.is_done().unwrap(), "the reader finished before a branch");
    }
    assert_eq!(sum.to_vec(&reader).unwrap(), vec![7.0; N]);

    // A later parallel node after the earlier one's ids.
    let later = graph
        .parallel(&[&*reader])
        .after(&ids)
        .run(|_| Ok::<(), Error>(()));
    assert!(later.is_ok());
    later.wait().unwrap();
}

#[test]
fn a_panicking_branch_is_reported_while_the_others_complete() {
    let ctx = ctx();
    let (spinner, filler, _) = kernels(&ctx);
    let streams = [(); 4].map(|_| Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    let xs: Vec<Mutex<DeviceBuffer<f32>>> =
        streams.iter().map(|_| Mutex::new(zeroed(&ctx))).collect();
    let position = |stream: &Stream| streams.iter().position(|s| s.id() == stream.id()).unwrap();
    // Every branch waits until all have started: only a truly parallel run
    // gets through.
    let arrived = (Mutex::new(0usize), Condvar::new());

    let run = graph.parallel(&streams).run(|stream| {
        let (count, all_here) = &arrived;
        let mut count = count.lock().unwrap();
        *count += 1;
        all_here.notify_all();
        let (count, timeout) = all_here
            .wait_timeout_while(count, HANG, |c| *c < streams.len())
            .unwrap();
        drop(count);
        assert!(!timeout.timed_out(), "the branches did not run at once");
        assert_eq!(
            std::thread::current().name(),
            Some(format!("stream-{}", stream.id()).as_str())
        );
        let i = position(stream);
        spin(stream, &spinner, SLOW / 3);
        fill(stream, &filler, i as f32 + 1.0, &mut xs[i].lock().unwrap());
        match i {
            1 => panic!("branch {i} exploded"),
            2 => Err(format!("bad input on branch {i}")),
            _ => Ok(()),
        }
    });

    assert!(!run.is_ok());
    let failed: Vec<u64> = run.failures().map(|b| b.stream.id()).collect();
    assert_eq!(failed, [streams[1].id(), streams[2].id()]);
    match &run.branches[1].error {
        Some(BranchError::Panicked(message)) => assert_eq!(message, "branch 1 exploded"),
        other => panic!("expected the panic, got {other:?}"),
    }
    match &run.branches[2].error {
        Some(BranchError::Failed(message)) => assert_eq!(message, "bad input on branch 2"),
        other => panic!("expected the error, got {other:?}"),
    }
    assert_eq!(
        run.branches[1].error.as_ref().unwrap().to_string(),
        "panicked: branch 1 exploded"
    );
    // Failed or not, every branch is a completed operation after its work.
    assert_eq!(run.ids().len(), 4);
    run.wait().unwrap();
    let xs: Vec<DeviceBuffer<f32>> = xs.into_iter().map(|x| x.into_inner().unwrap()).collect();
    for (i, (x, stream)) in xs.iter().zip(&streams).enumerate() {
        assert_eq!(x.to_vec(stream).unwrap(), vec![i as f32 + 1.0; N]);
    }

    // A dependency the graph does not know: no branch runs, each says why.
    let unknown = cuda_streams_engine::OperationId(1 << 40);
    let ran = Mutex::new(0);
    let refused = graph.parallel(&streams[..2]).after(&[unknown]).run(|_| {
        *ran.lock().unwrap() += 1;
        Ok::<(), Error>(())
    });
    assert_eq!(*ran.lock().unwrap(), 0);
    assert!(refused.ids().is_empty());
    for branch in &refused.branches {
        assert!(
            matches!(
                &branch.error,
                Some(BranchError::Engine(Error::UnknownDependency { dependency, .. })) if *dependency == unknown
            ),
            "{:?}",
            branch.error
        );
    }
}
