//! Stream-order tracking (`docs/ordering.md`): what `check` adds per buffer
//! use, on single enqueues, on engine operations and on a 10,000-operation
//! DAG, each against `off` in the same run; and what `auto` costs where it
//! infers the waits, against hand-written waits (a balanced two-stream
//! pipeline) and against explicit edges (the engine's 1→4 fork/join).
//!
//! `cargo bench -p cuda-streams-benches --bench ordering` (on the H200 with
//! `CUDA_STREAMS_DRIVER=cuda`). Each figure sets the policy itself, so
//! `CUDA_STREAMS_ORDERING` does not matter.

use criterion::Criterion;
use cuda_streams_benches::{compare, figure, median_ns, run_criterion};
use driver::{Context, DeviceBuffer, OrderPolicy, Stream};
use engine::OperationGraph;
use std::sync::Arc;

const LEN: usize = 256;

fn with_policy<R>(ctx: &Context, policy: OrderPolicy, f: impl FnOnce() -> R) -> R {
    let before = ctx.ordering();
    ctx.set_ordering(policy);
    let result = f();
    ctx.set_ordering(before);
    result
}

/// One memset (one buffer use) on a buffer used before: the common case.
fn per_enqueue(ctx: &Arc<Context>, policy: OrderPolicy) -> f64 {
    let stream = Stream::new(ctx).unwrap();
    let mut data = DeviceBuffer::<u32>::new(ctx, LEN).unwrap();
    with_policy(ctx, policy, || {
        let ns = median_ns(31, 2_000, || stream.memset_u32_async(&mut data, 1).unwrap());
        stream.synchronize().unwrap();
        ns
    })
}

/// `n` engine operations round-robin over four streams, each one memset of
/// its own buffer after the previous operation (explicit edges): the
/// engine bench's shape. Returns ns per operation (= per buffer use).
fn engine_dag(ctx: &Arc<Context>, policy: OrderPolicy, n: usize) -> f64 {
    let streams: Vec<_> = (0..4).map(|_| Stream::new(ctx).unwrap()).collect();
    let mut buffers: Vec<_> = (0..64)
        .map(|_| DeviceBuffer::<u32>::new(ctx, LEN).unwrap())
        .collect();
    with_policy(ctx, policy, || {
        let runs = if n > 1_000 { 5 } else { 21 };
        let total = cuda_streams_benches::median_duration(runs, || {
            let graph = OperationGraph::for_context(ctx);
            let mut last = None;
            for i in 0..n {
                let buffer = &mut buffers[i % 64];
                let after: Vec<_> = last.into_iter().collect();
                let op = graph
                    .op(&streams[i % 4])
                    .after(&after)
                    .run(|s| s.memset_u32_async(buffer, i as u32))
                    .unwrap();
                last = Some(op.id());
            }
            for s in &streams {
                s.synchronize().unwrap();
            }
        });
        total.as_nanos() as f64 / n as f64
    })
}

/// A producer stream fills one of three buffers, a consumer stream copies
/// it out: `hand` with the waits written, otherwise under `Auto` without.
fn pipeline(ctx: &Arc<Context>, hand: bool, iterations: usize) -> f64 {
    let (producer, consumer) = (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap());
    let mut slots: Vec<_> = (0..3)
        .map(|_| DeviceBuffer::<u32>::new(ctx, LEN).unwrap())
        .collect();
    let mut out = DeviceBuffer::<u32>::new(ctx, LEN).unwrap();
    let policy = if hand {
        OrderPolicy::Off
    } else {
        OrderPolicy::Auto
    };
    with_policy(ctx, policy, || {
        let total = cuda_streams_benches::median_duration(11, || {
            for i in 0..iterations {
                let slot = &mut slots[i % 3];
                if hand {
                    producer.wait_stream(&consumer).unwrap();
                }
                producer.memset_u32_async(slot, i as u32).unwrap();
                if hand {
                    consumer.wait_stream(&producer).unwrap();
                }
                consumer
                    .copy_device_to_device_async(&mut out, &*slot)
                    .unwrap();
            }
            consumer.synchronize().unwrap();
            producer.synchronize().unwrap();
        });
        total.as_nanos() as f64 / iterations as f64
    })
}

