//! `cuda-streams demo`: a triple-buffered pipeline and an operation DAG on
//! whichever driver is selected, profiled with GPU-timed scopes; prints the
//! profiler's report and the overlap the pipeline achieved, and writes a
//! Chrome trace (stream tracks and the allocator's memory tracks) for
//! Perfetto. Results are checked against the CPU reference on a sample of
//! each step (every element with `--verify-all`); a wrong one makes the
//! command fail.

use crate::progress::Progress;
use crate::{dag, steps};
use cuda_streams::prelude::*;
use std::error::Error;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub(crate) type DemoResult<T> = Result<T, Box<dyn Error>>;

/// How big the demo is: small on the software driver (it must finish in a
/// few seconds on two cores), big enough on a GPU to show the overlap.
pub(crate) struct Sizes {
    pub(crate) elements: usize,
    pub(crate) steps: u64,
    /// The kernel's iteration count on the software driver; on a GPU it is
    /// chosen so the kernel takes about as long as a step's upload.
    pub(crate) iterations: u32,
    pub(crate) dag_elements: usize,
    pub(crate) dag_rounds: usize,
}

impl Sizes {
    fn for_context(ctx: &Context) -> Self {
        if ctx.is_gpu() {
            Sizes {
                elements: 1 << 22,
                steps: 64,
                iterations: 64,
                dag_elements: 1 << 20,
                dag_rounds: 64,
            }
        } else {
            Sizes {
                elements: 1 << 16,
                steps: 32,
                iterations: 16,
                dag_elements: 1 << 16,
                dag_rounds: 8,
            }
        }
    }
}

/// `cuda-streams demo`'s options.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Pipeline steps and DAG rounds to run [default: 32 steps and 8 rounds
    /// on the software driver, 64 and 64 on a GPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    steps: Option<u64>,
    /// Check every element of every result against the CPU reference
    /// (by default a sample of each: the part that changed and a spread of
    /// the rest), at the cost of keeping the host busy.
    #[arg(long)]
    verify_all: bool,
    /// Where to write the Chrome trace (open it in https://ui.perfetto.dev).
    #[arg(long, value_name = "PATH", default_value = "trace.json")]
    trace: PathBuf,
}

pub(crate) fn run(args: &DemoArgs) -> DemoResult<()> {
    let started = Instant::now();
    let ctx = Context::new(0)?;
    let info = ctx.info();
    println!(
        "cuda-streams demo on {} ({} driver)",
        info.name,
        if ctx.is_gpu() { "CUDA" } else { "software" }
    );
    let mut sizes = Sizes::for_context(&ctx);
    if let Some(steps) = args.steps {
        sizes.steps = steps;
        sizes.dag_rounds = steps as usize;
    }
    let iterations = steps::balanced_iterations(&ctx, &sizes)?;
    let profiler = StreamProfiler::new(&ctx)?;
    let allocator = StreamOrderedAllocator::new(&ctx)?;
    profiler.track_memory(&allocator)?;
    profiler.enable();
    let progress = Progress::new();

    // Lives until the report: the profiler reads a stream's launch and
    // transfer counters from the stream itself.
    let pool = StreamPool::new(&ctx, 4)?;

    let bar = progress.phase("pipeline", sizes.steps);
    let pipeline = steps::run(&ctx, &profiler, &sizes, iterations, args.verify_all, &bar)?;
    progress.phase_done(&bar, &pipeline.summary);
    // Only the pipeline's streams are on the timeline yet.
    let overlap = Overlap::of(
        &profiler.get_comprehensive_report(),
        steps::WARM_UP.min(sizes.steps)..sizes.steps,
    );
    let bar = progress.phase("DAG", sizes.dag_rounds as u64);
    let dag = dag::run(&pool, &allocator, &profiler, &sizes, args.verify_all, &bar)?;
    progress.phase_done(&bar, &dag.summary);

    let report = profiler.get_comprehensive_report();
    println!("\n{report}");
    std::fs::write(&args.trace, profiler.to_chrome_trace()?)
        .map_err(|e| format!("cannot write {}: {e}", args.trace.display()))?;
    if profiler.error_count() > 0 {
        return Err(format!(
            "the profiler failed {} time(s) (see above)",
            profiler.error_count()
        )
        .into());
    }
    println!(
        "trace: {} ({} streams and the allocator's memory; open it in https://ui.perfetto.dev)",
        args.trace.display(),
        report.total_streams
    );
    println!("{overlap}");
    println!(
        "demo finished in {:.2} s; every result checked ({} pipeline steps and {} DAG rounds, {})",
        started.elapsed().as_secs_f64(),
        sizes.steps,
        dag.rounds_checked,
        if args.verify_all {
            "every element"
        } else {
            "a sample of each; --verify-all checks every element"
        }
    );
    Ok(())
}

/// How busy the GPU was over the pipeline's span, from the profiler's GPU
/// timings: the time at least one stream had timed work running, over the
/// time from the first timed work's start to the last one's end.
struct Overlap {
    busy: Duration,
    span: Duration,
    /// The time two or more streams were busy at once.
    overlapped: Duration,
    /// The steps timed (the warm-up is not).
    steps: std::ops::Range<u64>,
}

impl Overlap {
    fn of(report: &ComprehensiveReport, steps: std::ops::Range<u64>) -> Self {
        let idle = report.concurrency.first().copied().unwrap_or_default();
        let overlapped = report.concurrency.iter().skip(2).sum();
        Overlap {
            busy: report.wall_span.saturating_sub(idle),
            span: report.wall_span,
            overlapped,
            steps,
        }
    }

    fn fraction(&self) -> f64 {
        self.busy.as_secs_f64() / self.span.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.span.is_zero() {
            return write!(
                f,
                "pipeline overlap: not measured (the first {} steps are warm-up; run more with --steps)",
                steps::WARM_UP
            );
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "pipeline overlap: GPU busy {:.1} ms of its {:.1} ms span ({:.0}%) over steps {}..{}, two or more streams at once for {:.1} ms (GPU timings from the profiler)",
            ms(self.busy),
            ms(self.span),
            self.fraction() * 100.0,
            self.steps.start,
            self.steps.end,
            ms(self.overlapped)
        )
    }
}
