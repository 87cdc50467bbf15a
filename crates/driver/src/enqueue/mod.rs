//! The enqueue protocol: the one way work gets onto a stream.
//!
//! One call takes the work as a closure and does, in one place, the capture
//! gate ([`gate`]), the context bind, the buffers' checks, the order check
//! and step, the observers ([`observers`]), the driver call, the counters,
//! the use tracking and the end of the stream's latest mark
//! ([`protocol`]). The kinds of work differ only where the protocol's
//! `Work` says so: this crate's copies, memsets, launches, callbacks and
//! graph launches are its immediate case; work that another library
//! enqueues (an NCCL collective, a foreign kernel) its external case, now
//! or deferred ([`external`]); raw calls that use no buffer of ours (the
//! result layer's stream-ordered allocations, frees and copies, interop's
//! event records and waits) its raw case ([`raw`]); this crate's own event
//! records and stream waits (`Event::record`, `Stream::wait_event`) its mark
//! kinds ([`event_marks`]), which pass captures.
//!
//! The stream-order tracker ([`order`]) is the protocol's: the protocol runs
//! its check and step. Its per-context, per-stream and per-event state is
//! held by the objects, which therefore name its state types.
//!
//! What it may import: the ground and the objects. The features above
//! (copies, launches, graphs, futures, interop) call into it; it never names
//! them.

pub(crate) mod event_marks;
pub(crate) mod external;
pub(crate) mod gate;
pub(crate) mod observers;
pub mod order;
pub(crate) mod protocol;
pub(crate) mod raw;
