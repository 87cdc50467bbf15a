/* The header bindgen reads for cuda-sys's CUPTI bindings: CUDA 13.0's CUPTI
   (activity API and driver callback ids). Types of cuda.h come from bindings.rs. */
#include <cupti.h>
