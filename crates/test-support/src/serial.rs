//! Running the tests of one binary one at a time.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Hold the returned guard for the whole test to run the tests of a binary
/// one at a time (each test binary has its own lock).
///
/// Needed where a neighbouring test could disturb what a test asserts: a
/// [`crate::Gate`] holds its stream, and CUDA's plain frees (`cuMemFree`,
/// `cuMemFreeHost`) or a module or stream teardown can wait for the whole
/// device, so a neighbour would wait for this test's gate while this test
/// waits for it, or let "busy" kernels finish before they are looked at.
/// Process-wide software-driver state (capacity, injected faults) needs it
/// too. A panicking test does not poison the lock for the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}
