//! Every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of threads putting
//! marks in one [`MarkSlot`] (a record keeping its mark) while another takes
//! the mark out, retrying until the slot is free (a forget): the slot is held
//! by one thread at a time (loom's cell checks every access to the mark),
//! and each mark is dropped exactly once, whether it was handed back (the
//! slot was held), replaced, taken out, or left in the slot to the end.

use super::*;
use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

/// A mark that counts its drops in `drops[id]`.
struct Mark {
    id: usize,
    drops: Arc<[AtomicUsize; 2]>,
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::Relaxed);
    }
}

/// Two records race to keep their marks while a forget takes whatever is
/// kept; then the slot is free, and emptied, every mark is gone once.
#[test]
fn loom_racing_records_and_a_forget_hand_each_mark_on_exactly_once() {
    loom::model(|| {
        let slot = Arc::new(MarkSlot::<Mark>::default());
        let drops: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
        let records: Vec<_> = (0..2)
            .map(|id| {
                let (slot, drops) = (Arc::clone(&slot), Arc::clone(&drops));
                thread::spawn(move || {
                    // Replaced, or handed back: dropped after the slot is free.
                    drop(slot.replace(Some(Mark { id, drops })));
                })
            })
            .collect();
        // `Stream::forget_latest_mark`: retries until the slot is free.
        drop(slot.take());
        for record in records {
            record.join().unwrap();
        }
        let left = slot
            .try_with(Option::take)
            .expect("the slot is free once every thread let go");
        drop(left);
        for (id, drops) in drops.iter().enumerate() {
            assert_eq!(
                drops.load(Ordering::Relaxed),
                1,
                "mark {id} dropped that many times"
            );
        }
    });
}

/// A reader (a fork looking at the mark) and a record at once: the reader
/// sees no mark or the whole mark, and the slot is free after both.
#[test]
fn loom_a_reader_and_a_record_never_hold_the_slot_together() {
    loom::model(|| {
        let slot = Arc::new(MarkSlot::<Mark>::default());
        let drops: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
        drop(slot.replace(Some(Mark {
            id: 0,
            drops: Arc::clone(&drops),
        })));
        let record = {
            let (slot, drops) = (Arc::clone(&slot), Arc::clone(&drops));
            thread::spawn(move || drop(slot.replace(Some(Mark { id: 1, drops }))))
        };
        if let Some(seen) = slot.try_with(|kept| kept.as_ref().map(|mark| mark.id)) {
            assert!(seen.is_some(), "a mark was kept throughout");
        }
        record.join().unwrap();
        let left = slot.try_with(Option::take).expect("the slot is free");
        let left = left.expect("a mark is kept throughout");
        let (left, kept) = (left.id, left);
        drop(kept);
        // The first mark was replaced (then `left` is 1) or the record found
        // the slot held and handed its own back (then it is 0).
        let other = 1 - left;
        assert_eq!(drops[other].load(Ordering::Relaxed), 1, "mark {other}");
        assert_eq!(drops[left].load(Ordering::Relaxed), 1, "mark {left}");
    });
}
