//! The lock and counter the shared shelves use: std's, or loom's when the
//! driver's own tests run under `--cfg loom` (only then: the crates that
//! depend on the driver never see loom).

#[cfg(all(test, loom))]
pub(super) use loom::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};
#[cfg(not(all(test, loom)))]
pub(super) use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicUsize, Ordering},
};
