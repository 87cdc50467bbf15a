//! The pinned host pool on a real stream: a dropped block is handed out again
//! only after every stream that used it has passed that use (streams held by
//! a `Gate`, not timed), the cap's error names the stream holding the most,
//! trim, the figures, blocks as copy sources and destinations, bad sizes.
//!
//! Each test holds `serial()`: on a GPU, `cuMemFreeHost` (a pool's drop or
//! trim) waits for the whole device, and so for a neighbour's gate.

use cuda_streams_allocator::driver::{DeviceBuffer, Stream};
use cuda_streams_allocator::{Error, HostPool, host_size_class};
use std::io::Write;
use std::sync::{Arc, Mutex};
use test_support::{Gate, ctx, serial};

const LEN: usize = 1024; // u32s: 4 KiB, its own size class

#[test]
fn a_block_is_reused_only_after_every_stream_passed_its_use() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
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

    let class = host_size_class(LEN * 4).unwrap();
    if gate_a.still_held() && gate_b.still_held() {
        let second = pool.allocate::<u32>(LEN).unwrap();
        assert_ne!(second.as_ptr(), used, "handed out under two pending copies");
        assert_eq!(pool.stats().pending_bytes, class);
        gate_a.open();
        a.synchronize().unwrap();
        // `a` has passed its copy; `b` has not.
        let third = pool.allocate::<u32>(LEN).unwrap();
        assert_ne!(
            third.as_ptr(),
            used,
            "handed out while stream b still copies it"
        );
        let holder = pool.heaviest_holder().expect("b holds the block");
        assert_eq!((holder.stream, holder.blocks), (b.id(), 1));
        drop((second, third));
    }
    gate_b.open();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    let stats = pool.stats();
    assert_eq!(stats.pending_bytes, 0, "{stats}");
    // Now every block is free; taking them all must give the used one back.
    let blocks: Vec<_> = (0..3).map(|_| pool.allocate::<u32>(LEN).unwrap()).collect();
    assert!(blocks.iter().any(|blk| blk.as_ptr() == used));
    // The copies read the block's contents of the time, not a later owner's.
    assert_eq!(da.to_vec(&a).unwrap(), values);
    assert_eq!(db.to_vec(&b).unwrap(), values);
}

#[test]
fn past_the_cap_the_error_names_the_stream_holding_the_blocks() {
    let _serial = serial();
    let ctx = ctx();
    let class = host_size_class(LEN * 4).unwrap();
    let pool = HostPool::builder(&ctx).cap(2 * class).build().unwrap();
    let stuck = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stuck, LEN).unwrap();
    let gate = Gate::close(&stuck);
    for _ in 0..2 {
        let block = pool.allocate::<u32>(LEN).unwrap();
        stuck.copy_from_host_async(&mut device, &block).unwrap();
    }
    if gate.still_held() {
        let err = pool.allocate::<u32>(LEN).unwrap_err();
        let Error::HostPoolFull { holder, cap, .. } = &err else {
            panic!("expected HostPoolFull, got {err}");
        };
        assert_eq!(*cap, 2 * class);
        let holder = holder.expect("a stream holds the blocks");
        assert_eq!((holder.stream, holder.blocks), (stuck.id(), 2));
        let text = err.to_string();
        assert!(
            text.contains(&format!("stream {} holds 2", stuck.id())),
            "{text}"
        );
        assert!(pool.stats().reserved_bytes <= 2 * class);
    }
    gate.open();
    stuck.synchronize().unwrap();
    // Passed: the blocks are reusable and the pool did not grow.
    let again = pool.allocate::<u32>(LEN).unwrap();
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.misses),
        (2 * class, 2),
        "{stats}"
    );
    drop(again);
}

#[test]
fn a_full_pool_with_every_block_in_use_says_so() {
    let _serial = serial();
    let ctx = ctx();
    let class = host_size_class(LEN * 4).unwrap();
    let pool = HostPool::builder(&ctx).cap(class).build().unwrap();
    let held = pool.allocate::<u32>(LEN).unwrap();
    let err = pool.allocate::<u32>(LEN).unwrap_err();
    assert!(err.to_string().contains("every block is in use"), "{err}");
    drop(held);
    // Idle blocks of another class make room under the cap.
    let other = pool.allocate::<u8>(100).unwrap();
    assert_eq!(pool.stats().reserved_bytes, host_size_class(100).unwrap());
    drop(other);
}

#[test]
fn trim_frees_idle_blocks_only() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let sizes = [1000usize, 5000, 70_000];
    let classes: usize = sizes.iter().map(|&n| host_size_class(n).unwrap()).sum();
    for &n in &sizes {
        drop(pool.allocate::<u8>(n).unwrap());
    }
    let mut device = DeviceBuffer::<u8>::new_async(&stream, 3000).unwrap();
    let gate = Gate::close(&stream);
    let busy = pool.allocate::<u8>(3000).unwrap();
    stream.copy_from_host_async(&mut device, &busy).unwrap();
    drop(busy);
    let busy_class = host_size_class(3000).unwrap();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: trim's cuMemFreeHost would wait for the gate");
    } else if gate.still_held() {
        assert_eq!(pool.stats().cached_bytes, classes);
        assert_eq!(pool.trim(0), classes, "only idle blocks go");
        let stats = pool.stats();
        assert_eq!(
            (stats.reserved_bytes, stats.pending_bytes),
            (busy_class, busy_class)
        );
    }
    gate.open();
    stream.synchronize().unwrap();
    pool.trim(0);
    assert_eq!(pool.stats().reserved_bytes, 0);
}

