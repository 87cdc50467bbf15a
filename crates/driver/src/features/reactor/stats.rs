//! What the reactor tells: its counters ([`ReactorStats`]).

/// Counters of a context's reactor, from
/// [`Reactor::stats`](super::Reactor::stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReactorStats {
    /// Waits whose future is still waiting.
    pub pending: usize,
    /// Slots not free: pending, completed but not yet collected by their
    /// future, and cancelled ones whose write has not landed yet.
    pub slots_in_use: usize,
    /// Slots allocated (mapped pinned memory, grown in chunks of 4096).
    pub slot_capacity: usize,
    /// Waits completed (successfully or with an error).
    pub completed: u64,
    /// Waits that completed with an error.
    pub failed: u64,
    /// Futures dropped before their wait completed.
    pub cancelled: u64,
    /// Streams created to watch events.
    pub watch_streams: usize,
    /// Rounds the thread made over the pending slots.
    pub scans: u64,
    /// Times the thread parked with a timeout while slots were watched:
    /// each ends in a wake-up (its timeout, a new wait, a host function).
    /// Spinning rounds are not parks; see `scans`.
    pub parks: u64,
}
