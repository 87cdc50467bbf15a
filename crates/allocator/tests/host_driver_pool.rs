//! The pinned host pool on its driver backend (`HostBackend::DriverPool`, a
//! driver memory pool of host memory): blocks as copy sources and
//! destinations, a dropped block handed out again only after every stream
//! that used it has passed that use (streams held by a `Gate`, not timed),
//! the cap's refusal naming the values and the stream holding the blocks,
//! trim, the figures, and many threads at once.
//!
//! Exact byte figures are asserted on the software driver; a GPU's pool
//! reserves in its own granularity, so there they are bounds.
//!
//! Each test holds `serial()`, as the shelves' tests do.

use cuda_streams_allocator::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_allocator::{Error, HostBackend, HostPool};
use std::sync::Arc;
use test_support::{Gate, ctx, serial};

const LEN: usize = 1024; // u32s: 4 KiB
const BYTES: usize = LEN * 4;

/// A driver-backed pool on `ctx`, or `None` (saying why) where the driver
/// makes no pools of host memory.
fn driver_pool(ctx: &Arc<Context>, cap: Option<usize>) -> Option<HostPool> {
    let builder = HostPool::builder(ctx).backend(HostBackend::DriverPool);
    let builder = match cap {
        Some(cap) => builder.cap(cap),
        None => builder,
    };
    match builder.build() {
        Ok(pool) => Some(pool),
        Err(Error::Driver(
            err @ cuda_streams_allocator::driver::Error::HostPoolsUnsupported { .. },
        )) if ctx.is_gpu() => {
            eprintln!("skipped: {err}");
            None
        }
        Err(err) => panic!("the software driver has host pools: {err}"),
    }
}

#[test]
fn blocks_carry_data_to_the_device_and_back() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, None) else {
        return;
    };
    assert_eq!(pool.backend(), HostBackend::DriverPool);
    let stream = Stream::new(&ctx).unwrap();
    let values: Vec<u32> = (0..LEN as u32).map(|v| v * 7 + 1).collect();
    let mut up = pool.allocate::<u32>(LEN).unwrap();
    assert!(
        up.as_slice().unwrap().iter().all(|&v| v == 0),
        "new blocks hold zeros"
    );
    up.as_mut_slice().unwrap().copy_from_slice(&values);
    let mut device = DeviceBuffer::<u32>::new_async(&stream, LEN).unwrap();
    stream.copy_from_host_async(&mut device, &up).unwrap();
    let mut down = pool.allocate::<u32>(LEN).unwrap();
    stream.copy_to_host_async(&mut down, &device).unwrap();
    // No synchronize: reading waits for the copy that writes the block.
    assert_eq!(down.as_slice().unwrap(), &values[..]);
    drop((up, down));
    stream.synchronize().unwrap();
    let stats = pool.stats();
    assert_eq!((stats.in_use_bytes, stats.pending_bytes), (0, 0), "{stats}");
    // Two requests, each a hit or a miss. The software driver reserves per
    // request (two misses); a GPU's pool reserves a chunk (32 MiB on an
    // H100 with driver 580) at the first, which serves the second.
    assert_eq!(stats.misses + stats.hits, 2, "{stats}");
    assert!(stats.misses >= 1, "the first request reserves: {stats}");
    if !ctx.is_gpu() {
        assert_eq!((stats.misses, stats.hits), (2, 0), "{stats}");
    }
}

#[test]
fn a_block_is_handed_out_again_only_after_its_streams_passed_their_uses() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, None) else {
        return;
    };
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let values: Vec<u32> = (0..LEN as u32).collect();
    let mut da = DeviceBuffer::<u32>::new_async(&a, LEN).unwrap();
    let mut db = DeviceBuffer::<u32>::new_async(&b, LEN).unwrap();
    let (gate_a, gate_b) = (Gate::close(&a), Gate::close(&b));

    let mut block = pool.allocate::<u32>(LEN).unwrap();
    block.as_mut_slice().unwrap().copy_from_slice(&values);
    a.copy_from_host_async(&mut da, &block).unwrap();
    b.copy_from_host_async(&mut db, &block).unwrap();
    let used = block.as_ptr();
    drop(block); // both copies are still behind their gates

    if gate_a.still_held() && gate_b.still_held() {
        // Whoever gets the next block writes all over it at once: had it
        // been the dropped one, the copies behind the gates would read this.
        let mut second = pool.allocate::<u32>(LEN).unwrap();
        assert_ne!(second.as_ptr(), used, "handed out under two pending copies");
        second.as_mut_slice().unwrap().fill(0xdead);
        let stats = pool.stats();
        assert_eq!(stats.pending_bytes, BYTES, "{stats}");
        gate_a.open();
        a.synchronize().unwrap();
        // `a` has passed its copy; `b` has not.
        let mut third = pool.allocate::<u32>(LEN).unwrap();
        assert_ne!(
            third.as_ptr(),
            used,
            "handed out while stream b still copies it"
        );
        third.as_mut_slice().unwrap().fill(0xbeef);
        let holder = pool.heaviest_holder().expect("b holds the block");
        assert_eq!((holder.stream, holder.blocks), (b.id(), 1));
        drop((second, third));
    }
    gate_b.open();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    // The copies read the block's contents of the time, not a later owner's.
    assert_eq!(da.to_vec(&a).unwrap(), values);
    assert_eq!(db.to_vec(&b).unwrap(), values);
    let stats = pool.stats();
    assert_eq!(stats.pending_bytes, 0, "{stats}");
    // Every block is back in the driver's pool: the next one is a hit.
    let misses = stats.misses;
    let again = pool.allocate::<u32>(LEN).unwrap();
    assert_eq!(pool.stats().misses, misses, "{}", pool.stats());
    drop(again);
}