#[test]
fn trim_keeps_what_it_is_told_to() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
    let blocks: Vec<_> = (0..4).map(|_| pool.allocate::<u8>(4096).unwrap()).collect();
    drop(blocks);
    assert_eq!(pool.trim(2 * 4096), 2 * 4096);
    assert_eq!(pool.stats().cached_bytes, 2 * 4096);
}

#[test]
fn stats_count_hits_misses_and_peaks() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
    let a = pool.allocate::<u32>(LEN).unwrap();
    let b = pool.allocate::<u32>(LEN).unwrap();
    drop(a);
    let c = pool.allocate::<u32>(LEN).unwrap(); // a's block
    let stats = pool.stats();
    let class = host_size_class(LEN * 4).unwrap();
    assert_eq!((stats.hits, stats.misses), (1, 2));
    assert_eq!(stats.in_use_bytes, 2 * class);
    assert_eq!(stats.peak_in_use_bytes, 2 * class);
    assert_eq!(stats.reserved_bytes, 2 * class);
    drop((b, c));
    let stats = pool.stats();
    assert_eq!((stats.in_use_bytes, stats.cached_bytes), (0, 2 * class));
    pool.reset_peaks();
    assert_eq!(pool.stats().peak_in_use_bytes, 0);
    let text = stats.to_string();
    assert!(text.contains("1 hits, 2 misses"), "{text}");
    assert!(text.contains("8.0 KiB reserved"), "{text}");
}

#[test]
fn a_block_is_a_copy_destination_and_host_access_waits_for_it() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::from_slice(&stream, &[9u32; LEN]).unwrap();
    let mut block = pool.allocate::<u32>(LEN).unwrap();
    let gate = Gate::close(&stream);
    stream.copy_to_host_async(&mut block, &device).unwrap();
    gate.open();
    // No synchronize: reading waits for the copy that writes the block.
    assert_eq!(block.as_slice().unwrap(), &[9u32; LEN]);
}

#[test]
fn zero_and_overflowing_requests_are_refused_naming_the_size() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
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
    let err = pool.allocate::<u8>(usize::MAX - 1).unwrap_err();
    assert!(
        matches!(err, Error::HostPoolFull { .. } | Error::Driver(_)),
        "{err}"
    );
    assert_eq!(pool.stats().reserved_bytes, 0);
}

/// A `tracing` writer that keeps what it is given.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn blocks_piling_up_behind_a_stream_are_warned_about_once_naming_it() {
    let _serial = serial();
    let ctx = ctx();
    let class = host_size_class(LEN * 4).unwrap();
    let pool = HostPool::builder(&ctx)
        .warn_pending_bytes(class)
        .build()
        .unwrap();
    let stuck = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stuck, LEN).unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let gate = Gate::close(&stuck);
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..3 {
            let block = pool.allocate::<u32>(LEN).unwrap();
            stuck.copy_from_host_async(&mut device, &block).unwrap();
        }
    });
    let held = gate.still_held();
    gate.open();
    stuck.synchronize().unwrap();
    if held {
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.lines().count(), 1, "once per crossing: {log}");
        assert!(log.contains("WARN"), "{log}");
        assert!(
            log.contains(&format!("stream {} holds 2", stuck.id())),
            "{log}"
        );
    }
}

/// Many threads, each uploading batches from pool blocks on its own stream
/// and dropping each block while its copy may still run. Had a block gone to
/// another thread before the copy read it, that thread's fill would show up
/// in this thread's device buffer.
#[test]
fn threads_sharing_a_pool_never_get_a_block_a_copy_still_reads() {
    let _serial = serial();
    let ctx = ctx();
    let pool = Arc::new(HostPool::new(&ctx).unwrap());
    const THREADS: u32 = 8;
    const STEPS: u32 = 60;
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
    let class = host_size_class(LEN * 4).unwrap();
    // At most one block per thread in use and one waiting per thread.
    assert!(
        stats.reserved_bytes <= 2 * THREADS as usize * class,
        "{stats}"
    );
}

#[test]
fn types_aligned_past_a_block_are_refused_naming_the_type() {
    let _serial = serial();
    let ctx = ctx();
    let pool = HostPool::new(&ctx).unwrap();
    #[derive(Clone, Copy)]
    #[repr(C, align(4096))]
    struct Page([u8; 4096]);
    // SAFETY: bytes only; every bit pattern is valid, no pointers.
    unsafe impl cuda_streams_allocator::driver::DeviceCopy for Page {}
    let err = pool.allocate::<Page>(1).unwrap_err();
    assert!(
        matches!(err, Error::HostAlignment { align: 4096, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Page"), "{err}");
    assert_eq!(pool.stats().reserved_bytes, 0);
}

#[test]
fn blocks_hand_their_context_reference_to_the_next_block_and_the_pool_releases_them_all() {
    let _serial = serial();
    let ctx = ctx();
    let before = Arc::strong_count(&ctx);
    let pool = HostPool::new(&ctx).unwrap();
    let with_pool = Arc::strong_count(&ctx);
    let two = (
        pool.allocate::<u32>(LEN).unwrap(),
        pool.allocate::<u32>(2 * LEN).unwrap(),
    );
    assert_eq!(
        Arc::strong_count(&ctx),
        with_pool + 2,
        "a reference per block out"
    );
    drop(two);
    // A thousand hits, one block out at a time, reuse the two references the
    // dropped blocks handed back instead of taking new ones.
    for round in 0..1000 {
        let block = pool.allocate::<u32>(LEN).unwrap();
        assert_eq!(
            Arc::strong_count(&ctx),
            with_pool + 2,
            "round {round}: a hit took a reference of its own"
        );
        drop(block);
    }
    assert_eq!(pool.stats().hits, 1000);
    drop(pool);
    assert_eq!(
        Arc::strong_count(&ctx),
        before,
        "the pool's drop releases every reference its blocks handed back"
    );
}
