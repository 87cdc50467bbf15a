//! The ground floor: what every other file stands on.
//!
//! The loaded function table and its kind ([`loaded_driver`]), the choice
//! of driver ([`select`]), the one place where the two drivers' answers
//! differ (`seam`), the driver calls that need no context
//! ([`driver_calls`]), whether this thread runs a stream callback
//! ([`callback_thread`]), the crate's one error type ([`error`], its
//! longer wordings in `error_text`) with the
//! plain values its messages name ([`arch`], [`arg_kind`], [`race`],
//! [`order_policy`]), the loom shim that the atomic protocols are built
//! from ([`sync`]), how byte counts and durations print ([`units`]), and
//! the hasher of maps keyed by ids and addresses ([`id_hash`]).
//!
//! What it may import: `sys`, `soft_driver` and the standard library. Nothing
//! here names a context, a stream or anything built on them, so any file
//! above can use these without pulling the rest of the crate along.

pub(crate) mod arch;
pub(crate) mod arg_kind;
pub(crate) mod callback_thread;
pub(crate) mod driver_calls;
pub(crate) mod error;
mod error_text;
pub(crate) mod id_hash;
pub(crate) mod loaded_driver;
pub(crate) mod order_policy;
pub(crate) mod race;
mod seam;
pub(crate) mod select;
pub(crate) mod sync;
pub(crate) mod units;
