//! The multi-process loader: GB/s of batches delivered (filled by worker
//! processes, uploaded from the shared pinned region, normalised on the
//! GPU), against the raw pinned H2D line rate (`cuMemcpyHtoDAsync` from
//! `cuMemHostAlloc` memory, batch-sized copies back to back) in the same
//! run. The `RATIO` is raw time over ours: 0.90x is 90% of the line rate.
//!
//! `benches/anchors/dataloader_anchor.py` prints the same `FIGURE` lines for
//! PyTorch's `DataLoader(num_workers=N, pin_memory=True)` doing the same
//! work (same batch size, fill and normalisation), to run in the same GPU
//! call. `LOADER_WORKERS` sets N (default 8 on a GPU, 2 on the software
//! driver), `LOADER_BATCH_MIB` the batch size (default 64 MiB on a GPU).
//!
//! A second case times the loader with workers that write only the one
//! value a batch is checked by (`touch`): the hand-off, the upload and the
//! normalisation alone, what the loader costs when the workers' fill costs
//! nothing. Where the full case falls short of the line rate and this one
//! does not, the workers' fill is what bounds it.
//!
//! A third case fills the same values with non-temporal stores
//! (`streaming`), which skip the read for ownership of each cache line: where
//! it beats the plain fill, the host's memory traffic bounds the fill.
//!
//! Before the loader, it prints one core's fill rate in this process
//! (plain and streaming, into private and into page-locked memory), for
//! scale: the rate each worker could fill at if nothing else ran.
//!
//! This binary is also its own worker: `main` serves the fills first.

use cuda_streams_benches::{compare, figure, median_duration};
use driver::{Context, DeviceBuffer, Stream};
use kernels::typed::Elementwise;
use pipeline::{Fill, ProcessLoader, serve_if_worker};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::CUresult;

/// The normalisation, `(x - MEAN) / STD` (the anchor's too).
const MEAN: f32 = 512.0;
const STD: f32 = 256.0;
/// Timed windows; the median is reported.
const WINDOWS: usize = 3;

/// Batch `batch`: `i % 1024 + 7 * batch`, the anchor's values, made as the
/// anchor makes them: the `i % 1024` pattern once, then one pass adding the
/// batch's offset. (Converting each index to `f32` in the pass instead ran
/// at a third of the speed on a development machine, 6 against 17–20 GB/s:
/// more work than the anchor's workers do.)
fn fill(batch: u64, out: &mut [f32]) {
    let pattern: [f32; 1024] = std::array::from_fn(|j| j as f32);
    let base = (batch * 7) as f32;
    for chunk in out.chunks_mut(1024) {
        for (value, step) in chunk.iter_mut().zip(&pattern) {
            *value = step + base;
        }
    }
}

/// `fill`'s values, written with non-temporal (streaming) stores, which
/// skip the read for ownership a plain store makes of each cache line: a
/// diagnosis, not the anchor's work. If the loader gains from it, the plain
/// fill was bound by the host's memory traffic (each byte read, written and
/// read again by the copy engine), not by the loader.
fn fill_streaming(batch: u64, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_add_ps, _mm_loadu_ps, _mm_set1_ps, _mm_sfence, _mm_stream_ps};
        const WIDTH: usize = 4; // f32s per 16-byte store
        if !out.as_ptr().addr().is_multiple_of(16) || !out.len().is_multiple_of(1024) {
            return fill(batch, out);
        }
        let pattern: [f32; 1024] = std::array::from_fn(|j| j as f32);
        // SAFETY: SSE is part of every x86_64; no memory is touched.
        let base = unsafe { _mm_set1_ps((batch * 7) as f32) };
        for chunk in out.chunks_exact_mut(1024) {
            for j in (0..1024).step_by(WIDTH) {
                // SAFETY: `j + WIDTH <= 1024`, inside `pattern` and `chunk`;
                // `chunk` starts 16-byte aligned (checked above, and 1024
                // f32s keep it so) and `j` is a multiple of 4, as the
                // streaming store needs; SSE is part of every x86_64.
                unsafe {
                    let value = _mm_add_ps(_mm_loadu_ps(pattern.as_ptr().add(j)), base);
                    _mm_stream_ps(chunk.as_mut_ptr().add(j), value);
                }
            }
        }
        // Streaming stores are weakly ordered: make them visible before the
        // worker's reply tells the GPU process the batch is ready.
        // SAFETY: SSE is part of every x86_64; a fence touches no memory.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    fill(batch, out);
}

