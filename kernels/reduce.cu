// Reductions: an order-independent checksum, so the GPU result equals the CPU
// twin's exactly whatever the launch shape and the order of the atomics.
#include "common.cuh"

// Multiplier that spreads the element index over all 64 bits (2^64 / golden ratio).
#define CHECKSUM_GOLDEN 0x9E3779B97F4A7C15ull

// *out += sum over i < n of (u64(data[i]) ^ (i * CHECKSUM_GOLDEN)), all wrapping mod 2^64.
//
// The index term makes the checksum see swapped elements, not only changed ones.
// The kernel ADDS to *out: zero it before the launch (cuMemsetD32Async).
extern "C" __global__ void checksum(unsigned long long n, const unsigned int* data,
                                    unsigned long long* out) {
    unsigned long long sum = 0;
    GRID_STRIDE_LOOP(i, n) {
        sum += (unsigned long long)data[i] ^ (i * CHECKSUM_GOLDEN);
    }

    // Reduce within each warp, then one atomic per warp. The last warp of a block
    // whose size is not a multiple of 32 is partial: its shuffle mask names only
    // the lanes that exist, and lanes never read from a lane past the end.
    unsigned int t = block_thread_index();
    unsigned int lane = t % 32;
    unsigned int warp_first = t - lane;
    unsigned int lanes = min(32u, block_thread_count() - warp_first);
    unsigned int mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    for (unsigned int offset = 16; offset > 0; offset /= 2) {
        unsigned long long other = __shfl_down_sync(mask, sum, offset);
        if (lane + offset < lanes) {
            sum += other;
        }
    }
    if (lane == 0) {
        atomicAdd(out, sum);
    }
}
