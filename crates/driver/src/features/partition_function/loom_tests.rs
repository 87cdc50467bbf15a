//! Every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of two writers keeping
//! their pairs in one [`PartitionFunction`] while a reader asks for each
//! partition: a hit is always the handle its partition's writer wrote,
//! never one writer's id with the other's handle, and once the writers are
//! done the pair left in the slot is a hit.

use super::*;
use loom::sync::Arc;
use loom::thread;

fn handle(n: u64) -> CUfunction {
    (0x1000 * n) as usize as CUfunction
}

#[test]
fn loom_a_hit_is_a_pair_as_one_writer_wrote_it() {
    loom::model(|| {
        let slot = Arc::new(PartitionFunction::default());
        let writers: Vec<_> = (1..=2u64)
            .map(|partition| {
                let slot = Arc::clone(&slot);
                thread::spawn(move || slot.set(partition, handle(partition)))
            })
            .collect();
        for partition in 1..=2u64 {
            if let Some(function) = slot.get(partition) {
                assert_eq!(function, handle(partition), "a torn pair");
            }
        }
        for writer in writers {
            writer.join().unwrap();
        }
        let hits: Vec<u64> = (1..=2u64).filter(|&p| slot.get(p).is_some()).collect();
        assert_eq!(hits.len(), 1, "one pair is left in the slot: {hits:?}");
        assert_eq!(slot.get(hits[0]), Some(handle(hits[0])));
    });
}
