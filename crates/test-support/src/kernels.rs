//! Loading the kernels crate's functions and the launches most tests need.

use driver::{Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Module, Stream};
use kernels::KernelImage;
use std::sync::Arc;
use std::time::Duration;

/// One block of one thread: all `spin` needs (every thread would wait).
pub const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// `function` from `image`, with the signature the kernels crate declares,
/// so a launch with the wrong arguments fails instead of reading garbage.
pub fn kernel(ctx: &Arc<Context>, image: &'static KernelImage, function: &str) -> Kernel {
    let module = Module::load(ctx, image).expect("the image loads");
    assert!(
        image.signature(function).is_some(),
        "the image has the function"
    );
    // The signature comes with the function: the image declares it.
    module
        .function(function)
        .expect("the function is in the image")
}

/// The `spin` kernel of [`kernels::TIMING`].
pub fn spin_kernel(ctx: &Arc<Context>) -> Kernel {
    kernel(ctx, &kernels::TIMING, "spin")
}

/// Keep `stream` busy for `duration` with the `spin` kernel.
pub fn spin(stream: &Stream, spin: &Kernel, duration: Duration) {
    let ns = duration.as_nanos() as u64;
    stream
        .launch(spin, ONE_THREAD, &[ns.into()])
        .expect("spin launches");
}

/// `fill_f32(n, value, out)` over all of `out` on `stream` (the kernel's
/// argument order).
pub fn fill(stream: &Stream, fill: &Kernel, value: f32, out: &mut DeviceBuffer<f32>) {
    let n = out.len() as u64;
    let cfg = LaunchConfig::for_num_elems(out.len() as u32);
    stream
        .launch(fill, cfg, &[KernelArg::from(n), value.into(), out.into()])
        .expect("fill launches");
}

/// `saxpy(n, a, x, y)` over all of `y` on `stream`: `y = a * x + y` (the
/// kernel's argument order).
pub fn saxpy(
    stream: &Stream,
    saxpy: &Kernel,
    a: f32,
    x: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
) {
    let n = y.len() as u64;
    let cfg = LaunchConfig::for_num_elems(y.len() as u32);
    stream
        .launch(
            saxpy,
            cfg,
            &[KernelArg::from(n), a.into(), x.into(), y.into()],
        )
        .expect("saxpy launches");
}
