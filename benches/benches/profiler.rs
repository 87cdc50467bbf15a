//! Profiler overhead: kernels across 4 streams, each launch in a GPU-timed
//! scope, against the same launches unprofiled, in the same run.
//!
//! Variants, interleaved run by run: unprofiled; a disabled profiler; every
//! launch scoped (one shared boundary event per scope); the previous path's
//! driver work, a fresh pooled timing event before and after every launch
//! ("two events"), resolved the same way; and the sampling mode, one launch
//! in `SAMPLE_EVERY` timed per stream, every one counted.
//!
//! The CUPTI backend (`Backend::Cupti`) runs the same scoped workload with
//! no events: its cost is CUPTI's tracing of every driver call plus two
//! clock reads per scope, and the report's wait for CUPTI's records. A fresh
//! CUPTI profiler per run, dropped before the next variant, so CUPTI is off
//! for the others (its tracing slows every launch while it is on); "CUPTI
//! on, launches unscoped" is that tracing alone. On the software driver (or
//! without libcupti) the bench says CUPTI is unavailable, and why.
//!
//! Two workloads. `small` (the issue's: 10,000 `fill_f32` of 1,024 elements)
//! is host-bound: a launch costs the host more than the kernel costs the GPU,
//! so every event the profiler records is host time added to the critical
//! path; it is the worst case. `large` (fills of 64 MiB) is GPU-bound: the
//! host's extra work hides behind the GPU's, and what remains is the GPU's
//! cost of the events themselves.

use criterion::Criterion;
use cuda_streams_benches::{compare, criterion_summary, figure, kernel, run_criterion};
use driver::{Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Stream};
use profiler::{Backend, StreamProfiler};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const STREAMS: usize = 4;
/// The sampled variant times one launch in this many per stream.
const SAMPLE_EVERY: u32 = 16;
/// A sparser sampled variant: the rate a launch-bound loop needs to stay
/// within a few percent when a timed scope costs about one launch.
const SAMPLE_SPARSE: u32 = 64;

/// Kernel count and size, on the GPU and (smaller, since every launch runs a
/// CPU twin) on the software driver.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    gpu: (usize, usize),
    soft: (usize, usize),
}

/// (kernels, elements per fill)
const SMALL: Workload = Workload {
    name: "small",
    gpu: (10_000, 1024),
    soft: (2_000, 1024),
};
const LARGE: Workload = Workload {
    name: "large",
    gpu: (2_000, 16 << 20),
    soft: (200, 64 << 10),
};

struct Setup {
    ctx: Arc<Context>,
    streams: Vec<Arc<Stream>>,
    buffers: Vec<DeviceBuffer<f32>>,
    fill: Kernel,
    /// Its pool stays warm for the fresh profiler of each run.
    seed: StreamProfiler,
    kernels: usize,
    elements: usize,
}

impl Setup {
    fn new(workload: Workload) -> Self {
        let ctx = Context::new(0).expect("a context");
        let (kernels, elements) = if ctx.is_gpu() {
            workload.gpu
        } else {
            workload.soft
        };
        let streams: Vec<_> = (0..STREAMS)
            .map(|_| Stream::new(&ctx).expect("a stream"))
            .collect();
        let buffers = streams
            .iter()
            .map(|s| DeviceBuffer::new_async(s, elements).expect("a buffer"))
            .collect();
        let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
        let seed = StreamProfiler::new(&ctx).expect("a profiler");
        Self {
            ctx,
            streams,
            buffers,
            fill,
            seed,
            kernels,
            elements,
        }
    }

    fn launch(&mut self, i: usize) {
        let s = i % STREAMS;
        let args = [
            KernelArg::from(self.elements as u64),
            (i as f32).into(),
            (&mut self.buffers[s]).into(),
        ];
        // Enough blocks to fill the GPU, grid-stride beyond that.
        let mut cfg = LaunchConfig::for_num_elems(self.elements as u32);
        cfg.grid_dim.0 = cfg.grid_dim.0.min(4 * 132);
        self.streams[s]
            .launch(&self.fill, cfg, &args)
            .expect("fill launches");
    }

    fn sync(&self) {
        for s in &self.streams {
            s.synchronize().expect("synchronize");
        }
    }

    /// The workload without a profiler.
    fn plain(&mut self) {
        for i in 0..self.kernels {
            self.launch(i);
        }
        self.sync();
    }

    /// The workload with every launch in a scope (an inert one when the
    /// profiler is disabled).
    fn profiled(&mut self, profiler: &StreamProfiler) {
        for i in 0..self.kernels {
            let stream = Arc::clone(&self.streams[i % STREAMS]);
            let _scope = profiler.scope(&stream, "fill").expect("scope");
            self.launch(i);
        }
        self.sync();
    }

