//! The operation graph's builder: ordering by data across streams, cycles
//! refused when added, failed work still completes its operation.

use cuda_streams_engine::driver::{Context, DeviceBuffer, Kernel, PinnedBuffer, Stream};
use cuda_streams_engine::{Error, EventPool, OperationGraph, OperationId};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::{Gate, ctx, spin, spin_kernel};

#[test]
fn a_dependency_on_another_stream_orders_the_work() {
    let ctx = ctx();
    let (producer, consumer) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    let slow = spin_kernel(&ctx);
    let n = 1 << 16;
    let mut data = DeviceBuffer::<u32>::new(&ctx, n).unwrap();
    let mut host = PinnedBuffer::<u32>::new(&ctx, n).unwrap();
    for round in 1..=5u32 {
        // The fill runs behind a slow kernel: without the edge, the copy on
        // the other stream would read the previous round's values.
        let fill = graph
            .op(&producer)
            .label("fill")
            .run(|s| {
                spin(s, &slow, Duration::from_millis(2));
                s.memset_u32_async(&mut data, round)
            })
            .unwrap();
        let read = graph
            .op(&consumer)
            .after(&[fill.id()])
            .label("read")
            .run(|s| s.copy_to_host_async(&mut host, &data))
            .unwrap();
        read.wait().unwrap();
        assert!(
            fill.is_done().unwrap(),
            "a dependant finished before its dependency"
        );
        assert!(host.as_slice().unwrap().iter().all(|&v| v == round));
    }
}

#[test]
fn a_held_dependency_holds_its_dependant() {
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    let gate = Gate::close(&a);
    let first = graph.op(&a).label("gated").run(|_| Ok(())).unwrap();
    let second = graph.op(&b).after(&[first.id()]).run(|_| Ok(())).unwrap();
    let done_early = second.is_done().unwrap();
    // The gate opens itself after a long limit; only while it certainly
    // holds does "not done" say something.
    if gate.still_held() {
        assert!(!done_early, "ran before its dependency");
    }
    gate.open();
    second.wait().unwrap();
    assert!(first.is_done().unwrap());
}

