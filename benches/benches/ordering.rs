//! Stream-order tracking (`docs/ordering.md`): what `check` adds per buffer
//! use, on single enqueues, on engine operations and on a 10,000-operation
//! DAG, each against `off` in the same run; and what `auto` costs where it
//! infers the waits, against hand-written waits (a balanced two-stream
//! pipeline) and against explicit edges (the engine's 1→4 fork/join).
//!
//! `cargo bench -p cuda-streams-benches --bench ordering` (on the H200 with
//! `CUDA_STREAMS_DRIVER=cuda`). Each figure sets the policy itself, so
//! `CUDA_STREAMS_ORDERING` does not matter. Every figure is measured against
//! `off`, which the software driver refuses (a race there would be a data
//! race): there only the criterion group of `check` runs, and the figures
//! say they are skipped.
//!
//! The two sides of each comparison run on the same streams and buffers, in
//! batches that alternate ([`alternating`]): the hosts of the GPU machines
//! drift by more than the overheads measured here, and measured one after
//! the other the drift would land on one side. The policy is switched per
//! batch: the baseline's batch sets its own at its first call (a store
//! under a lock, against a whole batch), and after every batch the untimed
//! settle step sets the tracked side's policy and runs one untimed round of
//! its work, so that the shadow state, which switching tracking on clears,
//! is back in its steady state (every buffer used before) when the tracked
//! batch starts. The `FIGURE` lines give the overhead as the median over
//! pairs of neighbouring batches, in ns and in percent; the `RATIO` lines
//! the medians of each side over the run.
//!
//! `ORDERING_COUNT=<scenario>:<variant>:<n>` runs one scenario `n` times
//! and nothing else, for counting instructions under callgrind (two counts
//! with different `n`, subtracted, give the cost per repetition without the
//! set-up): `memset:off|check|auto` (`n` memsets), `engine:off|check` and
//! `dag:off|check` (`n` DAGs of 200 and of 10,000 operations),
//! `pipeline:hand|auto` (`n` runs of 1,000 steps), `forkjoin:explicit|auto`
//! (`n` fork/joins).

use criterion::Criterion;
use cuda_streams_benches::{Pair, alternating, compare, figure, run_criterion};
use driver::{Context, DeviceBuffer, OrderPolicy, Stream};
use engine::OperationGraph;
use std::cell::RefCell;
use std::sync::Arc;

const LEN: usize = 256;

/// One memset (one buffer use) on a buffer used before: the common case.
struct Memset {
    stream: Arc<Stream>,
    data: DeviceBuffer<u32>,
}

impl Memset {
    fn new(ctx: &Arc<Context>) -> Self {
        Self {
            stream: Stream::new(ctx).unwrap(),
            data: DeviceBuffer::new(ctx, LEN).unwrap(),
        }
    }

    fn call(&mut self, i: usize) {
        self.stream
            .memset_u32_async(&mut self.data, i as u32)
            .unwrap();
    }

    fn settle(&self) {
        self.stream.synchronize().unwrap();
    }
}

/// `n` engine operations round-robin over four streams, each one memset of
/// one of 64 buffers after the previous operation (explicit edges): the
/// engine bench's shape. One call is one whole DAG, synchronized.
struct EngineDag {
    ctx: Arc<Context>,
    streams: Vec<Arc<Stream>>,
    buffers: Vec<DeviceBuffer<u32>>,
    n: usize,
}

impl EngineDag {
    fn new(ctx: &Arc<Context>, n: usize) -> Self {
        Self {
            ctx: Arc::clone(ctx),
            streams: (0..4).map(|_| Stream::new(ctx).unwrap()).collect(),
            buffers: (0..64)
                .map(|_| DeviceBuffer::new(ctx, LEN).unwrap())
                .collect(),
            n,
        }
    }

