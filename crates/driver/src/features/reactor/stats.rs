//! What the reactor tells: its counters ([`ReactorStats`]).

/// Counters of a context's reactor, from
/// [`Reactor::stats`](super::Reactor::stats).
///
/// ```
/// use cuda_streams_driver::Context;
/// let ctx = Context::new(0).unwrap();
/// let stats = ctx.reactor().stats();
/// // One line for logs and reports:
/// let line = stats.to_string();
/// let head = format!("reactor: {} pending, {} completed", stats.pending, stats.completed);
/// assert!(line.starts_with(&head), "{line}");
/// let slots = format!("slots {} of {} in use", stats.slots_in_use, stats.slot_capacity);
/// assert!(line.contains(&slots), "{line}");
/// ```
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

impl std::fmt::Display for ReactorStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "reactor: {} pending, {} completed ({} failed), {} cancelled; \
             slots {} of {} in use; {} watch stream(s), {} scan(s), {} park(s)",
            self.pending,
            self.completed,
            self.failed,
            self.cancelled,
            self.slots_in_use,
            self.slot_capacity,
            self.watch_streams,
            self.scans,
            self.parks
        )
    }
}
