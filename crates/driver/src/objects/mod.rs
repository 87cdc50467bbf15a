//! The objects: the driver's things, each owning what it created.
//!
//! Contexts and devices ([`context`]), stream priorities ([`priority`]),
//! streams ([`stream`]) and the waits, forks and joins between them
//! ([`joins`]), events and their pool ([`event`], [`event_pool`]), memory
//! ([`memory`]), host callbacks ([`callback`]), the completion trail
//! ([`completion_trail`]), per-stream counters ([`metrics`]) and a value per
//! device ([`per_device`]).
//!
//! What it may import: the ground ([`crate::ground`]) and each other. Putting
//! work on a stream is the enqueue protocol's job, one layer up; an object
//! holds the state that protocol keeps on it, but does not run it.

pub(crate) mod completion_trail;
pub(crate) mod context;
pub(crate) mod event;
pub(crate) mod event_pool;
pub(crate) mod joins;
pub(crate) mod latest_mark;
pub(crate) mod memory;
pub(crate) mod metrics;
pub(crate) mod per_device;
pub(crate) mod priority;
pub mod result;
pub(crate) mod stream;
