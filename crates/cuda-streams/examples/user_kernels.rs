//! Your own kernels, first class: two kernels written in CUDA C++ (a fused
//! `y = relu(a·x + b)` and a histogram with shared memory and atomics),
//! compiled at run time, declared once with `kernel!` and once on the program
//! (the one `unsafe` promise: what each body touches; the signatures are
//! checked by the compiler), launched through their typed launchers as two
//! operations of the operation graph, and checked against a CPU reference.
//!
//! On a GPU, NVRTC compiles the source (cached on disk afterwards); on the
//! software driver the same program runs through the declarations' CPU twins:
//! a per-thread twin for the element-wise kernel, and a per-grid twin for the
//! histogram, whose block-shared counters and atomics a per-thread twin
//! cannot model.
//!
//! `cargo run -p cuda-streams --example user_kernels`

use cuda_streams::driver::{Program, kernel};
use cuda_streams::prelude::*;

const SOURCE: &str = r#"
// y[i] = max(a * x[i] + b, 0)
extern "C" __global__ void affine_relu(unsigned long long n, float a, float b,
                                       const float* x, float* y) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = a * x[i] + b;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

// bins[clamp((y[i] - lo) / width, 0, 63)] += 1 for every i < n: each block
// counts its grid-stride share in shared memory, then adds it to `bins`.
extern "C" __global__ void histogram(unsigned long long n, const float* y, float lo,
                                     float width, unsigned int* bins) {
    __shared__ unsigned int local[64];
    for (unsigned int b = threadIdx.x; b < 64; b += blockDim.x) local[b] = 0;
    __syncthreads();
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        int bin = (int)((y[i] - lo) / width);
        bin = bin < 0 ? 0 : (bin > 63 ? 63 : bin);
        atomicAdd(&local[bin], 1u);
    }
    __syncthreads();
    for (unsigned int b = threadIdx.x; b < 64; b += blockDim.x) atomicAdd(&bins[b], local[b]);
}
"#;

const BINS: usize = 64;

kernel! {
    /// `y = relu(a·x + b)`, element-wise.
    pub struct AffineRelu: fn affine_relu(n: u64, a: f32, b: f32, x: &[f32; n], y: &mut [f32; n]);
    twin = per_thread(|t, n, a, b, x, y| {
        let i = t.global_x();
        if (i as u64) < n {
            y[i] = relu(a * x[i] + b);
        }
    });
}

kernel! {
    /// A 64-bin histogram of `y` over `[lo, lo + 64·width)`, the ends clamped.
    pub struct Histogram:
        fn histogram(n: u64, y: &[f32; n], lo: f32, width: f32, bins: &mut [u32; 64]);
    twin = per_grid(|_dims, _n, y, lo, width, bins| {
        for &v in y {
            bins[bin(v, lo, width)] += 1;
        }
    });
}

fn relu(v: f32) -> f32 {
    if v > 0.0 { v } else { 0.0 }
}

fn bin(v: f32, lo: f32, width: f32) -> usize {
    // As the kernel: truncation toward zero, then a clamp.
    (((v - lo) / width) as i32).clamp(0, BINS as i32 - 1) as usize
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const N: usize = 100_000;
    let (a, b, lo, width) = (1.5f32, -4.0f32, 0.0f32, 0.5f32);

    let ctx = Context::new(0)?;
    let (s0, s1) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    // SAFETY: affine_relu touches x[i] and y[i] for i < n only, and
    // histogram reads y[i] for i < n and writes bins[0..64] only.
    let program = unsafe {
        Program::new(SOURCE)
            .name("user_kernels.cu")
            .declare::<AffineRelu>()
            .declare::<Histogram>()
    };
    // Compile, with each declared type checked by NVRTC (or, on the
    // software driver, read the source and take the twins).
    let module = program.compile_for(&ctx)?;
    let affine_relu: AffineRelu = module.kernel()?;
    let histogram: Histogram = module.kernel()?;

    // Quarters: every value below is exact in f32, so both drivers agree
    // with the reference bit for bit.
    let host_x: Vec<f32> = (0..N).map(|i| (i % 83) as f32 * 0.25).collect();
    let x = DeviceBuffer::from_slice(&s0, &host_x)?;
    let mut y = DeviceBuffer::<f32>::new(&ctx, N)?;
    let mut bins = DeviceBuffer::from_slice(&s1, &[0u32; BINS])?;

    // Two operations of the graph: the histogram waits (on the GPU, through
    // an event) for the fused kernel on the other stream.
    let graph = OperationGraph::for_context(&ctx);
    let fused = graph.op(&s0).label("y = relu(a·x + b)").run(|s| {
        affine_relu.launch(
            s,
            LaunchConfig::for_num_elems(N as u32),
            N as u64,
            a,
            b,
            &x,
            &mut y,
        )
    })?;
    let counted = graph
        .op(&s1)
        .after(&[fused.id()])
        .label("histogram of y")
        .run(|s| {
            let cfg = LaunchConfig {
                grid_dim: (32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            histogram.launch(s, cfg, N as u64, &y, lo, width, &mut bins)
        })?;
    counted.wait()?;

    let expected_y: Vec<f32> = host_x.iter().map(|&v| relu(a * v + b)).collect();
    let mut expected_bins = [0u32; BINS];
    for &v in &expected_y {
        expected_bins[bin(v, lo, width)] += 1;
    }
    assert_eq!(y.to_vec(&s1)?, expected_y, "relu(a·x + b) against the CPU");
    assert_eq!(
        bins.to_vec(&s1)?,
        expected_bins,
        "the histogram against the CPU"
    );

    let driver = if ctx.is_gpu() {
        "the GPU (NVRTC)"
    } else {
        "the software driver (CPU twins)"
    };
    println!(
        "{N} elements through relu(a·x + b) and a {BINS}-bin histogram on {driver}: both match the CPU"
    );
    println!(
        "bins 0..8: {:?} (zeros clamp into bin 0)",
        &expected_bins[..8]
    );
    Ok(())
}
