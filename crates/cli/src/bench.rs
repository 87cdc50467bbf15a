//! `cuda-streams bench`: a quick run of the key ratios, each side measured in
//! this run with the benches' method (median of batches), printed as a table.
//! On the software driver it says that the figures only show the code runs:
//! they time CPU threads standing in for a GPU.
//! The careful numbers are the criterion benches (`cargo bench -p
//! cuda-streams-benches`, `cargo xtask bench-report`).

use benches::{Comparison, median_duration, median_ns};
use cuda_streams::kernels;
use cuda_streams::prelude::*;
use serde::Serialize;
use std::error::Error;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

type BenchResult<T> = Result<T, Box<dyn Error>>;

/// `cuda-streams bench`'s options.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Print one JSON object on stdout instead of the table: the driver, the
    /// device, and each measurement's `ours_ns`, `baseline_ns` and `ratio`.
    #[arg(long)]
    json: bool,
}

/// What the software driver's figures mean: it runs the work on the host's
/// CPU threads, so they time its stand-in, not a GPU or the library's cost
/// beside NVIDIA's driver.
const SOFTWARE_FIGURES: &str = "the software driver runs the work on CPU threads: these figures only show that the code runs, not how fast it is on a GPU (run it where a GPU answers for figures that mean something)";

/// What the figures mean on a GPU.
const GPU_FIGURES: &str = "measured on the GPU, both sides in this run";

/// The `--json` output.
#[derive(Serialize)]
struct Report {
    driver: &'static str,
    device: String,
    /// What the figures mean: on the software driver, nothing about speed.
    figures: &'static str,
    /// What the ratio means, for a reader of the JSON alone.
    ratio: &'static str,
    measurements: Vec<Measurement>,
    /// Baselines this device cannot measure, and why.
    skipped: Vec<String>,
    seconds: f64,
}

#[derive(Serialize)]
struct Measurement {
    name: &'static str,
    ours_ns: f64,
    baseline_ns: f64,
    ratio: f64,
}

pub(crate) fn run(args: &BenchArgs) -> BenchResult<()> {
    let started = Instant::now();
    let ctx = Context::new(0)?;
    let driver = if ctx.is_gpu() { "CUDA" } else { "software" };
    let figures = if ctx.is_gpu() {
        GPU_FIGURES
    } else {
        SOFTWARE_FIGURES
    };
    if !args.json {
        println!(
            "cuda-streams bench on {} ({driver} driver); medians of batches, both sides in this run",
            ctx.info().name,
        );
        if !ctx.is_gpu() {
            println!("note: {figures}");
        }
        println!();
    }
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    rows.push(pool_vs_create(&ctx)?);
    rows.push(event_pool_vs_create(&ctx)?);
    rows.extend(allocator_vs_driver(&ctx, &mut skipped)?);
    rows.push(pipeline_vs_sequential(&ctx)?);
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let report = Report {
            driver,
            device: ctx.info().name.clone(),
            figures,
            ratio: "baseline_ns / ours_ns (above 1: ours is faster)",
            measurements: rows
                .iter()
                .map(|row| Measurement {
                    name: row.name,
                    ours_ns: row.ours_ns,
                    baseline_ns: row.baseline_ns,
                    ratio: row.speedup(),
                })
                .collect(),
            skipped,
            seconds,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for note in &skipped {
            println!("({note})");
        }
        print_table(&rows);
        println!("\nratio = baseline / ours (above 1: ours is faster); {seconds:.1} s in all");
        if !ctx.is_gpu() {
            println!("software driver: the ratios say nothing about a GPU; see the note above");
        }
    }
    Ok(())
}

fn pool_vs_create(ctx: &Arc<Context>) -> BenchResult<Comparison> {
    let pool = StreamPool::new(ctx, 8)?;
    let ours = median_ns(31, 10_000, || drop(black_box(pool.get_stream())));
    let baseline = median_ns(15, 20, || {
        drop(black_box(
            Stream::new_with_priority(ctx, StreamPriority::High).expect("a stream"),
        ))
    });
    Ok(Comparison {
        name: "pool get_stream vs cuStreamCreate+Destroy",
        ours_ns: ours,
        baseline_ns: baseline,
    })
}

fn event_pool_vs_create(ctx: &Arc<Context>) -> BenchResult<Comparison> {
    let events = Arc::new(EventPool::new(ctx, 64, 0)?);
    let ours = median_ns(31, 10_000, || {
        drop(black_box(events.acquire_event(false).expect("an event")))
    });
    let baseline = median_ns(31, 200, || {
        drop(black_box(Event::plain(ctx).expect("an event")))
    });
    Ok(Comparison {
        name: "event pool acquire+release vs cuEventCreate+Destroy",
        ours_ns: ours,
        baseline_ns: baseline,
    })
}

