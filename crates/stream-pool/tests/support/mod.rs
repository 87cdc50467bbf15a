//! Helpers shared by the stream-pool tests.
#![allow(dead_code, reason = "each test file uses a different subset")]

use cuda_streams_stream_pool::driver::{
    Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Module, Stream,
};
use kernels::KernelImage;
use std::sync::Arc;
use std::time::Duration;

/// Long enough that a hang fails instead of stalling the run.
pub(crate) const HANG: Duration = Duration::from_secs(30);

/// Serialises the tests of a file that asserts which streams are busy. On a
/// GPU, a neighbouring test's stream or module teardown can hold the calling
/// thread inside the driver until the whole device is idle, which would let
/// "busy" spin kernels finish before the pool looks at them.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The selected driver's device 0 (`CUDA_STREAMS_DRIVER`).
pub(crate) fn ctx() -> Arc<Context> {
    Context::new(0).expect("a context on device 0")
}

/// `function` from `image`, with the signature the kernels crate declares.
pub(crate) fn kernel(ctx: &Arc<Context>, image: &'static KernelImage, function: &str) -> Kernel {
    let module = Module::load(ctx, image.fatbin()).expect("the image loads");
    let sizes = image
        .arg_sizes(function)
        .expect("the image has the function");
    module
        .function(function)
        .expect("the function is in the image")
        .with_arg_sizes(sizes)
}

/// The `spin` kernel.
pub(crate) fn spin_kernel(ctx: &Arc<Context>) -> Kernel {
    kernel(ctx, &kernels::TIMING, "spin")
}

/// Keep `stream` busy for `duration` with the `spin` kernel (one thread).
pub(crate) fn spin(stream: &Stream, spin: &Kernel, duration: Duration) {
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let ns = duration.as_nanos() as u64;
    stream
        .launch(spin, one, &[ns.into()])
        .expect("spin launches");
}

/// `fill_f32(n, value, out)` on `stream`.
pub(crate) fn fill(stream: &Stream, fill: &Kernel, value: f32, out: &mut DeviceBuffer<f32>) {
    let n = out.len() as u64;
    let cfg = LaunchConfig::for_num_elems(out.len() as u32);
    stream
        .launch(fill, cfg, &[KernelArg::from(n), value.into(), out.into()])
        .expect("fill launches");
}

/// `saxpy(n, a, x, y)` on `stream`: `y = a * x + y`.
pub(crate) fn saxpy(
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

/// A small xorshift64*, so test data is random but reproducible and never all zeros.
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-4, 4), never exactly 0.
    pub(crate) fn next_f32(&mut self) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        let value = unit * 8.0 - 4.0;
        if value == 0.0 { 0.5 } else { value }
    }

    pub(crate) fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

/// Ids of a list of streams.
pub(crate) fn ids<'a>(streams: impl IntoIterator<Item = &'a Arc<Stream>>) -> Vec<u64> {
    streams.into_iter().map(|s| s.id()).collect()
}