#[test]
fn a_cycle_is_refused_when_the_edge_is_added() {
    let ctx = ctx();
    let s = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let kind = cuda_streams_engine::OperationType::Kernel;
    let normal = cuda_streams_engine::EventPriority::Normal;
    let a = graph
        .register_operation(kind, normal, &s, vec![], "a")
        .unwrap();
    let b = graph
        .register_operation(kind, normal, &s, vec![a], "b")
        .unwrap();
    let c = graph
        .register_operation(kind, normal, &s, vec![b], "c")
        .unwrap();
    let err = graph.add_dependency(a, c).unwrap_err();
    assert!(
        matches!(&err, Error::Cycle { cycle } if *cycle == [a, c, b, a]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "dependency would close a cycle: operation 1 -> operation 3 -> operation 2 -> operation 1"
    );
    // Unchanged, and still usable.
    assert!(graph.metadata(a).unwrap().dependencies.is_empty());
    assert!(matches!(
        graph.add_dependency(a, a),
        Err(Error::SelfDependency { .. })
    ));
    graph.begin_operation(a, &s).unwrap();
    graph.complete_operation(a).unwrap();
}

#[test]
fn failed_work_completes_its_operation_and_names_it() {
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    let mut small = DeviceBuffer::<u32>::new(&ctx, 4).unwrap();
    let err = graph
        .op(&a)
        .label("too long")
        .run(|s| s.copy_from_host(&mut small, &[1u32; 8]))
        .unwrap_err();
    let Error::OperationFailed {
        operation, label, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(label, "too long");
    assert!(err.to_string().contains("\"too long\""), "{err}");
    // It was completed: a dependant can begin and finish.
    let after = graph.op(&b).after(&[*operation]).run(|_| Ok(())).unwrap();
    after.wait().unwrap();
    // An unknown dependency is refused and the graph stays usable.
    let err = graph
        .op(&b)
        .after(&[OperationId(999)])
        .run(|_| Ok(()))
        .unwrap_err();
    assert!(matches!(
        err,
        Error::UnknownDependency {
            dependency: OperationId(999),
            ..
        }
    ));
    graph.op(&b).run(|_| Ok(())).unwrap().wait().unwrap();
}

/// What the fork/join tests share: a root stream and four branches, a
/// graph, the spin kernel, and a source buffer with four parts of
/// `FAN_ELEMENTS` each.
struct Fan {
    ctx: Arc<Context>,
    root: Arc<Stream>,
    branches: Vec<Arc<Stream>>,
    graph: OperationGraph,
    slow: Kernel,
    source: DeviceBuffer<u32>,
    parts: Vec<DeviceBuffer<u32>>,
}

const FAN_ELEMENTS: usize = 1 << 14;

impl Fan {
    fn new() -> Self {
        let ctx = ctx();
        let buffer = || DeviceBuffer::<u32>::new(&ctx, FAN_ELEMENTS).unwrap();
        Fan {
            root: Stream::new(&ctx).unwrap(),
            branches: (0..4).map(|_| Stream::new(&ctx).unwrap()).collect(),
            graph: OperationGraph::for_context(&ctx),
            slow: spin_kernel(&ctx),
            source: buffer(),
            parts: (0..4).map(|_| buffer()).collect(),
            ctx,
        }
    }
}

#[test]
fn a_fork_join_orders_every_branch_between_its_dependency_and_its_dependant() {
    let Fan {
        ctx,
        root,
        branches,
        graph,
        slow,
        mut source,
        mut parts,
    } = Fan::new();
    let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
    let mut host = PinnedBuffer::<u32>::new(&ctx, FAN_ELEMENTS).unwrap();
    for round in 1..=3u32 {
        // The source is written late (behind a slow kernel): a branch that
        // did not wait for the fork would copy the previous round's values.
        let fill = graph
            .op(&root)
            .run(|s| {
                spin(s, &slow, Duration::from_millis(2));
                s.memset_u32_async(&mut source, round)
            })
            .unwrap();
        let mut next = parts.iter_mut();
        let fan = graph
            .op(&root)
            .after(&[fill.id()])
            .label("copy to parts")
            .fork_join(&refs, |i, s| {
                // Each branch is slow too, so a join that did not wait would
                // let the reads below see stale parts.
                spin(s, &slow, Duration::from_millis(1 + i as u64));
                s.copy_device_to_device_async(next.next().unwrap(), &source)
            })
            .unwrap();
        // Read every part on another stream, after the fork/join only.
        let reader = &branches[(round as usize) % 4];
        for part in &parts {
            let read = graph
                .op(reader)
                .after(&[fan.id()])
                .run(|s| s.copy_to_host_async(&mut host, part))
                .unwrap();
            read.wait().unwrap();
            assert!(host.as_slice().unwrap().iter().all(|&v| v == round));
        }
    }
}

/// The fork of a fork/join waits on the stream's latest completion event
/// only while nothing was enqueued after it: work enqueued on the root
/// stream outside the graph, between an operation and the fork/join, is
/// still ordered before every branch.
#[test]
fn a_fork_join_after_work_outside_the_graph_waits_for_that_work() {
    let Fan {
        ctx: _,
        root,
        branches,
        graph,
        slow,
        mut source,
        mut parts,
    } = Fan::new();
    let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
    for round in 1..=3u32 {
        // An operation: its completion event is the root's latest mark.
        let _op = graph.op(&root).run(|_| Ok(())).unwrap();
        // Then work the graph does not see, late behind a slow kernel: a
        // fork that reused the operation's event would copy stale values.
        spin(&root, &slow, Duration::from_millis(2));
        root.memset_u32_async(&mut source, round).unwrap();
        let mut next = parts.iter_mut();
        let fan = graph
            .op(&root)
            .fork_join(&refs, |_, s| {
                s.copy_device_to_device_async(next.next().unwrap(), &source)
            })
            .unwrap();
        fan.wait().unwrap();
        for part in &parts {
            assert!(part.to_vec(&root).unwrap().iter().all(|&v| v == round));
        }
    }
}

#[test]
fn a_failed_branch_still_joins_and_names_the_operation() {
    let ctx = ctx();
    let root = Stream::new(&ctx).unwrap();
    let branches = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
    let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
    let graph = OperationGraph::for_context(&ctx);
    let slow = spin_kernel(&ctx);
    let mut small = DeviceBuffer::<u32>::new(&ctx, 4).unwrap();
    let mut ran = Vec::new();
    let err = graph
        .op(&root)
        .label("fan")
        .fork_join(&refs, |i, s| {
            ran.push(i);
            if i == 0 {
                s.copy_from_host(&mut small, &[1u32; 8])
            } else {
                spin(s, &slow, Duration::from_millis(2));
                Ok(())
            }
        })
        .unwrap_err();
    assert_eq!(ran, [0, 1], "the other branch still ran");
    let Error::OperationFailed {
        operation, label, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(label, "fan");
    // Completed after the join: its event is passed only after branch 1's
    // slow kernel, so once a dependant has finished, branch 1 has too.
    let after = graph
        .op(&root)
        .after(&[*operation])
        .run(|_| Ok(()))
        .unwrap();
    after.wait().unwrap();
    assert!(branches[1].query().unwrap(), "the join did not wait");
}

#[test]
fn an_operation_left_registered_stays_usable_while_thousands_retire_after_it() {
    use cuda_streams_engine::{EventPriority, OperationState, OperationType};
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    let waiting = graph
        .register_operation(
            OperationType::Kernel,
            EventPriority::Low,
            &a,
            vec![],
            "left registered",
        )
        .unwrap();
    // Far more operations than the graph keeps side by side, each retired
    // once the GPU passes it.
    let mut last = None;
    for round in 0..10 {
        for _ in 0..1000 {
            last = Some(graph.op(&b).run(|_| Ok(())).unwrap().id());
        }
        b.synchronize().unwrap();
        graph.retire_completed();
        assert!(
            graph.metrics().in_flight <= 2,
            "round {round}: {:?}",
            graph.metrics()
        );
    }
    assert_eq!(graph.state(last.unwrap()), Some(OperationState::Retired));
    assert_eq!(graph.state(OperationId(2)), Some(OperationState::Retired));
    // The one left behind is still there, with its metadata, and runs.
    assert_eq!(graph.state(waiting), Some(OperationState::Registered));
    assert_eq!(
        graph.metadata(waiting).unwrap().description,
        "left registered"
    );
    let after = graph
        .register_operation(
            OperationType::Kernel,
            EventPriority::Low,
            &b,
            vec![waiting, last.unwrap()],
            "after it",
        )
        .unwrap();
    graph.begin_operation(waiting, &a).unwrap();
    graph.complete_operation(waiting).unwrap();
    graph.begin_operation(after, &b).unwrap();
    graph.complete_operation(after).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_eq!(graph.retire_completed(), 2);
    assert_eq!(graph.state(waiting), Some(OperationState::Retired));
    let m = graph.metrics();
    assert_eq!((m.total_operations, m.in_flight), (10_002, 0));
    assert_eq!(m.completed_operations, m.retired_operations);
}

#[test]
fn an_operations_creation_time_is_when_it_was_built() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    // Held behind a gate, so the operations stay in the graph to be asked about.
    let gate = Gate::close(&stream);
    let mut built = Vec::new();
    for _ in 0..3 {
        let before = Instant::now();
        let op = graph.op(&stream).run(|_| Ok(())).unwrap();
        let after = Instant::now();
        built.push((op, before, after));
        // Time passes between operations and before anyone asks.
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(3) {
            std::hint::spin_loop();
        }
    }
    if gate.still_held() {
        // Each lies within its own window (1 ms allows for the thread being
        // preempted between two clock reads), so 3 ms apart from the next.
        let slack = Duration::from_millis(1);
        for (op, before, after) in &built {
            let meta = graph.metadata(op.id()).expect("held behind the gate");
            assert!(
                meta.creation_time + slack >= *before,
                "{meta:?} before {before:?}"
            );
            assert!(
                meta.creation_time <= *after + slack,
                "{meta:?} after {after:?}"
            );
        }
    }
    gate.open();
    built.last().unwrap().0.wait().unwrap();
}

#[test]
fn builder_operations_retire_on_their_own_while_running() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    for _ in 0..20 {
        for _ in 0..100 {
            let _op = graph.op(&stream).run(|_| Ok(())).unwrap();
        }
        stream.synchronize().unwrap();
    }
    // No retire_completed: each stream's sweeps find what the GPU passed and
    // its next operations retire it. Of the last batch, up to all 100 may
    // remain. An automatic sweep retires up to a guess of how far the GPU
    // trails, so what it passed beyond the guess waits for the next sweep:
    // a few of the batch before can remain too (103 in flight was seen on a
    // loaded machine). Without the sweeps all 2000 would.
    let m = graph.metrics();
    assert!(m.in_flight <= 200, "the graph did not stay small: {m:?}");
    assert!(m.retired_operations >= 1800, "{m:?}");
    // And what remains is retired when asked, exactly.
    assert_eq!(graph.retire_completed() as u64, 2000 - m.retired_operations);
    assert_eq!(graph.metrics().in_flight, 0);
}

/// Retired operations' completion events are kept for the next operations
/// (no `Arc` or pool trip), but never one an `Op` handle still holds: that
/// handle's `wait` and `is_done` must keep answering for its own operation.
#[test]
fn a_held_operations_event_is_never_given_to_a_later_operation() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let held = graph.op(&stream).run(|_| Ok(())).unwrap();
    let held_event = held.event().as_raw();
    stream.synchronize().unwrap();
    let mut later = Vec::new();
    // Enough operations for several sweeps, each retiring what the GPU passed
    // (the held one included) and keeping their events as spares.
    for _ in 0..300 {
        let op = graph.op(&stream).run(|_| Ok(())).unwrap();
        later.push(op.event().as_raw());
        drop(op);
        stream.synchronize().unwrap();
    }
    assert!(
        later.iter().all(|&event| event != held_event),
        "a later operation recorded the held operation's event"
    );
    // Events are reused (spares, or the pool): far fewer than operations.
    later.sort_unstable_by_key(|&event| event as usize);
    later.dedup();
    assert!(
        later.len() < 300,
        "{} distinct events for 300 operations",
        later.len()
    );
    assert!(held.is_done().unwrap());
    held.wait().unwrap();
}

