// Shared helpers for the cuda-streams kernels.
//
// Every kernel walks its elements with a grid-stride loop over a *flattened*
// thread index, so any launch shape is correct: 1-D, 2-D or 3-D grids and
// blocks, any sizes. The CPU twins in kernels/src/twins.rs rely on this: they
// ignore the launch shape and compute the whole range.
#pragma once

// This thread's index among all threads of the grid, x fastest, then y, then z.
__device__ __forceinline__ unsigned long long global_thread_index() {
    unsigned long long block = blockIdx.x
        + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    unsigned long long threads_per_block =
        (unsigned long long)blockDim.x * blockDim.y * blockDim.z;
    unsigned long long thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return block * threads_per_block + thread;
}

// The number of threads in the whole grid: the stride of a grid-stride loop.
__device__ __forceinline__ unsigned long long grid_thread_count() {
    return (unsigned long long)gridDim.x * gridDim.y * gridDim.z
        * ((unsigned long long)blockDim.x * blockDim.y * blockDim.z);
}

// This thread's index inside its block, and the block's size.
__device__ __forceinline__ unsigned int block_thread_index() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
__device__ __forceinline__ unsigned int block_thread_count() {
    return blockDim.x * blockDim.y * blockDim.z;
}

#define GRID_STRIDE_LOOP(i, n) \
    for (unsigned long long i = global_thread_index(), i##_stride = grid_thread_count(); \
         i < (n); i += i##_stride)
