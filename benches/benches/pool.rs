//! Stream pool: handing out a pooled stream against creating and destroying
//! one (`cuStreamCreateWithPriority` + `cuStreamDestroy`), and eight 10 ms
//! spin kernels on the pool's streams against the same kernels on one stream;
//! the stream coordinator's barrier and re-applied dependencies against the
//! raw driver-layer calls.
//!
//! `POOL_COUNT=<scenario>:<n>` runs one coordinator scenario `n` times and
//! nothing else, for counting instructions under callgrind (two counts with
//! different `n`, subtracted, give the cost per repetition without the
//! set-up): `barrier` (the coordinator's `create_barrier` over 4 streams),
//! `stream-barrier` (`Stream::barrier` over the same streams), `apply` (its
//! `apply_dependencies` over a chain of 3) and `wait-stream` (the same
//! `wait_stream` calls). The streams are synchronized every 50 repetitions,
//! so that the event pool and the graph reach their steady state as on a
//! GPU, where the work is done long before the next repetition.

use criterion::Criterion;
use cuda_streams_benches::{
    compare, criterion_summary, figure, median_duration, median_ns, run_criterion, spin_kernel,
};
use driver::{Context, Kernel, LaunchConfig, Stream, StreamPriority};
use pool::{AllocationStrategy, MultiStreamCoordinator, StreamPool, StreamPurpose, WorkloadType};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const POOL_SIZE: usize = 8;
const SPINS: usize = 8;
const SPIN: Duration = Duration::from_millis(10);

fn setup() -> (Arc<Context>, StreamPool) {
    let ctx = Context::new(0).expect("a context");
    let pool = StreamPool::new_with_strategy(&ctx, POOL_SIZE, AllocationStrategy::RoundRobin)
        .expect("a pool");
    (ctx, pool)
}

fn create_and_destroy(ctx: &Arc<Context>) {
    drop(black_box(
        Stream::new_with_priority(ctx, StreamPriority::High).expect("a stream"),
    ));
}

fn getters(c: &mut Criterion) {
    let (ctx, pool) = setup();
    let balanced = StreamPool::new_with_strategy(&ctx, POOL_SIZE, AllocationStrategy::LoadBalanced)
        .expect("a pool");
    let mut group = c.benchmark_group("pool");
    group.bench_function("get_stream (round-robin)", |b| b.iter(|| pool.get_stream()));
    group.bench_function("get_stream_for_workload", |b| {
        b.iter(|| pool.get_stream_for_workload(black_box(WorkloadType::Compute)))
    });
    group.bench_function("get_priority_stream", |b| {
        b.iter(|| pool.get_priority_stream(black_box(StreamPriority::High)))
    });
    group.bench_function("get_stream_for_purpose", |b| {
        b.iter(|| pool.get_stream_for_purpose(black_box(StreamPurpose::KernelExecution)))
    });
    group.bench_function("get_stream (load-balanced, idle streams)", |b| {
        b.iter(|| balanced.get_stream())
    });
    group.bench_function("baseline: Stream::new_with_priority + drop", |b| {
        b.iter(|| create_and_destroy(&ctx))
    });
    group.finish();
}

fn spin_on(stream: &Stream, kernel: &Kernel, duration: Duration) {
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    stream
        .launch(kernel, one, &[(duration.as_nanos() as u64).into()])
        .expect("spin launches");
}

/// Wall time of `SPINS` spin kernels given to `streams` in turn, until all finish.
fn spin_wall(streams: &[Arc<Stream>], kernel: &Kernel) -> Duration {
    median_duration(5, || {
        for i in 0..SPINS {
            spin_on(&streams[i % streams.len()], kernel, SPIN);
        }
        for stream in streams {
            stream.synchronize().expect("synchronize");
        }
    })
}

