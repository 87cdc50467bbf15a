// Compute-bound kernels with a tunable arithmetic intensity, for pipeline benches.
#include "common.cuh"

// y[i] = v after `iterations` steps of v = fmaf(v, 0.5f, x[i]), starting from v = x[i].
//
// Each step depends on the one before, so the work is `iterations` FMAs per
// element (2 flops each) for 8 bytes of memory traffic. The iteration converges
// to 2 * x[i] and never overflows, so any iteration count gives finite results.
extern "C" __global__ void compute(unsigned long long n, unsigned int iterations, const float* x,
                                   float* y) {
    GRID_STRIDE_LOOP(i, n) {
        float xi = x[i];
        float v = xi;
        for (unsigned int k = 0; k < iterations; ++k) {
            v = fmaf(v, 0.5f, xi);
        }
        y[i] = v;
    }
}
