//! The demo's pipeline part: the managed context in asynchronous mode running
//! the demo's step, `kernels::COMPUTE`'s `compute` over `f32`, with upload,
//! compute and download of three steps in flight on three pool streams.
//!
//! The host keeps off the critical path: each slot's input is written in full
//! once, and later steps rewrite only a small stamp that differs per step
//! (the upload still moves the whole slot); each result is checked on a
//! sample of its elements (the whole stamp and a varying spread of the rest)
//! against the CPU reference, or in full with `--verify-all`.

use crate::demo_sizes::{DemoResult, Sizes};
use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;
use indicatif::ProgressBar;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Elements at the start of every input that differ from step to step.
const STAMP: usize = 4096;
/// Elements checked per step beyond the stamp (without `--verify-all`).
const SAMPLE: usize = 4096;
/// Steps that write a slot in full: one per slot of the triple buffer.
pub(crate) const WARM_UP: u64 = cuda_streams::pipeline::PIPELINE_DEPTH;

/// What the pipeline part reports.
pub(crate) struct PipelineRun {
    pub(crate) summary: String,
}

/// Input element `i` of step `step`: one of 64 values, so the expected
/// outputs are a 64-entry table however large the step. Past the stamp the
/// value does not depend on the step, so a slot written once stays right.
fn input_index(i: usize, step: u64) -> usize {
    if i < STAMP {
        (i * 7 + step as usize) % 64
    } else {
        (i * 7) % 64
    }
}

fn input_value(index: usize) -> f32 {
    index as f32 * 0.25 - 4.0
}

/// The demo's step kernel: `compute(n, iterations, x, y)` reads the step's
/// input as `x` and writes its output as `y`.
fn compute_step(
    ctx: &Arc<Context>,
    sizes: &Sizes,
    iterations: u32,
) -> DemoResult<GpuPipelineStage> {
    let compute = Module::load(ctx, &kernels::COMPUTE)?.function("compute")?;
    Ok(
        GpuPipelineStage::builder("compute", compute, launch_config(sizes.elements))
            .len()
            .u32(iterations)
            .reads(ManagedGpuContext::INPUT)
            .writes(ManagedGpuContext::OUTPUT)
            .build(),
    )
}

fn launch_config(elements: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(elements.min(1 << 20) as u32)
}

/// On a GPU, an iteration count that makes one step's kernel take about as
/// long as its upload (the pipeline bench's "balanced" workload), measured
/// with timing events; elsewhere the configured count.
pub(crate) fn balanced_iterations(ctx: &Arc<Context>, sizes: &Sizes) -> DemoResult<u32> {
    if !ctx.is_gpu() {
        return Ok(sizes.iterations);
    }
    const PROBE: u32 = 256;
    let stream = Stream::new(ctx)?;
    let compute = Module::load(ctx, &kernels::COMPUTE)?.function("compute")?;
    let host = PinnedBuffer::<f32>::new(ctx, sizes.elements)?;
    let mut x = DeviceBuffer::<f32>::new(ctx, sizes.elements)?;
    let mut y = DeviceBuffer::<f32>::new(ctx, sizes.elements)?;
    let time = |work: &mut dyn FnMut(&Stream) -> cuda_streams::driver::Result<()>| {
        let (start, end) = (Event::timing(ctx)?, Event::timing(ctx)?);
        work(&stream)?; // warm-up: the first launch and copy pay for setup
        start.record(&stream)?;
        work(&stream)?;
        end.record(&stream)?;
        end.synchronize()?;
        Event::elapsed(&start, &end)
    };
    let upload = time(&mut |s| s.copy_from_host_async(&mut x, &host))?;
    let n = sizes.elements as u64;
    let kernel = time(&mut |s| {
        s.launch(
            &compute,
            launch_config(sizes.elements),
            &[n.into(), PROBE.into(), (&x).into(), (&mut y).into()],
        )
    })?;
    let scale = upload.as_secs_f64() / kernel.as_secs_f64().max(1e-9);
    Ok(((PROBE as f64 * scale).round() as u32).clamp(16, 1 << 16))
}

