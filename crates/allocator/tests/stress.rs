//! Many threads allocating on many streams, with every block's contents checked.

mod common;

use common::{XorShift, backends, ctx};
use cuda_streams_allocator::driver::Stream;
use cuda_streams_allocator::{Allocation, StreamOrderedAllocator};
use std::sync::Arc;

const THREADS: usize = 8;
const STREAMS: usize = 4;
const ROUNDS: usize = 150;

/// Each thread keeps up to 6 live allocations on streams shared with other
/// threads, writes a value unique to the allocation into each, and before
/// dropping half of them reads them back (the other half are dropped with
/// their memset possibly still queued): an overlap with any other live block,
/// or a block handed out while a queued write still targets it, shows up as a
/// wrong word.
#[test]
fn many_threads_many_streams_keep_their_data() {
    let ctx = ctx();
    for backend in backends(&ctx) {
        let alloc = Arc::new(StreamOrderedAllocator::with_backend(&ctx, backend).unwrap());
        let streams: Vec<_> = (0..STREAMS).map(|_| Stream::new(&ctx).unwrap()).collect();
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let alloc = Arc::clone(&alloc);
                let streams = streams.clone();
                scope.spawn(move || {
                    let mut rng = XorShift(0x1234_5678_9abc_def1 ^ ((t as u64 + 1) << 32));
                    let mut live: Vec<(Allocation, u32)> = Vec::new();
                    let check = |(a, v): (Allocation, u32)| {
                        let mut back = vec![0u32; a.size() / 4];
                        a.copy_to_host(&mut back).unwrap();
                        assert!(
                            back.iter().all(|&w| w == v),
                            "{backend:?}: block {a:?} lost its value {v:#x}"
                        );
                    };
                    for round in 0..ROUNDS {
                        let words = 1 + match rng.below(10) {
                            0 => rng.below(3 << 20),  // medium/large
                            _ => rng.below(64 << 10), // small
                        } as usize;
                        let stream = &streams[rng.below(STREAMS as u64) as usize];
                        let a = alloc.allocate_for_stream(stream, words * 4).unwrap();
                        let value = (rng.next_u64() as u32) | 1;
                        a.memset_u32_async(value).unwrap();
                        live.push((a, value));
                        if live.len() > 6 || round == ROUNDS - 1 {
                            let victim = rng.below(live.len() as u64) as usize;
                            let entry = live.swap_remove(victim);
                            // Dropped unchecked, its memset may still be
                            // queued: a block handed to another stream too
                            // early would be overwritten by it later.
                            if rng.below(2) == 0 {
                                drop(entry);
                            } else {
                                check(entry);
                            }
                        }
                    }
                    for entry in live {
                        check(entry);
                    }
                });
            }
        });
        let stats = alloc.stats();
        assert_eq!(stats.live_allocations, 0, "{backend:?}: {stats:#?}");
        assert_eq!(stats.allocated_bytes, 0);
        for s in &streams {
            s.synchronize().unwrap();
        }
        assert!(alloc.trim(0).is_ok());
    }
}
