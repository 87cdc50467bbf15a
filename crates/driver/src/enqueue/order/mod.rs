//! Stream order, checked and inferred: happens-before over the bytes every
//! operation touches.
//!
//! Every enqueue that touches memory goes through `enqueue.rs`, which knows
//! the bytes each operation reads and writes; every ordering edge (stream
//! order, event record and wait, joins and forks, which are events, host
//! waits, graph launches) goes through this crate too. This module keeps a
//! vector clock per stream and per event record (`clock.rs`) and, per
//! context, the last write and the unordered reads of each byte range
//! (`tracker.rs`). An access that conflicts with one not in its past is a
//! [`Race`], which the context's [`OrderPolicy`] refuses, reports or repairs.
//!
//! The host is one agent: a completion observed on any thread (a stream or
//! event synchronized, a query that answered "done", a future that resolved)
//! orders the work every thread enqueues afterwards. Threads synchronise
//! with each other in ways this crate cannot see (channels, joins), so it
//! assumes they do; a completion that has not happened yet is never assumed.
//!
//! A programmatic dependent launch is stream order here, as a plain launch:
//! its kernel starts early but touches nothing before
//! `cudaGridDependencySynchronize` returns, after the stream's earlier work
//! (the reasoning is in `features/dependent_launch.rs`).
//!
//! `docs/ordering.md` describes the model, what is and is not checked, and
//! the cost of each policy.
//!
//! # The files
//!
//! From the entry points down; a file imports only files below it.
//!
//! - `capture`: the order within a graph being captured;
//! - `check`: the check before each enqueue (`before_enqueue`), the general
//!   way for races and memory of several contexts, and the race reports;
//! - `repair`: `Auto`'s waits for the streams an operation races with,
//!   through their marks ([`offer_mark`]);
//! - `step`: an operation's access recorded and its stream's step taken;
//! - `record_and_wait`: what an event's record covers, and what a wait for
//!   it teaches;
//! - `host`: the host's clock, what any thread has seen complete;
//! - `in_flight`: a step whose driver call is being made;
//! - `stream_state`: per stream, its clock, its steps in flight and the
//!   points taken of it;
//! - `context_state`: per context, its policy and its shadow;
//! - `label`: the names operations carry into reports ([`labelled`]);
//! - `kept`: what the tracker keeps per thread, above all the point an
//!   enqueue kept for the records right after it;
//! - `tracker`: the accesses recorded per byte range (the shadow);
//! - `recorded`: an event's latest record, read without a lock;
//! - `policy` ([`OrderPolicy`], where it comes from, what a switch keeps),
//!   `stats` ([`OrderStats`]), `touch` (the bytes an operation touches),
//!   `report` ([`Race`]) and `clock` (vector clocks).

mod capture;
mod check;
mod clock;
mod context_state;
mod flying;
mod host;
mod in_flight;
mod kept;
mod label;
mod policy;
mod record_and_wait;
mod recorded;
mod repair;
mod stats;
mod step;
mod stream_state;
#[cfg(test)]
mod tests;
mod touch;
mod tracker;

pub use crate::ground::race::{Race, RaceOp};
pub(crate) use capture::CaptureOrder;
pub(crate) use check::before_enqueue;
pub(crate) use clock::VectorClock;
pub(crate) use context_state::{ContextOrder, forget};
pub(crate) use host::{completed, event_point, stream_point};
pub(crate) use in_flight::InFlight;
pub(crate) use kept::KeptPoint;
pub use label::labelled;
pub use policy::{ORDERING_SETTING, OrderPolicy};
pub(crate) use policy::{initial_policy, policy_from_env};
pub(crate) use record_and_wait::{Point, record_point, recorded, waited};
pub(crate) use recorded::EventOrder;
pub use repair::offer_mark;
pub use stats::OrderStats;
pub(crate) use stream_state::TrackedStream;
pub(crate) use touch::{Touch, Touches};
