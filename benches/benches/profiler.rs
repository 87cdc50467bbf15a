//! Profiler overhead: kernels across 4 streams, each launch in a GPU-timed
//! scope, against the same launches unprofiled, in the same run.
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
use profiler::StreamProfiler;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const STREAMS: usize = 4;

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

    fn profiler(&self, enabled: bool) -> StreamProfiler {
        let profiler = StreamProfiler::with_pool(Arc::clone(self.seed.pool()));
        if enabled {
            profiler.enable();
        }
        profiler
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
    group.finish();
}

/// Medians of `RUNS` timings of each variant, interleaved so drift in the
/// machine's speed hits all of them alike.
fn compare_overhead(workload: Workload) {
    const RUNS: usize = 9;
    let mut setup = Setup::new(workload);
    let (mut plain, mut scoped, mut with_report, mut disabled, mut report) =
        (vec![], vec![], vec![], vec![], vec![]);
    setup.plain(); // warm up
    for _ in 0..RUNS {
        let t = Instant::now();
        setup.plain();
        plain.push(t.elapsed());

        let profiler = setup.profiler(true);
        let t = Instant::now();
        setup.profiled(&profiler);
        let run = t.elapsed();
        let r = Instant::now();
        black_box(profiler.get_comprehensive_report());
        report.push(r.elapsed());
        scoped.push(run);
        with_report.push(t.elapsed());
        drop(profiler);

        let profiler = setup.profiler(false);
        let t = Instant::now();
        setup.profiled(&profiler);
        disabled.push(t.elapsed());
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_nanos() as f64
    };
    let (plain, scoped, with_report, disabled, report) = (
        median(&mut plain),
        median(&mut scoped),
        median(&mut with_report),
        median(&mut disabled),
        median(&mut report),
    );
    let n = setup.kernels;
    let w = workload.name;
    println!("profiler workload {}", setup.describe(workload));
    if !setup.ctx.is_gpu() {
        println!(
            "note: software driver: {n} kernels of {} elements instead of {} of {}; the overhead goal (<= 3%) is for the H200",
            setup.elements, workload.gpu.0, workload.gpu.1
        );
    }
    let name = |what: &str| -> &'static str { format!("profiler {w}: {what}").leak() };
    compare(
        name("scoped launches + report vs plain"),
        with_report,
        plain,
    );
    compare(name("scoped launches vs plain"), scoped, plain);
    compare(name("disabled scopes vs plain"), disabled, plain);
    let percent = |t: f64| 100.0 * (t - plain) / plain;
    figure(
        &format!("profiler overhead {w}, every launch scoped, with the report (%)"),
        percent(with_report),
        "%",
    );
    figure(
        &format!("profiler overhead {w}, every launch scoped, before the report (%)"),
        percent(scoped),
        "%",
    );
    figure(
        &format!("profiler overhead {w}, disabled (%)"),
        percent(disabled),
        "%",
    );
    figure(
        &format!("profiler {w}: host time added per scoped launch"),
        (scoped - plain) / n as f64,
        "ns",
    );
    figure(
        &format!("profiler {w}: report over {n} scopes"),
        report / 1e6,
        "ms",
    );
}

fn main() {
    run_criterion(&[bench_profiler]);
    compare_overhead(SMALL);
    compare_overhead(LARGE);
    criterion_summary();
}
