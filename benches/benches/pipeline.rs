//! The async pipeline against sequential execution on one stream, a
//! hand-written three-stream loop on raw driver calls, and the ideal bound,
//! on three workloads (balanced, compute-bound, transfer-bound).
//!
//! Each iteration uploads a buffer, runs `kernels::COMPUTE` over it (its
//! iteration count sets the intensity, calibrated from measured stage times)
//! and downloads the result. Buffers are 64 MiB on the GPU, much smaller on
//! the software driver (where the figures only show the bench runs).

use criterion::Criterion;
use cuda_streams_benches::{
    compare, criterion_summary, figure, kernel, median_duration, run_criterion,
};
use driver::{Context, DeviceBuffer, Event, Kernel, LaunchConfig, PinnedBuffer, Stream};
use pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::{CUevent, CUevent_flags};

struct Setup {
    ctx: Arc<Context>,
    kernel: Kernel,
    elements: usize,
    iterations: usize,
    runs: usize,
}

fn launch_config(ctx: &Context, elements: usize) -> LaunchConfig {
    let blocks = (elements as u32)
        .div_ceil(256)
        .min(4 * ctx.info().multiprocessor_count.max(1));
    LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Host buffers and device buffers for `slots` batches.
struct Buffers {
    host_in: Vec<PinnedBuffer<f32>>,
    host_out: Vec<PinnedBuffer<f32>>,
    dev_in: Vec<DeviceBuffer<f32>>,
    dev_out: Vec<DeviceBuffer<f32>>,
}

fn buffers(s: &Setup, slots: usize) -> Buffers {
    let data: Vec<f32> = (0..s.elements).map(|i| (i % 1000) as f32 * 0.001).collect();
    Buffers {
        host_in: (0..slots)
            .map(|_| PinnedBuffer::from_slice(&s.ctx, &data).unwrap())
            .collect(),
        host_out: (0..slots)
            .map(|_| PinnedBuffer::new(&s.ctx, s.elements).unwrap())
            .collect(),
        dev_in: (0..slots)
            .map(|_| DeviceBuffer::new(&s.ctx, s.elements).unwrap())
            .collect(),
        dev_out: (0..slots)
            .map(|_| DeviceBuffer::new(&s.ctx, s.elements).unwrap())
            .collect(),
    }
}

/// GPU time of `f`'s work on `stream`, median of three.
fn gpu_time(stream: &Arc<Stream>, mut f: impl FnMut(&Stream)) -> Duration {
    let (start, end) = (
        Event::timing(stream.context()).unwrap(),
        Event::timing(stream.context()).unwrap(),
    );
    let mut times: Vec<Duration> = (0..3)
        .map(|_| {
            start.record(stream).unwrap();
            f(stream);
            end.record(stream).unwrap();
            end.synchronize().unwrap();
            Event::elapsed(&start, &end).unwrap()
        })
        .collect();
    times.sort();
    times[1]
}

struct StageTimes {
    upload: Duration,
    compute: Duration,
    download: Duration,
    /// One upload and one download at once, on two streams.
    copies_together: Duration,
}

fn stage_times(s: &Setup, b: &mut Buffers, intensity: u32) -> StageTimes {
    let stream = Stream::new(&s.ctx).unwrap();
    let other = Stream::new(&s.ctx).unwrap();
    let cfg = launch_config(&s.ctx, s.elements);
    let n = s.elements as u64;
    let upload = gpu_time(&stream, |st| {
        st.copy_from_host_async(&mut b.dev_in[0], &b.host_in[0])
            .unwrap()
    });
    let (dev_in, dev_out) = (&b.dev_in[0], &mut b.dev_out[0]);
    let compute = gpu_time(&stream, |st| {
        st.launch(
            &s.kernel,
            cfg,
            &[
                n.into(),
                intensity.into(),
                dev_in.into(),
                (&mut *dev_out).into(),
            ],
        )
        .unwrap()
    });
    let download = gpu_time(&stream, |st| {
        st.copy_to_host_async(&mut b.host_out[0], &b.dev_out[0])
            .unwrap()
    });
    let copies_together = median_duration(3, || {
        stream
            .copy_from_host_async(&mut b.dev_in[1], &b.host_in[1])
            .unwrap();
        other
            .copy_to_host_async(&mut b.host_out[1], &b.dev_out[1])
            .unwrap();
        stream.synchronize().unwrap();
        other.synchronize().unwrap();
    });
    StageTimes {
        upload,
        compute,
        download,
        copies_together,
    }
}

fn sequential(s: &Setup, b: &mut Buffers, intensity: u32) -> Duration {
    let stream = Stream::new(&s.ctx).unwrap();
    let cfg = launch_config(&s.ctx, s.elements);
    let n = s.elements as u64;
    median_duration(s.runs, || {
        for _ in 0..s.iterations {
            stream
                .copy_from_host_async(&mut b.dev_in[0], &b.host_in[0])
                .unwrap();
            let args = [
                n.into(),
                intensity.into(),
                (&b.dev_in[0]).into(),
                (&mut b.dev_out[0]).into(),
            ];
            stream.launch(&s.kernel, cfg, &args).unwrap();
            stream
                .copy_to_host_async(&mut b.host_out[0], &b.dev_out[0])
                .unwrap();
        }
        stream.synchronize().unwrap();
    })
}

fn ours(s: &Setup, intensity: u32) -> Duration {
    let coordinator = AsyncCoordinator::new(&s.ctx).unwrap();
    let mut pipeline = PipelineStageManager::new(coordinator, s.elements).unwrap();
    let cfg = launch_config(&s.ctx, s.elements);
    let stage = pipeline.add_stage(GpuPipelineStage::compute(
        "compute",
        s.kernel.clone(),
        cfg,
        intensity,
        0,
        1,
    ));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![stage]).unwrap();
    let data: Vec<f32> = (0..s.elements).map(|i| (i % 1000) as f32 * 0.001).collect();
    pipeline.fill_input(0, &data).unwrap();
    // Warm up: the first run pays for lazy event creation.
    for _ in 0..3 {
        pipeline.execute_iteration().unwrap();
    }
    pipeline.drain().unwrap();
    median_duration(s.runs, || {
        for _ in 0..s.iterations {
            pipeline.execute_iteration().unwrap();
        }
        pipeline.drain().unwrap();
    })
}