    fn call(&mut self) {
        let graph = OperationGraph::for_context(&self.ctx);
        let mut last = None;
        for i in 0..self.n {
            let buffer = &mut self.buffers[i % 64];
            let after: Vec<_> = last.into_iter().collect();
            let op = graph
                .op(&self.streams[i % 4])
                .after(&after)
                .run(|s| s.memset_u32_async(buffer, i as u32))
                .unwrap();
            last = Some(op.id());
        }
        for s in &self.streams {
            s.synchronize().unwrap();
        }
    }
}

/// A producer stream fills one of three buffers, a consumer stream copies
/// it out: `hand` with the waits written (under `off`), otherwise under
/// `auto` without them. One call is one step.
struct Pipeline {
    producer: Arc<Stream>,
    consumer: Arc<Stream>,
    slots: Vec<DeviceBuffer<u32>>,
    out: DeviceBuffer<u32>,
}

impl Pipeline {
    fn new(ctx: &Arc<Context>) -> Self {
        Self {
            producer: Stream::new(ctx).unwrap(),
            consumer: Stream::new(ctx).unwrap(),
            slots: (0..3)
                .map(|_| DeviceBuffer::new(ctx, LEN).unwrap())
                .collect(),
            out: DeviceBuffer::new(ctx, LEN).unwrap(),
        }
    }

    fn step(&mut self, i: usize, hand: bool) {
        let slot = &mut self.slots[i % 3];
        if hand {
            self.producer.wait_stream(&self.consumer).unwrap();
        }
        self.producer.memset_u32_async(slot, i as u32).unwrap();
        if hand {
            self.consumer.wait_stream(&self.producer).unwrap();
        }
        self.consumer
            .copy_device_to_device_async(&mut self.out, &*slot)
            .unwrap();
    }

    fn settle(&self) {
        self.consumer.synchronize().unwrap();
        self.producer.synchronize().unwrap();
    }
}

/// The engine's 1→4 fork/join: a root fills a buffer, four branches copy it
/// into their own, a join reads the four; `explicit` with its edges (under
/// `off`), otherwise under `auto` with the edges left out. One call is one
/// fork/join, synchronized.
struct ForkJoin {
    ctx: Arc<Context>,
    main: Arc<Stream>,
    branches: Vec<Arc<Stream>>,
    root: DeviceBuffer<u32>,
    parts: Vec<DeviceBuffer<u32>>,
    outs: Vec<DeviceBuffer<u32>>,
}

impl ForkJoin {
    fn new(ctx: &Arc<Context>) -> Self {
        let buffers = || -> Vec<_> {
            (0..4)
                .map(|_| DeviceBuffer::new(ctx, LEN).unwrap())
                .collect()
        };
        Self {
            ctx: Arc::clone(ctx),
            main: Stream::new(ctx).unwrap(),
            branches: (0..4).map(|_| Stream::new(ctx).unwrap()).collect(),
            root: DeviceBuffer::new(ctx, LEN).unwrap(),
            parts: buffers(),
            outs: buffers(),
        }
    }

    fn call(&mut self, explicit: bool) {
        let graph = OperationGraph::for_context(&self.ctx);
        let root = &mut self.root;
        let fill = graph
            .op(&self.main)
            .run(|s| s.memset_u32_async(root, 3))
            .unwrap();
        let mut ids = Vec::new();
        for (stream, part) in self.branches.iter().zip(self.parts.iter_mut()) {
            let after = if explicit { vec![fill.id()] } else { vec![] };
            let op = graph
                .op(stream)
                .after(&after)
                .run(|s| s.copy_device_to_device_async(part, &self.root))
                .unwrap();
            ids.push(op.id());
        }
        let after = if explicit { ids } else { vec![] };
        let (outs, parts) = (&mut self.outs, &self.parts);
        let _join = graph
            .op(&self.main)
            .after(&after)
            .run(|s| {
                for (out, part) in outs.iter_mut().zip(parts) {
                    s.copy_device_to_device_async(out, part)?;
                }
                Ok(())
            })
            .unwrap();
        self.main.synchronize().unwrap();
    }
}

