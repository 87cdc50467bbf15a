//! The enqueue protocol: the one way work gets onto a stream.
//!
//! One call takes the work as a closure and does, in one place, the capture
//! gate ([`gate`]), the context bind, the order check and step, the
//! observers, the driver call, the counters, the use tracking and the
//! stream's latest mark ([`latest_mark`]) ([`protocol`]). Work that runs
//! outside this crate's calls (a collective's NCCL call, work deferred
//! across an NCCL group) goes through the same protocol as a case it knows
//! ([`external`]).
//!
//! What it may import: the ground and the objects. The features above
//! (copies, launches, graphs, futures, interop) call into it; it never names
//! them.

pub(crate) mod external;
pub(crate) mod gate;
pub(crate) mod observers;
pub(crate) mod protocol;

// Graph capture names the protocol's use type by its old path until it moves.
pub(crate) use protocol::Use;
