//! The objects: the driver's things, each owning what it created.
//!
//! Contexts and devices ([`context`]), stream priorities ([`priority`]),
//! streams ([`stream`]), the waits, forks and joins between them
//! ([`joins`]) and each stream's latest mark ([`latest_mark`]), events and
//! their pool ([`event`], [`event_pool`]), memory ([`memory`]), the
//! completion trail ([`completion_trail`]), SM partitions and their streams
//! ([`partition`]), per-stream counters
//! ([`metrics`]), a value per device ([`per_device`]) and the result layer
//! ([`result`]: one checked wrapper per raw call on a context or stream).
//!
//! What it may import: the ground ([`crate::ground`]) and each other. Putting
//! work on a stream is the enqueue protocol's job, one layer up: a stream
//! holds the state that protocol keeps on it (its gate's lock, its
//! observers, its latest mark), but does not run it; recording an event on a
//! stream and waiting for one are the protocol's too
//! (`crate::enqueue::event_marks`). One exception stands:
//! contexts, streams and events hold the stream-order tracker's state, and
//! tell it of their syncs, waits and frees (`crate::enqueue::order`). What
//! stands on a context from above (the reactor) lives in its service slot
//! ([`context::ContextService`]), so the context names none of it.

pub(crate) mod completion_trail;
pub(crate) mod context;
pub(crate) mod event;
pub(crate) mod event_pool;
pub(crate) mod joins;
pub(crate) mod latest_mark;
pub(crate) mod mark_state;
pub(crate) mod memory;
pub(crate) mod metrics;
pub(crate) mod partition;
pub(crate) mod per_device;
pub(crate) mod priority;
pub mod result;
pub(crate) mod stream;