/// Four streams that each get one operation a round sweep together, every
/// 32 rounds, and retire some 128 operations at once: their events are all
/// kept for the next operations, none sent back to the pool only to be taken
/// out again (a fixed limit of two sweeps' worth sent half of them back).
#[test]
fn streams_that_sweep_together_keep_all_their_events_for_the_next_operations() {
    let ctx = ctx();
    let streams: Vec<_> = (0..4).map(|_| Stream::new(&ctx).unwrap()).collect();
    // A pool of its own, grown on demand: what it has free is what came back.
    let pool = std::sync::Arc::new(EventPool::new(&ctx, 0, 0).unwrap());
    let graph = OperationGraph::new(std::sync::Arc::clone(&pool));
    // 32 rounds: the 32nd operation on each stream sweeps it, with the
    // earlier 31 (at least) passed.
    for _ in 0..32 {
        for stream in &streams {
            drop(graph.op(stream).run(|_| Ok(())).unwrap());
        }
        for stream in &streams {
            stream.synchronize().unwrap();
        }
    }
    let m = graph.metrics();
    assert!(m.retired_operations >= 4 * 31, "{m:?}");
    // Back in the pool: at most what the streams' latest marks let go of.
    let free = pool.utilization().available_regular;
    assert!(
        free <= streams.len(),
        "{free} events went back to the pool while {} operations retired",
        m.retired_operations
    );
    // Trimming gives the spares back.
    graph.retire_completed();
    assert!(pool.utilization().available_regular >= 4 * 31 - streams.len());
}