#[test]
fn past_the_cap_the_error_names_the_values_and_the_stream_holding_the_blocks() {
    let _serial = serial();
    let ctx = ctx();
    let cap = 2 * BYTES;
    let Some(pool) = driver_pool(&ctx, Some(cap)) else {
        return;
    };
    let stuck = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stuck, LEN).unwrap();
    let gate = Gate::close(&stuck);
    for _ in 0..2 {
        let block = pool.allocate::<u32>(LEN).unwrap();
        stuck.copy_from_host_async(&mut device, &block).unwrap();
    }
    if gate.still_held() {
        let err = pool.allocate::<u32>(LEN).unwrap_err();
        let Error::HostPoolFull {
            requested,
            cap: named_cap,
            holder,
            ..
        } = &err
        else {
            panic!("expected HostPoolFull, got {err}");
        };
        assert_eq!((*requested, *named_cap), (BYTES, cap));
        let holder = holder.expect("a stream holds the blocks");
        assert_eq!((holder.stream, holder.blocks), (stuck.id(), 2));
        let text = err.to_string();
        assert!(text.contains(&format!("cap of {cap} bytes")), "{text}");
        assert!(text.contains(&format!("for {BYTES}")), "{text}");
        assert!(
            text.contains(&format!("stream {} holds 2", stuck.id())),
            "{text}"
        );
    }
    gate.open();
    stuck.synchronize().unwrap();
    // Passed: the blocks went back to the driver's pool, which serves the
    // next request from them, reserving nothing more.
    let before = pool.stats();
    let again = pool.allocate::<u32>(LEN).unwrap();
    let stats = pool.stats();
    assert_eq!(
        (stats.misses, stats.hits),
        (before.misses, before.hits + 1),
        "{stats}"
    );
    assert!(stats.reserved_bytes <= cap || ctx.is_gpu(), "{stats}");
    drop(again);
}

#[test]
fn a_full_pool_with_every_block_in_use_says_so() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, Some(BYTES)) else {
        return;
    };
    let held = pool.allocate::<u32>(LEN).unwrap();
    let err = pool.allocate::<u8>(1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::HostPoolFull {
                requested: 1,
                holder: None,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("every block is in use"), "{err}");
    drop(held);
    drop(pool.allocate::<u8>(1).unwrap());
}

#[test]
fn trim_gives_idle_memory_back_and_keeps_blocks_a_stream_still_uses() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, None) else {
        return;
    };
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u8>::new_async(&stream, 3072).unwrap();
    let gate = Gate::close(&stream);
    let busy = pool.allocate::<u8>(3072).unwrap();
    stream.copy_from_host_async(&mut device, &busy).unwrap();
    drop(busy);
    let idle: Vec<_> = [1024usize, 8192, 70_144]
        .into_iter()
        .map(|bytes| pool.allocate::<u8>(bytes).unwrap())
        .collect();
    drop(idle);
    let idle = 1024 + 8192 + 70_144;
    if gate.still_held() {
        let stats = pool.stats();
        assert_eq!(stats.pending_bytes, 3072, "{stats}");
        let reserved = stats.reserved_bytes;
        let released = pool.trim(0);
        let after = pool.stats();
        assert_eq!(released, reserved - after.reserved_bytes, "{after}");
        assert!(
            after.reserved_bytes >= 3072,
            "the busy block stays: {after}"
        );
        if !ctx.is_gpu() {
            assert_eq!(released, idle);
            assert_eq!(after.reserved_bytes, 3072, "{after}");
        }
    }
    gate.open();
    stream.synchronize().unwrap();
    pool.trim(0);
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.cached_bytes),
        (0, 0),
        "{stats}"
    );
}

