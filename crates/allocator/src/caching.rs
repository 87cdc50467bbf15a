//! The caching backend: per-stream hits, cross-stream hand-off of proven-free
//! segments, growth from the driver, and out-of-memory recovery.
//!
//! Cross-stream reuse is by proof, not by `cuStreamWaitEvent`: a fully free
//! segment leaves stream S for the shared cache only once S is idle
//! (`cuStreamQuery`) or a fence event recorded on S after the free has
//! completed (S's fences are a driver completion trail). Fences are recorded
//! lazily, when another stream misses, so a free on the hit path makes no
//! driver call. RMM's hand-off (the new stream
//! waits on an event of the old one) would reuse memory sooner but make the
//! new stream wait for all of S's queued work, a false dependency this
//! allocator never introduces; memory held by a busy stream is reclaimed by
//! waiting only when the alternative is failing with out-of-memory.

use crate::arena::Segment;
use crate::error::{Error, Result};
use crate::shared::{Fence, PendingFree, Shared, Slot, SlotState, is_oom};
use crate::size::{Class, segment_size};
use driver::{Stream, TrailSearch};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Growth gives cached, unusable segments back while the reserve would
/// exceed this multiple of the live bytes.
const GROWTH_BUDGET: f64 = 1.25;

/// What an allocation got: `(address, block size, id)`.
pub(crate) type Block = (u64, usize, u64);

