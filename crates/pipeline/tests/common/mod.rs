//! Helpers shared by the integration tests: the generic ones from
//! `test_support`, and what only these tests need.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different subset"
)]

// The plain xorshift64 these tests' data was drawn from (`XorShift::new`).
pub(crate) use test_support::{
    HANG, ONE_THREAD, XorShift64 as XorShift, ctx, kernel, spin, spin_kernel,
};

/// `compute(iterations)` on the CPU, bit-identical to the kernel.
pub(crate) fn reference_compute(iterations: u32, x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| kernels::reference::compute_element(iterations, v))
        .collect()
}

/// `kernels::COMPUTE`'s `compute(n, iterations, x, y)` as a managed
/// context's step kernel: reads the step's input, writes its output.
pub(crate) fn compute_step(
    ctx: &std::sync::Arc<driver::Context>,
    iterations: u32,
) -> cuda_streams_pipeline::GpuPipelineStage {
    use cuda_streams_pipeline::{GpuPipelineStage, ManagedGpuContext};
    GpuPipelineStage::builder(
        "compute",
        kernel(ctx, &kernels::COMPUTE, "compute"),
        driver::LaunchConfig::for_num_elems(1 << 12),
    )
    .len()
    .u32(iterations)
    .reads(ManagedGpuContext::INPUT)
    .writes(ManagedGpuContext::OUTPUT)
    .build()
}