/// Batch `batch` as far as the check reads it (element 5), nothing else:
/// the loader's own cost, with the workers' fill taken out.
fn touch(batch: u64, out: &mut [f32]) {
    out[5] = 5.0 + (batch * 7) as f32;
}

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a count")),
        Err(_) => default,
    }
}

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "{:?}", sys::error_name(code));
}

/// Batch-sized copies from raw `cuMemHostAlloc` memory, back to back:
/// the line rate, seconds per batch (median of `WINDOWS` windows).
fn raw_pinned_seconds(ctx: &Arc<Context>, bytes: usize, per_window: usize) -> f64 {
    ctx.bind().unwrap();
    let stream = Stream::new(ctx).expect("a stream");
    let device = DeviceBuffer::<u8>::new_async(&stream, bytes).expect("device memory");
    let mut host = std::ptr::null_mut::<c_void>();
    // SAFETY: a valid out-pointer; flags 0; the context is bound above.
    ok(unsafe { (ctx.driver().cuMemHostAlloc)(&mut host, bytes, 0) });
    // SAFETY: `bytes` bytes just allocated.
    unsafe { std::ptr::write_bytes(host.cast::<u8>(), 1, bytes) };
    let mut windows: Vec<f64> = (0..=WINDOWS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_window {
                // SAFETY: both regions hold `bytes` bytes and outlive the
                // copies (synchronised below); nothing writes the source.
                ok(unsafe {
                    (ctx.driver().cuMemcpyHtoDAsync)(
                        device.as_device_ptr(),
                        host,
                        bytes,
                        stream.as_raw(),
                    )
                });
            }
            stream.synchronize().unwrap();
            start.elapsed().as_secs_f64() / per_window as f64
        })
        .skip(1) // the first window warms up
        .collect();
    // SAFETY: from cuMemHostAlloc, freed once; every copy was synchronised.
    ok(unsafe { (ctx.driver().cuMemFreeHost)(host) });
    windows.sort_by(f64::total_cmp);
    windows[windows.len() / 2]
}

/// One core's fill of a batch in this process, for scale beside the
/// loader: GB/s of `fill` (and of `fill_streaming`) writing a batch of
/// private memory and a batch of page-locked memory (`cuMemHostAlloc`),
/// median of 5 after one warm-up, each with the minor page faults the
/// timed fills took. Tells a slow core from slow memory when the workers'
/// fill bounds the loader.
fn fill_rates(ctx: &Arc<Context>, len: usize) {
    let bytes = len * std::mem::size_of::<f32>();
    let mut private = vec![0f32; len];
    let pool = allocator::HostPool::new(ctx).expect("a host pool");
    let mut pinned = pool.allocate::<f32>(len).expect("a pinned block");
    let pinned = pinned.as_mut_slice().expect("host access");
    let fills: [(&str, Fill); 2] = [("plain", fill), ("streaming", fill_streaming)];
    for (memory, out) in [("private", &mut private[..]), ("pinned", pinned)] {
        for (kind, run) in fills {
            run(0, out);
            let faults = minor_faults();
            let time = median_duration(5, || run(1, out));
            let faults = minor_faults() - faults;
            assert_eq!(out[5], 12.0, "the {kind} fill wrote batch 1");
            figure(
                &format!(
                    "one core's {kind} fill of {memory} memory ({faults} minor faults in 5 fills)"
                ),
                bytes as f64 / time.as_secs_f64() / 1e9,
                "GB/s",
            );
        }
    }
}

/// Minor page faults this thread has taken.
fn minor_faults() -> i64 {
    // SAFETY: `usage` is a plain C struct, valid zeroed, written by the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer for the calling thread's usage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    usage.ru_minflt
}

