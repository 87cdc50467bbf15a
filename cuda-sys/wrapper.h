/* The header bindgen reads for cuda-sys: the CUDA 13.0 driver API and nothing else. */
#include <cuda.h>
