//! The stream-ordered allocator: allocate + free that hits the cache on one
//! stream (both backends) against `cuMemAllocAsync` + `cuMemFreeAsync` and
//! `cuMemAlloc` + `cuMemFree`, measured in the same run; and a random trace
//! (sizes 1 KiB to 64 MiB log-uniform, random lifetimes, 4 streams) reporting
//! peak reserved over peak live for both backends and the raw driver pool.

use allocator::{Backend, StreamOrderedAllocator};
use criterion::Criterion;
use cuda_streams_benches::{compare, criterion_summary, figure, median_ns, run_criterion};
use driver::{Context, Stream};
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;
use sys::{CUdeviceptr, CUmemPool_attribute, CUmemoryPool, CUresult};

const SIZE: usize = 1 << 20;

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "{:?}", sys::error_name(code));
}

fn raw_async(ctx: &Context, stream: &Stream) {
    let table = ctx.driver();
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: valid out-pointer and live stream; the context is bound by the
    // caller; the memory is freed in order on the same stream and never used.
    unsafe {
        ok((table.cuMemAllocAsync)(&mut ptr, SIZE, stream.as_raw()));
        ok((table.cuMemFreeAsync)(black_box(ptr), stream.as_raw()));
    }
}

fn raw_sync(ctx: &Context) {
    let table = ctx.driver();
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the context is bound; the memory is never used.
    unsafe {
        ok((table.cuMemAlloc)(&mut ptr, SIZE));
        ok((table.cuMemFree)(black_box(ptr)));
    }
}

fn ours(allocator: &StreamOrderedAllocator, stream: &Arc<Stream>) {
    drop(black_box(
        allocator
            .allocate_for_stream(stream, SIZE)
            .expect("allocation"),
    ));
}

struct Setup {
    ctx: Arc<Context>,
    stream: Arc<Stream>,
    caching: StreamOrderedAllocator,
    pool: Option<StreamOrderedAllocator>,
}

fn setup() -> Setup {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    let caching = StreamOrderedAllocator::new(&ctx).expect("caching allocator");
    let pool = ctx
        .info()
        .memory_pools_supported
        .then(|| StreamOrderedAllocator::with_backend(&ctx, Backend::driver_pool()).expect("pool"));
    Setup {
        ctx,
        stream,
        caching,
        pool,
    }
}

fn bench_hits(c: &mut Criterion) {
    let s = setup();
    s.ctx.bind().unwrap();
    let mut group = c.benchmark_group("allocator allocate+free 1 MiB, same stream");
    group.bench_function("caching (hit)", |b| b.iter(|| ours(&s.caching, &s.stream)));
    if let Some(pool) = &s.pool {
        group.bench_function("driver pool backend", |b| b.iter(|| ours(pool, &s.stream)));
        group.bench_function("raw cuMemAllocAsync+cuMemFreeAsync", |b| {
            b.iter(|| raw_async(&s.ctx, &s.stream))
        });
    }
    group.bench_function("raw cuMemAlloc+cuMemFree", |b| b.iter(|| raw_sync(&s.ctx)));
    group.finish();
    s.stream.synchronize().unwrap();
}

fn comparisons() {
    let s = setup();
    s.ctx.bind().unwrap();
    let caching = median_ns(101, 1000, || ours(&s.caching, &s.stream));
    let sync = median_ns(21, 20, || raw_sync(&s.ctx));
    compare(
        "allocator caching hit vs cuMemAlloc+cuMemFree",
        caching,
        sync,
    );
    if let Some(pool) = &s.pool {
        let raw = median_ns(51, 200, || raw_async(&s.ctx, &s.stream));
        s.stream.synchronize().unwrap();
        let ours_pool = median_ns(51, 200, || ours(pool, &s.stream));
        s.stream.synchronize().unwrap();
        compare(
            "allocator caching hit vs cuMemAllocAsync+cuMemFreeAsync",
            caching,
            raw,
        );
        compare(
            "allocator driver-pool backend vs cuMemAllocAsync+cuMemFreeAsync",
            ours_pool,
            raw,
        );
    }
    figure("allocator caching hit median", caching, "ns");
}

/// The trace: `STEPS` allocations, each on one of 4 streams, freed on the same
/// stream after a random number of steps.
const STEPS: usize = 3000;
const STREAMS: usize = 4;
const MEAN_LIFETIME: u64 = 60;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One step of the trace: `(size, stream index, lifetime in steps)`.
fn trace() -> Vec<(usize, usize, usize)> {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    (0..STEPS)
        .map(|_| {
            let size = (1024.0 * 65536f64.powf(rng.unit())) as usize;
            let stream = (rng.next() % STREAMS as u64) as usize;
            let life = 1 + (rng.next() % (2 * MEAN_LIFETIME)) as usize;
            (size, stream, life)
        })
        .collect()
}

