//! Helpers shared by the cuda-streams integration tests.
//!
//! Each crate's `tests/support` (or `tests/common`) module re-exports what it
//! needs from here and keeps only what is its own. Everything here goes
//! through the selected driver (`CUDA_STREAMS_DRIVER`), so the same tests run
//! on the software driver and on the GPU.
//!
//! Only `driver`, `kernels` and the software driver (for fault injection)
//! are dependencies: the upper crates use this one
//! as a dev-dependency, and depending on them would close a cycle.

mod context;
mod faults;
mod gate;
mod kernels;
mod rng;
mod sanitizer;
mod serial;

pub use context::{ctx, zeroed_elsewhere};
pub use faults::{FaultReset, fail_next_launch};
pub use gate::Gate;
pub use kernels::{ONE_THREAD, fill, kernel, saxpy, spin, spin_kernel};
pub use rng::{XorShift, XorShift64};
pub use sanitizer::skip_under_sanitizer;
pub use serial::serial;

use std::time::Duration;

/// Long enough that a hang fails instead of stalling the run; a deadlock
/// guard, not a speed assertion.
pub const HANG: Duration = Duration::from_secs(30);