/// 1 MiB allocate + free on one stream: the caching allocator against the
/// driver's pool (`cuMemAllocAsync` + `cuMemFreeAsync`, through
/// `DeviceBuffer::new_async`) and against `cuMemAlloc` + `cuMemFree`.
fn allocator_vs_driver(
    ctx: &Arc<Context>,
    skipped: &mut Vec<String>,
) -> BenchResult<Vec<Comparison>> {
    const SIZE: usize = 1 << 20;
    let stream = Stream::new(ctx)?;
    let allocator = StreamOrderedAllocator::new(ctx)?;
    let ours = median_ns(31, 1_000, || {
        drop(black_box(
            allocator
                .allocate_for_stream(&stream, SIZE)
                .expect("an allocation"),
        ))
    });
    let mut rows = Vec::new();
    if ctx.info().memory_pools_supported {
        let pool = median_ns(31, 200, || {
            drop(black_box(
                DeviceBuffer::<u8>::new_async(&stream, SIZE).expect("an allocation"),
            ))
        });
        stream.synchronize()?;
        rows.push(Comparison {
            name: "allocator 1 MiB vs cuMemAllocAsync+FreeAsync",
            ours_ns: ours,
            baseline_ns: pool,
        });
    } else {
        skipped.push(
            "no memory pools on this device: the cuMemAllocAsync baseline is skipped".to_string(),
        );
    }
    let sync = median_ns(15, 20, || {
        drop(black_box(
            DeviceBuffer::<u8>::new(ctx, SIZE).expect("an allocation"),
        ))
    });
    rows.push(Comparison {
        name: "allocator 1 MiB vs cuMemAlloc+cuMemFree",
        ours_ns: ours,
        baseline_ns: sync,
    });
    Ok(rows)
}

/// Upload, `compute` and download of `STEPS` batches: the stage manager
/// (three streams, three batches in flight) against the same work on one
/// stream. Wall time until the results are on the host.
fn pipeline_vs_sequential(ctx: &Arc<Context>) -> BenchResult<Comparison> {
    const STEPS: usize = 16;
    let (elements, iterations) = if ctx.is_gpu() {
        (1 << 22, 64u32)
    } else {
        (1 << 15, 16)
    };
    let compute = Module::load(ctx, &kernels::COMPUTE)?.function("compute")?;
    let cfg = LaunchConfig::for_num_elems(elements.min(1 << 20) as u32);
    let data: Vec<f32> = (0..elements).map(|i| (i % 1000) as f32 * 0.001).collect();

    let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(ctx)?, elements)?;
    let stage = pipeline.add_stage(GpuPipelineStage::compute(
        "compute",
        compute.clone(),
        cfg,
        iterations,
        0,
        1,
    ));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![stage])?;
    pipeline.fill_input(0, &data)?;
    let mut failure = None;
    let mut pipelined = || {
        let result = (0..STEPS)
            .try_for_each(|_| pipeline.execute_iteration().map(drop))
            .and_then(|()| pipeline.drain().map(drop));
        if let Err(e) = result {
            failure.get_or_insert(e);
        }
    };
    pipelined(); // warm-up: first use creates events and loads the module
    let ours = median_duration(3, pipelined);
    if let Some(e) = failure {
        return Err(e.into());
    }

    let stream = Stream::new(ctx)?;
    let host_in = PinnedBuffer::from_slice(ctx, &data)?;
    let mut host_out = PinnedBuffer::<f32>::new(ctx, elements)?;
    let (mut dev_in, mut dev_out) = (
        DeviceBuffer::<f32>::new(ctx, elements)?,
        DeviceBuffer::<f32>::new(ctx, elements)?,
    );
    let mut sequential = || -> Result<(), driver::Error> {
        for _ in 0..STEPS {
            stream.copy_from_host_async(&mut dev_in, &host_in)?;
            let args = [
                (elements as u64).into(),
                iterations.into(),
                (&dev_in).into(),
                (&mut dev_out).into(),
            ];
            stream.launch(&compute, cfg, &args)?;
            stream.copy_to_host_async(&mut host_out, &dev_out)?;
        }
        stream.synchronize()
    };
    sequential()?;
    let mut failure = None;
    let baseline = median_duration(3, || {
        if let Err(e) = sequential() {
            failure.get_or_insert(e);
        }
    });
    if let Some(e) = failure {
        return Err(e.into());
    }
    Ok(Comparison {
        name: "pipeline (3 streams) vs sequential, 16 batches",
        ours_ns: ours.as_nanos() as f64,
        baseline_ns: baseline.as_nanos() as f64,
    })
}

fn format_ns(ns: f64) -> String {
    match ns {
        ns if ns >= 1e6 => format!("{:.2} ms", ns / 1e6),
        ns if ns >= 1e3 => format!("{:.2} µs", ns / 1e3),
        ns => format!("{ns:.1} ns"),
    }
}

fn print_table(rows: &[Comparison]) {
    let width = rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max("measurement".len());
    println!(
        "{:<width$}  {:>11}  {:>11}  {:>8}",
        "measurement", "ours", "baseline", "ratio"
    );
    println!("{}", "-".repeat(width + 36));
    for row in rows {
        println!(
            "{:<width$}  {:>11}  {:>11}  {:>7.2}x",
            row.name,
            format_ns(row.ours_ns),
            format_ns(row.baseline_ns),
            row.speedup()
        );
    }
}
