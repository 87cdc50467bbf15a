// An iterative solver's kernels, for graphs that loop on the device: a Jacobi
// sweep that records how far it moved, and a kernel that sets a conditional
// node's condition from a device value.
//
// The sweep's sums are written in a fixed order and the largest change is
// taken with an integer atomicMax over the bits of non-negative floats, so
// the result does not depend on the launch shape or the order of threads:
// the CPU twins match bit for bit.
#include "common.cuh"
#include <cuda_runtime.h>

// One Jacobi sweep of tridiag(-1, 4, -1) x = b, with x[-1] = x[n] = 0:
// y[i] = ((b[i] + x[i-1]) + x[i+1]) * 0.25f, and
// *delta = max(*delta, |y[i] - x[i]|). `delta` is one float, zeroed first.
extern "C" __global__ void jacobi_sweep(unsigned long long n, const float* b, const float* x,
                                        float* y, float* delta) {
    GRID_STRIDE_LOOP(i, n) {
        float left = i > 0 ? x[i - 1] : 0.0f;
        float right = i + 1 < n ? x[i + 1] : 0.0f;
        float v = ((b[i] + left) + right) * 0.25f;
        y[i] = v;
        atomicMax(reinterpret_cast<int*>(delta), __float_as_int(fabsf(v - x[i])));
    }
}

// Set the conditional node's condition `handle` to whether *value > tol: a
// WHILE node goes on while the value is above the tolerance. One thread
// does it; any launch shape is correct.
extern "C" __global__ void set_while_f32_above(const float* value, float tol,
                                               cudaGraphConditionalHandle handle) {
    if (global_thread_index() == 0) {
        cudaGraphSetConditional(handle, *value > tol ? 1u : 0u);
    }
}

// One turn of a counted loop: ++*counter, and the condition `handle` is
// whether the counter is still below `limit` (one thread; any launch shape).
extern "C" __global__ void count_while_below(unsigned int* counter, unsigned int limit,
                                             cudaGraphConditionalHandle handle) {
    if (global_thread_index() == 0) {
        unsigned int count = *counter + 1;
        *counter = count;
        cudaGraphSetConditional(handle, count < limit ? 1u : 0u);
    }
}