/// Set `ctx`'s policy to `policy` unless it is already (switching tracking
/// on clears the shadow state).
fn ensure(ctx: &Context, policy: OrderPolicy) {
    if ctx.ordering() != policy {
        let set = ctx.set_ordering(policy);
        set.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Time a tracked side (`tracked`, under `policy`) against a baseline side
/// (`baseline`, under `base`) of one scenario, in alternating batches
/// ([`alternating`]): the baseline's batch sets `base` at its first call;
/// after every batch, untimed, `settle` waits for the work, the policy goes
/// back to `policy` and `tracked` runs once more, so each tracked batch
/// starts in the steady state.
#[allow(clippy::too_many_arguments)]
fn pair<S>(
    ctx: &Context,
    scenario: &RefCell<S>,
    samples: usize,
    batch: usize,
    policy: OrderPolicy,
    base: OrderPolicy,
    tracked: impl Fn(&mut S, usize),
    baseline: impl Fn(&mut S, usize),
    settle: impl Fn(&S),
) -> Pair {
    let prime = || {
        let mut s = scenario.borrow_mut();
        settle(&s);
        ensure(ctx, policy);
        tracked(&mut s, 0);
        settle(&s);
    };
    prime();
    let result = alternating(
        samples,
        batch,
        |i| {
            if i == 0 {
                // Primed by the settle step before; checked, not assumed.
                ensure(ctx, policy);
            }
            tracked(&mut scenario.borrow_mut(), i);
        },
        |i| {
            if i == 0 {
                ensure(ctx, base);
            }
            baseline(&mut scenario.borrow_mut(), i);
        },
        prime,
    );
    ensure(ctx, base);
    result
}

/// Print one pair: the `RATIO` line (medians over the run), and the
/// overhead as the median over pairs of neighbouring batches, in ns
/// (`overhead_ns`) and in percent (`overhead_percent`).
fn report(ratio: &'static str, overhead_ns: &str, overhead_percent: &str, pair: &Pair) {
    compare(ratio, pair.ours, pair.raw);
    figure(overhead_ns, pair.over_raw_ns, "ns");
    figure(overhead_percent, pair.over_raw_percent, "%");
}

fn ratios(ctx: &Arc<Context>) {
    if !ctx.is_gpu() {
        println!(
            "skipped: the figures measure check and auto against off, which the software driver refuses; run with CUDA_STREAMS_DRIVER=cuda"
        );
        return;
    }
    let before = ctx.ordering();
    let (check, off, auto) = (OrderPolicy::Check, OrderPolicy::Off, OrderPolicy::Auto);

    let memset = RefCell::new(Memset::new(ctx));
    let per_use = pair(
        ctx,
        &memset,
        61,
        2_000,
        check,
        off,
        Memset::call,
        Memset::call,
        Memset::settle,
    );
    report(
        "memset, check vs off",
        "check per buffer use, single enqueue (goal <= 200 ns)",
        "check over off per pair, single enqueue",
        &per_use,
    );

    engine_line(
        ctx,
        (200, 41, 5),
        "engine operation (one buffer use), check vs off",
        "check per buffer use, engine (goal <= 200 ns)",
        "check over off per pair, engine",
    );
    engine_line(
        ctx,
        (10_000, 15, 1),
        "10,000-operation DAG, per operation, check vs off",
        "check per buffer use, 10,000-operation DAG (goal <= 200 ns)",
        "check over off per pair, 10,000-operation DAG",
    );

    let pipeline = RefCell::new(Pipeline::new(ctx));
    let per_step = pair(
        ctx,
        &pipeline,
        41,
        1_000,
        auto,
        off,
        |p, i| p.step(i, false),
        |p, i| p.step(i, true),
        Pipeline::settle,
    );
    report(
        "balanced pipeline per step, auto vs hand-written waits (goal <= 1.02x)",
        "balanced pipeline per step, auto over hand-written waits per pair",
        "balanced pipeline per step, auto over hand-written waits per pair (goal <= 2%)",
        &per_step,
    );

    let fork_join = RefCell::new(ForkJoin::new(ctx));
    let per_fork = pair(
        ctx,
        &fork_join,
        41,
        50,
        auto,
        off,
        |f, _| f.call(false),
        |f, _| f.call(true),
        |_| {},
    );
    report(
        "engine 1->4 fork/join, auto without edges vs explicit edges (goal <= 1.10x)",
        "engine 1->4 fork/join, auto without edges over explicit edges per pair",
        "engine 1->4 fork/join, auto without edges over explicit edges per pair (goal <= 10%)",
        &per_fork,
    );
    ensure(ctx, before);
}

/// `check` against `off` on DAGs of `n` engine operations, `samples` pairs
/// of batches of `batch` DAGs, per operation.
fn engine_line(
    ctx: &Arc<Context>,
    (n, samples, batch): (usize, usize, usize),
    ratio: &'static str,
    overhead_ns: &str,
    overhead_percent: &str,
) {
    let dag = RefCell::new(EngineDag::new(ctx, n));
    let (check, off) = (OrderPolicy::Check, OrderPolicy::Off);
    let call = |d: &mut EngineDag, _| d.call();
    let per_dag = pair(ctx, &dag, samples, batch, check, off, call, call, |_| {});
    report(
        ratio,
        overhead_ns,
        overhead_percent,
        &per_operation(per_dag, n),
    );
}

/// A pair timed per call of `n` operations, per operation.
fn per_operation(pair: Pair, n: usize) -> Pair {
    let n = n as f64;
    Pair {
        ours: pair.ours / n,
        raw: pair.raw / n,
        over_raw_ns: pair.over_raw_ns / n,
        ..pair
    }
}

fn criterion_groups(c: &mut Criterion) {
    let ctx = Context::new(0).expect("a context");
    let before = ctx.ordering();
    let mut memset = Memset::new(&ctx);
    for policy in [OrderPolicy::Off, OrderPolicy::Check] {
        if let Err(refused) = ctx.set_ordering(policy) {
            println!("skipped: ordering/memset {policy:?}: {refused}");
            continue;
        }
        c.bench_function(&format!("ordering/memset {policy:?}"), |b| {
            b.iter(|| memset.call(1))
        });
        memset.settle();
    }
    ensure(&ctx, before);
}

/// The policy of a side whose order is written by hand (`off`), or left
/// to `auto`.
fn written_or_auto(written: bool) -> OrderPolicy {
    if written {
        OrderPolicy::Off
    } else {
        OrderPolicy::Auto
    }
}

/// `ORDERING_COUNT=<scenario>:<variant>:<n>`: run that scenario alone,
/// once untimed under its policy to reach the steady state, then `n` times.
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
    // `off` and the hand-written sides (under `off`) are refused on the
    // software driver: the error says so.
    let set = |policy: OrderPolicy| {
        let set = ctx.set_ordering(policy);
        set.unwrap_or_else(|e| panic!("ORDERING_COUNT={spec:?}: {e}"));
    };
    let repeat = |f: &mut dyn FnMut(usize)| (0..=n).for_each(f);
    match (scenario, variant) {
        ("memset", _) => {
            set(policy());
            let mut m = Memset::new(&ctx);
            repeat(&mut |i| m.call(i));
            m.settle();
        }
        ("engine" | "dag", _) => {
            set(policy());
            let mut d = EngineDag::new(&ctx, if scenario == "dag" { 10_000 } else { 200 });
            repeat(&mut |_| d.call());
        }
        ("pipeline", "hand" | "auto") => {
            let hand = variant == "hand";
            set(written_or_auto(hand));
            let mut p = Pipeline::new(&ctx);
            // A run is 1,000 steps, as the timed batch.
            repeat(&mut |_| {
                (0..1_000).for_each(|i| p.step(i, hand));
                p.settle();
            });
        }
        ("forkjoin", "explicit" | "auto") => {
            let explicit = variant == "explicit";
            set(written_or_auto(explicit));
            let mut f = ForkJoin::new(&ctx);
            repeat(&mut |_| f.call(explicit));
        }
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
