// Elementwise kernels: saxpy, fill, scale-and-add, a chain step.
//
// Every product-and-sum is written as an explicit fmaf so the result does not
// depend on nvcc's contraction choices: the CPU twins compute f32::mul_add in
// the same order and match bit for bit.
#include "common.cuh"

// y[i] = a * x[i] + y[i] (one fused multiply-add), for i < n.
extern "C" __global__ void saxpy(unsigned long long n, float a, const float* x, float* y) {
    GRID_STRIDE_LOOP(i, n) {
        y[i] = fmaf(a, x[i], y[i]);
    }
}

// out[i] = value, for i < n.
extern "C" __global__ void fill_f32(unsigned long long n, float value, float* out) {
    GRID_STRIDE_LOOP(i, n) {
        out[i] = value;
    }
}

// out[i] = value, for i < n.
extern "C" __global__ void fill_u32(unsigned long long n, unsigned int value, unsigned int* out) {
    GRID_STRIDE_LOOP(i, n) {
        out[i] = value;
    }
}

// out[i] = fmaf(a, x[i], b * y[i]), for i < n. `out` may be `x` or `y`.
extern "C" __global__ void scale_add(unsigned long long n, float a, const float* x, float b,
                                     const float* y, float* out) {
    GRID_STRIDE_LOOP(i, n) {
        out[i] = fmaf(a, x[i], b * y[i]);
    }
}

// y[i] = x[i] + 1.0f, for i < n: one step of a chain of dependent kernels,
// written for programmatic dependent launch. Nothing before
// cudaGridDependencySynchronize touches memory: the kernel ahead of it on the
// stream may still be writing `x` or reading `y` until that returns. The
// trigger then lets the next kernel of the chain be scheduled while this one
// runs; the next one's own wait still waits for this one to complete.
// Below sm_90 there is neither call, and programmatic launches are refused
// there (the library checks the device's compute capability).
extern "C" __global__ void chain_step_f32(unsigned long long n, const float* x, float* y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#endif
    GRID_STRIDE_LOOP(i, n) {
        y[i] = x[i] + 1.0f;
    }
}
