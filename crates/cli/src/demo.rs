//! `cuda-streams demo`: a triple-buffered pipeline and an operation DAG on
//! whichever driver is selected, profiled with timed scopes. It prints what
//! ran, what the pipeline's streams overlapped (the profiler's summary of
//! them, with its one overlap figure) and where the timeline was written
//! (a Chrome trace with stream tracks and the allocator's memory tracks, for
//! Perfetto). Results are checked against the CPU reference on a sample of
//! each step (every element with `--verify-all`); a wrong one makes the
//! command fail. `--verbose` adds the engine's diagnostics of the DAG and
//! the profiler's full report.

use crate::demo_sizes::{DemoResult, Sizes};
use crate::progress::Progress;
use crate::{dag, steps};
use cuda_streams::prelude::*;
use std::path::PathBuf;
use std::time::Instant;

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
    /// Also print the engine's diagnostics of the DAG (its host time per
    /// operation beside the engine bench's shape, run here) and the
    /// profiler's full report of every stream, operation by operation.
    #[arg(long, short)]
    verbose: bool,
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
    // Only the pipeline's timed steps are on the timeline yet: this report
    // is what the pipeline overlapped, and its one overlap figure.
    let timed_steps = steps::WARM_UP.min(sizes.steps)..sizes.steps;
    let overlap = profiler.get_comprehensive_report();
    let bar = progress.phase("DAG", sizes.dag_rounds as u64);
    let dag = dag::run(&pool, &allocator, &profiler, &sizes, args.verify_all, &bar)?;
    progress.phase_done(&bar, &dag.summary);
    if args.verbose {
        println!("{}", dag.diagnostics);
    }

    if overlap.total_streams == 0 {
        println!(
            "\nwhat overlapped: not measured (the first {} steps are warm-up; run more with --steps)",
            steps::WARM_UP
        );
    } else {
        println!(
            "\nwhat overlapped: the pipeline's streams over steps {}..{} (each step uploads one batch, computes the one before and downloads the one before that)\n{}",
            timed_steps.start,
            timed_steps.end,
            overlap.summary()
        );
    }
    let report = profiler.get_comprehensive_report();
    if args.verbose {
        // Each stream's own lines: the report's summary line would give a
        // second busy share, over the whole run with the gap between the
        // two parts, beside the pipeline's.
        println!("every stream, the DAG's included, operation by operation:");
        for stream in &report.streams {
            // Its text ends with a newline.
            print!("\n{stream}");
        }
    }
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
        "timeline: {} ({} streams, the DAG's included, and the allocator's memory; open it in https://ui.perfetto.dev){}",
        args.trace.display(),
        report.total_streams,
        if args.verbose {
            ""
        } else {
            "; --verbose prints every stream's operations and the engine's diagnostics"
        }
    );
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
