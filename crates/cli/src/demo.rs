//! `cuda-streams demo`: a triple-buffered pipeline and an operation DAG on
//! whichever driver is selected, profiled with GPU-timed scopes; prints the
//! profiler's report and writes a Chrome trace for Perfetto. Every result is
//! checked against the CPU reference; a wrong one makes the command fail.

use crate::dag;
use crate::progress::Progress;
use cuda_streams::kernels::reference;
use cuda_streams::prelude::*;
use indicatif::ProgressBar;
use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub(crate) type DemoResult<T> = Result<T, Box<dyn Error>>;

/// How big the demo is: small on the software driver (it must finish in a
/// few seconds on two cores), big enough on a GPU to show the overlap.
pub(crate) struct Sizes {
    pub(crate) elements: usize,
    pub(crate) steps: u64,
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
                dag_rounds: 16,
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
    /// on the software driver, 64 and 16 on a GPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    steps: Option<u64>,
    /// Where to write the Chrome trace (open it in https://ui.perfetto.dev).
    #[arg(long, value_name = "PATH", default_value = "trace.json")]
    trace: PathBuf,
}

pub(crate) fn run(args: &DemoArgs) -> DemoResult<()> {
    demo(args)
}

fn demo(options: &DemoArgs) -> DemoResult<()> {
    let started = Instant::now();
    let ctx = Context::new(0)?;
    let info = ctx.info();
    println!(
        "cuda-streams demo on {} ({} driver)",
        info.name,
        if ctx.is_gpu() { "CUDA" } else { "software" }
    );
    let mut sizes = Sizes::for_context(&ctx);
    if let Some(steps) = options.steps {
        sizes.steps = steps;
        sizes.dag_rounds = steps as usize;
    }
    let profiler = StreamProfiler::new(&ctx)?;
    profiler.enable();
    let progress = Progress::new();

    // Both live until the report: the profiler reads a stream's launch and
    // transfer counters from the stream itself.
    let mut managed = ManagedGpuContext::new(&ctx, true)?;
    let pool = StreamPool::new(&ctx, 4)?;

    let bar = progress.phase("pipeline", sizes.steps);
    let pipeline = pipeline(&mut managed, &profiler, &sizes, &bar)?;
    progress.phase_done(&bar, &pipeline);
    let bar = progress.phase("DAG", sizes.dag_rounds as u64);
    let dag = dag::run(&pool, &profiler, &sizes, &bar)?;
    progress.phase_done(&bar, &dag);

    let report = profiler.get_comprehensive_report();
    println!("\n{report}");
    std::fs::write(&options.trace, profiler.to_chrome_trace()?)
        .map_err(|e| format!("cannot write {}: {e}", options.trace.display()))?;
    if profiler.error_count() > 0 {
        return Err(format!(
            "the profiler failed {} time(s) (see above)",
            profiler.error_count()
        )
        .into());
    }
    println!(
        "trace: {} ({} streams; open it in https://ui.perfetto.dev)",
        options.trace.display(),
        report.total_streams
    );
    println!(
        "demo finished in {:.2} s; every result verified",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Input element `i` of step `step`: one of 64 values, so the expected
/// outputs are a 64-entry table however large the step.
fn input_index(i: usize, step: u64) -> usize {
    (i * 7 + step as usize) % 64
}

fn input_value(index: usize) -> f32 {
    index as f32 * 0.25 - 4.0
}

/// The managed context in asynchronous mode: upload, `compute` and download
/// of three steps in flight on three pool streams (results two steps late),
/// each stream's share of every step in a profiler scope.
fn pipeline(
    managed: &mut ManagedGpuContext,
    profiler: &StreamProfiler,
    sizes: &Sizes,
    progress: &ProgressBar,
) -> DemoResult<String> {
    let start = Instant::now();
    let streams = {
        let c = managed
            .async_coordinator()
            .ok_or("asynchronous mode has a coordinator")?;
        [
            (Arc::clone(c.upload_stream()), "pipeline upload"),
            (Arc::clone(c.compute_stream()), "pipeline compute"),
            (Arc::clone(c.download_stream()), "pipeline download"),
        ]
    };
    let table: Vec<f32> = (0..64)
        .map(|v| reference::compute_element(sizes.iterations, input_value(v)))
        .collect();
    let mut verified = 0;
    let mut check = |step: u64, output: &[f32]| -> DemoResult<()> {
        if let Some((i, &got)) = output
            .iter()
            .enumerate()
            .find(|&(i, &got)| got != table[input_index(i, step)])
        {
            return Err(format!(
                "pipeline step {step}: element {i} is {got}, expected {}",
                table[input_index(i, step)]
            )
            .into());
        }
        verified += 1;
        Ok(())
    };
    // In place: each step's input is written straight into the pinned slot
    // the GPU uploads from, and its result read where the GPU downloaded it,
    // so the host copies nothing and the GPU never waits for it.
    for step in 0..sizes.steps {
        // Step k uploads batch k, computes k - 1 and downloads k - 2: time
        // each stream's share of the step.
        let busy = (step as usize + 1).min(3);
        let scopes = streams[..busy]
            .iter()
            .map(|(stream, name)| profiler.scope(stream, *name))
            .collect::<Result<Vec<_>, _>>()?;
        let done = managed.step_in_place(sizes.elements, sizes.iterations, |input| {
            for (i, value) in input.iter_mut().enumerate() {
                *value = input_value(input_index(i, step));
            }
        })?;
        drop(scopes);
        if let Some(done) = done {
            check(done.step(), done.output()?)?;
        }
        progress.inc(1);
    }
    // The last two steps run inside one call, each download waiting for
    // its compute: a scope around both would count that wait between them.
    // They stay unscoped; every step above is timed.
    let mut failure = None;
    managed.finish_steps_in_place(|done| {
        if failure.is_none() {
            failure = check(done.step(), done.output()?).err();
        }
        Ok(())
    })?;
    if let Some(failure) = failure {
        return Err(failure);
    }
    if verified != sizes.steps {
        return Err(format!("pipeline: {verified} of {} steps came back", sizes.steps).into());
    }
    Ok(format!(
        "pipeline: {} triple-buffered steps of {} elements (upload, compute x{}, download on 3 streams), all {verified} results verified, {:.3} s",
        sizes.steps,
        sizes.elements,
        sizes.iterations,
        start.elapsed().as_secs_f64()
    ))
}
