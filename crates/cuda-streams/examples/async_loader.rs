//! An async data loader on tokio: batches are uploaded on the pool's streams,
//! transformed on the GPU and read back, each task awaiting its copies
//! instead of blocking a thread, while another task keeps the GPU busy with
//! kernels it awaits too. Every result is checked.
//!
//! The futures come from `cuda_streams::driver` and need no particular
//! runtime: tokio here is a dev-dependency of the example only.
//!
//! `cargo run -p cuda-streams --example async_loader`

use cuda_streams::Error;
use cuda_streams::kernels::typed::{Elementwise, Timing};
use cuda_streams::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BATCHES: usize = 16;
const BATCH_LEN: usize = 1 << 16;

/// What batch `b` holds at index `i` when it leaves the "disk".
fn source(b: usize, i: usize) -> f32 {
    (b * 7 + i % 1000) as f32
}

/// Upload one batch, scale it on the GPU (`y = 2 x + y`, with `y = 1`),
/// download it and check it: every wait is an `.await`.
async fn load(b: usize, stream: Arc<Stream>, kernels: Arc<Elementwise>) -> Result<usize, Error> {
    let ctx = stream.context();
    let staging = PinnedBuffer::from_slice(
        ctx,
        &(0..BATCH_LEN).map(|i| source(b, i)).collect::<Vec<_>>(),
    )?;
    let mut x = DeviceBuffer::<f32>::new_async(&stream, BATCH_LEN)?;
    let mut y = DeviceBuffer::<f32>::new_async(&stream, BATCH_LEN)?;
    // The upload: the future holds `staging` until the copy has completed.
    let staging = stream.copy_from_host_future(&mut x, &staging)?.await?;
    kernels.fill_f32(&stream, 1.0, &mut y)?;
    kernels.saxpy(&stream, 2.0, &x, &mut y)?;
    let mut result = PinnedBuffer::<f32>::new(ctx, BATCH_LEN)?;
    let result = stream.copy_to_host_future(&mut result, &y)?.await?;
    for (i, (&got, &input)) in result
        .as_slice()?
        .iter()
        .zip(staging.as_slice()?)
        .enumerate()
    {
        let want = 2.0 * input + 1.0;
        assert_eq!(got, want, "batch {b}, element {i}");
    }
    Ok(b)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let pool = StreamPool::new(&ctx, 4)?;
    let kernels = Arc::new(Elementwise::load(&ctx)?);
    let timing = Timing::load(&ctx)?;
    println!(
        "loading {BATCHES} batches of {BATCH_LEN} floats over {} pool streams on the {} driver",
        pool.len(),
        if ctx.is_gpu() { "CUDA" } else { "software" }
    );

    // Keep the GPU busy meanwhile: short kernels on a stream of their own,
    // each awaited, until the loader is done.
    let busy_stream = Stream::new_with_priority(&ctx, StreamPriority::Low)?;
    let loading = Arc::new(AtomicBool::new(true));
    let kernels_run = Arc::new(AtomicU64::new(0));
    let busy = tokio::spawn({
        let (loading, kernels_run) = (Arc::clone(&loading), Arc::clone(&kernels_run));
        async move {
            while loading.load(Ordering::Acquire) {
                timing.spin(&busy_stream, Duration::from_micros(500))?;
                busy_stream.completion()?.await?;
                kernels_run.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(())
        }
    });

    let start = Instant::now();
    let streams: Vec<Arc<Stream>> = pool.streams().cloned().collect();
    let tasks: Vec<_> = (0..BATCHES)
        .map(|b| {
            tokio::spawn(load(
                b,
                Arc::clone(&streams[b % streams.len()]),
                Arc::clone(&kernels),
            ))
        })
        .collect();
    let mut loaded = Vec::new();
    for task in tasks {
        loaded.push(task.await??);
    }
    loading.store(false, Ordering::Release);
    busy.await??;

    loaded.sort_unstable();
    assert_eq!(loaded, (0..BATCHES).collect::<Vec<_>>());
    println!(
        "{BATCHES} batches uploaded, transformed and checked in {:.1} ms; \
         {} busy kernels ran meanwhile; reactor: {:?}",
        start.elapsed().as_secs_f64() * 1e3,
        kernels_run.load(Ordering::Relaxed),
        ctx.reactor().stats()
    );
    assert_eq!(ctx.reactor().stats().pending, 0);
    Ok(())
}
