//! Urgent work under a saturating background: SM partitions against
//! priorities, ours against the raw green-context calls, in one run
//! (the shape of `frontier.cu`'s QoS section).
//!
//! The urgent kernel is `spin(0)` in one block of 32 threads, launched and
//! synchronized [`SAMPLES`] times with a pause between; its p50 and p99 are
//! taken on an idle device, behind a background of [`BACKGROUND_LAUNCHES`]
//! `spin` kernels of 1 ms in four blocks of 512 threads per SM (every SM
//! full), with the urgent stream at the same priority, at the greatest
//! priority, and on a partition of 8, 16 and 32 SMs kept for it (the
//! background on the rest). Each partition case runs twice, through
//! [`Partition::stream`] and `Stream::launch` (ours) and through
//! `cuGreenCtxCreate`, `cuGreenCtxStreamCreate` and `cuLaunchKernel` of the
//! image loaded as a library (raw), and prints a `RATIO` of the two p50s.
//!
//! The background sized to its partition (four blocks per SM of the rest)
//! is timed against the same launches sized to the whole device, alone: the
//! `FIGURE ... throughput kept` line is its blocks per second as a share of
//! the whole device's, beside the share of SMs it kept.
//!
//! On the software driver the figures mean nothing for speed: kernels are
//! CPU twins (a spin sleeps once per launch) and every stream has a worker
//! of its own, so nothing contends for SMs. It runs to check the path.

use cuda_streams_benches::{compare, figure};
use driver::{Context, Kernel, LaunchConfig, Module, Partition, Sms, Stream, StreamPriority};
use std::ffi::c_void;
use std::time::{Duration, Instant};
use sys::{CUfunction, CUgreenCtx, CUstream};

/// Urgent launches per case.
const SAMPLES: usize = 60;
/// Background launches per case.
const BACKGROUND_LAUNCHES: usize = 150;
/// Each background kernel's time.
const BACKGROUND_SPIN: Duration = Duration::from_millis(1);
/// The pause between urgent launches (the background keeps running).
const PAUSE: Duration = Duration::from_micros(1500);
/// The urgent partitions' sizes.
const KEEP: [u32; 3] = [8, 16, 32];

const URGENT: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};

/// p50 and p99 of a set of latencies, in µs.
#[derive(Clone, Copy, Debug)]
struct Latency {
    p50: f64,
    p99: f64,
}

fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    Latency {
        p50: at(0.5),
        p99: at(0.99),
    }
}

fn pause() {
    let start = Instant::now();
    while start.elapsed() < PAUSE {
        std::hint::spin_loop();
    }
}

/// The urgent loop through our API.
fn urgent_ours(stream: &Stream, spin: &Kernel) -> Latency {
    let samples = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            stream
                .launch(spin, URGENT, &[0u64.into()])
                .expect("urgent launch");
            stream.synchronize().expect("urgent sync");
            let took = start.elapsed();
            pause();
            took
        })
        .collect();
    latency(samples)
}

/// The urgent loop through raw calls.
fn urgent_raw(ctx: &Context, stream: CUstream, function: CUfunction) -> Latency {
    let driver = ctx.driver();
    ctx.bind().expect("bind");
    let mut ns = 0u64;
    let mut params = [(&raw mut ns).cast::<c_void>()];
    let samples = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            // SAFETY: `spin(u64)` with one u64 parameter; a live stream and function.
            let code = unsafe {
                (driver.cuLaunchKernel)(
                    function,
                    1,
                    1,
                    1,
                    32,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "raw urgent launch");
            // SAFETY: a live stream.
            let code = unsafe { (driver.cuStreamSynchronize)(stream) };
            assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "raw urgent sync");
            let took = start.elapsed();
            pause();
            took
        })
        .collect();
    latency(samples)
}

/// The background: `BACKGROUND_LAUNCHES` spins of `blocks` blocks of 512 threads.
fn background(stream: &Stream, spin: &Kernel, blocks: u32) {
    let config = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: 0,
    };
    let ns = BACKGROUND_SPIN.as_nanos() as u64;
    for _ in 0..BACKGROUND_LAUNCHES {
        stream
            .launch(spin, config, &[ns.into()])
            .expect("background launch");
    }
}

fn print(what: &str, which: &str, l: Latency) {
    figure(
        &format!("QoS {what}, urgent kernel p50 ({which})"),
        l.p50,
        "us",
    );
    figure(
        &format!("QoS {what}, urgent kernel p99 ({which})"),
        l.p99,
        "us",
    );
}

