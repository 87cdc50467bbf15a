/* The header bindgen reads for cuda-sys's NVRTC bindings: CUDA 13.0's nvrtc.h
   (from the nvidia-cuda-nvrtc wheel), the run-time compiler. */
#include <nvrtc.h>
