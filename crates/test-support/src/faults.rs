//! Fault injection through the software driver, for tests of what the upper
//! crates report when work on the GPU fails.

use driver::Stream;

/// Make the next kernel launched on `stream` fail when the stream gets to
/// it, with `CUDA_ERROR_LAUNCH_FAILED`, sticky for the whole context as on a
/// GPU (see `cuda_streams_soft_driver::faults`). Returns `false`, saying why
/// on stderr, on the GPU, where faults cannot be injected: the caller skips.
///
/// A test that injects a fault takes [`crate::serial`] (every test of its
/// binary must, since the fault fails the whole context) and holds a
/// [`FaultReset`].
pub fn fail_next_launch(stream: &Stream) -> bool {
    if stream.context().is_gpu() {
        eprintln!("skipped on the GPU: fault injection is a software-driver feature");
        return false;
    }
    soft_driver::faults::fail_next_launch(stream.as_raw()).expect("a software stream");
    true
}

/// Clears every sticky error and pending injection when dropped, even when an
/// assertion failed, so the next test starts from a working context.
#[must_use = "the faults are reset when this is dropped"]
pub struct FaultReset;

impl Drop for FaultReset {
    fn drop(&mut self) {
        soft_driver::faults::reset();
    }
}
