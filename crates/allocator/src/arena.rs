//! One stream's blocks: segments split into blocks, best-fit free lists by
//! size, coalescing with free neighbours. Pure bookkeeping, no driver calls;
//! the caller holds the stream's lock.
//!
//! Blocks freed since the last merge wait in a short list per class before
//! joining the sorted sets: the hit path (free a block, allocate the same
//! size again) then takes an exact fit from that list, which is a best fit,
//! without a sorted-set insert, search and removal. Any other request first
//! moves the list into the sets, so best-fit choices are unchanged.

mod snapshot;

use crate::size::Class;
use driver::IdMap;
use driver::Stream;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A live block: what its handle checks and what its free needs.
pub(crate) struct Live {
    /// Matches the handle's id; a handle whose id no longer matches is dead.
    pub(crate) id: u64,
    pub(crate) requested: usize,
    /// Other streams the block was used on (`record_stream`).
    pub(crate) uses: Vec<Arc<Stream>>,
    /// Views that keep the block from being freed.
    pub(crate) pins: Pins,
}

/// How many views of a live allocation exist, and whether `free_for_stream`
/// freed it meanwhile: its free then waits for the last view to go.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pins {
    pub(crate) views: u32,
    pub(crate) doomed: bool,
}

enum State {
    Free,
    Live(Live),
    /// Freed, waiting for events before it can be reused (or leaked when no
    /// event could prove the end of its uses).
    Pending,
}

struct Block {
    size: usize,
    segment: u64,
    /// Neighbours in the segment by address; 0 = none (no device address is 0).
    prev: u64,
    next: u64,
    class: Class,
    state: State,
    /// The number of the last free merged into this block (0: never used).
    freed_at: u64,
}

/// A segment leaving the arena (to the shared cache or the driver).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) base: u64,
    pub(crate) size: usize,
    pub(crate) class: Class,
}

/// How many recently freed blocks per class wait outside the sorted sets.
const RECENT: usize = 8;

/// One stream's share of the cache.
#[derive(Default)]
pub(crate) struct Arena {
    blocks: IdMap<u64, Block>,
    /// Free blocks by `(size, address)`, per class, except those in `recent`.
    free: [BTreeSet<(usize, u64)>; 2],
    /// Free blocks not yet in `free` (`(size, address)`, at most [`RECENT`]
    /// per class); never holds a fully free segment that `idle` lists, since
    /// only [`Arena::coalesce`] (which empties it first) fills `idle`.
    recent: [Vec<(usize, u64)>; 2],
    segments: IdMap<u64, Segment>,
    /// Fully free segments and the free sequence number that made them so.
    idle: IdMap<u64, u64>,
    /// The number of the last free, so a fence can say which frees it covers.
    free_seq: u64,
    next_id: u64,
    /// Bytes of this arena's segments.
    pub(crate) reserved: usize,
    /// Bytes of its blocks in the `Free` state.
    pub(crate) free_bytes: usize,
    /// Whether a free since the last [`Arena::coalesce`] may have left free
    /// neighbours unmerged.
    dirty: bool,
}

fn slot(class: Class) -> usize {
    match class {
        Class::Small => 0,
        Class::Large => 1,
    }
}

impl Arena {
    /// The best-fitting free block for `rounded` bytes of `class`, split when
    /// the rest is worth keeping, marked live: `(address, block size, id)`.
    pub(crate) fn take(
        &mut self,
        class: Class,
        rounded: usize,
        requested: usize,
    ) -> Option<(u64, usize, u64)> {
        let recent = &mut self.recent[slot(class)];
        let (size, ptr) = match recent.iter().rposition(|&(size, _)| size == rounded) {
            Some(i) => recent.swap_remove(i),
            None => {
                self.flush_recent();
                let set = &mut self.free[slot(class)];
                let found = set.range((rounded, 0)..).next().copied()?;
                set.remove(&found);
                found
            }
        };
        let block = self.blocks.get_mut(&ptr)?;
        if block.prev == 0 && block.next == 0 {
            self.idle.remove(&block.segment);
        }
        self.next_id += 1;
        let id = self.next_id;
        block.state = State::Live(Live {
            id,
            requested,
            uses: Vec::new(),
            pins: Pins::default(),
        });
        let mut taken = size;
        if class.should_split(size, rounded) {
            let rest_ptr = ptr + rounded as u64;
            let rest = Block {
                size: size - rounded,
                segment: block.segment,
                prev: ptr,
                next: block.next,
                class,
                state: State::Free,
                freed_at: block.freed_at,
            };
            let after = block.next;
            block.size = rounded;
            block.next = rest_ptr;
            taken = rounded;
            self.free[slot(class)].insert((rest.size, rest_ptr));
            self.blocks.insert(rest_ptr, rest);
            if after != 0
                && let Some(after) = self.blocks.get_mut(&after)
            {
                after.prev = rest_ptr;
            }
        }
        self.free_bytes -= taken;
        Some((ptr, taken, id))
    }

