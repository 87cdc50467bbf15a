//! Your own kernels (docs/kernels.md), in the same run:
//! - a declared kernel's typed `launch` (`kernel!`) against the `unsafe`
//!   `launch_unchecked` of the same kernel and arguments: the declaration
//!   should cost at most 30 ns a launch (`FIGURE declared launch overhead`);
//! - compiling a program with NVRTC, cold, against a cache hit, which must
//!   take under 1 ms (needs NVRTC; without it the compile half says why it is
//!   skipped).
//!
//! The launches are of a `fill` kernel compiled from source, over 256
//! elements, in batches of 256 with the stream drained after each batch
//! (outside the timing), as in the `launch` bench. The two sides' batches
//! alternate, and the overhead is the median over pairs of neighbouring
//! batches of their difference (`alternating`), so that host drift moves
//! both sides of each pair alike.

use criterion::Criterion;
use cuda_streams_benches::{
    Pair, alternating_on, compare, criterion_summary, figure, median_duration, median_ns,
    run_criterion,
};
use driver::{
    Arch, Compiler, Context, DeclaredKernel, DeviceBuffer, LaunchConfig, Program, Stream,
};
use std::hint::black_box;
use std::sync::Arc;

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
    // SAFETY: fill writes out[i] for i < n only.
    let program = unsafe { Program::new(SOURCE).name("bench_fill.cu").declare::<Fill>() };
    let module = match program.compile_for(&ctx) {
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

/// Ns per launch of `ours` and of `base`, in alternating batches with the
/// stream drained after each ([`alternating`]).
fn pair(s: &mut Setup, ours: fn(&mut Setup), base: fn(&mut Setup)) -> Pair {
    alternating_on(s, SAMPLES, BATCH, ours, base, |s| {
        s.stream.synchronize().expect("drain")
    })
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
    let p = pair(&mut s, declared, unchecked);
    compare("declared launch vs launch_unchecked", p.ours, p.raw);
    // The median over neighbouring batches of their difference: a change
    // of the host's state moves both sides of each pair alike.
    figure(
        "declared launch overhead (goal <= 30 ns)",
        p.over_raw_ns,
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
