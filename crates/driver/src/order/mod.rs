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
//! `docs/ordering.md` describes the model, what is and is not checked, and
//! the cost of each policy.
//!
//! # The files
//!
//! From the bottom up: `clock` (vector clocks), `report` ([`Race`]),
//! `stats` ([`OrderStats`]), `touch` (the bytes an operation touches) and
//! `tracker` (the accesses recorded per byte range) know nothing of the
//! rest. `recorded` is an event's latest record; `policy` the context's
//! [`OrderPolicy`]; `context_state` and `stream_state` what the tracker
//! keeps per context and per stream; `kept` what it keeps per thread;
//! `host` what the host has seen complete; `label` the names in reports.
//! The entry points sit on top: `check` (before each enqueue), `step` (an
//! operation's step taken), `in_flight` (until its driver call returns),
//! `repair` (`Auto`'s waits), `record_and_wait` (an event recorded and
//! waited for) and `capture` (the order within a graph being captured).

mod capture;
mod check;
mod clock;
mod context_state;
mod host;
mod in_flight;
mod kept;
mod label;
mod policy;
mod record_and_wait;
mod recorded;
mod repair;
mod report;
mod stats;
mod step;
mod stream_state;
#[cfg(test)]
mod tests;
mod touch;
mod tracker;

pub(crate) use capture::CaptureOrder;
pub(crate) use check::before_enqueue;
pub(crate) use clock::Clock;
pub(crate) use context_state::{ContextOrder, forget};
pub(crate) use host::{completed, event_point, stream_point};
pub(crate) use in_flight::InFlight;
pub(crate) use kept::KeptPoint;
pub use label::labelled;
pub use policy::{ORDERING_SETTING, OrderPolicy};
pub(crate) use policy::{initial_policy, policy_from_env, refusal_message};
pub(crate) use record_and_wait::{Point, record_point, recorded, waited};
pub(crate) use recorded::EventOrder;
pub use repair::offer_mark;
pub use report::{Race, RaceOp};
pub use stats::OrderStats;
pub(crate) use stream_state::StreamOrder;
pub(crate) use touch::{Touch, Touches};
