//! The stream-ordered caching allocator: allocations tied to streams, data
//! through them, reuse on the same stream without a driver call, a block used
//! on a second stream, and the statistics.
//!
//! `cargo run -p cuda-streams --example allocator`

use cuda_streams::allocator::Backend;
use cuda_streams::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let (s1, s2) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    let allocator = StreamOrderedAllocator::with_backend(&ctx, Backend::Caching)?;

    // Data through an allocation on each stream.
    let a = allocator.allocate_for_stream(&s1, 1 << 20)?;
    let b = allocator.allocate_for_stream(&s2, 3 << 20)?;
    let input: Vec<u32> = (0..(1 << 18))
        .map(|i: u32| i.wrapping_mul(2_654_435_761))
        .collect();
    a.copy_from_host(&input)?;
    let mut back = vec![0u32; input.len()];
    a.copy_to_host(&mut back)?;
    assert_eq!(back, input);
    b.memset_u32_async(0x5eed)?;
    println!(
        "allocated {} + {} bytes (blocks of {} and {} bytes) on streams {} and {}",
        a.size(),
        b.size(),
        a.block_size(),
        b.block_size(),
        a.stream_id(),
        b.stream_id()
    );

    // Freed in stream order; the same size on the same stream is a cache hit.
    let before = allocator.stats();
    drop(a);
    for _ in 0..1000 {
        drop(allocator.allocate_for_stream(&s1, 1 << 20)?);
    }
    let after = allocator.stats();
    assert_eq!(after.driver_alloc_calls, before.driver_alloc_calls);
    println!(
        "1000 allocate+free on stream {}: {} cache hits, no driver call",
        s1.id(),
        after.cache_hits - before.cache_hits
    );

    // A block that another stream will also use: declare it, so the block is
    // not reused before that stream is past the point of the free.
    let shared = allocator.allocate_for_stream(&s2, 16)?;
    shared.memset_u32_async(7)?;
    shared.record_stream(&s1)?;
    let mut host = [0u32; 4];
    shared.copy_to_host(&mut host)?;
    assert_eq!(host, [7, 7, 7, 7]);
    drop((b, shared));

    let stats = allocator.stats();
    println!(
        "live {}, reserved {} bytes in {} segments, peak allocated {} bytes, {} driver allocations",
        stats.live_allocations,
        stats.reserved_bytes,
        stats.segments,
        stats.peak_allocated_bytes,
        stats.driver_alloc_calls
    );
    assert_eq!(stats.live_allocations, 0);
    let given_back = allocator.trim(0)?;
    println!("trim gave {given_back} bytes back to the driver");
    Ok(())
}
