//! Your own kernels (docs/kernels.md), in the same run:
//! - a declared kernel's typed `launch` (`kernel!`) against the `unsafe`
//!   `launch_unchecked` of the same kernel and arguments: the declaration
//!   should cost at most 30 ns a launch (`FIGURE declared launch overhead`);
//! - compiling a program with NVRTC, cold, against a cache hit, which must
//!   take under 1 ms (needs NVRTC; without it the compile half says why it is
//!   skipped).
//!
//! The launches are of a `fill` kernel compiled from source, over 256
//! elements, in batches of 256 with the stream drained between batches
//! (outside the timing), as in the `launch` bench.

use criterion::Criterion;
use cuda_streams_benches::{
    compare, criterion_summary, figure, median_duration, median_ns, run_criterion,
};
use driver::{
    Arch, Compiler, Context, DeclaredKernel, DeviceBuffer, LaunchConfig, Program, Stream,
};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

const SOURCE: &str = r#"
extern "C" __global__ void fill(unsigned long long n, float value, float* out) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}"#;

driver::kernel! {
    /// `out[i] = value` for `i < n`.
    pub struct Fill: fn fill(n: u64, value: f32, out: &mut [f32; n]);
    twin = per_thread(|t, n, value, out| {
        let i = t.global_x();
        if (i as u64) < n {
            out[i] = value;
        }
    });
}

const ELEMENTS: usize = 256;
const BATCH: usize = 256;
const SAMPLES: usize = 400;

struct Setup {
    stream: Arc<Stream>,
    fill: Fill,
    out: DeviceBuffer<f32>,
    cfg: LaunchConfig,
}

fn setup() -> Option<Setup> {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    let module = match Program::new(SOURCE).name("bench_fill.cu").compile_for(&ctx) {
        Ok(module) => module,
        Err(err) => {
            println!("SKIP programs launch: {err}");
            return None;
        }
    };
    let fill: Fill = module.kernel().expect("the declaration matches the source");
    let out = DeviceBuffer::<f32>::new_async(&stream, ELEMENTS).expect("a buffer");
    Some(Setup {
        stream,
        fill,
        out,
        cfg: LaunchConfig::for_num_elems(ELEMENTS as u32),
    })
}

fn declared(s: &mut Setup) {
    s.fill
        .launch(
            &s.stream,
            s.cfg,
            ELEMENTS as u64,
            black_box(1.5f32),
            &mut s.out,
        )
        .expect("launch");
}

fn unchecked(s: &mut Setup) {
    let args = [
        (ELEMENTS as u64).into(),
        black_box(1.5f32).into(),
        (&mut s.out).into(),
    ];
    // SAFETY: fill(u64 n, f32 value, f32* out) with n = the buffer's length.
    unsafe { s.stream.launch_unchecked(s.fill.kernel(), s.cfg, &args) }.expect("launch");
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
    let Some(mut s) = setup() else { return };
    let mut group = c.benchmark_group("launch of a kernel from source");
    group.bench_function("declared", |b| {
        b.iter(|| declared(&mut s));
        s.stream.synchronize().expect("drain");
    });
    group.bench_function("unchecked", |b| {
        b.iter(|| unchecked(&mut s));
        s.stream.synchronize().expect("drain");
    });
    group.finish();
}

fn launch_ratio() {
    let Some(mut s) = setup() else { return };
    let m = medians(&mut s, &[declared, unchecked]);
    let (declared_ns, unchecked_ns) = (m[0], m[1]);
    compare(
        "declared launch vs launch_unchecked",
        declared_ns,
        unchecked_ns,
    );
    figure(
        "declared launch overhead (goal <= 30 ns)",
        declared_ns - unchecked_ns,
        "ns",
    );
}

fn compile_ratio() {
    let compiler = match Compiler::global() {
        Ok(compiler) => compiler,
        Err(err) => {
            println!("SKIP programs compile: {err}");
            return;
        }
    };
    let ctx = Context::new(0).expect("a context");
    let arch = if ctx.is_gpu() {
        Arch::of(&ctx)
    } else {
        Arch::new(9, 0)
    };
    let cold_program = Program::new(SOURCE).name("bench_fill.cu").no_cache();
    let cold = median_duration(5, || {
        let compiled = cold_program.compile_with(compiler, arch).expect("compiles");
        assert!(!compiled.from_cache());
    });
    let dir = std::env::temp_dir().join(format!("cuda-streams-bench-cache-{}", std::process::id()));
    let cached = Program::new(SOURCE).name("bench_fill.cu").cache_dir(&dir);
    cached.compile_with(compiler, arch).expect("compiles");
    let hit_ns = median_ns(50, 10, || {
        let compiled = cached.compile_with(compiler, arch).expect("a cache hit");
        assert!(compiled.from_cache());
        black_box(compiled);
    });
    let _ = std::fs::remove_dir_all(&dir);
    compare(
        "compile: cache hit vs NVRTC cold",
        hit_ns,
        cold.as_nanos() as f64,
    );
    figure("compile cold (NVRTC)", cold.as_secs_f64() * 1e3, "ms");
    figure("compile cache hit (goal < 1 ms)", hit_ns / 1e6, "ms");
}

fn main() {
    run_criterion(&[criterion_groups]);
    launch_ratio();
    compile_ratio();
    criterion_summary();
}
