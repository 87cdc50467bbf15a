//! Helpers shared by the event-coord tests.
#![allow(dead_code, reason = "each test file uses a different subset")]

use cuda_streams_event_coord::EventPool;
use driver::{Context, Kernel, LaunchConfig, Module, Stream};
use kernels::KernelImage;
use std::sync::Arc;
use std::time::Duration;

/// Long enough that a hang fails instead of stalling the run.
pub(crate) const HANG: Duration = Duration::from_secs(30);

/// The selected driver's device 0.
pub(crate) fn ctx() -> Arc<Context> {
    Context::new(0).expect("a context on device 0")
}

/// A pool on `ctx` with a few events of each kind.
pub(crate) fn pool(ctx: &Arc<Context>) -> Arc<EventPool> {
    Arc::new(EventPool::new(ctx, 8, 2).expect("an event pool"))
}

/// `n` fresh streams.
pub(crate) fn streams(ctx: &Arc<Context>, n: usize) -> Vec<Arc<Stream>> {
    (0..n)
        .map(|_| Stream::new(ctx).expect("a stream"))
        .collect()
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

/// `function` from `image`, with the argument sizes the kernels crate declares.
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

/// A host callback that holds its stream until [`Gate::open`] (or drop):
/// deterministic "this stream has not got there yet".
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