/// `retire_through` retires an operation the GPU has passed together with
/// what it was ordered after (the earlier operations of its stream, its
/// dependencies and theirs) and nothing else; before the GPU passes it,
/// nothing.
#[test]
fn retiring_through_an_operation_takes_what_it_was_ordered_after_and_nothing_else() {
    use cuda_streams_engine::OperationState::{Completed, Retired};
    let ctx = ctx();
    let (s0, s1, s2) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let graph = OperationGraph::for_context(&ctx);
    let run = |stream: &Stream, after: &[OperationId]| {
        graph.op(stream).after(after).run(|_| Ok(())).unwrap()
    };
    let gate = Gate::close(&s2);
    let early = run(&s0, &[]);
    let before_side = run(&s1, &[]);
    let side = run(&s1, &[]);
    let last = run(&s0, &[side.id()]);
    // On a stream `last` waited on, after what it waited for.
    let later_on_s1 = run(&s1, &[]);
    // Behind the gate, and an operation on `last`'s stream that waits for it.
    let held = run(&s2, &[]);
    let after_held = run(&s0, &[held.id()]);
    last.wait().unwrap();
    later_on_s1.wait().unwrap();
    let state = |op: &cuda_streams_engine::Op| graph.state(op.id()).unwrap();

    if gate.still_held() {
        assert_eq!(graph.retire_through(after_held.id()).unwrap(), 0);
        assert_eq!(state(&after_held), Completed);
    }
    assert_eq!(graph.retire_through(last.id()).unwrap(), 4);
    for op in [&early, &before_side, &side, &last] {
        assert_eq!(state(op), Retired, "{:?}", op.id());
    }
    // Passed by the GPU, but not ordered before `last`: left to the sweeps.
    assert_eq!(state(&later_on_s1), Completed);
    // Retired already.
    assert_eq!(graph.retire_through(last.id()).unwrap(), 0);
    let unknown = OperationId(graph.next_id().0 + 10);
    assert!(
        matches!(
            graph.retire_through(unknown),
            Err(Error::UnknownOperation { operation, call: "retire_through" }) if operation == unknown
        ),
        "an id never issued"
    );

    gate.open();
    after_held.wait().unwrap();
    // `held` through the dependency; `after_held` alone on its stream now.
    assert_eq!(graph.retire_through(after_held.id()).unwrap(), 2);
    assert_eq!(state(&held), Retired);
    assert_eq!(state(&later_on_s1), Completed);
    assert_eq!(graph.metrics().retired_operations, 6);
}
