//! Host memory: a pinned host pool hit (allocate + free) against a fresh
//! `cuMemHostAlloc` + `cuMemFreeHost`, and an H2D upload from a pool block,
//! from registered memory (`HostRegistered`) and from ordinary pageable
//! memory, each against raw `cuMemHostAlloc` memory copied with raw
//! `cuMemcpyHtoDAsync`, all in the same run. The upload `RATIO`s are raw
//! pinned time over ours: 1.00x is line rate, 0.95x is 95% of it.

use allocator::HostPool;
use cuda_streams_benches::{compare, figure, median_duration, median_ns};
use driver::{Context, DeviceBuffer, DeviceMemory, HostRegistered, Stream};
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use sys::CUresult;

/// Bytes a pool hit asks for.
const HIT_BYTES: usize = 1 << 20;
/// Copies per timed upload run (one stream, back to back).
const COPIES: usize = 4;
const RUNS: usize = 9;

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "{:?}", sys::error_name(code));
}

/// Raw page-locked memory, freed on drop.
struct RawPinned {
    ctx: Arc<Context>,
    ptr: *mut c_void,
}

impl RawPinned {
    fn new(ctx: &Arc<Context>, bytes: usize) -> Self {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags 0; the context is bound by the caller.
        ok(unsafe { (ctx.driver().cuMemHostAlloc)(&mut ptr, bytes, 0) });
        // SAFETY: `bytes` bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 1, bytes) };
        Self {
            ctx: Arc::clone(ctx),
            ptr,
        }
    }
}

impl Drop for RawPinned {
    fn drop(&mut self) {
        // SAFETY: from cuMemHostAlloc, freed once; every copy was synchronised.
        ok(unsafe { (self.ctx.driver().cuMemFreeHost)(self.ptr) });
    }
}

fn pool_hit() {
    let ctx = Context::new(0).expect("a context");
    ctx.bind().unwrap();
    let pool = HostPool::new(&ctx).expect("a host pool");
    let ours = median_ns(101, 1000, || {
        drop(black_box(pool.allocate::<u8>(HIT_BYTES).expect("a block")));
    });
    let raw = median_ns(11, 10, || drop(black_box(RawPinned::new(&ctx, HIT_BYTES))));
    compare(
        "host pool hit (1 MiB) vs cuMemHostAlloc+cuMemFreeHost",
        ours,
        raw,
    );
    figure("host pool hit (allocate+free) median", ours, "ns");
    // For scale on this CPU: what any hit must do at the least, two
    // uncontended lock round trips on a free list (take, then give back)
    // and the two reference counts a block holds (its context and its
    // owner). Not a baseline to beat: the floor a lock-based pool stands on.
    let free_list = std::sync::Mutex::new(vec![0u64; 4]);
    let counted = Arc::new(0u8);
    let floor = median_ns(101, 1000, || {
        let address = free_list.lock().unwrap().pop();
        let refs = (Arc::clone(&counted), Arc::clone(&counted));
        black_box(&refs);
        drop(refs);
        free_list
            .lock()
            .unwrap()
            .push(black_box(address.unwrap_or(0)));
    });
    figure(
        "host pool hit floor (two lock round trips, two Arc clones) median",
        floor,
        "ns",
    );
    let stats = pool.stats();
    assert_eq!(
        stats.misses, 1,
        "every allocation after the first is a hit: {stats}"
    );
}

fn gbps(bytes: usize, time: Duration) -> f64 {
    (bytes * COPIES) as f64 / time.as_secs_f64() / 1e9
}

fn uploads() {
    let ctx = Context::new(0).expect("a context");
    ctx.bind().unwrap();
    let stream = Stream::new(&ctx).expect("a stream");
    // 256 MiB on a GPU; less on the software driver, whose copies are memcpy.
    let bytes: usize = if ctx.is_gpu() { 256 << 20 } else { 16 << 20 };
    let mut device = DeviceBuffer::<u8>::new_async(&stream, bytes).expect("device memory");

    let raw = RawPinned::new(&ctx, bytes);
    let dst = device.device_ptr();
    let raw_time = median_duration(RUNS, || {
        for _ in 0..COPIES {
            // SAFETY: both regions hold `bytes` bytes and outlive the copy
            // (synchronised below); nothing writes the source meanwhile.
            ok(unsafe { (ctx.driver().cuMemcpyHtoDAsync)(dst, raw.ptr, bytes, stream.as_raw()) });
        }
        stream.synchronize().unwrap();
    });

    let pool = HostPool::new(&ctx).expect("a host pool");
    let mut block = pool.allocate::<u8>(bytes).expect("a block");
    block.as_mut_slice().unwrap().fill(1);
    let pool_time = median_duration(RUNS, || {
        for _ in 0..COPIES {
            stream.copy_from_host_async(&mut device, &block).unwrap();
        }
        stream.synchronize().unwrap();
    });
    drop(block);

    let mut data = vec![1u8; bytes];
    let registering = median_duration(RUNS, || {
        HostRegistered::scope(&ctx, &mut data, |r| black_box(r.len())).unwrap();
    });
    let registered_time = HostRegistered::scope(&ctx, &mut data, |registered| {
        median_duration(RUNS, || {
            for _ in 0..COPIES {
                stream
                    .copy_from_host_async(&mut device, &*registered)
                    .unwrap();
            }
            stream.synchronize().unwrap();
        })
    })
    .expect("registration");

    let pageable_time = median_duration(RUNS, || {
        for _ in 0..COPIES {
            stream.copy_from_host(&mut device, &data).unwrap();
        }
        stream.synchronize().unwrap();
    });

    let ns = |t: Duration| t.as_nanos() as f64;
    compare(
        "H2D upload from a host pool block vs raw pinned",
        ns(pool_time),
        ns(raw_time),
    );
    compare(
        "H2D upload from registered memory vs raw pinned",
        ns(registered_time),
        ns(raw_time),
    );
    compare(
        "H2D upload from pageable memory vs raw pinned",
        ns(pageable_time),
        ns(raw_time),
    );
    let mib = bytes >> 20;
    figure(
        &format!("H2D raw pinned, {mib} MiB copies"),
        gbps(bytes, raw_time),
        "GB/s",
    );
    figure(
        &format!("H2D host pool block, {mib} MiB copies"),
        gbps(bytes, pool_time),
        "GB/s",
    );
    figure(
        &format!("H2D registered, {mib} MiB copies"),
        gbps(bytes, registered_time),
        "GB/s",
    );
    figure(
        &format!("H2D pageable, {mib} MiB copies"),
        gbps(bytes, pageable_time),
        "GB/s",
    );
    figure(
        &format!("cuMemHostRegister+Unregister of {mib} MiB"),
        registering.as_secs_f64() * 1e6,
        "us",
    );
    drop(raw);
}

fn main() {
    pool_hit();
    uploads();
}