pub(crate) fn run(
    ctx: &Arc<Context>,
    profiler: &StreamProfiler,
    sizes: &Sizes,
    iterations: u32,
    verify_all: bool,
    progress: &ProgressBar,
) -> DemoResult<PipelineRun> {
    let start = Instant::now();
    let mut managed = ManagedGpuContext::builder(ctx)
        .asynchronous()
        .step(compute_step(ctx, sizes, iterations)?)
        .build()?;
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
        .map(|v| reference::compute_element(iterations, input_value(v)))
        .collect();
    let mut checker = Checker {
        table,
        verify_all,
        verified: 0,
        checked_elements: 0,
        host: Duration::ZERO,
    };
    // In place: each step's input is written straight into the pinned slot
    // the GPU uploads from, and its result read where the GPU downloaded it,
    // so the host copies nothing and the GPU never waits for it.
    for step in 0..sizes.steps {
        // Step k uploads batch k, computes k - 1 and downloads k - 2: time
        // each stream's share of the step. The first steps write their
        // slots in full on the host while the GPU waits: they are the
        // warm-up, left out of the timeline as the pipeline bench leaves
        // its warm-up out of its timings.
        let scopes = if step >= WARM_UP {
            streams
                .iter()
                .map(|(stream, name)| profiler.scope(stream, *name))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let fill_started = Instant::now();
        let done = managed.step_in_place(sizes.elements, |input| {
            // A slot keeps its input from three steps before: the first
            // round writes it whole, later ones only the stamp.
            let write = if step < WARM_UP {
                input.len()
            } else {
                STAMP.min(input.len())
            };
            for (i, value) in input[..write].iter_mut().enumerate() {
                *value = input_value(input_index(i, step));
            }
        })?;
        checker.host += fill_started.elapsed();
        drop(scopes);
        if let Some(done) = done {
            checker.check(done.step(), done.output()?)?;
        }
        progress.inc(1);
    }
    // The last two steps run inside one call, each download waiting for
    // its compute: a scope around both would count that wait between them.
    // They stay unscoped; every step above is timed.
    let mut failure = None;
    managed.finish_steps_in_place(|done| {
        if failure.is_none() {
            failure = checker.check(done.step(), done.output()?).err();
        }
        Ok(())
    })?;
    if let Some(failure) = failure {
        return Err(failure);
    }
    if checker.verified != sizes.steps {
        return Err(format!(
            "pipeline: {} of {} steps came back",
            checker.verified, sizes.steps
        )
        .into());
    }
    let how = if verify_all {
        "every element".to_string()
    } else {
        format!(
            "{} elements of each; --verify-all checks all",
            checker.checked_elements / sizes.steps as usize
        )
    };
    Ok(PipelineRun {
        summary: format!(
            "pipeline: {} triple-buffered steps of {} elements (upload, compute x{iterations}, download on 3 streams), {} results checked ({how}), host {:.1} ms in steps and checks, {:.3} s",
            sizes.steps,
            sizes.elements,
            checker.verified,
            checker.host.as_secs_f64() * 1e3,
            start.elapsed().as_secs_f64()
        ),
    })
}

/// Checks each step's output against the 64-entry table.
struct Checker {
    table: Vec<f32>,
    verify_all: bool,
    verified: u64,
    checked_elements: usize,
    host: Duration,
}

impl Checker {
    fn check(&mut self, step: u64, output: &[f32]) -> DemoResult<()> {
        let started = Instant::now();
        let table = &self.table;
        let mut wrong = None;
        let mut check = |i: usize| {
            if wrong.is_none() && output[i] != table[input_index(i, step)] {
                wrong = Some(i);
            }
        };
        let checked = if self.verify_all {
            (0..output.len()).for_each(&mut check);
            output.len()
        } else {
            // The stamp (what this step changed) and an evenly spread
            // sample of the rest, offset differently every step.
            let stamp = STAMP.min(output.len());
            (0..stamp).for_each(&mut check);
            let rest = output.len() - stamp;
            let stride = (rest / SAMPLE).max(1);
            let offset = (step as usize * 7919) % stride;
            let sampled = (stamp + offset..output.len()).step_by(stride);
            let count = sampled.len();
            sampled.for_each(&mut check);
            stamp + count
        };
        self.host += started.elapsed();
        if let Some(i) = wrong {
            return Err(format!(
                "pipeline step {step}: element {i} is {}, expected {}",
                output[i],
                table[input_index(i, step)]
            )
            .into());
        }
        self.checked_elements += checked;
        self.verified += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = STAMP + 8 * SAMPLE;

    fn checker(verify_all: bool) -> Checker {
        Checker {
            table: (0..64)
                .map(|v| reference::compute_element(4, input_value(v)))
                .collect(),
            verify_all,
            verified: 0,
            checked_elements: 0,
            host: Duration::ZERO,
        }
    }

    fn output(checker: &Checker, step: u64) -> Vec<f32> {
        (0..N)
            .map(|i| checker.table[input_index(i, step)])
            .collect()
    }

    #[test]
    fn a_right_result_passes_and_counts() {
        let mut checker = checker(false);
        for step in 0..5 {
            let out = output(&checker, step);
            checker.check(step, &out).unwrap();
        }
        assert_eq!(checker.verified, 5);
        // The stamp and about SAMPLE more per step, far fewer than N.
        let per_step = checker.checked_elements / 5;
        assert!(
            (STAMP + SAMPLE / 2..=STAMP + 2 * SAMPLE).contains(&per_step),
            "{per_step}"
        );
    }

    #[test]
    fn the_sample_sees_the_stamp_and_the_spread_and_verify_all_sees_everything() {
        let step = 9;
        // Another step's stamp: what a stale slot would hold.
        let mut checker = checker(false);
        let stale = output(&checker, step - 1);
        let err = checker.check(step, &stale).unwrap_err();
        assert!(
            err.to_string().contains("pipeline step 9: element "),
            "{err}"
        );
        // A wrong element the sample visits.
        let stride = (N - STAMP) / SAMPLE;
        let visited = STAMP + (step as usize * 7919) % stride + 3 * stride;
        let mut wrong = output(&checker, step);
        wrong[visited] += 1.0;
        let err = checker.check(step, &wrong).unwrap_err();
        assert!(
            err.to_string().contains(&format!("element {visited} ")),
            "{err}"
        );
        // One it does not visit passes the sample but not --verify-all.
        let mut off_sample = output(&checker, step);
        off_sample[visited + 1] += 1.0;
        checker.check(step, &off_sample).unwrap();
        let err = super::tests::checker(true)
            .check(step, &off_sample)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("element {} ", visited + 1)),
            "{err}"
        );
    }
}
