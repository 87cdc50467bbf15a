//! Helpers shared by the profiler's tests.
#![allow(dead_code, reason = "each test file uses a different subset")]

use driver::{Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Module, Stream};
use kernels::KernelImage;
use std::sync::Arc;
use std::time::Duration;

/// Long enough that a hang fails instead of stalling the run.
pub(crate) const HANG: Duration = Duration::from_secs(30);

/// One block of one thread (what `spin` needs).
pub(crate) const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// The selected driver's device 0.
pub(crate) fn ctx() -> Arc<Context> {
    Context::new(0).expect("a context on device 0")
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

    /// Uniform in `lo..hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
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

/// Keep `stream` busy for `duration` with the `spin` kernel.
pub(crate) fn spin(stream: &Stream, spin: &Kernel, duration: Duration) {
    let ns = duration.as_nanos() as u64;
    stream
        .launch(spin, ONE_THREAD, &[ns.into()])
        .expect("spin launches");
}

/// `fill_f32(n, value, out)` over all of `out`.
pub(crate) fn fill(stream: &Stream, fill: &Kernel, out: &mut DeviceBuffer<f32>, value: f32) {
    let n = out.len() as u64;
    let cfg = LaunchConfig::for_num_elems(out.len() as u32);
    stream
        .launch(fill, cfg, &[KernelArg::from(n), value.into(), out.into()])
        .expect("fill launches");
}

/// A host callback that holds its stream until [`Gate::open`] (or drop):
/// deterministic "the GPU has not got there yet".
pub(crate) struct Gate(Option<std::sync::mpsc::Sender<()>>);

impl Gate {
    /// Enqueue the gate on `stream`.
    pub(crate) fn close(stream: &Stream) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        stream
            .add_callback(move || {
                // Returns when the sender is dropped; the timeout only guards a broken test.
                let _ = rx.recv_timeout(HANG);
            })
            .expect("the gate is enqueued");
        Self(Some(tx))
    }

    /// Let the stream go on.
    pub(crate) fn open(mut self) {
        self.0.take();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.0.take();
    }
}

/// Whether the GPU-only tolerance applies; prints why not otherwise.
pub(crate) fn on_gpu(ctx: &Context, what: &str) -> bool {
    let gpu = ctx.is_gpu();
    if !gpu {
        println!("skipping the GPU-only check ({what}): running on the software driver");
    }
    gpu
}