#[test]
fn trim_keeps_what_it_is_told_to() {
    let _serial = serial();
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: its pool keeps memory in its own granularity");
        return;
    }
    let pool = driver_pool(&ctx, None).unwrap();
    let blocks: Vec<_> = (0..4).map(|_| pool.allocate::<u8>(4096).unwrap()).collect();
    drop(blocks);
    assert_eq!(pool.trim(2 * 4096), 2 * 4096);
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.cached_bytes),
        (8192, 8192),
        "{stats}"
    );
}

#[test]
fn stats_count_hits_misses_and_peaks() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, None) else {
        return;
    };
    let a = pool.allocate::<u32>(LEN).unwrap();
    let b = pool.allocate::<u32>(LEN).unwrap();
    drop(a);
    let before = pool.stats();
    let c = pool.allocate::<u32>(LEN).unwrap(); // from a's memory
    let stats = pool.stats();
    assert_eq!(
        (stats.hits, stats.misses),
        (before.hits + 1, before.misses),
        "{stats}"
    );
    // The software driver reserves per request (a and b miss); a GPU's
    // pool reserves a chunk at the first, which may serve b too.
    if !ctx.is_gpu() {
        assert_eq!((stats.hits, stats.misses), (1, 2), "{stats}");
    }
    assert_eq!(stats.in_use_bytes, 2 * BYTES);
    assert_eq!(stats.peak_in_use_bytes, 2 * BYTES);
    assert!(stats.reserved_bytes >= 2 * BYTES, "{stats}");
    assert!(stats.peak_reserved_bytes >= stats.reserved_bytes, "{stats}");
    if !ctx.is_gpu() {
        assert_eq!(stats.reserved_bytes, 2 * BYTES, "{stats}");
    }
    drop((b, c));
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats}");
    assert_eq!(
        stats.cached_bytes, stats.reserved_bytes,
        "all idle: {stats}"
    );
    pool.trim(0);
    pool.reset_peaks();
    let stats = pool.stats();
    assert_eq!(stats.peak_in_use_bytes, 0, "{stats}");
    assert_eq!(stats.peak_reserved_bytes, stats.reserved_bytes, "{stats}");
    let text = stats.to_string();
    let counts = format!("{} hits, {} misses", stats.hits, stats.misses);
    assert!(text.contains(&counts), "{text}");
}

#[test]
fn zero_and_overflowing_requests_are_refused_naming_the_size() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, None) else {
        return;
    };
    let err = pool.allocate::<u32>(0).unwrap_err();
    assert!(
        err.to_string().contains("0 element(s)") && err.to_string().contains("empty"),
        "{err}"
    );
    let err = pool.allocate::<u64>(usize::MAX / 4).unwrap_err();
    assert!(
        err.to_string().contains(&(usize::MAX / 4).to_string()),
        "{err}"
    );
    let stats = pool.stats();
    assert_eq!((stats.reserved_bytes, stats.misses), (0, 0), "{stats}");
}

/// Many threads, each uploading batches from pool blocks on its own stream
/// and dropping each block while its copy may still run. Had a block gone to
/// another thread before the copy read it, that thread's fill would show up
/// in this thread's device buffer.
#[test]
fn threads_sharing_a_pool_never_get_a_block_a_copy_still_reads() {
    let _serial = serial();
    let ctx = ctx();
    let Some(pool) = driver_pool(&ctx, None) else {
        return;
    };
    let pool = Arc::new(pool);
    const THREADS: u32 = 8;
    const STEPS: u32 = 40;
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (ctx, pool) = (Arc::clone(&ctx), Arc::clone(&pool));
            scope.spawn(move || {
                let stream = Stream::new(&ctx).unwrap();
                let mut device = DeviceBuffer::<u32>::new_async(&stream, LEN).unwrap();
                for step in 0..STEPS {
                    let tag = thread * 1000 + step;
                    let mut block = pool.allocate::<u32>(LEN).unwrap();
                    block.as_mut_slice().unwrap().fill(tag);
                    stream.copy_from_host_async(&mut device, &block).unwrap();
                    drop(block);
                    let back = device.to_vec(&stream).unwrap();
                    assert!(
                        back.iter().all(|&v| v == tag),
                        "thread {thread} step {step}"
                    );
                }
            });
        }
    });
    let stats = pool.stats();
    assert_eq!((stats.in_use_bytes, stats.pending_bytes), (0, 0), "{stats}");
    assert_eq!(stats.hits + stats.misses, u64::from(THREADS * STEPS));
    if !ctx.is_gpu() {
        // At most one block per thread in use and one waiting per thread.
        assert!(
            stats.reserved_bytes <= 2 * THREADS as usize * BYTES,
            "{stats}"
        );
    }
}