/// The loader's seconds per batch delivered (median of `WINDOWS` windows of
/// `per_window` batches, after one window of warm-up), checking one value
/// of every batch.
/// Seconds per batch (median of `WINDOWS` windows) of a loader whose
/// workers run the fill named `fill`.
fn loader_seconds(
    ctx: &Arc<Context>,
    fill: &str,
    workers: usize,
    len: usize,
    per_window: usize,
) -> f64 {
    let kernels = Elementwise::load(ctx).expect("the elementwise kernels");
    let setup = Stream::new(ctx).expect("a stream");
    let mut ones = DeviceBuffer::<f32>::new_async(&setup, len).expect("device memory");
    kernels.fill_f32(&setup, 1.0, &mut ones).unwrap();
    setup.synchronize().unwrap();
    let windows_total = (WINDOWS + 1) * per_window;
    let mut loader = ProcessLoader::builder(fill, len)
        .workers(workers)
        .batches(windows_total as u64)
        .gpu_step(move |stream, raw, out| {
            kernels.scale_add(stream, 1.0 / STD, raw, -MEAN / STD, &ones, out)
        })
        .build(ctx)
        .expect("a process loader");
    let stream = loader.stream().clone();
    let mut windows = Vec::with_capacity(WINDOWS);
    let mut checked = Vec::new();
    for window in 0..=WINDOWS {
        let start = Instant::now();
        for _ in 0..per_window {
            let batch = loader.next_batch().expect("a batch").expect("not the end");
            if batch.index().is_multiple_of(per_window as u64) {
                checked.push(batch); // looked at after the timing
            }
        }
        stream.synchronize().unwrap();
        if window > 0 {
            windows.push(start.elapsed().as_secs_f64() / per_window as f64);
        }
    }
    for batch in checked {
        let values = batch.data().to_vec(&stream).unwrap();
        let expected = ((batch.index() * 7) as f32 + 5.0 - MEAN) / STD;
        assert_eq!(values[5], expected, "batch {}", batch.index());
    }
    windows.sort_by(f64::total_cmp);
    windows[windows.len() / 2]
}

fn main() {
    serve_if_worker(&[
        ("bench", fill),
        ("streaming", fill_streaming),
        ("touch", touch),
    ]);
    let ctx = Context::new(0).expect("a context");
    let gpu = ctx.is_gpu();
    let workers = env_usize("LOADER_WORKERS", if gpu { 8 } else { 2 });
    let mib = env_usize("LOADER_BATCH_MIB", if gpu { 64 } else { 1 });
    let bytes = mib << 20;
    let len = bytes / 4;
    let per_window = if gpu { 32 } else { 8 };

    fill_rates(&ctx, len);
    let raw = raw_pinned_seconds(&ctx, bytes, per_window);
    let ours = loader_seconds(&ctx, "bench", workers, len, per_window);
    let touch_only = loader_seconds(&ctx, "touch", workers, len, per_window);
    let streaming = loader_seconds(&ctx, "streaming", workers, len, per_window);
    let secs_to_ns = |s: f64| Duration::from_secs_f64(s).as_nanos() as f64;
    compare(
        "process loader batch (fill, upload, normalise) vs raw pinned H2D of the batch",
        secs_to_ns(ours),
        secs_to_ns(raw),
    );
    figure(
        &format!("process loader N={workers}, {mib} MiB f32 batches, normalised on the GPU"),
        bytes as f64 / ours / 1e9,
        "GB/s",
    );
    compare(
        "process loader batch, workers filling with streaming stores vs raw pinned H2D",
        secs_to_ns(streaming),
        secs_to_ns(raw),
    );
    figure(
        &format!("process loader N={workers}, workers filling with streaming stores"),
        bytes as f64 / streaming / 1e9,
        "GB/s",
    );
    compare(
        "process loader batch, workers writing one value (upload, normalise) vs raw pinned H2D",
        secs_to_ns(touch_only),
        secs_to_ns(raw),
    );
    figure(
        &format!("process loader N={workers}, workers writing one value a batch"),
        bytes as f64 / touch_only / 1e9,
        "GB/s",
    );
    figure(
        &format!("H2D raw pinned, {mib} MiB copies"),
        bytes as f64 / raw / 1e9,
        "GB/s",
    );
}