    /// The workload with one launch in `every` per stream timed.
    fn sampled(&mut self, profiler: &StreamProfiler, every: u32) {
        let sampler = profiler.sampler("fill", every).expect("sampler");
        for i in 0..self.kernels {
            let stream = Arc::clone(&self.streams[i % STREAMS]);
            let _scope = sampler.scope(&stream).expect("scope");
            self.launch(i);
        }
        self.sync();
    }

    /// The previous path's driver work: two pooled timing events around
    /// every launch (start recorded at open, end at close), elapsed times
    /// read once the streams are done.
    fn two_events(&mut self) -> Duration {
        let pool = Arc::clone(self.seed.pool());
        let mut pending = Vec::with_capacity(self.kernels);
        for i in 0..self.kernels {
            let stream = Arc::clone(&self.streams[i % STREAMS]);
            let start = pool.acquire_event(true).expect("an event");
            start.record(&stream).expect("record");
            self.launch(i);
            let end = pool.acquire_event(true).expect("an event");
            end.record(&stream).expect("record");
            pending.push((start, end));
        }
        self.sync();
        pending
            .iter()
            .map(|(s, e)| driver::Event::elapsed(s, e).expect("elapsed"))
            .sum()
    }

    /// A fresh profiler on the seed's warm pool. Enabled, it has already
    /// timed one empty scope, so its one-time start (the base event on a
    /// stream of its own, waited for) is not in the timed runs.
    fn profiler(&self, enabled: bool) -> StreamProfiler {
        let profiler = StreamProfiler::with_pool(Arc::clone(self.seed.pool()));
        if enabled {
            profiler.enable();
            profiler
                .time(&self.streams[0], "start", |_| ())
                .expect("an empty scope");
        }
        profiler
    }

    /// A fresh enabled CUPTI profiler that has timed one empty scope (its
    /// start is not in the timed runs), or why there is none.
    fn cupti_profiler(&self) -> Result<StreamProfiler, String> {
        let profiler = StreamProfiler::with_backend(&self.ctx, Backend::Cupti).expect("a profiler");
        if profiler.backend() != Backend::Cupti {
            return Err(profiler
                .backend_fallback()
                .unwrap_or("no reason given")
                .to_string());
        }
        profiler.enable();
        profiler
            .time(&self.streams[0], "start", |_| ())
            .expect("an empty scope");
        black_box(profiler.get_comprehensive_report());
        Ok(profiler)
    }

    fn describe(&self, workload: Workload) -> String {
        format!(
            "{} ({} fill_f32 of {} elements on {STREAMS} streams)",
            workload.name, self.kernels, self.elements
        )
    }
}

fn bench_profiler(c: &mut Criterion) {
    let mut setup = Setup::new(SMALL);
    let n = setup.kernels;
    let mut group = c.benchmark_group("profiler");
    group.sample_size(10);
    group.bench_function(
        format!("{n} small fills on {STREAMS} streams, unprofiled"),
        |b| b.iter(|| setup.plain()),
    );
    group.bench_function(
        format!("{n} small fills on {STREAMS} streams, each in a scope"),
        |b| {
            b.iter_with_large_drop(|| {
                let profiler = setup.profiler(true);
                setup.profiled(&profiler);
                black_box(profiler.get_comprehensive_report());
                profiler
            })
        },
    );
    group.bench_function(
        format!("{n} small fills on {STREAMS} streams, 1 in {SAMPLE_EVERY} timed"),
        |b| {
            b.iter_with_large_drop(|| {
                let profiler = setup.profiler(true);
                setup.sampled(&profiler, SAMPLE_EVERY);
                black_box(profiler.get_comprehensive_report());
                profiler
            })
        },
    );
    group.finish();
}

