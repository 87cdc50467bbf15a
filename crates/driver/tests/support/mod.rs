//! Helpers shared by the safe-layer tests (the raw-table tests use `common/`).
#![allow(dead_code, reason = "each test file uses a different subset")]

use cuda_streams_driver::{Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Module, Stream};
use kernels::KernelImage;
use std::sync::Arc;
use std::time::Duration;

/// Long enough that a hang fails instead of stalling the run.
pub(crate) const HANG: Duration = Duration::from_secs(30);

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

    pub(crate) fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [-4, 4), never exactly 0.
    pub(crate) fn next_f32(&mut self) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        let value = unit * 8.0 - 4.0;
        if value == 0.0 { 0.5 } else { value }
    }

    pub(crate) fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_u32()).collect()
    }

    pub(crate) fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
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

/// `checksum(n, data, out)` on `stream`; `out` must be zeroed before.
pub(crate) fn checksum(
    stream: &Stream,
    kernel: &Kernel,
    data: &DeviceBuffer<u32>,
    out: &mut DeviceBuffer<u64>,
) {
    let n = data.len() as u64;
    let args = [KernelArg::from(n), data.into(), out.into()];
    stream
        .launch(
            kernel,
            LaunchConfig::for_num_elems(data.len() as u32),
            &args,
        )
        .expect("checksum launches");
}

/// How long a [`Gate`] holds its stream at most. Normally the test opens it
/// within milliseconds; under a sanitizer that makes launches behind the gate
/// block the host, the gate opens itself after this long.
pub(crate) const GATE_LIMIT: Duration = Duration::from_secs(3);

/// A host callback that holds its stream until [`Gate::open`] (or drop, or
/// [`GATE_LIMIT`]): a deterministic "this stream has not got there yet".
pub(crate) struct Gate {
    tx: Option<std::sync::mpsc::Sender<()>>,
    closed_at: std::time::Instant,
}

impl Gate {
    /// Enqueue the gate on `stream`.
    pub(crate) fn close(stream: &Stream) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let closed_at = std::time::Instant::now();
        stream
            .add_callback(move || {
                // Returns when the sender is dropped, or at the limit.
                let _ = rx.recv_timeout(GATE_LIMIT);
            })
            .expect("the gate is enqueued");
        Self {
            tx: Some(tx),
            closed_at,
        }
    }

    /// Whether the gate is certainly still holding its stream. Its timer
    /// starts when the callback starts, which is after `closed_at`, so an
    /// observation made before this returns `true` was made while it held.
    /// `false` says why a "not there yet" check is skipped.
    pub(crate) fn still_held(&self) -> bool {
        let held = self.closed_at.elapsed() < GATE_LIMIT;
        if !held {
            eprintln!(
                "note: the gate opened itself after {GATE_LIMIT:?} (launches behind it blocked the host, as under a sanitizer); skipping the not-there-yet check"
            );
        }
        held
    }

    /// Let the stream go on.
    pub(crate) fn open(mut self) {
        self.tx.take();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.tx.take();
    }
}

/// Run the tests of a file one at a time. Needed where tests close [`Gate`]s:
/// CUDA's plain frees (`cuMemFree`, `cuMemFreeHost`) wait for the whole
/// context, so a neighbouring test's free would wait for this test's gate
/// while this test waits for that free.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