    /// The live block at `ptr` if its id is `id`.
    pub(crate) fn live_mut(&mut self, ptr: u64, id: u64) -> Option<&mut Live> {
        match self.blocks.get_mut(&ptr) {
            Some(Block {
                state: State::Live(live),
                ..
            }) if live.id == id => Some(live),
            _ => None,
        }
    }

    /// Take the live block at `ptr` (id `id`) out of service: it becomes
    /// pending, and its handle dead; then, if `now` says it has nothing to
    /// wait for, [`Arena::release`] it (one lookup for both). Returns its
    /// record, its size and whether it was released.
    #[inline]
    pub(crate) fn retire_then(
        &mut self,
        ptr: u64,
        id: u64,
        now: impl FnOnce(&Live) -> bool,
    ) -> Option<(Live, usize, bool)> {
        let block = self.blocks.get_mut(&ptr)?;
        match &block.state {
            State::Live(live) if live.id == id => {}
            _ => return None,
        }
        let State::Live(live) = std::mem::replace(&mut block.state, State::Pending) else {
            return None;
        };
        let size = block.size;
        if !now(&live) {
            return Some((live, size, false));
        }
        self.free_seq += 1;
        block.state = State::Free;
        block.freed_at = self.free_seq;
        let class = block.class;
        self.push_free(class, size, ptr);
        Some((live, size, true))
    }

    /// A block that just became free joins the recent list, or the sorted
    /// set when the list is full.
    #[inline]
    fn push_free(&mut self, class: Class, size: usize, ptr: u64) {
        let recent = &mut self.recent[slot(class)];
        if recent.len() < RECENT {
            recent.push((size, ptr));
        } else {
            self.free[slot(class)].insert((size, ptr));
        }
        self.free_bytes += size;
        self.dirty = true;
    }

    /// Move the recent lists into the sorted sets.
    fn flush_recent(&mut self) {
        for (recent, set) in self.recent.iter_mut().zip(&mut self.free) {
            set.extend(recent.drain(..));
        }
    }

