//! Every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of the stages' threads
//! over [`SlotStates`]: a slot has one holder at a time, it goes through the
//! stages in order with each stage seeing the one before's writes, the
//! stages take slots in turn, and a retirement never frees a held slot.
//!
//! Each slot's payload is a loom atomic read and written `Relaxed`: only the
//! protocol's own acquire/release orders them, so a missing edge shows up as
//! a stale read in some interleaving. `holders` counts the threads inside a
//! slot; more than one at once is the bug the protocol exists to prevent.

use super::*;
use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

struct Model {
    states: SlotStates,
    payload: [AtomicU64; 3],
    holders: [AtomicUsize; 3],
}

impl Model {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            states: SlotStates::new(),
            payload: std::array::from_fn(|_| AtomicU64::new(0)),
            holders: std::array::from_fn(|_| AtomicUsize::new(0)),
        })
    }

    /// Claim for `stage` (retrying while the slot is not ready), check the
    /// payload the stage before left, leave `to`, release. The slot index.
    fn step(&self, stage: usize, from: SlotState, expect: u64, to: u64) -> usize {
        let index = loop {
            match self.states.claim(stage, from) {
                Some(index) => break index,
                None => thread::yield_now(),
            }
        };
        assert_eq!(
            self.holders[index].fetch_add(1, Ordering::Relaxed),
            0,
            "slot {index} held twice"
        );
        assert_eq!(
            self.payload[index].load(Ordering::Relaxed),
            expect,
            "slot {index} for {:?}: the stage before's write is not visible",
            from.next()
        );
        self.payload[index].store(to, Ordering::Relaxed);
        self.holders[index].fetch_sub(1, Ordering::Relaxed);
        self.states.release(index, from.next());
        index
    }
}

#[test]
fn loom_a_slot_goes_through_the_stages_in_order_across_threads() {
    loom::model(|| {
        let model = Model::new();
        let upload = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.step(UPLOAD, SlotState::Free, 0, 1))
        };
        // Processing waits for the other thread's upload, and sees its write.
        let process = model.step(PROCESS, SlotState::Uploading, 1, 2);
        let download = model.step(DOWNLOAD, SlotState::Processing, 2, 3);
        assert_eq!((upload.join().unwrap(), process, download), (0, 0, 0));
        assert_eq!(model.states.retire(), Ok(()));
        assert_eq!(model.states.bits(0), SlotState::Free as u8);
        // The stages moved on to slot 1.
        assert_eq!(model.states.claim(PROCESS, SlotState::Uploading), None);
        assert_eq!(model.states.claim(UPLOAD, SlotState::Free), Some(1));
    });
}

#[test]
fn loom_racing_uploaders_take_distinct_slots_in_turn() {
    loom::model(|| {
        let model = Model::new();
        let other = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.step(UPLOAD, SlotState::Free, 0, 1))
        };
        let mine = model.step(UPLOAD, SlotState::Free, 0, 1);
        let theirs = other.join().unwrap();
        let mut taken = [mine, theirs];
        taken.sort_unstable();
        assert_eq!(taken, [0, 1], "each upload took the next slot");
        // Both are uploaded and unheld; the third is still free, and the
        // processing stage starts at slot 0.
        assert_eq!(model.states.bits(0), SlotState::Uploading as u8);
        assert_eq!(model.states.bits(1), SlotState::Uploading as u8);
        assert_eq!(model.states.bits(2), SlotState::Free as u8);
        assert_eq!(model.states.claim(PROCESS, SlotState::Uploading), Some(0));
    });
}

#[test]
fn loom_retiring_never_frees_a_slot_a_download_holds() {
    loom::model(|| {
        let model = Model::new();
        model.step(UPLOAD, SlotState::Free, 0, 1);
        model.step(PROCESS, SlotState::Uploading, 1, 2);
        let download = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.step(DOWNLOAD, SlotState::Processing, 2, 3))
        };
        // Retire as soon as it is allowed; until then it must refuse.
        loop {
            match model.states.retire() {
                Ok(()) => break,
                Err((index, bits)) => {
                    assert_eq!(index, 0);
                    assert!(
                        bits & HELD != 0 || state_of(bits) == SlotState::Processing,
                        "refused only while held or not yet downloaded: {bits:#x}"
                    );
                    thread::yield_now();
                }
            }
        }
        // Freed only after the download let go: its write is visible.
        assert_eq!(model.payload[0].load(Ordering::Relaxed), 3);
        download.join().unwrap();
        assert_eq!(model.states.bits(0), SlotState::Free as u8);
    });
}