/// A raw green context of `resource`'s SMs, and a stream in it.
struct RawGreen {
    driver: &'static sys::Driver,
    table: &'static sys::GreenContexts,
    green: CUgreenCtx,
    stream: CUstream,
}

impl RawGreen {
    /// Partitions of `keep` SMs and the rest, made by raw calls.
    fn split(ctx: &Context, keep: u32) -> (RawGreen, RawGreen) {
        let table = ctx
            .loaded_driver()
            .green_contexts()
            .expect("green contexts");
        let sm = sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
        let (mut all, mut part, mut rest) = Default::default();
        let mut groups = 1;
        let ok = sys::CUresult::CUDA_SUCCESS;
        // SAFETY: valid locals; one result slot.
        unsafe {
            assert_eq!(
                (table.cuDeviceGetDevResource)(ctx.device(), &mut all, sm),
                ok
            );
            assert_eq!(
                (table.cuDevSmResourceSplitByCount)(
                    &mut part,
                    &mut groups,
                    &all,
                    &mut rest,
                    0,
                    keep
                ),
                ok
            );
        }
        let range = ctx.priority_range();
        let make = |mut resource: sys::CUdevResource, priority: i32| {
            let (mut desc, mut green, mut stream) = (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            let default_stream = sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM.0;
            let non_blocking = sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0;
            // SAFETY: valid locals and handles just made.
            unsafe {
                assert_eq!(
                    (table.cuDevResourceGenerateDesc)(&mut desc, &mut resource, 1),
                    ok
                );
                assert_eq!(
                    (table.cuGreenCtxCreate)(&mut green, desc, ctx.device(), default_stream),
                    ok
                );
                assert_eq!(
                    (table.cuGreenCtxStreamCreate)(&mut stream, green, non_blocking, priority),
                    ok
                );
            }
            RawGreen {
                driver: ctx.driver(),
                table,
                green,
                stream,
            }
        };
        (make(part, range.greatest), make(rest, range.least))
    }

    /// `spin` for launches in this green context: the image as a library on
    /// a GPU; the module's twin on the software driver.
    fn spin(&self, ctx: &Context, spin: &Kernel) -> CUfunction {
        if !ctx.is_gpu() {
            return spin.as_raw();
        }
        let (mut library, mut kernel) = (std::ptr::null_mut(), std::ptr::null_mut());
        let ok = sys::CUresult::CUDA_SUCCESS;
        // SAFETY: a 'static module image; valid locals; a NUL-terminated name.
        unsafe {
            let image = kernels::TIMING.fatbin().as_ptr().cast();
            assert_eq!(
                (self.table.cuLibraryLoadData)(
                    &mut library,
                    image,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0
                ),
                ok
            );
            assert_eq!(
                (self.table.cuLibraryGetKernel)(&mut kernel, library, c"spin".as_ptr()),
                ok
            );
        }
        // The library stays loaded for the process: one per case, a bench.
        kernel as CUfunction
    }
}

impl Drop for RawGreen {
    fn drop(&mut self) {
        // SAFETY: made by `split`, destroyed once, after their work (the
        // cases synchronize it); the stream before its green context.
        unsafe {
            (self.driver.cuStreamDestroy)(self.stream);
            (self.table.cuGreenCtxDestroy)(self.green);
        }
    }
}

fn main() {
    let ctx = Context::new(0).expect("a context");
    if !ctx.is_gpu() {
        println!(
            "note: the software driver: these figures are meaningless for speed (CPU twins, a worker per stream)"
        );
    }
    let spin = Module::load(&ctx, &kernels::TIMING)
        .expect("the timing image loads")
        .function("spin")
        .expect("spin");
    let (total, _) = ctx.partitionable_sms().expect("partitions (CUDA 12.4+)");
    let all_blocks = total * 4;
    let range = ctx.priority_range();

    let high = Stream::new_with_priority(&ctx, StreamPriority::High).unwrap();
    let low = Stream::new_with_priority(&ctx, StreamPriority::Low).unwrap();
    let bg = Stream::new_with_priority(&ctx, StreamPriority::Low).unwrap();
    // Raw streams of the primary context, for the raw priority cases.
    let raw_stream = |priority: i32| {
        ctx.bind().unwrap();
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        // SAFETY: a valid local; the context is current.
        let code = unsafe { (ctx.driver().cuStreamCreateWithPriority)(&mut raw, flags, priority) };
        assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
        // SAFETY: just made, owned by the returned Stream.
        unsafe { Stream::from_raw(&ctx, raw, true) }
    };
    let raw_high = raw_stream(range.greatest);

    // Warm up both paths.
    urgent_ours(&high, &spin);
    let idle = urgent_ours(&high, &spin);
    print("idle", "ours", idle);
    print(
        "idle",
        "raw",
        urgent_raw(&ctx, raw_high.as_raw(), spin.as_raw()),
    );

    background(&bg, &spin, all_blocks);
    let same = urgent_ours(&low, &spin);
    bg.synchronize().unwrap();
    print("busy, same priority", "ours", same);

    background(&bg, &spin, all_blocks);
    let priority = urgent_ours(&high, &spin);
    bg.synchronize().unwrap();
    print("busy, highest priority", "ours", priority);

    let start = Instant::now();
    background(&bg, &spin, all_blocks);
    bg.synchronize().unwrap();
    let whole = start.elapsed();
    figure(
        &format!("QoS background of {BACKGROUND_LAUNCHES} spins on all {total} SMs alone"),
        whole.as_secs_f64() * 1e3,
        "ms",
    );

    for keep in KEEP {
        // Ours.
        let split = ctx.partition(&[Sms(keep)]).expect("a partition");
        let urgent_part: &Partition = &split.partitions[0];
        let rest = split
            .remainder
            .as_ref()
            .expect("SMs left for the background");
        let (urgent, background_stream) = (
            urgent_part.stream(StreamPriority::High).unwrap(),
            rest.stream(StreamPriority::Low).unwrap(),
        );
        // Loaded before timing: on a GPU loading waits for the device, so a
        // first launch that loads would time the background.
        urgent_part
            .load(&spin)
            .expect("spin loads into the partition");
        rest.load(&spin).expect("spin loads into the remainder");
        let what = format!("busy, partition of {} SMs", urgent_part.sms());
        let rest_blocks = rest.sms() * 4;
        let start = Instant::now();
        background(&background_stream, &spin, rest_blocks);
        let ours = urgent_ours(&urgent, &spin);
        background_stream.synchronize().unwrap();
        let sized = start.elapsed();
        print(&what, "ours", ours);

        // Raw, the same shape.
        let (raw_urgent, raw_rest) = RawGreen::split(&ctx, keep);
        let raw_spin = raw_urgent.spin(&ctx, &spin);
        let raw_bg_spin = raw_rest.spin(&ctx, &spin);
        // The raw kernel's first launch there loads it: done on an idle device.
        let _warm = urgent_raw(&ctx, raw_urgent.stream, raw_spin);
        // SAFETY: the raw stream lives until `raw_rest` drops, after this Stream.
        let raw_bg = unsafe { Stream::from_raw(&ctx, raw_rest.stream, false) };
        let ns = BACKGROUND_SPIN.as_nanos() as u64;
        let mut params = [(&raw const ns).cast_mut().cast::<c_void>()];
        ctx.bind().unwrap();
        for _ in 0..BACKGROUND_LAUNCHES {
            // SAFETY: `spin(u64)`; a live stream and function.
            let code = unsafe {
                (ctx.driver().cuLaunchKernel)(
                    raw_bg_spin,
                    rest_blocks,
                    1,
                    1,
                    512,
                    1,
                    1,
                    0,
                    raw_rest.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "raw background launch");
        }
        let raw = urgent_raw(&ctx, raw_urgent.stream, raw_spin);
        raw_bg.synchronize().unwrap();
        print(&what, "raw", raw);
        let name: &'static str = Box::leak(
            format!("QoS urgent p50 on a partition of {keep} SMs: ours vs raw green contexts")
                .into_boxed_str(),
        );
        compare(name, ours.p50 * 1e3, raw.p50 * 1e3);

        figure(
            &format!("QoS {what}: urgent p50 / idle p50"),
            ours.p50 / idle.p50,
            "x",
        );
        figure(
            &format!("QoS {what}: priority-only p50 / partition p50"),
            priority.p50 / ours.p50,
            "x",
        );
        let kept_share = f64::from(rest.sms()) / f64::from(total);
        let throughput = (f64::from(rest_blocks) / sized.as_secs_f64())
            / (f64::from(all_blocks) / whole.as_secs_f64());
        figure(
            &format!(
                "QoS background of {BACKGROUND_LAUNCHES} spins sized to its {} SMs, beside the urgent loop",
                rest.sms()
            ),
            sized.as_secs_f64() * 1e3,
            "ms",
        );
        figure(
            &format!(
                "QoS background on {} of {total} SMs ({:.1}% of the SMs): throughput kept",
                rest.sms(),
                kept_share * 100.0
            ),
            throughput * 100.0,
            "%",
        );
    }
}
