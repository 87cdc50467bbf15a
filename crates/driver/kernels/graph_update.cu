// Kernels the driver crate launches itself: the device-side update of graph
// kernel nodes (CUDA 12.4+ device-updatable kernel nodes).
//
// Each writes `count` scalar kernel parameters: entry i sets the bytes at
// `offsets[i]` in the parameter buffer of device node `nodes[i]` to
// `values[i]`, through `cudaGraphKernelNodeSetParam`. One kernel per scalar
// width, so each value is read at its own alignment. The node table and
// the offsets are the driver's, checked when the table was made (the
// parameter is a scalar of that width, and no pointer's extent depends on
// it); the values are the caller's.
//
// `cudaGraphKernelNodeSetParam` lives in the device runtime (cudadevrt), so
// `cargo xtask build-kernels` compiles this file as relocatable device code
// and links it with libcudadevrt.a into SASS for each architecture; there is
// no PTX to JIT (the device runtime would have to be linked at load time).
#include <cuda_runtime.h>

template <typename T>
__device__ void set_params(unsigned long long count, const unsigned long long* nodes,
                           const unsigned long long* offsets, const T* values) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
       i += stride) {
    cudaGraphKernelNodeSetParam((cudaGraphDeviceNode_t)nodes[i], (size_t)offsets[i], &values[i],
                                sizeof(T));
  }
}

extern "C" __global__ void set_node_params_u8(unsigned long long count,
                                              const unsigned long long* nodes,
                                              const unsigned long long* offsets,
                                              const unsigned char* values) {
  set_params(count, nodes, offsets, values);
}

extern "C" __global__ void set_node_params_u32(unsigned long long count,
                                               const unsigned long long* nodes,
                                               const unsigned long long* offsets,
                                               const unsigned int* values) {
  set_params(count, nodes, offsets, values);
}

extern "C" __global__ void set_node_params_u64(unsigned long long count,
                                               const unsigned long long* nodes,
                                               const unsigned long long* offsets,
                                               const unsigned long long* values) {
  set_params(count, nodes, offsets, values);
}
