//! Helpers shared by the profiler's tests: the generic ones from
//! `test_support`, and what only these tests need.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test file uses a different subset"
)]

use driver::Context;

pub(crate) use test_support::{Gate, XorShift, ctx, fill, kernel, spin};

/// Whether the GPU-only tolerance applies; prints why not otherwise.
pub(crate) fn on_gpu(ctx: &Context, what: &str) -> bool {
    let gpu = ctx.is_gpu();
    if !gpu {
        println!("skipping the GPU-only check ({what}): running on the software driver");
    }
    gpu
}