impl Shared {
    /// Serve `bytes` (rounded to `rounded`) on `slot`'s stream.
    pub(crate) fn caching_allocate(
        &self,
        slot: &Arc<Slot>,
        bytes: usize,
        rounded: usize,
    ) -> Result<Block> {
        let class = Class::of(rounded);
        {
            let mut st = slot.lock();
            // The oldest free still waiting for another stream comes back as
            // soon as that stream is done, not at the next miss: one event
            // query per allocation while one waits (frees settle in order).
            settle_oldest(&mut st);
            // A hit: the stream's own lists serve it, directly or once its
            // free blocks are merged and its settled frees released.
            let own = match st.arena.take(class, rounded, bytes) {
                Some(block) => Some(block),
                None => retry_own(&mut st, class, rounded, bytes),
            };
            if let Some(block) = own {
                st.counts.hits += 1;
                return Ok(self.served(&mut st, block, bytes));
            }
            st.counts.misses += 1;
            if let Some(block) = self.adopt_cached(&mut st, class, rounded, bytes) {
                return Ok(block);
            }
        }
        // Other streams' fully free segments, where their streams have passed
        // the frees. No lock of ours is held meanwhile.
        self.harvest_all(Some(slot.stream.id()), false);
        {
            let mut st = slot.lock();
            if let Some(block) = self.retry_local(&mut st, class, rounded, bytes) {
                return Ok(block);
            }
        }
        let segment = segment_size(rounded).ok_or(Error::TooLarge {
            requested: bytes,
            total: self.total_memory,
            stream: slot.stream.id(),
        })?;
        self.make_room(slot, segment, rounded);
        match self.grow(slot, class, segment, rounded, bytes) {
            Err(err) if is_oom(&err) => {}
            other => return other,
        }
        // Out of memory: give every cached segment back, waiting for streams
        // where that is what it takes, then retry.
        self.release_cache(true, 0);
        self.counters.oom_recoveries.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = slot.lock();
            if let Some(block) = self.retry_local(&mut st, class, rounded, bytes) {
                return Ok(block);
            }
        }
        let mut result = self.grow(slot, class, segment, rounded, bytes);
        if segment > rounded && matches!(&result, Err(err) if is_oom(err)) {
            // The request itself may still fit where its usual segment does not.
            result = self.grow(slot, class, rounded, rounded, bytes);
        }
        match result {
            Err(err) if is_oom(&err) => Err(Error::OutOfMemory {
                requested: bytes,
                reserved: self.counters.reserved.load(Ordering::Relaxed),
                free: self.free_device_memory(),
            }),
            other => other,
        }
    }

    #[inline]
    fn served(&self, st: &mut SlotState, block: Block, bytes: usize) -> Block {
        st.counts.add(block.1, bytes);
        self.counters.allocated(block.1);
        block
    }

    /// The stream's own lists (after merging and settling), then the shared cache.
    fn retry_local(
        &self,
        st: &mut SlotState,
        class: Class,
        rounded: usize,
        bytes: usize,
    ) -> Option<Block> {
        if let Some(block) = retry_own(st, class, rounded, bytes) {
            return Some(self.served(st, block, bytes));
        }
        self.adopt_cached(st, class, rounded, bytes)
    }

    /// A fully free segment from the shared cache, adopted by this stream.
    fn adopt_cached(
        &self,
        st: &mut SlotState,
        class: Class,
        rounded: usize,
        bytes: usize,
    ) -> Option<Block> {
        let segment = {
            let mut cache = self.lock_cache();
            let found = match class {
                Class::Small => cache
                    .range((Class::Small, 0, 0)..(Class::Large, 0, 0))
                    .next(),
                Class::Large => cache.range((Class::Large, rounded, 0)..).next(),
            }
            .copied()?;
            cache.remove(&found);
            found
        };
        st.arena.adopt(Segment {
            class: segment.0,
            size: segment.1,
            base: segment.2,
        });
        let block = st.arena.take(class, rounded, bytes)?;
        Some(self.served(st, block, bytes))
    }

    /// Before growing by `segment` bytes: if the reserve would exceed
    /// [`GROWTH_BUDGET`] times what is live, give proven-free cached segments
    /// (none of which fits this request, or it would have been served) back
    /// to the driver first. Growth already costs a `cuMemAlloc`; a few
    /// `cuMemFree`s of unusable memory keep the reserve close to the live set.
    fn make_room(&self, slot: &Slot, segment: usize, rounded: usize) {
        let over = || {
            let reserved = self.counters.reserved.load(Ordering::Relaxed) + segment;
            let live = self.counters.allocated.load(Ordering::Relaxed) + rounded;
            reserved as f64 > live as f64 * GROWTH_BUDGET
        };
        if !over() {
            return;
        }
        // This stream's own fully free segments are candidates too.
        self.harvest(slot, false);
        while over() {
            let Some(largest) = self.lock_cache().pop_last_largest() else {
                break;
            };
            self.driver_free(largest);
        }
    }

    /// A new segment of `size` bytes from the driver, serving the request.
    fn grow(
        &self,
        slot: &Slot,
        class: Class,
        size: usize,
        rounded: usize,
        bytes: usize,
    ) -> Result<Block> {
        let base = self.driver_alloc(size)?;
        let mut st = slot.lock();
        st.arena.adopt(Segment { base, size, class });
        let block = st
            .arena
            .take(class, rounded, bytes)
            .expect("a fresh segment of at least the rounded size serves it");
        Ok(self.served(&mut st, block, bytes))
    }

    /// The handle of block `ptr` (id `id`) was dropped or freed by
    /// `free_for_stream`: return it to its stream's lists, after the events
    /// its other uses need. A dead handle (id no longer matching) is a no-op.
    pub(crate) fn caching_free(&self, st: &mut SlotState, ptr: u64, id: u64) {
        // With no other uses and no dependencies, stream order makes the block
        // safe to reuse on this stream at once.
        let no_deps = st.deps.is_empty();
        let Some((live, size, released)) = st
            .arena
            .retire_then(ptr, id, |live| no_deps && live.uses.is_empty())
        else {
            return;
        };
        st.counts.sub(size, live.requested);
        self.counters.freed(size);
        if released {
            return;
        }
        match self.waits_for(&live.uses, &st.deps) {
            Some(waits) if waits.is_empty() => {
                st.arena.release(ptr);
            }
            Some(waits) => st.pending.push(PendingFree { ptr, waits }),
            // Stays pending with nothing to wait for: never reused.
            None => {}
        }
    }

    /// Move `slot`'s proven-free segments to the shared cache; with `block`,
    /// wait for the stream so that all of them are proven.
    pub(crate) fn harvest(&self, slot: &Slot, block: bool) {
        let segments = self.proven_segments(&slot.stream, &mut slot.lock(), block);
        if segments.is_empty() {
            return;
        }
        self.counters
            .handoffs
            .fetch_add(segments.len() as u64, Ordering::Relaxed);
        let mut cache = self.lock_cache();
        for s in segments {
            cache.insert((s.class, s.size, s.base));
        }
    }

    /// Take the fully free segments of `stream`'s state that are proven
    /// unused (the stream idle, or a fence passed; with `block`, wait for the
    /// stream), recording a fence for the rest.
    pub(crate) fn proven_segments(
        &self,
        stream: &Stream,
        st: &mut SlotState,
        block: bool,
    ) -> Vec<Segment> {
        if !st.pending.is_empty() {
            settle_pending(st, block);
        }
        st.arena.coalesce();
        if !st.arena.has_idle() {
            return Vec::new();
        }
        // The newest fence passed proves every free below its number. A
        // failed query proves nothing (the blocks wait: safe).
        let passed = st
            .fences
            .passed(TrailSearch::Exact, |fence| Some(&*fence.event))
            .unwrap_or(0);
        let mut proven = st.fences.take_front(passed).last().map_or(0, |f| f.seq);
        if matches!(stream.query(), Ok(true)) || (block && stream.synchronize().is_ok()) {
            proven = u64::MAX;
        }
        let segments = st.arena.remove_idle(proven);
        if st.arena.has_idle() && st.fences.is_empty() {
            let seq = st.arena.free_seq();
            match self.record_on(stream) {
                Ok(event) => st.fences.push(Fence { event, seq }),
                Err(err) => tracing::warn!("fence on stream {}: {err}", stream.id()),
            }
        }
        segments
    }

    /// [`Shared::harvest`] every stream but `except`.
    pub(crate) fn harvest_all(&self, except: Option<u64>, block: bool) {
        for slot in self.all_slots() {
            if Some(slot.stream.id()) != except {
                self.harvest(&slot, block);
            }
        }
    }

    /// Harvest every stream, then give cached segments back to the driver,
    /// largest first, until at most `keep` cached bytes (reserved but not
    /// allocated) remain. Returns the bytes given back.
    pub(crate) fn release_cache(&self, block: bool, keep: usize) -> usize {
        self.harvest_all(None, block);
        let mut released = 0;
        loop {
            let reserved = self.counters.reserved.load(Ordering::Relaxed);
            let allocated = self.counters.allocated.load(Ordering::Relaxed);
            if reserved.saturating_sub(allocated) <= keep {
                break;
            }
            let Some(last) = self.lock_cache().pop_last_largest() else {
                break;
            };
            self.driver_free(last);
            released += last.size;
        }
        released
    }

    pub(crate) fn lock_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<(Class, usize, u64)>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Merge the stream's free blocks and release its settled frees, then try
