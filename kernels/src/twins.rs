//! The kernels' declarations, each with its safe CPU twin, made with
//! [`driver::kernel!`] as any user kernel is.
//!
//! The CUDA kernels use grid-stride loops over the flattened thread index, so
//! their result does not depend on the launch shape; the twins are per-grid
//! (one call per launch) and compute the same result as
//! [`crate::reference`], over the typed slices the software
//! driver hands them after its memcheck-grade pointer checks.

use crate::reference;
use driver::{DeclaredKernel, KernelDecl, kernel};

kernel! {
    /// `saxpy(u64 n, f32 a, const f32* x, f32* y)`: `y[i] = fma(a, x[i], y[i])`.
    pub struct Saxpy: fn saxpy(n: u64, a: f32, x: &[f32; n], y: &mut [f32; n]);
    twin = per_grid(|_, _n, a, x, y| {
        for (y, x) in y.iter_mut().zip(x) {
            *y = reference::saxpy_element(a, *x, *y);
        }
    });
}

kernel! {
    /// `fill_f32(u64 n, f32 value, f32* out)`.
    pub struct FillF32: fn fill_f32(n: u64, value: f32, out: &mut [f32; n]);
    twin = per_grid(|_, _n, value, out| out.fill(value));
}

kernel! {
    /// `fill_u32(u64 n, u32 value, u32* out)`.
    pub struct FillU32: fn fill_u32(n: u64, value: u32, out: &mut [u32; n]);
    twin = per_grid(|_, _n, value, out| out.fill(value));
}

kernel! {
    /// `scale_add(u64 n, f32 a, const f32* x, f32 b, const f32* y, f32* out)`:
    /// `out[i] = fma(a, x[i], b * y[i])`. `out` may be `x` or `y` on a GPU;
    /// the software driver then hands the twin a launch-time copy of the
    /// input, which is what the element-wise kernel reads too.
    pub struct ScaleAdd: fn scale_add(n: u64, a: f32, x: &[f32; n], b: f32, y: &[f32; n], out: &mut [f32; n]);
    twin = per_grid(|_, _n, a, x, b, y, out| {
        for (i, out) in out.iter_mut().enumerate() {
            *out = reference::scale_add_element(a, x[i], b, y[i]);
        }
    });
}

kernel! {
    /// `chain_step_f32(u64 n, const f32* x, f32* y)`: `y[i] = x[i] + 1`,
    /// after `cudaGridDependencySynchronize()`, so it may be launched as a
    /// programmatic dependent launch (`launch_programmatic`).
    pub struct ChainStepF32: fn chain_step_f32(n: u64, x: &[f32; n], y: &mut [f32; n]);
    twin = per_grid(|_, _n, x, y| {
        for (y, x) in y.iter_mut().zip(x) {
            *y = reference::chain_step_element(*x);
        }
    });
    calls cudaGridDependencySynchronize;
}

kernel! {
    /// `checksum(u64 n, const u32* data, u64* out)`: `*out +=`
    /// [`reference::checksum`]`(data)`; `out` is one accumulator.
    pub struct Checksum: fn checksum(n: u64, data: &[u32; n], out: &mut [u64; 1]);
    twin = per_grid(|_, _n, data, out| {
        out[0] = out[0].wrapping_add(reference::checksum(data));
    });
}

kernel! {
    /// `spin(u64 nanoseconds)`: busy-waits on the GPU; the twin sleeps, so
    /// the stream is busy for the time asked without using a core (CI
    /// machines have two, and tests run several spins at once).
    pub struct Spin: fn spin(nanoseconds: u64);
    twin = per_grid(|_, nanoseconds| {
        std::thread::sleep(std::time::Duration::from_nanos(nanoseconds));
    });
}

