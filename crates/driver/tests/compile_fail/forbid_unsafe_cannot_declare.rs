//! A crate that forbids `unsafe` cannot make the promise of
//! `Program::declare` at all, not even in an `unsafe` block.
#![forbid(unsafe_code)]

use cuda_streams_driver::{Program, kernel};

kernel! {
    pub struct Fill: fn fill(n: u64, y: &mut [f32; n]);
}

fn main() {
    // SAFETY: not allowed here.
    let program = unsafe { Program::new("extern \"C\" __global__ void fill(unsigned long long n, float* y) {}").declare::<Fill>() };
    let _ = program;
}