/// The same schedule written directly against the driver table: three
/// streams, one event per slot and stage, no safe layer in the loop.
fn hand_written(s: &Setup, b: &mut Buffers, intensity: u32) -> Duration {
    let ctx = &s.ctx;
    let d = ctx.driver();
    let streams = [
        Stream::new(&s.ctx).unwrap(),
        Stream::new(&s.ctx).unwrap(),
        Stream::new(&s.ctx).unwrap(),
    ];
    let (up, comp, down) = (
        streams[0].as_raw(),
        streams[1].as_raw(),
        streams[2].as_raw(),
    );
    ctx.bind().unwrap();
    let mut events = [[std::ptr::null_mut::<c_void>() as CUevent; 3]; 3];
    for e in events.iter_mut().flatten() {
        // SAFETY: writes one handle; the context is current.
        let code = unsafe { (d.cuEventCreate)(e, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) };
        d.check(code).unwrap();
    }
    let [ev_up, ev_comp, ev_down] = events;
    let cfg = launch_config(&s.ctx, s.elements);
    let bytes = s.elements * 4;
    let n = s.elements as u64;
    let func = s.kernel.as_raw();
    let run = || {
        let total = s.iterations + 2;
        for k in 0..total {
            if k < s.iterations {
                let slot = k % 3;
                // SAFETY: live handles; pinned and device buffers of `bytes`,
                // alive until the end of this function, which synchronizes.
                unsafe {
                    d.check((d.cuStreamWaitEvent)(up, ev_comp[slot], 0))
                        .unwrap();
                    d.check((d.cuMemcpyHtoDAsync)(
                        b.dev_in[slot].as_device_ptr(),
                        b.host_in[slot].as_ptr().cast(),
                        bytes,
                        up,
                    ))
                    .unwrap();
                    d.check((d.cuEventRecord)(ev_up[slot], up)).unwrap();
                }
            }
            if (2..s.iterations + 2).contains(&k) {
                let slot = (k - 2) % 3;
                // SAFETY: as above.
                unsafe {
                    d.check((d.cuStreamWaitEvent)(down, ev_comp[slot], 0))
                        .unwrap();
                    d.check((d.cuMemcpyDtoHAsync)(
                        b.host_out[slot].as_ptr().cast_mut().cast(),
                        b.dev_out[slot].as_device_ptr(),
                        bytes,
                        down,
                    ))
                    .unwrap();
                    d.check((d.cuEventRecord)(ev_down[slot], down)).unwrap();
                }
            }
            if (1..s.iterations + 1).contains(&k) {
                let slot = (k - 1) % 3;
                let mut x = b.dev_in[slot].as_device_ptr();
                let mut y = b.dev_out[slot].as_device_ptr();
                let (mut n, mut it) = (n, intensity);
                let mut params: [*mut c_void; 4] = [
                    (&raw mut n).cast(),
                    (&raw mut it).cast(),
                    (&raw mut x).cast(),
                    (&raw mut y).cast(),
                ];
                // SAFETY: the parameters match compute(u64, u32, f32*, f32*)
                // and outlive the call; the buffers outlive the work.
                unsafe {
                    d.check((d.cuStreamWaitEvent)(comp, ev_up[slot], 0))
                        .unwrap();
                    d.check((d.cuStreamWaitEvent)(comp, ev_down[slot], 0))
                        .unwrap();
                    d.check((d.cuLaunchKernel)(
                        func,
                        cfg.grid_dim.0,
                        1,
                        1,
                        cfg.block_dim.0,
                        1,
                        1,
                        0,
                        comp,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    ))
                    .unwrap();
                    d.check((d.cuEventRecord)(ev_comp[slot], comp)).unwrap();
                }
            }
        }
        for stream in &streams {
            stream.synchronize().unwrap();
        }
    };
    run();
    let time = median_duration(s.runs, run);
    for e in events.iter().flatten() {
        // SAFETY: every stream was synchronized; each event is destroyed once.
        unsafe { d.check((d.cuEventDestroy)(*e)).unwrap() };
    }
    time
}

