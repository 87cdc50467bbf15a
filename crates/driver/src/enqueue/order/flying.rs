//! A stream's steps in flight held outside its lock ([`FlyingSlots`]), so
//! that the end of a driver call releases its step with one store instead
//! of a lock. The protocol is loom-checked (`flying/loom_tests.rs`,
//! docs/testing.md).

use crate::ground::sync::{AtomicU32, Ordering};

/// Slots of [`FlyingSlots`]: more than the threads that enqueue on one
/// stream at once in any program seen so far.
pub(super) const FLYING: usize = 3;

/// Steps checked and recorded whose driver call has not returned yet, one
/// per slot; 0 is a free slot (steps start at 1). A fourth concurrent
/// enqueue on one stream goes to
/// [`StreamState::in_flight`](super::stream_state::StreamState::in_flight),
/// under the lock.
///
/// The protocol, on which a point's soundness rests (a point taken while a
/// step's driver call is being made must not cover it):
/// - only the holder of the stream's lock fills a slot ([`FlyingSlots::fill`]),
///   and only one it read free, so a slot is never handed to two steps;
/// - only the step's [`InFlight`](super::InFlight) empties it
///   ([`FlyingSlots::empty`], Release), after the driver call returned;
/// - a slot read free (Acquire) was emptied after its driver call returned,
///   so whatever the reader queues next is queued after that call; a slot
///   read busy keeps its step out of a point ([`FlyingSlots::lowest`]).
#[derive(Default)]
pub(super) struct FlyingSlots([AtomicU32; FLYING]);

impl FlyingSlots {
    /// Put `step` (not 0) in a free slot, with the stream's lock held: the
    /// slot, or `None` when every slot is taken; and whether a slot held a
    /// step then. One look at each slot.
    #[inline]
    pub(super) fn fill(&self, step: u32) -> (Option<u8>, bool) {
        debug_assert_ne!(step, 0, "0 marks a free slot");
        // Acquire, as in `lowest`. Slots are filled only under the lock, so
        // one seen free stays free until filled below; one seen busy that
        // was just emptied only costs the fallback. Each slot loaded once,
        // with no loop: the common case (all free) is a few instructions.
        let [a, b, c] = &self.0;
        let slots = [
            a.load(Ordering::Acquire),
            b.load(Ordering::Acquire),
            c.load(Ordering::Acquire),
        ];
        let busy = (slots[0] | slots[1] | slots[2]) != 0;
        let slot = match slots.iter().position(|&s| s == 0) {
            Some(i) => {
                // Relaxed: the lock's release publishes it to the next
                // holder, and an emptier only ever writes it.
                self.0[i].store(step, Ordering::Relaxed);
                Some(i as u8)
            }
            None => None,
        };
        (slot, busy)
    }

    /// `slot`'s step is no longer in flight: its driver call returned. Only
    /// that step's [`InFlight`](super::InFlight) calls this, without the
    /// lock.
    #[inline]
    pub(super) fn empty(&self, slot: u8) {
        // Release: the driver call returned before the slot is seen free.
        self.0[usize::from(slot)].store(0, Ordering::Release);
    }

    /// The lowest step in a slot, with the stream's lock held (`None` when
    /// every slot is free): a point taken now covers only the steps below
    /// it and below those beyond the slots.
    #[inline]
    pub(super) fn lowest(&self) -> Option<u32> {
        // Acquire: a slot seen free was emptied after its driver call
        // returned, so whatever the caller queues next is queued after it.
        // A free slot (0) reads as the highest step: one `min` per slot.
        let lowest = self
            .0
            .iter()
            .map(|s| s.load(Ordering::Acquire).wrapping_sub(1))
            .fold(u32::MAX, u32::min);
        // Steps start at 1, so no step reads as `u32::MAX` here.
        (lowest != u32::MAX).then(|| lowest + 1)
    }

    /// Whether `step` (not 0) is in a slot, with the stream's lock held.
    #[inline]
    pub(super) fn holds(&self, step: u32) -> bool {
        self.0.iter().any(|s| s.load(Ordering::Acquire) == step)
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