/// The engine's 1→4 fork/join: a root fills a buffer, four branches copy it
/// into their own, a join reads the four; `explicit` with its edges under
/// `off`, otherwise under `Auto` with the edges left out.
fn fork_join(ctx: &Arc<Context>, explicit: bool) -> f64 {
    let main = Stream::new(ctx).unwrap();
    let branches: Vec<_> = (0..4).map(|_| Stream::new(ctx).unwrap()).collect();
    let mut root = DeviceBuffer::<u32>::new(ctx, LEN).unwrap();
    let mut parts: Vec<_> = (0..4)
        .map(|_| DeviceBuffer::<u32>::new(ctx, LEN).unwrap())
        .collect();
    let mut outs: Vec<_> = (0..4)
        .map(|_| DeviceBuffer::<u32>::new(ctx, LEN).unwrap())
        .collect();
    let policy = if explicit {
        OrderPolicy::Off
    } else {
        OrderPolicy::Auto
    };
    with_policy(ctx, policy, || {
        median_ns(21, 50, || {
            let graph = OperationGraph::for_context(ctx);
            let fill = graph
                .op(&main)
                .run(|s| s.memset_u32_async(&mut root, 3))
                .unwrap();
            let mut ids = Vec::new();
            for (stream, part) in branches.iter().zip(parts.iter_mut()) {
                let after = if explicit { vec![fill.id()] } else { vec![] };
                let op = graph
                    .op(stream)
                    .after(&after)
                    .run(|s| s.copy_device_to_device_async(part, &root))
                    .unwrap();
                ids.push(op.id());
            }
            let after = if explicit { ids } else { vec![] };
            let _join = graph
                .op(&main)
                .after(&after)
                .run(|s| {
                    for (out, part) in outs.iter_mut().zip(&parts) {
                        s.copy_device_to_device_async(out, part)?;
                    }
                    Ok(())
                })
                .unwrap();
            main.synchronize().unwrap();
        })
    })
}

fn ratios(ctx: &Arc<Context>) {
    let off = per_enqueue(ctx, OrderPolicy::Off);
    let check = per_enqueue(ctx, OrderPolicy::Check);
    compare("memset, check vs off", check, off);
    figure(
        "check per buffer use, single enqueue (goal <= 200 ns)",
        check - off,
        "ns",
    );

    let off = engine_dag(ctx, OrderPolicy::Off, 200);
    let check = engine_dag(ctx, OrderPolicy::Check, 200);
    compare(
        "engine operation (one buffer use), check vs off",
        check,
        off,
    );
    figure(
        "check per buffer use, engine (goal <= 200 ns)",
        check - off,
        "ns",
    );

    let off = engine_dag(ctx, OrderPolicy::Off, 10_000);
    let check = engine_dag(ctx, OrderPolicy::Check, 10_000);
    compare(
        "10,000-operation DAG, per operation, check vs off",
        check,
        off,
    );
    figure(
        "check per buffer use, 10,000-operation DAG (goal <= 200 ns)",
        check - off,
        "ns",
    );

    let hand = pipeline(ctx, true, 1_000);
    let auto = pipeline(ctx, false, 1_000);
    compare(
        "balanced pipeline per step, auto vs hand-written waits (goal <= 1.02x)",
        auto,
        hand,
    );

    let explicit = fork_join(ctx, true);
    let inferred = fork_join(ctx, false);
    compare(
        "engine 1->4 fork/join, auto without edges vs explicit edges (goal <= 1.10x)",
        inferred,
        explicit,
    );
}

fn criterion_groups(c: &mut Criterion) {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).unwrap();
    let mut data = DeviceBuffer::<u32>::new(&ctx, LEN).unwrap();
    for policy in [OrderPolicy::Off, OrderPolicy::Check] {
        with_policy(&ctx, policy, || {
            c.bench_function(&format!("ordering/memset {policy:?}"), |b| {
                b.iter(|| stream.memset_u32_async(&mut data, 1).unwrap())
            });
            stream.synchronize().unwrap();
        });
    }
}

fn main() {
    run_criterion(&[criterion_groups]);
    ratios(&Context::new(0).expect("a context"));
    cuda_streams_benches::criterion_summary();
}
