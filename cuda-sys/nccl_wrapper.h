/* The header bindgen reads for cuda-sys's NCCL bindings: NCCL 2.28's nccl.h. */
#include <nccl.h>