kernel! {
    /// `compute(u64 n, u32 iterations, const f32* x, f32* y)`: `iterations`
    /// dependent FMAs per element.
    pub struct Compute: fn compute(n: u64, iterations: u32, x: &[f32; n], y: &mut [f32; n]);
    twin = per_grid(|_, _n, iterations, x, y| {
        for (y, x) in y.iter_mut().zip(x) {
            *y = reference::compute_element(iterations, *x);
        }
    });
}

kernel! {
    /// `jacobi_sweep(u64 n, const f32* b, const f32* x, f32* y, f32* delta)`:
    /// one sweep ([`reference::jacobi_sweep`]); `*delta` becomes the larger
    /// of itself and the sweep's largest change.
    pub struct JacobiSweep: fn jacobi_sweep(n: u64, b: &[f32; n], x: &[f32; n], y: &mut [f32; n], delta: &mut [f32; 1]);
    twin = per_grid(|_, _n, b, x, y, delta| {
        delta[0] = delta[0].max(reference::jacobi_sweep(b, x, y));
    });
}

kernel! {
    /// `set_while_f32_above(const f32* value, f32 tol, cudaGraphConditionalHandle
    /// handle)`: sets the condition to whether `*value > tol`
    /// (`cudaGraphSetConditional`; the twin calls
    /// `cuda_streams_soft_driver::set_conditional`). Pass the handle as the
    /// [`Condition`](driver::Condition) itself, in a launch captured in its
    /// graph (`launch_captured`, or `Condition::arg()`).
    pub struct SetWhileF32Above: fn set_while_f32_above(value: &[f32; 1], tol: f32, handle: Condition);
    twin = per_grid(|_, value, tol, handle| {
        soft_driver::set_conditional(handle, u32::from(value[0] > tol));
    });
}

kernel! {
    /// `count_while_below(u32* counter, u32 limit, cudaGraphConditionalHandle
    /// handle)`: `*counter += 1`, and the condition is whether it is still
    /// below `limit` (a WHILE loop of `limit` turns).
    pub struct CountWhileBelow: fn count_while_below(counter: &mut [u32; 1], limit: u32, handle: Condition);
    twin = per_grid(|_, counter, limit, handle| {
        counter[0] += 1;
        soft_driver::set_conditional(handle, u32::from(counter[0] < limit));
    });
}

/// The declarations of `elementwise.cu`.
pub const ELEMENTWISE: &[KernelDecl] = &[
    Saxpy::DECL,
    FillF32::DECL,
    FillU32::DECL,
    ScaleAdd::DECL,
    ChainStepF32::DECL,
];
/// The declarations of `reduce.cu`.
pub const REDUCE: &[KernelDecl] = &[Checksum::DECL];
/// The declarations of `timing.cu`.
pub const TIMING: &[KernelDecl] = &[Spin::DECL];
/// The declarations of `compute.cu`.
pub const COMPUTE: &[KernelDecl] = &[Compute::DECL];
/// The declarations of `solver.cu`.
pub const SOLVER: &[KernelDecl] = &[
    JacobiSweep::DECL,
    SetWhileF32Above::DECL,
    CountWhileBelow::DECL,
];

/// The parameters of `saxpy`.
pub const SAXPY: &[driver::sys::signature::Param] = Saxpy::DECL.params;
/// The parameters of `fill_f32`.
pub const FILL_F32: &[driver::sys::signature::Param] = FillF32::DECL.params;
/// The parameters of `fill_u32`.
pub const FILL_U32: &[driver::sys::signature::Param] = FillU32::DECL.params;
/// The parameters of `scale_add`.
pub const SCALE_ADD: &[driver::sys::signature::Param] = ScaleAdd::DECL.params;
/// The parameters of `checksum`.
pub const CHECKSUM: &[driver::sys::signature::Param] = Checksum::DECL.params;
/// The parameters of `spin`.
pub const SPIN: &[driver::sys::signature::Param] = Spin::DECL.params;
/// The parameters of `compute`.
pub const COMPUTE_PARAMS: &[driver::sys::signature::Param] = Compute::DECL.params;
