//! An event's record and a wait for it: the point of its stream that a
//! record covers ([`record_point`], [`recorded`]), and what a wait for the
//! record teaches the waiting stream ([`waited`]).

use super::clock::{self, VectorClock};
#[cfg(test)]
use super::kept::still_kept;
use super::kept::{KeptPoint, THIS_THREAD, kept_point, still_kept_by};
use super::stream_state::StreamState;
use crate::objects::event::Event;
use crate::objects::stream::Stream;

/// What a record of an event on `stream` will cover, taken just before the
/// driver records it (work queued after this point is not covered).
#[inline]
pub(crate) fn record_point(stream: &Stream) -> Option<Point> {
    if !stream.context().order.is_on() {
        return None;
    }
    if let Some(kept) = kept_point(stream) {
        return Some(Point::Kept(kept));
    }
    // A record captured into a graph happens at each replay, not now: it
    // carries the stream's clock within the graph, never its own.
    let state = stream.order.lock();
    if let Some(captured) = &state.captured {
        return Some(Point::Taken(captured.clone(), true));
    }
    Some(Point::Taken(stream.order.snapshot_settling(state), false))
}

/// What a record covers ([`record_point`]).
pub(crate) enum Point {
    /// The point this thread kept of the stream ([`KeptPoint`]), still
    /// where it was kept: the record is written from there, not copied out
    /// first (an eager point).
    Kept(KeptPoint),
    /// A clock taken from the stream, and whether it was captured.
    Taken(VectorClock, bool),
}

impl Point {
    /// The clock and whether it was captured (for tests: the kept point
    /// copied out).
    #[cfg(test)]
    pub(super) fn taken(self) -> (VectorClock, bool) {
        match self {
            Point::Taken(clock, captured) => (clock, captured),
            Point::Kept(kept) => {
                assert!(still_kept(&kept), "the kept point changed");
                (THIS_THREAD.with(|t| t.clock(clock::Flat::clock)), false)
            }
        }
    }
}

/// `event` was recorded at `point` ([`record_point`]); `exclusive`: the caller
/// holds the event's only handle, so no other record can overlap this one
/// ([`Event::record_counted`]). Whether the record was written from the kept
/// point of `point`: while this thread keeps it
/// ([`learn_kept`](super::kept::learn_kept)), it is what the record says. (A
/// flag, not the point: most callers drop it, and a point handed back costs a
/// copy each.)
#[inline]
pub(crate) fn recorded(event: &Event, point: Option<&Point>, exclusive: bool) -> bool {
    // By reference: under `Off` (`None`) nothing is moved.
    match point {
        None => false,
        Some(Point::Taken(clock, captured)) => {
            event.order.set(clock, *captured, exclusive);
            false
        }
        Some(Point::Kept(kept)) => THIS_THREAD.with(|this| {
            if still_kept_by(this, kept) {
                this.clock(|flat| event.order.set_flat(flat, exclusive));
                true
            } else {
                // The thread kept another point since the record's (none
                // of its enqueues runs inside a record's driver call, so
                // this does not happen): a record that knows nothing of
                // the stream is true of any point of it.
                event
                    .order
                    .set(&VectorClock::new(kept.stream), false, exclusive);
                false
            }
        }),
    }
}

/// `stream` was made to wait for `event`.
#[inline]
pub(crate) fn waited(stream: &Stream, event: &Event) {
    if stream.context().order.is_on() {
        // Read without a lock (`recorded.rs`), as plain data when its
        // entries are inline (the common case), then learnt under the
        // stream's.
        let mut flat = clock::Flat::EMPTY;
        match event.order.read_flat(&mut flat) {
            None => {}
            Some(Some(captured)) => {
                if let Some(clock) = taught_by_wait(&mut stream.order.lock(), captured) {
                    clock.learn_flat(&flat);
                }
            }
            Some(None) => waited_spilled(stream, event),
        }
    }
}

/// [`waited`] for a record too large to keep inline.
#[cold]
#[inline(never)]
fn waited_spilled(stream: &Stream, event: &Event) {
    {
        let mut snapshot = VectorClock::new(0);
        let Some(captured) = event.order.read_into(&mut snapshot) else {
            return;
        };
        if let Some(clock) = taught_by_wait(&mut stream.order.lock(), captured) {
            clock.learn(&snapshot);
        }
    }
}

/// The clock of a stream that a wait for a record teaches (`captured`:
/// the record was made in a capture): its clock within its capture, or
/// its own for an eager record; `None` for a mix, which
/// `Stream::wait_event` refuses before it gets here.
#[inline(always)]
fn taught_by_wait(state: &mut StreamState, captured: bool) -> Option<&mut VectorClock> {
    match (&mut state.captured, captured) {
        (Some(within), true) => Some(within),
        (None, false) => Some(&mut state.clock),
        _ => None,
    }
}
