//! A step in flight: checked and recorded, its driver call being made
//! ([`InFlight`]).

use super::kept::land_kept;
use crate::objects::stream::Stream;

/// A step checked and recorded by [`before_enqueue`](super::before_enqueue)
/// whose driver call is being made: keep it until the call returns (or fails).
/// The slot of [`TrackedStream::flying`](super::TrackedStream::flying) holding the
/// step, or `None` when it is in
/// [`StreamState::in_flight`](super::stream_state::StreamState::in_flight).
#[must_use = "the step is in flight until this is dropped, after the driver call"]
pub(crate) struct InFlight<'s>(pub(super) Option<(&'s Stream, u32, Option<u8>)>);

impl InFlight<'_> {
    /// Nothing in flight (the policy is `Off`).
    pub(crate) const NONE: InFlight<'static> = InFlight(None);
}

impl Drop for InFlight<'_> {
    /// Inlined down to one test where nothing is in flight (every enqueue
    /// under `Off`); the landing is out of line.
    #[inline]
    fn drop(&mut self) {
        if self.0.is_some() {
            self.land();
        }
    }
}

impl InFlight<'_> {
    /// The step lands.
    #[inline(never)]
    fn land(&mut self) {
        match self.0 {
            // The driver call returned before the slot is seen free
            // ([`TrackedStream::snapshot_of`]). No lock: only this empties
            // the slot, and only a lock holder fills a free one.
            Some((stream, step, Some(slot))) => {
                stream.order.flying.empty(slot);
                land_kept(stream, step, true);
            }
            // Under the lock, which makes a kept point stale anyway.
            Some((stream, step, None)) => {
                land_kept(stream, step, false);
                stream.order.land(step);
            }
            None => {}
        }
    }
}