/// An iteration count for `compute` whose kernel takes about `target`.
/// The kernel is memory-bound at low counts, so time is not proportional to
/// the count there: refine from the measured time a few times.
fn calibrate(s: &Setup, b: &mut Buffers, target: Duration) -> u32 {
    let mut iterations = 64u32;
    for _ in 0..4 {
        let t = stage_times(s, b, iterations)
            .compute
            .as_secs_f64()
            .max(1e-9);
        let next = (iterations as f64 * target.as_secs_f64() / t).round();
        iterations = (next as u32).clamp(1, 1 << 20);
    }
    iterations
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

fn workloads(s: &Setup) {
    let mut b = buffers(s, 3);
    let base = stage_times(s, &mut b, 1);
    let transfer = base.upload.max(base.download);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    figure("pipeline upload (H2D) alone", ms(base.upload), "ms");
    figure("pipeline download (D2H) alone", ms(base.download), "ms");
    figure(
        "pipeline upload + download at once",
        ms(base.copies_together),
        "ms",
    );
    for (name, ratio) in [
        ("balanced", 1.0),
        ("compute-bound", 4.0),
        ("transfer-bound", 0.25),
    ] {
        let intensity = calibrate(s, &mut b, transfer.mul_f64(ratio));
        let st = stage_times(s, &mut b, intensity);
        let n = s.iterations as u32;
        let fill_drain = st.upload + st.compute + st.download;
        let slowest = st.upload.max(st.compute).max(st.download);
        // Isolated stage times, and with the two copies sharing the link.
        let ideal = fill_drain + slowest * (n - 1);
        let ideal_shared = fill_drain + st.compute.max(st.copies_together) * (n - 1);
        let seq = sequential(s, &mut b, intensity);
        let ours = ours(s, intensity);
        let hand = hand_written(s, &mut b, intensity);
        println!(
            "pipeline {name}: compute iterations {intensity}; stages upload {:.3} ms, compute {:.3} ms, download {:.3} ms",
            ms(st.upload),
            ms(st.compute),
            ms(st.download)
        );
        figure(&format!("pipeline {name} sequential"), ms(seq), "ms");
        figure(&format!("pipeline {name} ours"), ms(ours), "ms");
        figure(&format!("pipeline {name} hand-written"), ms(hand), "ms");
        figure(
            &format!("pipeline {name} ideal (isolated stage times)"),
            ms(ideal),
            "ms",
        );
        figure(
            &format!("pipeline {name} ideal (copies sharing the link)"),
            ms(ideal_shared),
            "ms",
        );
        let ns = |d: Duration| d.as_nanos() as f64;
        compare(
            leak(format!("pipeline {name}: ours vs sequential")),
            ns(ours),
            ns(seq),
        );
        compare(
            leak(format!("pipeline {name}: ours vs hand-written")),
            ns(ours),
            ns(hand),
        );
        compare(
            leak(format!("pipeline {name}: ours vs ideal (shared link)")),
            ns(ours),
            ns(ideal_shared),
        );
    }
}

fn bench_step(c: &mut Criterion) {
    // Host cost of one step with tiny buffers: the overhead the pipeline adds.
    let ctx = Context::new(0).unwrap();
    let kernel = kernel(&ctx, &kernels::COMPUTE, "compute");
    let mut pipeline =
        PipelineStageManager::new(AsyncCoordinator::new(&ctx).unwrap(), 256).unwrap();
    let stage = pipeline.add_stage(GpuPipelineStage::compute(
        "c",
        kernel,
        LaunchConfig::for_num_elems(256),
        1,
        0,
        1,
    ));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![stage]).unwrap();
    c.bench_function("pipeline execute_iteration (256 elements)", |bench| {
        bench.iter(|| pipeline.execute_iteration().unwrap())
    });
    pipeline.drain().unwrap();
}

fn main() {
    let ctx = Context::new(0).expect("a device");
    let kernel = kernel(&ctx, &kernels::COMPUTE, "compute");
    let gpu = ctx.is_gpu();
    let setup = Setup {
        elements: if gpu { 16 << 20 } else { 1 << 16 },
        iterations: if gpu { 30 } else { 6 },
        runs: if gpu { 5 } else { 1 },
        kernel,
        ctx,
    };
    println!(
        "pipeline bench on the {} driver: buffers of {:.2} MiB, {} iterations per run{}",
        setup.ctx.loaded_driver().name(),
        (setup.elements * 4) as f64 / (1 << 20) as f64,
        setup.iterations,
        if gpu {
            ""
        } else {
            " (software driver: small buffers; the figures only show the bench runs, not GPU speed)"
        }
    );
    let start = Instant::now();
    workloads(&setup);
    println!(
        "pipeline workloads took {:.1} s",
        start.elapsed().as_secs_f64()
    );
    run_criterion(&[bench_step]);
    criterion_summary();
}
