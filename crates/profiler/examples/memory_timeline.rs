//! A memory timeline: three streams allocate, work and free through the
//! caching allocator while the profiler times their scopes and tracks the
//! allocator; writes the trace (stream tracks and memory counter tracks) and
//! prints the allocator's snapshot at its peak.
//!
//! `cargo run --release -p cuda-streams-profiler --example memory_timeline -- trace.json`

use cuda_streams_profiler::allocator::{BlockState, StreamOrderedAllocator};
use cuda_streams_profiler::driver::{Context, LaunchConfig, Module, Stream};
use cuda_streams_profiler::{StreamProfiler, format_bytes};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory-trace.json".into());
    let ctx = Context::new(0)?;
    let spin = Module::load(&ctx, &kernels::TIMING)?.function("spin")?;
    let one_thread = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let streams = [Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?];
    let allocator = StreamOrderedAllocator::new(&ctx)?;
    let profiler = StreamProfiler::new(&ctx)?;
    profiler.track_memory(&allocator)?;
    profiler.enable();

    let mut peak = None;
    for step in 0..6usize {
        let mut held = Vec::new();
        for (i, stream) in streams.iter().enumerate() {
            // Each stream's working set grows with the step.
            let bytes = ((i + 1) * (step + 1)) << 20;
            let block = allocator.allocate_for_stream(stream, bytes)?;
            profiler.time(stream, format!("step {step} clear"), |_| {
                block.memset_u32_async(step as u32)
            })??;
            let ns = 1_000_000u64 * (i as u64 + 1);
            profiler.time(stream, format!("step {step} compute"), |s| {
                s.launch(&spin, one_thread, &[ns.into()])
            })??;
            held.push(block);
        }
        for stream in &streams {
            stream.synchronize()?;
        }
        if step == 5 {
            peak = Some(allocator.snapshot());
        }
        drop(held);
    }

    std::fs::write(&path, profiler.to_chrome_trace()?)?;
    println!("wrote {path}");
    if let Some(snapshot) = peak {
        println!(
            "at the peak: {} live, {} reserved",
            format_bytes(snapshot.allocated_bytes as u64),
            format_bytes(snapshot.reserved_bytes as u64)
        );
        for stream in &snapshot.streams {
            for segment in &stream.segments {
                let blocks: Vec<String> = segment
                    .blocks
                    .iter()
                    .map(|b| {
                        let size = format_bytes(b.size as u64);
                        match b.state {
                            BlockState::Live => format!("live {size}"),
                            BlockState::Free => format!("free {size}"),
                            _ => format!("pending {size}"),
                        }
                    })
                    .collect();
                println!(
                    "  stream {} segment +{:#x} ({}): {}",
                    stream.stream_id,
                    segment.address & 0xff_ffff,
                    format_bytes(segment.size as u64),
                    blocks.join(" | ")
                );
            }
            if !stream.pending_frees.is_empty() {
                println!(
                    "  stream {}: {} frees pending",
                    stream.stream_id,
                    stream.pending_frees.len()
                );
            }
        }
    }
    Ok(())
}
