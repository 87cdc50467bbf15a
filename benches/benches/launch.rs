//! Launch cost: the checked, typed `Stream::launch` against the `unsafe`
//! `Stream::launch_unchecked` of the same kernel and arguments (same
//! tracking, no signature check), and both against a raw `cuLaunchKernel`
//! from the table, in the same run.
//!
//! The kernel is `fill_f32` over 256 elements: one pointer parameter whose
//! extent is checked, two scalars. Launches go in batches of 256 with the
//! stream drained between batches (outside the timing), so the GPU's launch
//! queue never fills and blocks the host.

use criterion::Criterion;
use cuda_streams_benches::{compare, criterion_summary, figure, median_ns, run_criterion};
use driver::{Context, DeviceBuffer, DeviceMemory, Kernel, LaunchConfig, Stream};
use kernels::typed::Elementwise;
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

const ELEMENTS: usize = 256;
const BATCH: usize = 256;
const SAMPLES: usize = 400;

struct Setup {
    stream: Arc<Stream>,
    fill: Kernel,
    out: DeviceBuffer<f32>,
    cfg: LaunchConfig,
}

fn setup() -> Setup {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    let fill = Elementwise::load(&ctx)
        .expect("the image loads")
        .kernel("fill_f32")
        .expect("fill_f32")
        .clone();
    let out = DeviceBuffer::<f32>::new_async(&stream, ELEMENTS).expect("a buffer");
    Setup {
        stream,
        fill,
        out,
        cfg: LaunchConfig::for_num_elems(ELEMENTS as u32),
    }
}

fn checked(s: &mut Setup) {
    let args = [
        (ELEMENTS as u64).into(),
        black_box(1.5f32).into(),
        (&mut s.out).into(),
    ];
    s.stream.launch(&s.fill, s.cfg, &args).expect("launch");
}

fn unchecked(s: &mut Setup) {
    let args = [
        (ELEMENTS as u64).into(),
        black_box(1.5f32).into(),
        (&mut s.out).into(),
    ];
    // SAFETY: fill_f32(u64 n, f32 value, f32* out) with n = the buffer's length.
    unsafe { s.stream.launch_unchecked(&s.fill, s.cfg, &args) }.expect("launch");
}

fn raw(s: &mut Setup) {
    let ctx = s.stream.context();
    let mut n = ELEMENTS as u64;
    let mut value = black_box(1.5f32);
    let mut ptr = s.out.device_ptr();
    let mut params: [*mut c_void; 3] = [
        (&raw mut n).cast(),
        (&raw mut value).cast(),
        (&raw mut ptr).cast(),
    ];
    let (g, b) = (s.cfg.grid_dim, s.cfg.block_dim);
    // SAFETY: the same arguments as above; the buffer outlives the batch,
    // which is drained before it is dropped.
    let code = unsafe {
        (ctx.driver().cuLaunchKernel)(
            s.fill.as_raw(),
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            0,
            s.stream.as_raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    code.result().expect("raw launch");
}

/// Median ns per launch of each of `ways`, sampled in turn so drift hits all alike.
fn medians(s: &mut Setup, ways: &[fn(&mut Setup)]) -> Vec<f64> {
    let mut samples = vec![Vec::with_capacity(SAMPLES); ways.len()];
    for round in 0..SAMPLES + 2 {
        for (way, times) in ways.iter().zip(&mut samples) {
            s.stream.synchronize().expect("drain");
            let start = Instant::now();
            for _ in 0..BATCH {
                way(s);
            }
            let per_launch = start.elapsed().as_nanos() as f64 / BATCH as f64;
            if round >= 2 {
                times.push(per_launch); // the first rounds warm up
            }
        }
    }
    s.stream.synchronize().expect("drain");
    samples
        .into_iter()
        .map(|mut times| {
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        })
        .collect()
}

fn criterion_groups(c: &mut Criterion) {
    let mut s = setup();
    let mut group = c.benchmark_group("launch fill_f32");
    group.bench_function("checked", |b| {
        b.iter(|| {
            checked(&mut s);
        });
        s.stream.synchronize().expect("drain");
    });
    group.bench_function("unchecked", |b| {
        b.iter(|| {
            unchecked(&mut s);
        });
        s.stream.synchronize().expect("drain");
    });
    group.finish();
}

fn ratios() {
    let mut s = setup();
    let m = medians(&mut s, &[checked, unchecked, raw]);
    let (checked_ns, unchecked_ns, raw_ns) = (m[0], m[1], m[2]);
    compare(
        "checked launch vs unchecked launch",
        checked_ns,
        unchecked_ns,
    );
    compare("checked launch vs raw cuLaunchKernel", checked_ns, raw_ns);
    figure(
        "checked launch: signature check cost (checked - unchecked)",
        checked_ns - unchecked_ns,
        "ns",
    );
    // The difference of two ~3 µs medians is noisy to a few tens of ns; the
    // check itself, with no driver call around it, is what the typed launch
    // adds.
    let check_ns = median_ns(200, 1000, || {
        let args = [
            (ELEMENTS as u64).into(),
            black_box(1.5f32).into(),
            (&mut s.out).into(),
        ];
        s.fill.check_args(black_box(&args)).expect("checked");
    });
    figure("checked launch: signature check alone", check_ns, "ns");
}

fn main() {
    run_criterion(&[criterion_groups]);
    ratios();
    criterion_summary();
}
