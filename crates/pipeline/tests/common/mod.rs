//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use driver::Context;
use std::sync::Arc;

/// The device's context on the selected driver (CUDA_STREAMS_DRIVER).
pub fn ctx() -> Arc<Context> {
    Context::new(0).expect("a device on the selected driver")
}

/// A small xorshift generator: deterministic, never all zeros.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Values in [-4, 4).
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0)
            .collect()
    }
}

/// `compute(iterations)` on the CPU, bit-identical to the kernel.
pub fn reference_compute(iterations: u32, x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| kernels::reference::compute_element(iterations, v))
        .collect()
}
