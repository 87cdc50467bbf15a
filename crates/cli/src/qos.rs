//! `cuda-streams qos`: urgent kernels under a saturating background, with
//! priorities only and with an SM partition kept for them, side by side.
//!
//! Each case launches a one-block kernel on an urgent stream and waits for
//! it, `--samples` times with a pause between, while a background of long
//! one-millisecond spins fills every SM it may use; it prints the urgent
//! kernel's p50 and p99 and the background's throughput. On the software
//! driver the figures say nothing about a GPU: kernels are CPU twins and
//! nothing contends for SMs there.

use cuda_streams::driver::{Context, Event, Kernel, LaunchConfig, Module, Stream};
use cuda_streams::kernels;
use cuda_streams::pool::{QosPool, QosSettings, ServiceClass};
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

type QosResult<T> = Result<T, Box<dyn Error>>;

/// `cuda-streams qos`'s options.
#[derive(clap::Args)]
pub(crate) struct QosArgs {
    /// SMs kept for urgent work (default: `CUDA_STREAMS_URGENT_SMS`, else 16).
    #[arg(long)]
    urgent_sms: Option<u32>,
    /// Urgent launches per case.
    #[arg(long, default_value_t = 40)]
    samples: usize,
    /// Background launches (1 ms spins filling the SMs) per case.
    #[arg(long, default_value_t = 100)]
    background: usize,
}

const URGENT: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};
const SPIN: Duration = Duration::from_millis(1);
const PAUSE: Duration = Duration::from_micros(1500);

/// One case's figures.
struct Row {
    case: String,
    p50_us: f64,
    p99_us: f64,
    /// Background blocks per millisecond, when a background ran.
    background: Option<f64>,
}

pub(crate) fn run(args: &QosArgs) -> QosResult<()> {
    if args.samples == 0 {
        return Err("--samples 0: at least one urgent launch is needed".into());
    }
    let ctx = Context::new(0)?;
    let mut settings = QosSettings::from_env()?;
    if let Some(sms) = args.urgent_sms {
        settings.urgent_sms = sms;
    }
    let spin = Module::load(&ctx, &kernels::TIMING)?.function("spin")?;
    // Every SM of the device: the unpartitioned background fills them all.
    let total = ctx.info().multiprocessor_count;
    println!(
        "cuda-streams qos on {} ({total} SMs, {} driver): an urgent one-block kernel, {} times per case",
        ctx.info().name,
        if ctx.is_gpu() { "CUDA" } else { "software" },
        args.samples
    );
    if !ctx.is_gpu() {
        println!(
            "note: the software driver runs kernels as CPU threads and nothing contends for SMs: \
             these figures only show that the code runs"
        );
    }
    let priorities = QosPool::new(
        &ctx,
        QosSettings {
            urgent_sms: 0,
            ..settings
        },
    )?;
    let partitioned = QosPool::new(&ctx, settings)?;
    // Loaded before timing: on a GPU loading waits for the device, so a
    // first launch that loads would time the background, not the partition.
    partitioned.load(&spin)?;
    let urgent_sms = partitioned.urgent_sms().unwrap_or(0);
    let rest_sms = partitioned.rest_sms().unwrap_or(total);

    let mut rows = Vec::new();
    let idle = urgent_loop(
        &priorities.stream(ServiceClass::Urgent),
        &spin,
        args.samples,
    )?;
    rows.push(row("idle, greatest priority".into(), &idle, None));
    for (case, pool, sms) in [
        ("busy, priorities only".to_owned(), &priorities, total),
        (
            format!("busy, {urgent_sms} SMs kept for urgent work"),
            &partitioned,
            rest_sms,
        ),
    ] {
        let background = pool.stream(ServiceClass::Background);
        // One launch of each first, on an idle device: nothing timed below
        // is a first launch.
        urgent_loop(&pool.stream(ServiceClass::Urgent), &spin, 1)?;
        launch_background(&background, &spin, 1, 1)?;
        background.synchronize()?;
        let blocks = sms * 4;
        // The background's own span, timed by the device between two
        // events on its stream: the host's clock would also count the
        // urgent loop, which may end after the background.
        let (begun, ended) = (Event::timing(&ctx)?, Event::timing(&ctx)?);
        begun.record(&background)?;
        launch_background(&background, &spin, blocks, args.background)?;
        ended.record(&background)?;
        let urgent = urgent_loop(&pool.stream(ServiceClass::Urgent), &spin, args.samples)?;
        background.synchronize()?;
        let span = Event::elapsed(&begun, &ended)?;
        let per_ms = f64::from(blocks) * args.background as f64 / (span.as_secs_f64() * 1e3);
        rows.push(row(case, &urgent, Some(per_ms)));
    }
    println!();
    println!(
        "{:<40} {:>12} {:>12} {:>22}",
        "case", "p50 (µs)", "p99 (µs)", "background blocks/ms"
    );
    for row in &rows {
        let background = row
            .background
            .map_or_else(|| "-".to_owned(), |b| format!("{b:.1}"));
        println!(
            "{:<40} {:>12.1} {:>12.1} {:>22}",
            row.case, row.p50_us, row.p99_us, background
        );
    }
    if let [_, busy, kept] = &rows[..] {
        println!(
            "\nurgent p50 with {urgent_sms} SMs kept: {:.1}x its idle p50, {:.1}x below priorities only",
            kept.p50_us / rows[0].p50_us,
            busy.p50_us / kept.p50_us
        );
    }
    Ok(())
}

fn row(case: String, samples: &[Duration], background: Option<f64>) -> Row {
    let at =
        |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    Row {
        case,
        p50_us: at(0.5),
        p99_us: at(0.99),
        background,
    }
}

/// The urgent kernel `samples` times, each waited for; sorted latencies.
fn urgent_loop(stream: &Arc<Stream>, spin: &Kernel, samples: usize) -> QosResult<Vec<Duration>> {
    let mut took = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        stream.launch(spin, URGENT, &[0u64.into()])?;
        stream.synchronize()?;
        took.push(start.elapsed());
        let pause = Instant::now();
        while pause.elapsed() < PAUSE {
            std::hint::spin_loop();
        }
    }
    took.sort();
    Ok(took)
}

/// `launches` spins of 1 ms in `blocks` blocks of 512 threads.
fn launch_background(
    stream: &Stream,
    spin: &Kernel,
    blocks: u32,
    launches: usize,
) -> QosResult<()> {
    let config = LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: 0,
    };
    let ns = SPIN.as_nanos() as u64;
    for _ in 0..launches {
        stream.launch(spin, config, &[ns.into()])?;
    }
    Ok(())
}
