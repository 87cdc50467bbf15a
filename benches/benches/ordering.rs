//! Stream-order tracking (`docs/ordering.md`): what `check` adds per buffer
//! use, on single enqueues, on engine operations and on a 10,000-operation
//! DAG, each against `off` in the same run; and what `auto` costs where it
//! infers the waits, against hand-written waits (a balanced two-stream
//! pipeline) and against explicit edges (the engine's 1→4 fork/join).
//!
//! `cargo bench -p cuda-streams-benches --bench ordering` (on the H200 with
//! `CUDA_STREAMS_DRIVER=cuda`). Each figure sets the policy itself, so
//! `CUDA_STREAMS_ORDERING` does not matter.
//!
//! `ORDERING_COUNT=<scenario>:<variant>:<n>` runs one scenario `n` times
//! and nothing else, for counting instructions under callgrind (two counts
//! with different `n`, subtracted, give the cost per repetition without the
//! set-up): `memset:off|check|auto` (`n` memsets), `engine:off|check` and
//! `dag:off|check` (`n` DAGs of 200 and of 10,000 operations),
//! `pipeline:hand|auto` (`n` runs of 1,000 steps), `forkjoin:explicit|auto`
//! (`n` fork/joins).

use criterion::Criterion;
use cuda_streams_benches::{compare, figure, median_ns, run_criterion};
use driver::{Context, DeviceBuffer, OrderPolicy, Stream};
use engine::OperationGraph;
use std::sync::Arc;

const LEN: usize = 256;

/// How a scenario repeats its step: timed for the figures, or a fixed
/// number of times for an instruction count (`ORDERING_COUNT`).
#[derive(Clone, Copy)]
enum Runs {
    Timed,
    Counted(usize),
}

impl Runs {
    /// [`median_ns`] of `f`, or `f` run the counted number of times.
    fn per_call(self, samples: usize, batch: usize, mut f: impl FnMut()) -> f64 {
        match self {
            Runs::Timed => median_ns(samples, batch, f),
            Runs::Counted(n) => {
                (0..n).for_each(|_| f());
                0.0
            }
        }
    }

    /// The median time of `f` over `runs` runs, or `f` run the counted
    /// number of times.
    fn median(self, runs: usize, mut f: impl FnMut()) -> std::time::Duration {
        match self {
            Runs::Timed => cuda_streams_benches::median_duration(runs, f),
            Runs::Counted(n) => {
                (0..n).for_each(|_| f());
                std::time::Duration::ZERO
            }
        }
    }
}

fn with_policy<R>(ctx: &Context, policy: OrderPolicy, f: impl FnOnce() -> R) -> R {
    let before = ctx.ordering();
    ctx.set_ordering(policy);
    let result = f();
    ctx.set_ordering(before);
    result
}

/// One memset (one buffer use) on a buffer used before: the common case.
fn per_enqueue(ctx: &Arc<Context>, policy: OrderPolicy, runs: Runs) -> f64 {
    let stream = Stream::new(ctx).unwrap();
    let mut data = DeviceBuffer::<u32>::new(ctx, LEN).unwrap();
    with_policy(ctx, policy, || {
        let ns = runs.per_call(31, 2_000, || stream.memset_u32_async(&mut data, 1).unwrap());
        stream.synchronize().unwrap();
        ns
    })
}

/// `n` engine operations round-robin over four streams, each one memset of
/// its own buffer after the previous operation (explicit edges): the
/// engine bench's shape. Returns ns per operation (= per buffer use).
fn engine_dag(ctx: &Arc<Context>, policy: OrderPolicy, n: usize, runs: Runs) -> f64 {
    let streams: Vec<_> = (0..4).map(|_| Stream::new(ctx).unwrap()).collect();
    let mut buffers: Vec<_> = (0..64)
        .map(|_| DeviceBuffer::<u32>::new(ctx, LEN).unwrap())
        .collect();
    with_policy(ctx, policy, || {
        let total = runs.median(if n > 1_000 { 5 } else { 21 }, || {
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
fn pipeline(ctx: &Arc<Context>, hand: bool, iterations: usize, runs: Runs) -> f64 {
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
        let total = runs.median(11, || {
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
fn fork_join(ctx: &Arc<Context>, explicit: bool, runs: Runs) -> f64 {
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
        runs.per_call(21, 50, || {
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
    let off = per_enqueue(ctx, OrderPolicy::Off, Runs::Timed);
    let check = per_enqueue(ctx, OrderPolicy::Check, Runs::Timed);
    compare("memset, check vs off", check, off);
    figure(
        "check per buffer use, single enqueue (goal <= 200 ns)",
        check - off,
        "ns",
    );

    let off = engine_dag(ctx, OrderPolicy::Off, 200, Runs::Timed);
    let check = engine_dag(ctx, OrderPolicy::Check, 200, Runs::Timed);
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

    let off = engine_dag(ctx, OrderPolicy::Off, 10_000, Runs::Timed);
    let check = engine_dag(ctx, OrderPolicy::Check, 10_000, Runs::Timed);
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

    let hand = pipeline(ctx, true, 1_000, Runs::Timed);
    let auto = pipeline(ctx, false, 1_000, Runs::Timed);
    compare(
        "balanced pipeline per step, auto vs hand-written waits (goal <= 1.02x)",
        auto,
        hand,
    );

    let explicit = fork_join(ctx, true, Runs::Timed);
    let inferred = fork_join(ctx, false, Runs::Timed);
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

/// `ORDERING_COUNT=<scenario>:<variant>:<n>`: run that scenario alone.
fn count(spec: &str) {
    let ctx = Context::new(0).expect("a context");
    let parts: Vec<&str> = spec.split(':').collect();
    let [scenario, variant, n] = parts[..] else {
        panic!("ORDERING_COUNT={spec:?}: expected <scenario>:<variant>:<n>");
    };
    let n: usize = n
        .parse()
        .unwrap_or_else(|_| panic!("ORDERING_COUNT={spec:?}: {n:?} is not a count"));
    let policy =
        || OrderPolicy::parse(variant).unwrap_or_else(|e| panic!("ORDERING_COUNT={spec:?}: {e}"));
    let runs = Runs::Counted(n);
    match (scenario, variant) {
        ("memset", _) => drop(per_enqueue(&ctx, policy(), runs)),
        ("engine", _) => drop(engine_dag(&ctx, policy(), 200, runs)),
        ("dag", _) => drop(engine_dag(&ctx, policy(), 10_000, runs)),
        ("pipeline", "hand" | "auto") => drop(pipeline(&ctx, variant == "hand", 1_000, runs)),
        ("forkjoin", "explicit" | "auto") => drop(fork_join(&ctx, variant == "explicit", runs)),
        _ => panic!("ORDERING_COUNT={spec:?}: unknown scenario or variant"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("ORDERING_COUNT") {
        return count(&spec);
    }
    run_criterion(&[criterion_groups]);
    ratios(&Context::new(0).expect("a context"));
    cuda_streams_benches::criterion_summary();
}