/// its lists again.
fn retry_own(st: &mut SlotState, class: Class, rounded: usize, bytes: usize) -> Option<Block> {
    let settled = !st.pending.is_empty() && settle_pending(st, false) > 0;
    if st.arena.coalesce() || settled {
        st.arena.take(class, rounded, bytes)
    } else {
        None
    }
}

/// Largest-first removal from the shared cache.
trait PopLargest {
    fn pop_last_largest(&mut self) -> Option<Segment>;
}

impl PopLargest for std::collections::BTreeSet<(Class, usize, u64)> {
    fn pop_last_largest(&mut self) -> Option<Segment> {
        let largest = *self.iter().max_by_key(|(_, size, _)| *size)?;
        self.remove(&largest);
        Some(Segment {
            class: largest.0,
            size: largest.1,
            base: largest.2,
        })
    }
}

/// Release the oldest pending block if its events have completed.
#[inline]
fn settle_oldest(st: &mut SlotState) {
    let Some(oldest) = st.pending.first() else {
        return;
    };
    if oldest.waits.iter().all(|wait| wait.done(false)) {
        let free = st.pending.remove(0);
        st.arena.release(free.ptr);
    }
}

/// Release the pending blocks whose events have completed (with `block`,
/// wait for them). Returns how many were released.
pub(crate) fn settle_pending(st: &mut SlotState, block: bool) -> usize {
    let pending = std::mem::take(&mut st.pending);
    let mut released = 0;
    for free in pending {
        if free.waits.iter().all(|wait| wait.done(block)) {
            st.arena.release(free.ptr);
            released += 1;
        } else {
            st.pending.push(free);
        }
    }
    released
}
