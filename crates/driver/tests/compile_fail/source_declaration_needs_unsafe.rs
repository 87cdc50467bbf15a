//! Issue 41: a kernel of one's own source is declared on its program with
//! the one `unsafe` promise (what the body touches). Safe code cannot make it.
#![forbid(unsafe_code)]

use cuda_streams_driver::{Program, kernel};

kernel! {
    pub struct Fill: fn fill(n: u64, y: &mut [f32; n]);
}

fn main() {
    let program = Program::new("extern \"C\" __global__ void fill(unsigned long long n, float* y) { y[n] = 0; }")
        .declare::<Fill>();
    let _ = program;
}
