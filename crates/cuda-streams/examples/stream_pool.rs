//! The stream pool: priorities read back from the driver, streams per
//! workload and purpose, an exclusive stream, and eight spin kernels spread
//! over the pool's streams against the same kernels on one stream.
//!
//! `cargo run -p cuda-streams --example stream_pool`

use cuda_streams::kernels;
use cuda_streams::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let pool = StreamPool::new_with_strategy(&ctx, 8, AllocationStrategy::Workload)?;
    let range = ctx.priority_range();
    println!(
        "pool of {} streams on the {} driver; priorities {} (least) to {} (greatest)",
        pool.len(),
        if ctx.is_gpu() { "CUDA" } else { "software" },
        range.least,
        range.greatest
    );

    // Priorities are real: each class's streams report the driver's value.
    for class in [
        StreamPriority::High,
        StreamPriority::Normal,
        StreamPriority::Low,
    ] {
        let stream = pool.get_priority_stream(class);
        assert_eq!(stream.priority()?, range.value(class));
        println!(
            "{class:?}: stream {} at priority {}",
            stream.id(),
            stream.priority()?
        );
    }
    for workload in [
        WorkloadType::Compute,
        WorkloadType::Memory,
        WorkloadType::Mixed,
    ] {
        let ids: Vec<u64> = pool
            .workload_streams(workload)
            .iter()
            .map(|s| s.id())
            .collect();
        println!("{workload:?} work goes to streams {ids:?}");
    }
    let upload = pool.get_stream_for_purpose(StreamPurpose::ConfigUpload);
    let download = pool.get_stream_for_purpose(StreamPurpose::TelemetryDownload);
    assert_ne!(upload.id(), download.id());

    // A stream nobody else is handed while we hold it.
    let mine = pool.acquire_exclusive()?;
    assert!(pool.streams().all(|s| s.id() != mine.id()));
    println!("exclusive stream {} (not in the shared set)", mine.id());
    drop(mine);

    // Eight 20 ms kernels: one stream runs them back to back, the pool's
    // eight streams side by side.
    let spin = Module::load(&ctx, &kernels::TIMING)?.function("spin")?;
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let run = |streams: &[Arc<Stream>]| -> Result<Duration, driver::Error> {
        let start = Instant::now();
        for i in 0..8 {
            streams[i % streams.len()].launch(&spin, one, &[20_000_000u64.into()])?;
        }
        for stream in streams {
            stream.synchronize()?;
        }
        Ok(start.elapsed())
    };
    let streams: Vec<Arc<Stream>> = pool.streams().cloned().collect();
    let serial = run(&streams[..1])?;
    let parallel = run(&streams)?;
    println!(
        "8 x 20 ms spin kernels: one stream {serial:.1?}, eight streams {parallel:.1?} ({:.1}x)",
        serial.as_secs_f64() / parallel.as_secs_f64()
    );
    assert!(
        parallel < serial,
        "the pool's streams must run side by side"
    );
    Ok(())
}
