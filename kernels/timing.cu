// Timing kernels: make a stream busy for a known time, for overlap and
// ordering tests.
#include "common.cuh"

__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Busy-wait until at least `nanoseconds` have passed on %globaltimer.
//
// Every thread waits on its own, so the kernel lasts about `nanoseconds` however
// it is launched; one block of one thread is enough and leaves the rest of the
// GPU free for work on other streams.
extern "C" __global__ void spin(unsigned long long nanoseconds) {
    unsigned long long start = global_timer_ns();
    while (global_timer_ns() - start < nanoseconds) {
    }
}
