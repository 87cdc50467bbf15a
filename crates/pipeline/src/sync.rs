//! The atomics the triple buffer's state protocol uses: std's, or loom's
//! when the crate's own tests run under `--cfg loom` (only then: a crate that
//! depends on this one never sees loom).

#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic;
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::atomic;
