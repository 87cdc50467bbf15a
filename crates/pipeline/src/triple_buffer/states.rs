//! The slots' state protocol: which thread may hold which slot, for which
//! stage, and which slot each stage takes next. Nothing here touches a
//! buffer, so loom can check every interleaving of it (`loom_tests`,
//! `RUSTFLAGS="--cfg loom"`, see docs/testing.md); [`super::GpuTripleBuffer`]
//! pairs it with the buffers.

use super::SlotState;
use crate::sync::{AtomicU8, AtomicU64, Ordering};

/// Set in a slot's byte while a guard owns the slot's current stage.
pub(super) const HELD: u8 = 0x80;
const STATE_MASK: u8 = 0x03;

/// Which cursor a stage moves.
pub(super) const UPLOAD: usize = 0;
pub(super) const PROCESS: usize = 1;
pub(super) const DOWNLOAD: usize = 2;
const RETIRE: usize = 3;

/// The stage in a slot's byte.
pub(super) fn state_of(bits: u8) -> SlotState {
    match bits & STATE_MASK {
        0 => SlotState::Free,
        1 => SlotState::Uploading,
        2 => SlotState::Processing,
        _ => SlotState::Downloading,
    }
}

/// Three slots' stages, one atomic byte each, and the stages' cursors.
pub(super) struct SlotStates {
    states: [AtomicU8; 3],
    /// Monotonic stage cursors: the next upload, process, download and
    /// retirement take slot `cursor % 3`. Only the thread that owns that
    /// slot's transition moves a cursor.
    cursors: [AtomicU64; 4],
}

impl SlotStates {
    /// Every slot `Free`, every cursor at slot 0.
    pub(super) fn new() -> Self {
        Self {
            states: std::array::from_fn(|_| AtomicU8::new(SlotState::Free as u8)),
            cursors: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Hold the slot at stage `stage`'s cursor if it is in `from` and
    /// unheld, moving it to `from.next()`: its index, or `None`.
    pub(super) fn claim(&self, stage: usize, from: SlotState) -> Option<usize> {
        let cursor = self.cursors[stage].load(Ordering::Acquire);
        let index = (cursor % 3) as usize;
        let state = &self.states[index];
        let to = from.next();
        state
            .compare_exchange(
                from as u8,
                to as u8 | HELD,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .ok()?;
        // Our read of the cursor may be stale: another thread may have taken
        // this slot at an earlier turn and moved the cursor past it since.
        // Only the holder of the cursor's slot moves the cursor, so if it
        // still reads `cursor` now, this slot really is the stage's next one.
        if self.cursors[stage]
            .compare_exchange(cursor, cursor + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Undo: nobody else can touch a held slot, so this cannot fail.
            let _ = state.compare_exchange(
                to as u8 | HELD,
                from as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return None;
        }
        Some(index)
    }

    /// Let go of slot `index`, held for `stage`: the next stage may take it.
    pub(super) fn release(&self, index: usize, stage: SlotState) {
        // Only the holder can clear HELD, so this always succeeds.
        let _ = self.states[index].compare_exchange(
            stage as u8 | HELD,
            stage as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Return the oldest downloaded slot to `Free` and rotate; when that
    /// slot is not downloaded (or is still held), its index and byte.
    pub(super) fn retire(&self) -> Result<(), (usize, u8)> {
        let cursor = self.cursors[RETIRE].load(Ordering::Acquire);
        let index = (cursor % 3) as usize;
        match self.states[index].compare_exchange(
            SlotState::Downloading as u8,
            SlotState::Free as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.cursors[RETIRE].store(cursor + 1, Ordering::Release);
                Ok(())
            }
            Err(actual) => Err((index, actual)),
        }
    }

    /// Slot `index`'s byte (a snapshot: other threads may move on).
    pub(super) fn bits(&self, index: usize) -> u8 {
        self.states[index].load(Ordering::Acquire)
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
