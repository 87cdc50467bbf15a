//! The operation graph's host cost against the raw driver calls it makes.
//!
//! 1. Per operation: an operation on one of two streams depending on the
//!    previous one (on the other stream) is one `cuStreamWaitEvent` and one
//!    `cuEventRecord`. The baseline makes exactly those calls with pooled
//!    events; the difference is the graph's own overhead per operation
//!    (registration, state, retirement), driver calls excluded.
//! 2. A 1→4 fork/join: a root operation, four branches after it on four
//!    streams, a join after all four: 6 records and 8 waits, through the
//!    graph and as raw calls; then the same as one graph operation
//!    (`OpBuilder::fork_join`: the fork, four branches and the join, with
//!    5 records and 8 waits, the fork waiting on the root stream's latest
//!    completion event, and one operation's bookkeeping). Also the driver
//!    layer's `Stream::fork`/`join` (5 records, 8 waits).
//!
//! The sections are named functions (`graph_op`, `raw_op`, `node_fork_join`,
//! `raw_fork_join`), so that callgrind counts their instructions:
//! `ENGINE_BENCH_SAMPLES=3 valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='engine::node_fork_join' target/release/deps/engine-… --bench`.
//!
//! Every batch of work is followed by an untimed synchronize, so queues stay
//! short on both sides. The batches of the graph and of its baseline
//! alternate, so both see the same state of the machine: the host of the H200
//! machine runs in two states, one about 1.7 times slower than the other, and
//! measured one after the other the two sides could land in different ones.
//! The overheads in percent are the median over pairs of neighbouring
//! batches of one batch's time over the other's, so that a change of state
//! during the run moves both sides of each pair alike; the RATIO lines give
//! the medians of each side over the whole run.

use cuda_streams_benches::{Pair, alternating, compare, criterion_summary, figure, run_criterion};
use driver::{Context, EventPool, PooledEvent, Stream};
use engine::{OperationGraph, OperationId};
use std::sync::Arc;

const SAMPLES: usize = 400;
const BATCH: usize = 100;

/// Batches per side: [`SAMPLES`], or `ENGINE_BENCH_SAMPLES` (a few, for a
/// run under callgrind, which counts instructions rather than timing).
fn samples() -> usize {
    std::env::var("ENGINE_BENCH_SAMPLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(SAMPLES)
}

/// [`alternating`] with this bench's sample and batch counts.
fn per_call_pair(ours: impl FnMut(usize), raw: impl FnMut(usize), settle: impl FnMut()) -> Pair {
    alternating(samples(), BATCH, ours, raw, settle)
}

/// One operation of section 1 through the graph: after `prev`, on `stream`.
/// Not inlined, so that callgrind counts it by name.
#[inline(never)]
fn graph_op(graph: &OperationGraph, stream: &Stream, prev: OperationId) -> OperationId {
    graph
        .op(stream)
        .after(&[prev])
        .run(|_| Ok(()))
        .expect("an op")
        .id()
}

/// Its raw baseline: a wait on the last event and a record.
#[inline(never)]
fn raw_op(pool: &Arc<EventPool>, stream: &Stream, last: &mut PooledEvent) {
    stream.wait_event(last).expect("wait");
    *last = record(pool, stream);
}

/// The 1->4 fork/join as raw calls: 6 records, 8 waits.
#[inline(never)]
fn raw_fork_join(pool: &Arc<EventPool>, root_stream: &Stream, branches: &[Arc<Stream>]) {
    let root = record(pool, root_stream);
    let ends: Vec<PooledEvent> = branches
        .iter()
        .map(|b| {
            b.wait_event(&root).expect("wait");
            record(pool, b)
        })
        .collect();
    for end in &ends {
        root_stream.wait_event(end).expect("wait");
    }
    let _join = record(pool, root_stream);
}

/// The 1->4 fork/join as one graph operation.
#[inline(never)]
fn node_fork_join(graph: &OperationGraph, root_stream: &Stream, refs: &[&Stream]) {
    let _fan = graph
        .op(root_stream)
        .fork_join(refs, |_, _| Ok(()))
        .expect("fork/join");
}

fn record(pool: &Arc<EventPool>, stream: &Stream) -> PooledEvent {
    let event = pool.acquire_event(false).expect("an event");
    event.record(stream).expect("record");
    event
}

fn main() {
    run_criterion(&[]);
    let ctx = Context::new(0).expect("a context");
    let streams: Vec<Arc<Stream>> = (0..5)
        .map(|_| Stream::new(&ctx).expect("a stream"))
        .collect();
    let settle = || {
        for stream in &streams {
            stream.synchronize().expect("synchronize");
        }
    };
    let pool = ctx.event_pool();

    // 1. Per operation.
    let graph = OperationGraph::for_context(&ctx);
    let first = graph.op(&streams[0]).run(|_| Ok(())).expect("an op");
    first.wait().expect("the first op");
    let mut prev = first.id();
    // Retired now, as the steady state would: an operation on a stream that
    // gets no more stays live until that stream's next sweep, and at the
    // front of the graph's ring it would keep every later slot there until
    // the ring's limit (4096), so that the first few thousand operations
    // measured would also pay for a growing ring.
    graph.retire_completed();
    let mut last = record(&pool, &streams[0]);
    let per_op = per_call_pair(
        |i| prev = graph_op(&graph, &streams[1 + i % 2], prev),
        |i| raw_op(&pool, &streams[1 + i % 2], &mut last),
        settle,
    );
    compare(
        "engine: one operation with a cross-stream dependency vs the raw wait + record",
        per_op.ours,
        per_op.raw,
    );
    figure(
        "engine: host overhead per operation, driver calls excluded",
        per_op.over_raw_ns,
        "ns",
    );

    // 2. 1 -> 4 fork/join.
    let (root_stream, branches) = (&streams[0], &streams[1..5]);
    let mut raw_fork_join = |_| raw_fork_join(&pool, root_stream, branches);
    let builder = per_call_pair(
        |_| {
            let root = graph.op(root_stream).run(|_| Ok(())).expect("root");
            let ids: Vec<_> = branches
                .iter()
                .map(|b| {
                    graph
                        .op(b)
                        .after(&[root.id()])
                        .run(|_| Ok(()))
                        .expect("branch")
                        .id()
                })
                .collect();
            let _join = graph
                .op(root_stream)
                .after(&ids)
                .run(|_| Ok(()))
                .expect("join");
        },
        &mut raw_fork_join,
        settle,
    );
    compare(
        "engine: 1->4 fork/join through the graph vs the same raw calls",
        builder.ours,
        builder.raw,
    );
    figure(
        "engine: 1->4 fork/join, graph over raw",
        builder.over_raw_percent,
        "%",
    );
    let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
    let node = per_call_pair(
        |_| node_fork_join(&graph, root_stream, &refs),
        &mut raw_fork_join,
        settle,
    );
    compare(
        "engine: 1->4 fork/join as one graph operation vs the same raw calls",
        node.ours,
        node.raw,
    );
    figure(
        "engine: 1->4 fork/join node, graph over raw",
        node.over_raw_percent,
        "%",
    );
    let layer = per_call_pair(
        |_| {
            root_stream.fork(&refs).expect("fork");
            root_stream.join(&refs).expect("join");
        },
        &mut raw_fork_join,
        settle,
    );
    compare(
        "engine: Stream::fork + join (1->4, 5 records) vs the same raw calls (6 records)",
        layer.ours,
        layer.raw,
    );
    criterion_summary();
}
