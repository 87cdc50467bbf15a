//! A kernel's handle for the SM partition it was last launched in, kept on
//! the kernel, so that a launch on a partition's stream finds it without a
//! lock: the partition's table of loaded libraries (`objects/partition.rs`)
//! is behind a `Mutex` that every kernel of the partition shares, and is
//! asked only when this slot misses.
//!
//! Why a hit is sound: partition ids are never reused, and a launch's
//! stream holds its partition. A hit for the stream's partition id
//! therefore names a handle that partition loaded and still holds; a slot
//! left naming a dropped partition matches no live one.
//!
//! Why the id and the handle agree: they are two atomics written under a
//! sequence count (even: settled; odd: a writer is between them), as a
//! seqlock. A reader keeps what it read only when the count was even and
//! unchanged around its reads; a writer that finds another one writing
//! leaves the slot to it (the slot is a cache: the lookup it saves is
//! still correct). Loom checks the protocol (`loom_tests`): a hit is always
//! a pair as one writer wrote it.

use crate::ground::sync::{AtomicU64, Ordering, fence};
use sys::CUfunction;

/// One partition id and the kernel's handle loaded for it (see the
/// module's docs).
#[derive(Default)]
pub(crate) struct PartitionFunction {
    /// Even: `partition` and `function` agree; odd: a writer is between them.
    seq: AtomicU64,
    /// 0: none (partition ids start at 1).
    partition: AtomicU64,
    /// The handle's address (an `AtomicU64`, which the loom shim has for
    /// both std and loom, where it has no `AtomicPtr`).
    function: AtomicU64,
}

impl PartitionFunction {
    /// The handle kept for `partition`, if the slot holds that partition's.
    #[inline]
    pub(crate) fn get(&self, partition: u64) -> Option<CUfunction> {
        let before = self.seq.load(Ordering::Acquire);
        let id = self.partition.load(Ordering::Relaxed);
        let function = self.function.load(Ordering::Relaxed);
        // Orders the two reads above before the count's second read.
        fence(Ordering::Acquire);
        let after = self.seq.load(Ordering::Relaxed);
        (before.is_multiple_of(2) && before == after && id == partition && id != 0)
            .then_some(function as usize as CUfunction)
    }

    /// Keep `function` as the handle for `partition`, unless another thread
    /// is writing the slot right now.
    pub(crate) fn set(&self, partition: u64, function: CUfunction) {
        let seq = self.seq.load(Ordering::Relaxed);
        if !seq.is_multiple_of(2)
            || self
                .seq
                // Acquire: this writer's stores must come after the last
                // writer's (whose even count it read) in every atomic's
                // order, or the slot could settle on one writer's id and
                // the other's handle (loom found it with `Relaxed`).
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // Orders the odd count before the writes below, for a reader that
        // sees either of them.
        fence(Ordering::Release);
        self.partition.store(partition, Ordering::Relaxed);
        self.function
            .store(function as usize as u64, Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn handle(n: u64) -> CUfunction {
        n as usize as CUfunction
    }

    #[test]
    fn a_slot_answers_only_for_the_partition_it_holds() {
        let slot = PartitionFunction::default();
        assert_eq!(slot.get(1), None, "an empty slot");
        slot.set(1, handle(0x10));
        assert_eq!(slot.get(1), Some(handle(0x10)));
        assert_eq!(slot.get(2), None, "another partition misses");
        slot.set(2, handle(0x20));
        assert_eq!(slot.get(1), None, "replaced");
        assert_eq!(slot.get(2), Some(handle(0x20)));
        assert_eq!(slot.get(0), None, "0 is no partition");
    }

    /// Writers keep pairs (n, handle n) while readers read: every hit is
    /// a pair as it was written, never one writer's id with another's
    /// handle; once the writers are done, the last pair is a hit.
    #[test]
    fn concurrent_readers_never_see_a_torn_pair() {
        let slot = PartitionFunction::default();
        let writing = AtomicBool::new(true);
        std::thread::scope(|scope| {
            let writers: Vec<_> = (0..2u64)
                .map(|writer| {
                    let slot = &slot;
                    scope.spawn(move || {
                        for i in 0..100_000u64 {
                            let n = 1 + 2 * i + writer;
                            slot.set(n, handle(n));
                        }
                    })
                })
                .collect();
            for _ in 0..2 {
                let (slot, writing) = (&slot, &writing);
                scope.spawn(move || {
                    while writing.load(Ordering::Relaxed) {
                        let id = slot.partition.load(Ordering::Relaxed);
                        if let Some(function) = slot.get(id) {
                            assert_eq!(function, handle(id), "a torn pair for partition {id}");
                        }
                    }
                });
            }
            for writer in writers {
                writer.join().unwrap();
            }
            writing.store(false, Ordering::Relaxed);
        });
        let last = slot.partition.load(Ordering::Relaxed);
        assert_ne!(last, 0, "no writer kept a pair");
        assert_eq!(slot.get(last), Some(handle(last)));
    }
}