/// Replay the trace with `alloc(size, stream) -> handle` and `free(handle)`;
/// returns the peak of live requested bytes.
fn replay<H>(mut alloc: impl FnMut(usize, usize) -> H, mut free: impl FnMut(H)) -> usize {
    let mut live: Vec<(usize, usize, H)> = Vec::new(); // (expiry, size, handle)
    let (mut now_live, mut peak) = (0usize, 0usize);
    for (step, (size, stream, life)) in trace().into_iter().enumerate() {
        let mut i = 0;
        while i < live.len() {
            if live[i].0 <= step {
                let (_, bytes, handle) = live.swap_remove(i);
                now_live -= bytes;
                free(handle);
            } else {
                i += 1;
            }
        }
        live.push((step + life, size, alloc(size, stream)));
        now_live += size;
        peak = peak.max(now_live);
    }
    for (_, _, handle) in live {
        free(handle);
    }
    peak
}

fn default_pool(ctx: &Context) -> CUmemoryPool {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    ctx.bind().unwrap();
    // SAFETY: valid out-pointer; the device is the context's.
    ok(unsafe { (ctx.driver().cuDeviceGetDefaultMemPool)(&mut pool, ctx.device()) });
    pool
}

fn pool_attr(ctx: &Context, pool: CUmemoryPool, attr: CUmemPool_attribute) -> u64 {
    let mut value = 0u64;
    // SAFETY: the byte attributes are cuuint64_t, written through a valid pointer.
    ok(unsafe {
        (ctx.driver().cuMemPoolGetAttribute)(pool, attr, (&mut value as *mut u64).cast::<c_void>())
    });
    value
}

/// Empty the default pool and reset its high watermark.
fn reset_pool(ctx: &Context, streams: &[Arc<Stream>], pool: CUmemoryPool) {
    for s in streams {
        s.synchronize().unwrap();
    }
    let table = ctx.driver();
    let mut zero = 0u64;
    // SAFETY: the default pool; a cuuint64_t through a valid pointer.
    unsafe {
        ok((table.cuMemPoolTrimTo)(pool, 0));
        ok((table.cuMemPoolSetAttribute)(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            (&mut zero as *mut u64).cast::<c_void>(),
        ));
    }
}

fn traces() {
    let ctx = Context::new(0).expect("a context");
    let streams: Vec<_> = (0..STREAMS).map(|_| Stream::new(&ctx).unwrap()).collect();
    let report = |name: &str, reserved: usize, live: usize| {
        figure(
            &format!("allocator trace peak reserved / peak live ({name})"),
            reserved as f64 / live as f64,
            "x",
        );
        figure(
            &format!("allocator trace peak reserved ({name})"),
            reserved as f64 / (1 << 20) as f64,
            "MiB",
        );
    };

    let caching = StreamOrderedAllocator::new(&ctx).unwrap();
    let live = replay(
        |size, s| caching.allocate_for_stream(&streams[s], size).unwrap(),
        drop,
    );
    figure(
        "allocator trace peak live",
        live as f64 / (1 << 20) as f64,
        "MiB",
    );
    let stats = caching.stats();
    report("caching", stats.peak_reserved_bytes, live);
    figure(
        "allocator trace driver calls per allocation (caching)",
        (stats.driver_alloc_calls + stats.driver_free_calls) as f64 / STEPS as f64,
        "calls",
    );
    for s in &streams {
        s.synchronize().unwrap();
    }
    caching.trim(0).unwrap();
    drop(caching);

    if !ctx.info().memory_pools_supported {
        return;
    }
    let pool = default_pool(&ctx);
    let backend = StreamOrderedAllocator::with_backend(&ctx, Backend::driver_pool()).unwrap();
    reset_pool(&ctx, &streams, pool);
    backend.reset_peaks();
    replay(
        |size, s| backend.allocate_for_stream(&streams[s], size).unwrap(),
        drop,
    );
    report(
        "driver-pool backend",
        backend.stats().peak_reserved_bytes,
        live,
    );
    drop(backend);

    reset_pool(&ctx, &streams, pool);
    let table = ctx.driver();
    replay(
        |size, s| {
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: valid out-pointer and live stream; freed once below.
            ok(unsafe { (table.cuMemAllocAsync)(&mut ptr, size, streams[s].as_raw()) });
            (ptr, s)
        },
        |(ptr, s)| {
            // SAFETY: allocated above, freed once, in order on its stream.
            ok(unsafe { (table.cuMemFreeAsync)(ptr, streams[s].as_raw()) });
        },
    );
    let reserved = pool_attr(
        &ctx,
        pool,
        CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
    );
    report("raw driver pool", reserved as usize, live);
    reset_pool(&ctx, &streams, pool);
}

fn main() {
    run_criterion(&[bench_hits]);
    comparisons();
    traces();
    criterion_summary();
}