/// Medians of `RUNS` timings of each variant, interleaved so drift in the
/// machine's speed hits all of them alike.
fn compare_overhead(workload: Workload) {
    const RUNS: usize = 9;
    let mut setup = Setup::new(workload);
    let mut t = Timings::default();
    setup.plain(); // warm up
    // Enough events in the pool for the two-event variant's whole run.
    black_box(setup.two_events());
    let cupti = setup.cupti_profiler().map(drop);
    for _ in 0..RUNS {
        if cupti.is_ok() {
            let profiler = setup.cupti_profiler().expect("CUPTI, as before");
            let start = Instant::now();
            setup.profiled(&profiler);
            let run = start.elapsed();
            let r = Instant::now();
            black_box(profiler.get_comprehensive_report());
            t.cupti_report.push(r.elapsed());
            t.cupti_scoped.push(run);
            t.cupti_with_report.push(start.elapsed());
            drop(profiler);

            let profiler = setup.cupti_profiler().expect("CUPTI, as before");
            let start = Instant::now();
            setup.plain();
            t.cupti_unscoped.push(start.elapsed());
            drop(profiler);
        }

        let start = Instant::now();
        setup.plain();
        t.plain.push(start.elapsed());

        let profiler = setup.profiler(true);
        let start = Instant::now();
        setup.profiled(&profiler);
        let run = start.elapsed();
        let r = Instant::now();
        black_box(profiler.get_comprehensive_report());
        t.report.push(r.elapsed());
        t.scoped.push(run);
        t.with_report.push(start.elapsed());
        drop(profiler);

        let start = Instant::now();
        black_box(setup.two_events());
        t.two_events.push(start.elapsed());

        let profiler = setup.profiler(true);
        let start = Instant::now();
        setup.sampled(&profiler, SAMPLE_EVERY);
        t.sampled.push(start.elapsed());
        black_box(profiler.get_comprehensive_report());
        drop(profiler);

        let profiler = setup.profiler(true);
        let start = Instant::now();
        setup.sampled(&profiler, SAMPLE_SPARSE);
        t.sampled_sparse.push(start.elapsed());
        black_box(profiler.get_comprehensive_report());
        drop(profiler);

        let profiler = setup.profiler(false);
        let start = Instant::now();
        setup.profiled(&profiler);
        t.disabled.push(start.elapsed());
    }
    let plain = median(&mut t.plain);
    let n = setup.kernels;
    let w = workload.name;
    println!("profiler workload {}", setup.describe(workload));
    if !setup.ctx.is_gpu() {
        println!(
            "note: software driver: {n} kernels of {} elements instead of {} of {}; the goals (<= 0.5 us per scoped launch, GPU-bound <= 1%, sampled <= 3%) are for the H200",
            setup.elements, workload.gpu.0, workload.gpu.1
        );
    }
    let name = |what: &str| -> &'static str { format!("profiler {w}: {what}").leak() };
    let variants = [
        (
            "every launch scoped, with the report",
            median(&mut t.with_report),
        ),
        (
            "every launch scoped, before the report",
            median(&mut t.scoped),
        ),
        (
            "two events per launch (the previous path)",
            median(&mut t.two_events),
        ),
        ("sampled, 1 launch in 16 timed", median(&mut t.sampled)),
        (
            "sampled, 1 launch in 64 timed",
            median(&mut t.sampled_sparse),
        ),
        ("disabled", median(&mut t.disabled)),
    ];
    let mut variants = variants.to_vec();
    match &cupti {
        Ok(()) => variants.extend([
            (
                "CUPTI, every launch scoped, with the report",
                median(&mut t.cupti_with_report),
            ),
            (
                "CUPTI, every launch scoped, before the report",
                median(&mut t.cupti_scoped),
            ),
            ("CUPTI on, launches unscoped", median(&mut t.cupti_unscoped)),
        ]),
        Err(why) => println!("profiler {w}: CUPTI backend unavailable: {why}"),
    }
    for (what, time) in variants {
        compare(name(&format!("{what} vs unprofiled")), time, plain);
        figure(
            &format!("profiler overhead {w}, {what} (%)"),
            100.0 * (time - plain) / plain,
            "%",
        );
        figure(
            &format!("profiler {w}: host time added per launch, {what}"),
            (time - plain) / n as f64,
            "ns",
        );
    }
    figure(
        &format!("profiler {w}: report over {n} scopes"),
        median(&mut t.report) / 1e6,
        "ms",
    );
    if cupti.is_ok() {
        figure(
            &format!("profiler {w}: CUPTI report over {n} scopes"),
            median(&mut t.cupti_report) / 1e6,
            "ms",
        );
    }
}

#[derive(Default)]
struct Timings {
    plain: Vec<Duration>,
    scoped: Vec<Duration>,
    with_report: Vec<Duration>,
    report: Vec<Duration>,
    two_events: Vec<Duration>,
    sampled: Vec<Duration>,
    sampled_sparse: Vec<Duration>,
    disabled: Vec<Duration>,
    cupti_scoped: Vec<Duration>,
    cupti_with_report: Vec<Duration>,
    cupti_report: Vec<Duration>,
    cupti_unscoped: Vec<Duration>,
}

fn median(v: &mut [Duration]) -> f64 {
    v.sort();
    v[v.len() / 2].as_nanos() as f64
}

/// What an NVTX range costs the host here (with no tool attached it must be
/// next to nothing: one load of a cached flag).
fn nvtx_cost() {
    const RANGES: u32 = 1_000_000;
    let attached = driver::nvtx::is_attached();
    let start = Instant::now();
    for _ in 0..RANGES {
        let range = driver::nvtx::range(black_box("scope"));
        black_box(&range);
    }
    let per = start.elapsed().as_nanos() as f64 / f64::from(RANGES);
    let how = match (cfg!(feature = "nvtx"), attached) {
        (false, _) => "nvtx feature off",
        (true, false) => "no tool attached",
        (true, true) => "a tool attached",
    };
    figure(&format!("profiler: one NVTX range, {how}"), per, "ns");
}

fn main() {
    run_criterion(&[bench_profiler]);
    nvtx_cost();
    compare_overhead(SMALL);
    compare_overhead(LARGE);
    criterion_summary();
}