/// The `RATIO` and `FIGURE` lines, each side measured in this run.
fn ratios() {
    let (ctx, pool) = setup();
    let create = median_ns(31, 20, || create_and_destroy(&ctx));
    type Getter<'a> = Box<dyn Fn() + 'a>;
    let getters: [(&'static str, &'static str, Getter<'_>); 4] = [
        (
            "pool get_stream vs stream create+destroy",
            "pool get_stream median (target <= 50 ns on the H200)",
            Box::new(|| drop(black_box(pool.get_stream()))),
        ),
        (
            "pool get_stream_for_workload vs stream create+destroy",
            "pool get_stream_for_workload median",
            Box::new(|| {
                drop(black_box(
                    pool.get_stream_for_workload(WorkloadType::Memory),
                ))
            }),
        ),
        (
            "pool get_priority_stream vs stream create+destroy",
            "pool get_priority_stream median",
            Box::new(|| drop(black_box(pool.get_priority_stream(StreamPriority::High)))),
        ),
        (
            "pool get_stream_for_purpose vs stream create+destroy",
            "pool get_stream_for_purpose median",
            Box::new(|| {
                drop(black_box(
                    pool.get_stream_for_purpose(StreamPurpose::AuxCompute),
                ))
            }),
        ),
    ];
    figure("stream create+destroy median (baseline)", create, "ns");
    for (ratio, median, get) in &getters {
        let ours = median_ns(101, 10_000, get);
        figure(median, ours, "ns");
        compare(ratio, ours, create);
    }
    let balanced = StreamPool::new_with_strategy(&ctx, POOL_SIZE, AllocationStrategy::LoadBalanced)
        .expect("a pool");
    figure(
        "pool get_stream, load-balanced (driver queries)",
        median_ns(51, 1_000, || drop(black_box(balanced.get_stream()))),
        "ns",
    );

    let kernel = spin_kernel(&ctx);
    let streams: Vec<_> = pool.streams().cloned().collect();
    for stream in &streams {
        spin_on(stream, &kernel, Duration::ZERO); // first launch may load the module
        stream.synchronize().expect("synchronize");
    }
    let one = spin_wall(&streams[..1], &kernel);
    let many = spin_wall(&streams, &kernel);
    figure(
        "8 x 10 ms spin kernels, one stream: wall",
        one.as_secs_f64() * 1e3,
        "ms",
    );
    figure(
        "8 x 10 ms spin kernels, the pool's 8 streams: wall",
        many.as_secs_f64() * 1e3,
        "ms",
    );
    compare(
        "8 x 10 ms spin: pool streams vs one stream",
        many.as_nanos() as f64,
        one.as_nanos() as f64,
    );
}

/// The coordinator, a view on the operation graph, against the raw driver
/// layer calls: its barrier over 4 streams (the graph's barrier node, one
/// operation: 4 records and 6 waits) against `Stream::barrier`, the seed's
/// barrier (4 records, 12 waits), and re-applying a chain of 3 standing
/// dependencies against the same `wait_stream` calls.
fn coordinator_ratios() {
    let (_ctx, pool) = setup();
    let streams: Vec<Arc<Stream>> = pool.streams().take(4).cloned().collect();
    let mut coordinator = MultiStreamCoordinator::new(streams.iter().cloned());
    let refs: Vec<&Stream> = streams.iter().map(|s| &**s).collect();
    let ours = median_ns(51, 200, || coordinator.create_barrier().expect("barrier"));
    let raw = median_ns(51, 200, || Stream::barrier(&refs).expect("barrier"));
    compare(
        "coordinator create_barrier (4 streams) vs Stream::barrier",
        ours,
        raw,
    );
    for pair in streams.windows(2) {
        coordinator
            .add_dependency(&pair[1], &pair[0])
            .expect("no cycle");
    }
    let ours = median_ns(51, 200, || coordinator.apply_dependencies().expect("apply"));
    let raw = median_ns(51, 200, || {
        for pair in streams.windows(2) {
            pair[1].wait_stream(&pair[0]).expect("wait");
        }
    });
    compare(
        "coordinator apply_dependencies (chain of 3) vs the same wait_stream calls",
        ours,
        raw,
    );
    for stream in &streams {
        stream.synchronize().expect("synchronize");
    }
}

/// `POOL_COUNT=<scenario>:<n>`: run that scenario alone (see the top).
fn count(spec: &str) {
    let fail = |why: &str| -> ! { panic!("POOL_COUNT={spec:?}: {why}") };
    let (scenario, n) = spec
        .split_once(':')
        .unwrap_or_else(|| fail("expected <scenario>:<n>"));
    let n: usize = n.parse().unwrap_or_else(|_| fail("the count is no number"));
    let (_ctx, pool) = setup();
    let streams: Vec<Arc<Stream>> = pool.streams().take(4).cloned().collect();
    let mut coordinator = MultiStreamCoordinator::new(streams.iter().cloned());
    let refs: Vec<&Stream> = streams.iter().map(|s| &**s).collect();
    if scenario == "apply" {
        for pair in streams.windows(2) {
            coordinator
                .add_dependency(&pair[1], &pair[0])
                .expect("no cycle");
        }
    }
    let once: Box<dyn Fn()> = match scenario {
        "barrier" => Box::new(|| coordinator.create_barrier().expect("barrier")),
        "stream-barrier" => Box::new(|| Stream::barrier(&refs).expect("barrier")),
        "apply" => Box::new(|| coordinator.apply_dependencies().expect("apply")),
        "wait-stream" => Box::new(|| {
            for pair in streams.windows(2) {
                pair[1].wait_stream(&pair[0]).expect("wait");
            }
        }),
        _ => fail("the scenario is barrier, stream-barrier, apply or wait-stream"),
    };
    let settle = || {
        for stream in &streams {
            stream.synchronize().expect("synchronize");
        }
    };
    once(); // the first of each makes the events the rest reuse
    settle();
    for i in 0..n {
        once();
        if i % 50 == 49 {
            settle();
        }
    }
    settle();
}

fn main() {
    if let Ok(spec) = std::env::var("POOL_COUNT") {
        count(&spec);
        return;
    }
    run_criterion(&[getters]);
    ratios();
    coordinator_ratios();
    criterion_summary();
}
