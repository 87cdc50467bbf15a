//! The `spin` kernel, with which the benches keep a stream busy for a set time.

use driver::{Context, Kernel, Module};
use std::sync::Arc;

/// `spin(u64 nanoseconds)` from [`kernels::TIMING`], with the argument sizes
/// the kernels crate declares.
pub fn spin_kernel(ctx: &Arc<Context>) -> Kernel {
    let image = &kernels::TIMING;
    Module::load(ctx, image.fatbin())
        .and_then(|m| m.function("spin"))
        .expect("spin")
        .with_arg_sizes(image.arg_sizes("spin").expect("spin's signature"))
}