    /// Every live block: `(address, id)`.
    pub(crate) fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.blocks
            .iter()
            .filter_map(|(&ptr, block)| match &block.state {
                State::Live(live) => Some((ptr, live.id)),
                _ => None,
            })
            .collect()
    }

    /// Make a retired (pending) block free again. It is not merged with its
    /// neighbours here: that is [`Arena::coalesce`]'s job on the miss path, so
    /// the hit path (allocate and free the same sizes) stays a list push and
    /// pop. Returns its size.
    #[inline]
    pub(crate) fn release(&mut self, ptr: u64) -> usize {
        let Some(block) = self.blocks.get_mut(&ptr) else {
            return 0;
        };
        if !matches!(block.state, State::Pending) {
            return 0;
        }
        self.free_seq += 1;
        block.state = State::Free;
        block.freed_at = self.free_seq;
        let (class, size) = (block.class, block.size);
        self.push_free(class, size, ptr);
        size
    }

    /// Merge every free block with its free neighbours, and note the segments
    /// that became fully free. Returns whether anything merged.
    pub(crate) fn coalesce(&mut self) -> bool {
        if !self.dirty {
            return false;
        }
        self.dirty = false;
        self.flush_recent();
        let mut starts: Vec<u64> = self.free.iter().flatten().map(|&(_, ptr)| ptr).collect();
        starts.sort_unstable();
        let mut merged = false;
        for ptr in starts {
            let Some(block) = self.blocks.get(&ptr) else {
                continue; // absorbed by a free block just below it
            };
            let (mut size, mut next, mut freed_at) = (block.size, block.next, block.freed_at);
            let (class, segment, prev, own) = (block.class, block.segment, block.prev, block.size);
            while let Some(after) = self.blocks.get(&next) {
                if !matches!(after.state, State::Free) {
                    break;
                }
                self.free[slot(class)].remove(&(after.size, next));
                size += after.size;
                freed_at = freed_at.max(after.freed_at);
                let after_next = after.next;
                self.blocks.remove(&next);
                next = after_next;
            }
            if size != own {
                merged = true;
                self.free[slot(class)].remove(&(own, ptr));
                self.free[slot(class)].insert((size, ptr));
                if let Some(block) = self.blocks.get_mut(&ptr) {
                    block.size = size;
                    block.next = next;
                    block.freed_at = freed_at;
                }
                if let Some(after) = self.blocks.get_mut(&next) {
                    after.prev = ptr;
                }
            }
            if prev == 0 && next == 0 {
                self.idle.insert(segment, freed_at);
            }
        }
        merged
    }

    /// Add a segment fresh from the driver or the shared cache: one free block.
    pub(crate) fn adopt(&mut self, segment: Segment) {
        self.blocks.insert(
            segment.base,
            Block {
                size: segment.size,
                segment: segment.base,
                prev: 0,
                next: 0,
                class: segment.class,
                state: State::Free,
                freed_at: 0,
            },
        );
        self.free[slot(segment.class)].insert((segment.size, segment.base));
        self.segments.insert(segment.base, segment);
        // Already proven unused by any stream: any fence covers it.
        self.idle.insert(segment.base, 0);
        self.reserved += segment.size;
        self.free_bytes += segment.size;
    }

    /// What a fence recorded now covers: every free numbered below this
    /// (frees are numbered from 1; segments adopted unused carry 0).
    pub(crate) fn free_seq(&self) -> u64 {
        self.free_seq + 1
    }

    /// Whether any segment is fully free.
    pub(crate) fn has_idle(&self) -> bool {
        !self.idle.is_empty()
    }

    /// Remove and return the fully free segments whose last free is numbered
    /// below `before` (`u64::MAX`: all of them).
    pub(crate) fn remove_idle(&mut self, before: u64) -> Vec<Segment> {
        self.flush_recent();
        let bases: Vec<u64> = self
            .idle
            .iter()
            .filter(|&(_, &seq)| seq < before)
            .map(|(&base, _)| base)
            .collect();
        let mut out = Vec::with_capacity(bases.len());
        for base in bases {
            self.idle.remove(&base);
            let Some(segment) = self.segments.remove(&base) else {
                continue;
            };
            self.blocks.remove(&base);
            self.free[slot(segment.class)].remove(&(segment.size, base));
            self.reserved -= segment.size;
            self.free_bytes -= segment.size;
            out.push(segment);
        }
        out
    }

    /// Segments held.
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The largest free block.
    pub(crate) fn largest_free(&self) -> usize {
        let sorted = self.free.iter().filter_map(|set| set.last());
        sorted
            .chain(self.recent.iter().flatten())
            .map(|&(size, _)| size)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::{MEDIUM_SEGMENT, SMALL_SEGMENT};

    const BASE: u64 = 1 << 32;

    fn arena_with(class: Class, size: usize) -> Arena {
        let mut arena = Arena::default();
        arena.adopt(Segment {
            base: BASE,
            size,
            class,
        });
        arena
    }

    fn free(arena: &mut Arena, (ptr, _, id): (u64, usize, u64)) {
        arena.retire_then(ptr, id, |_| false).expect("live");
        arena.release(ptr);
        arena.coalesce();
    }

    #[test]
    fn split_then_coalesce_back_to_one_block() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let a = arena.take(Class::Small, 512, 100).unwrap();
        let b = arena.take(Class::Small, 1024, 1000).unwrap();
        let c = arena.take(Class::Small, 512, 512).unwrap();
        assert_eq!((a.0, b.0, c.0), (BASE, BASE + 512, BASE + 1536));
        assert!(!arena.has_idle());
        assert_eq!(arena.free_bytes, SMALL_SEGMENT - 2048);
        // Free the middle, then the ends: every order must merge back.
        free(&mut arena, b);
        assert_eq!(arena.largest_free(), SMALL_SEGMENT - 2048);
        free(&mut arena, a);
        assert_eq!(arena.largest_free(), SMALL_SEGMENT - 2048);
        free(&mut arena, c);
        assert_eq!(arena.largest_free(), SMALL_SEGMENT);
        assert!(arena.has_idle());
        assert_eq!(arena.blocks.len(), 1);
        assert!(!arena.coalesce(), "nothing left to merge");
        assert_eq!(arena.free_bytes, SMALL_SEGMENT);
    }

    #[test]
    fn release_defers_merging_to_coalesce() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let a = arena.take(Class::Small, 512, 512).unwrap();
        let b = arena.take(Class::Small, 512, 512).unwrap();
        for (ptr, _, id) in [a, b] {
            arena.retire_then(ptr, id, |_| false).unwrap();
            arena.release(ptr);
        }
        assert!(!arena.has_idle(), "not merged yet");
        assert_eq!(arena.free_bytes, SMALL_SEGMENT);
        assert!(arena.coalesce());
        assert!(arena.has_idle());
        assert_eq!(arena.largest_free(), SMALL_SEGMENT);
        // The segment's last free is b's (the second): a fence taken between
        // the two frees does not cover it.
        assert!(arena.remove_idle(2).is_empty());
        assert_eq!(arena.remove_idle(3).len(), 1);
    }

    #[test]
    fn freed_block_is_reused_best_fit() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let a = arena.take(Class::Small, 4096, 4096).unwrap();
        let _b = arena.take(Class::Small, 512, 512).unwrap();
        free(&mut arena, a);
        // The 4 KiB hole fits better than the rest of the segment.
        let c = arena.take(Class::Small, 2048, 2048).unwrap();
        assert_eq!(c.0, a.0);
    }

    #[test]
    fn large_blocks_keep_small_remainders() {
        let mut arena = arena_with(Class::Large, MEDIUM_SEGMENT);
        let a = arena
            .take(Class::Large, MEDIUM_SEGMENT - (1 << 20), 1)
            .unwrap();
        assert_eq!(a.1, MEDIUM_SEGMENT, "a 1 MiB rest is not split off");
        assert!(arena.take(Class::Large, 2 << 20, 1).is_none());
        assert!(
            arena.take(Class::Small, 512, 1).is_none(),
            "classes never mix"
        );
    }

    #[test]
    fn dead_ids_do_not_match() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let a = arena.take(Class::Small, 512, 512).unwrap();
        free(&mut arena, a);
        let b = arena.take(Class::Small, 512, 512).unwrap();
        assert_eq!(a.0, b.0);
        assert!(arena.live_mut(a.0, a.2).is_none());
        assert!(
            arena.retire_then(a.0, a.2, |_| true).is_none(),
            "an old handle cannot free the new block"
        );
        assert!(arena.live_mut(b.0, b.2).is_some());
    }

    #[test]
    fn recent_frees_serve_exact_fits_and_join_best_fit_otherwise() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let a = arena.take(Class::Small, 4096, 4096).unwrap();
        let b = arena.take(Class::Small, 1024, 1024).unwrap();
        let _c = arena.take(Class::Small, 512, 512).unwrap();
        for (ptr, _, id) in [a, b] {
            arena.retire_then(ptr, id, |_| true).unwrap();
        }
        assert_eq!(arena.recent[0].len(), 2, "both wait outside the sorted set");
        assert_eq!(arena.largest_free(), SMALL_SEGMENT - 5632);
        // An exact fit comes straight from the recent list...
        let again = arena.take(Class::Small, 4096, 1).unwrap();
        assert_eq!(again.0, a.0);
        assert_eq!(arena.recent[0].len(), 1);
        // ...and any other size sees every free block: the freed 1 KiB block
        // is the best fit for 512 bytes, not the segment's tail.
        let d = arena.take(Class::Small, 512, 1).unwrap();
        assert_eq!(d.0, b.0);
        assert!(arena.recent[0].is_empty());
    }

    #[test]
    fn many_frees_overflow_into_the_sorted_set_and_merge_back() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let blocks: Vec<_> = (0..3 * RECENT)
            .map(|_| arena.take(Class::Small, 512, 512).unwrap())
            .collect();
        for &(ptr, _, id) in &blocks {
            let (_, size, released) = arena.retire_then(ptr, id, |_| true).unwrap();
            assert_eq!((size, released), (512, true));
        }
        assert_eq!(arena.recent[0].len(), RECENT);
        assert_eq!(arena.free_bytes, SMALL_SEGMENT);
        assert!(arena.coalesce());
        assert!(arena.recent[0].is_empty());
        assert_eq!(arena.blocks.len(), 1);
        assert_eq!(arena.largest_free(), SMALL_SEGMENT);
        assert!(arena.has_idle());
    }

    #[test]
    fn a_block_that_must_wait_is_not_reusable() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let a = arena.take(Class::Small, 512, 512).unwrap();
        let (_, _, released) = arena.retire_then(a.0, a.2, |_| false).unwrap();
        assert!(!released);
        assert_ne!(arena.take(Class::Small, 512, 512).unwrap().0, a.0);
        assert_eq!(arena.release(a.0), 512);
        assert_eq!(arena.take(Class::Small, 512, 512).unwrap().0, a.0);
    }

    #[test]
    fn idle_segments_leave_by_sequence() {
        let mut arena = arena_with(Class::Small, SMALL_SEGMENT);
        let fence = arena.free_seq();
        let a = arena.take(Class::Small, 512, 512).unwrap();
        free(&mut arena, a);
        assert!(arena.remove_idle(fence).is_empty(), "freed after the fence");
        let gone = arena.remove_idle(u64::MAX);
        assert_eq!(gone.len(), 1);
        assert_eq!(
            (arena.reserved, arena.free_bytes, arena.segment_count()),
            (0, 0, 0)
        );
        assert!(arena.take(Class::Small, 512, 512).is_none());
    }
}
