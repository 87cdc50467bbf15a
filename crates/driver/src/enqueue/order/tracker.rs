//! The accesses recorded per byte range: for each range, the last write and
//! the reads since it that are not yet known to be ordered (FastTrack's
//! shadow state, over byte ranges instead of words).
//!
//! Disjoint segments keyed by start address. Most operations use a whole
//! buffer the same way each time, so the common case finds the one segment
//! spanning the range (one hash lookup, whatever the number of buffers)
//! and updates it in place, allocating nothing; an ordered index of the
//! segments' bounds serves the ranges that are not one whole segment.

use super::clock::{Agent, Knows};
use super::stats::OrderStats;
use super::touch::Touch;
use crate::ground::id_hash::IdMap;
use crate::objects::stream::Stream;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// An access by one operation, and how a report names it. Small and free of
/// reference counts but the label's (operations without one, the common
/// case, touch no atomic when recorded or overwritten).
#[derive(Clone, Debug)]
pub(crate) struct Access {
    /// The stream (its id), whose step `counter` the access is.
    pub(crate) agent: Agent,
    pub(crate) counter: u32,
    pub(crate) device: i32,
    pub(crate) what: &'static str,
    pub(crate) label: Option<Arc<str>>,
}
impl Access {
    /// Become `other`, in place: the label's reference count is touched
    /// only when the label changes (a loop's operations share one), and
    /// nothing is dropped when neither has one.
    #[inline(always)]
    fn assign(&mut self, other: &Access) {
        self.agent = other.agent;
        self.counter = other.counter;
        self.device = other.device;
        self.what = other.what;
        match (&self.label, &other.label) {
            (None, None) => {}
            (Some(mine), Some(theirs)) if Arc::ptr_eq(mine, theirs) => {}
            _ => self.label.clone_from(&other.label),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Segment {
    end: u64,
    write: Option<Access>,
    reads: Vec<Access>,
}

/// A prior access that the new one conflicts with.
pub(crate) struct Conflict<'a> {
    pub(crate) prior: &'a Access,
    pub(crate) prior_writes: bool,
    pub(crate) from: u64,
    pub(crate) to: u64,
}

/// The shadow state of one context's memory.
#[derive(Default)]
pub(crate) struct Shadow {
    /// The segments by start address: a range that is one whole segment is
    /// one hash lookup away.
    segments: IdMap<u64, Segment>,
    /// Each segment's start and end, in address order: for ranges that are
    /// not one whole segment. Changed with `segments`, always.
    bounds: BTreeMap<u64, u64>,
    /// Bumped by every change: a repair that finds it unchanged after its
    /// waits knows no new access arrived meanwhile.
    version: u64,
    /// The streams whose accesses are recorded here, for `Auto` to order a
    /// later stream after one (an access keeps only the id).
    streams: IdMap<Agent, Weak<Stream>>,
    /// The table's size at which the next join sweeps out dead streams.
    sweep_at: usize,
    /// Races found and waits inserted in this context: counted under the
    /// lock every operation takes anyway, rather than by atomic
    /// read-modify-writes of their own.
    pub(crate) stats: OrderStats,
}

impl Shadow {
    /// The version, which every change bumps.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Register `stream` as the holder of its id's accesses here (once per
    /// stream and shadow). Streams that are gone are dropped from the table
    /// whenever it has doubled since the last sweep, so it stays in
    /// proportion to the live streams.
    pub(crate) fn join(&mut self, stream: &Stream) {
        if self.streams.len() >= self.sweep_at {
            self.streams.retain(|_, s| s.strong_count() > 0);
            self.sweep_at = (2 * self.streams.len()).max(64);
        }
        self.streams.insert(stream.id(), stream.weak());
    }

    /// The stream whose accesses carry `agent`, if it is still alive.
    pub(crate) fn stream(&self, agent: Agent) -> Weak<Stream> {
        self.streams.get(&agent).cloned().unwrap_or_default()
    }

    /// The stream whose accesses carry `agent`, held, if it is still alive.
    pub(crate) fn live_stream(&self, agent: Agent) -> Option<Arc<Stream>> {
        self.streams.get(&agent).and_then(Weak::upgrade)
    }

    /// The fast path of an operation whose ranges were each used whole
    /// before (the common case: buffers used the same way each time):
    /// check the new access against the one segment spanning exactly each
    /// range and, when none conflicts, record it in each; for one range in
    /// one lookup, and with no call per range. `None` when some range is
    /// not one whole segment (then use [`Shadow::conflicts`] and
    /// [`Shadow::record`]; `race` may have been called for the ranges
    /// before it). `Some(false)` when the access conflicts: nothing is
    /// recorded, in any range, and `race` has been called with the stream
    /// and step of each access it conflicts with. Inline: the operation's
    /// fast path is this and little else.
    #[inline(always)]
    pub(crate) fn record_exact_or_races(
        &mut self,
        touches: &[Touch],
        access: &Access,
        clock: &impl Knows,
        mut race: impl FnMut(Agent, u32),
    ) -> Option<bool> {
        let mut any = false;
        let mut found = |conflict: Conflict<'_>| {
            any = true;
            race(conflict.prior.agent, conflict.prior.counter);
        };
        if let [touch] = touches {
            let (lo, hi) = touch.range();
            let segment = self.segments.get_mut(&lo).filter(|s| s.end == hi)?;
            segment.each_conflict(touch.write, clock, lo, hi, &mut found);
            if !any {
                update(segment, touch.write, access, clock);
                self.version += 1;
            }
            return Some(!any);
        }
        // Every range is checked before any is recorded: a race in a later
        // range leaves the earlier ones as they were.
        for touch in touches {
            let (lo, hi) = touch.range();
            let segment = self.segments.get(&lo).filter(|s| s.end == hi)?;
            segment.each_conflict(touch.write, clock, lo, hi, &mut found);
        }
        if any {
            return Some(false);
        }
        for touch in touches {
            let (lo, _) = touch.range();
            let segment = self
                .segments
                .get_mut(&lo)
                .expect("a whole segment, found above under the same borrow");
            update(segment, touch.write, access, clock);
        }
        self.version += 1;
        Some(true)
    }

    /// Whether any recorded access to `[lo, hi)` conflicts with a new one
    /// by the holder of `clock`; one lookup when a segment spans the range
    /// exactly.
    pub(crate) fn any_conflict(&self, lo: u64, hi: u64, write: bool, clock: &impl Knows) -> bool {
        if let Some(segment) = self.segments.get(&lo).filter(|s| s.end == hi) {
            return segment.conflicts(write, clock);
        }
        let mut any = false;
        self.conflicts(lo, hi, write, clock, |_| any = true);
        any
    }

    /// Call `found` for each recorded access to `[lo, hi)` that conflicts
    /// with a new access (`write` or read) by the holder of `clock` and is
    /// not in its past.
    pub(crate) fn conflicts<'a>(
        &'a self,
        lo: u64,
        hi: u64,
        write: bool,
        clock: &impl Knows,
        mut found: impl FnMut(Conflict<'a>),
    ) {
        if lo >= hi {
            return;
        }
        // A segment spanning exactly the range is the only one overlapping
        // it (segments are disjoint): one lookup, no range walk.
        if let Some(segment) = self.segments.get(&lo).filter(|s| s.end == hi) {
            return segment.each_conflict(write, clock, lo, hi, &mut found);
        }
        for (&start, &end) in self.bounds.range(..hi).rev() {
            if end <= lo {
                break;
            }
            let segment = &self.segments[&start];
            segment.each_conflict(write, clock, start.max(lo), end.min(hi), &mut found);
        }
    }

    /// Record `access` to `[lo, hi)`: in place when one segment spans it
    /// exactly (the common case, inline), else splitting and filling.
    #[inline(always)]
    pub(crate) fn record(
        &mut self,
        lo: u64,
        hi: u64,
        write: bool,
        access: &Access,
        clock: &impl Knows,
    ) {
        if lo >= hi {
            return;
        }
        self.version += 1;
        if let Some(segment) = self.segments.get_mut(&lo)
            && segment.end == hi
        {
            update(segment, write, access, clock);
            return;
        }
        self.record_split(lo, hi, write, access, clock);
    }

    /// [`Shadow::record`] over a range that is not one whole segment.
    #[cold]
    #[inline(never)]
    fn record_split(&mut self, lo: u64, hi: u64, write: bool, access: &Access, clock: &impl Knows) {
        self.split(lo);
        self.split(hi);
        let starts: smallvec::SmallVec<[u64; 4]> =
            self.bounds.range(lo..hi).map(|(s, _)| *s).collect();
        let mut cursor = lo;
        for start in starts {
            if start > cursor {
                self.insert_new(cursor, start, write, access);
            }
            let segment = self.segments.get_mut(&start).expect("listed above");
            update(segment, write, access, clock);
            cursor = segment.end;
        }
        if cursor < hi {
            self.insert_new(cursor, hi, write, access);
        }
    }

    /// Forget every access to `[lo, hi)` (the memory was freed).
    pub(crate) fn forget(&mut self, lo: u64, hi: u64) {
        if lo >= hi || self.segments.is_empty() {
            return;
        }
        self.version += 1;
        self.split(lo);
        self.split(hi);
        let starts: smallvec::SmallVec<[u64; 4]> =
            self.bounds.range(lo..hi).map(|(s, _)| *s).collect();
        for start in starts {
            self.bounds.remove(&start);
            self.segments.remove(&start);
        }
    }

    /// Forget everything (the policy was switched).
    pub(crate) fn clear(&mut self) {
        self.segments.clear();
        self.bounds.clear();
        self.version += 1;
    }

    /// The number of segments, checking that the two indexes agree.
    #[cfg(test)]
    pub(crate) fn segments(&self) -> usize {
        assert_eq!(self.bounds.len(), self.segments.len());
        let mut last_end = 0;
        for (start, end) in &self.bounds {
            assert!(*start >= last_end && start < end, "overlapping bounds");
            assert_eq!(self.segments[start].end, *end, "bounds disagree");
            last_end = *end;
        }
        self.segments.len()
    }

    fn insert_new(&mut self, lo: u64, hi: u64, write: bool, access: &Access) {
        let mut segment = Segment {
            end: hi,
            ..Segment::default()
        };
        if write {
            segment.write = Some(access.clone());
        } else {
            segment.reads.push(access.clone());
        }
        self.segments.insert(lo, segment);
        self.bounds.insert(lo, hi);
    }

    /// Make `at` a segment boundary.
    fn split(&mut self, at: u64) {
        let Some((&start, &end)) = self.bounds.range(..at).next_back() else {
            return;
        };
        if end <= at {
            return;
        }
        let segment = self
            .segments
            .get_mut(&start)
            .expect("every bound has its segment");
        let mut tail = segment.clone();
        segment.end = at;
        tail.end = end;
        debug_assert!(start < at);
        self.bounds.insert(start, at);
        self.bounds.insert(at, end);
        self.segments.insert(at, tail);
    }
}

impl Segment {
    /// Call `found` for each access here that conflicts with a new one
    /// (`write` or read) by the holder of `clock`, overlapping on
    /// `[from, to)`.
    #[inline(always)]
    fn each_conflict<'a>(
        &'a self,
        write: bool,
        clock: &impl Knows,
        from: u64,
        to: u64,
        found: &mut impl FnMut(Conflict<'a>),
    ) {
        if let Some(prior) = &self.write
            && !clock.knows(prior.agent, prior.counter)
        {
            found(Conflict {
                prior,
                prior_writes: true,
                from,
                to,
            });
        }
        if write {
            for prior in &self.reads {
                if !clock.knows(prior.agent, prior.counter) {
                    found(Conflict {
                        prior,
                        prior_writes: false,
                        from,
                        to,
                    });
                }
            }
        }
    }

    /// Whether a new access (`write` or read) by the holder of `clock`
    /// conflicts with one recorded here.
    #[inline]
    fn conflicts(&self, write: bool, clock: &impl Knows) -> bool {
        if let Some(prior) = &self.write
            && !clock.knows(prior.agent, prior.counter)
        {
            return true;
        }
        write
            && self
                .reads
                .iter()
                .any(|prior| !clock.knows(prior.agent, prior.counter))
    }
}

/// Inline: a call costs about as much as the update itself.
#[inline(always)]
fn update(segment: &mut Segment, write: bool, access: &Access, clock: &impl Knows) {
    if write {
        match &mut segment.write {
            Some(prior) => prior.assign(access),
            None => segment.write = Some(access.clone()),
        }
        // Checked first: clearing calls the items' drop even for none.
        if !segment.reads.is_empty() {
            segment.reads.clear();
        }
    } else {
        // Reads in this access's past can no longer race with anything it
        // does not also race with: keep the list short. (None since the
        // last write, the common case: nothing to look at.)
        if !segment.reads.is_empty() {
            segment
                .reads
                .retain(|r| r.agent != access.agent && !clock.knows(r.agent, r.counter));
        }
        segment.reads.push(access.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enqueue::order::clock::VectorClock;

    fn access(agent: Agent, counter: u32) -> Access {
        Access {
            agent,
            counter,
            device: 0,
            what: "test",
            label: None,
        }
    }

    fn count(shadow: &Shadow, lo: u64, hi: u64, write: bool, clock: &VectorClock) -> usize {
        let mut n = 0;
        shadow.conflicts(lo, hi, write, clock, |_| n += 1);
        n
    }

    #[test]
    fn conflicts_need_overlap_a_write_and_no_order() {
        let mut shadow = Shadow::default();
        let mut a = VectorClock::new(1);
        a.own = 1;
        shadow.record(100, 200, true, &access(1, 1), &a);
        let b = VectorClock::new(2);
        assert_eq!(
            count(&shadow, 150, 250, false, &b),
            1,
            "read after an unordered write"
        );
        assert_eq!(count(&shadow, 200, 300, true, &b), 0, "no overlap");
        assert_eq!(count(&shadow, 0, 101, true, &b), 1, "one byte is enough");
        assert_eq!(count(&shadow, 100, 200, true, &a), 0, "same stream");
        let mut ordered = VectorClock::new(2);
        ordered.learn(&a);
        assert_eq!(count(&shadow, 100, 200, true, &ordered), 0, "ordered");
        // Reads of two streams do not conflict with each other, only with a write.
        shadow.record(100, 200, false, &access(2, 1), &ordered);
        let c = VectorClock::new(3);
        assert_eq!(count(&shadow, 100, 200, false, &c), 1, "only the write");
        assert_eq!(
            count(&shadow, 100, 200, true, &c),
            2,
            "the write and the read"
        );
    }

    /// The bytes `[lo, hi)`, read or written.
    fn touch(lo: u64, hi: u64, write: bool) -> Touch {
        Touch {
            ctx: 0,
            address: lo,
            bytes: (hi - lo) as usize,
            write,
        }
    }

    /// [`Shadow::record_exact_or_races`], the races it found by stream.
    fn exact(
        shadow: &mut Shadow,
        touches: &[Touch],
        access: &Access,
        clock: &impl Knows,
    ) -> (Option<bool>, Vec<(Agent, u32)>) {
        let mut races = Vec::new();
        let recorded =
            shadow.record_exact_or_races(touches, access, clock, |a, s| races.push((a, s)));
        (recorded, races)
    }

    /// The one-lookup path agrees with the general one: a conflicting
    /// access (an unordered write, or an unordered read under a write) is
    /// not recorded, an ordered one is, and a range that is not one whole
    /// segment goes the general way.
    #[test]
    fn the_exact_segment_path_finds_what_the_general_path_finds() {
        let mut shadow = Shadow::default();
        let (mut a, mut b) = (VectorClock::new(1), VectorClock::new(2));
        a.own = 1;
        shadow.record(0, 64, true, &access(1, 1), &a);
        b.own = 1;
        assert_eq!(
            exact(&mut shadow, &[touch(0, 64, false)], &access(2, 1), &b),
            (Some(false), vec![(1, 1)]),
            "a read of an unordered write"
        );
        assert!(shadow.any_conflict(0, 64, false, &b));
        assert_eq!(count(&shadow, 0, 64, false, &b), 1, "nothing recorded");
        b.learn(&a);
        assert_eq!(
            exact(&mut shadow, &[touch(0, 64, false)], &access(2, b.own), &b),
            (Some(true), vec![]),
            "ordered after the write"
        );
        // Stream 1 writes again without knowing of stream 2's read.
        a.own = 2;
        assert!(shadow.any_conflict(0, 64, true, &a));
        assert_eq!(
            exact(&mut shadow, &[touch(0, 64, true)], &access(1, 2), &a),
            (Some(false), vec![(2, b.own)]),
            "a write over an unordered read"
        );
        assert_eq!(
            exact(&mut shadow, &[touch(0, 64, false)], &access(1, 2), &a),
            (Some(true), vec![]),
            "reads of two streams do not conflict"
        );
        assert_eq!(
            exact(&mut shadow, &[touch(0, 32, true)], &access(1, 2), &a).0,
            None,
            "not one whole segment"
        );
        assert!(
            shadow.any_conflict(0, 32, true, &a),
            "found the general way"
        );
        assert!(!shadow.any_conflict(64, 128, true, &a), "no access there");
        let before = shadow.version();
        shadow.record(64, 128, true, &access(1, 2), &a);
        assert!(shadow.version() > before, "a change moves the version");
    }

    /// An operation with several ranges (a copy) on the one-lookup path
    /// records nothing when a later range races, not even in the ranges
    /// before it, and reports that race; ordered, it records every range.
    #[test]
    fn the_exact_path_records_no_range_when_a_later_one_races() {
        let mut shadow = Shadow::default();
        let (mut a, mut b) = (VectorClock::new(1), VectorClock::new(2));
        a.own = 1;
        b.own = 1;
        // `src` written by stream 1, `dst` by stream 2 (its own).
        let (dst, src) = ((0, 64), (64, 128));
        shadow.record(src.0, src.1, true, &access(1, 1), &a);
        shadow.record(dst.0, dst.1, true, &access(2, 1), &b);
        b.own = 2;
        let copy = [touch(dst.0, dst.1, true), touch(src.0, src.1, false)];
        let version = shadow.version();
        assert_eq!(
            exact(&mut shadow, &copy, &access(2, 2), &b),
            (Some(false), vec![(1, 1)]),
            "the read of `src` races with stream 1's write"
        );
        assert_eq!(shadow.version(), version, "nothing recorded");
        // Stream 1 writing `dst` conflicts only with stream 2's first
        // write: the copy's write was not recorded.
        let mut conflicts = Vec::new();
        shadow.conflicts(dst.0, dst.1, true, &a, |c| {
            conflicts.push((c.prior.agent, c.prior.counter));
        });
        assert_eq!(conflicts, [(2, 1)], "the first range was recorded");
        b.learn(&a);
        let step = b.own;
        assert_eq!(
            exact(&mut shadow, &copy, &access(2, step), &b),
            (Some(true), vec![])
        );
        let mut conflicts = Vec::new();
        shadow.conflicts(dst.0, dst.1, true, &a, |c| {
            conflicts.push((c.prior.agent, c.prior.counter));
        });
        assert_eq!(conflicts, [(2, step)], "the write recorded");
        assert_eq!(
            count(&shadow, src.0, src.1, true, &a),
            1,
            "the read recorded"
        );
    }

    /// The table of streams by id keeps the live ones and sweeps the gone.
    #[test]
    fn the_stream_table_keeps_live_streams_and_sweeps_gone_ones() {
        let ctx = crate::Context::new(0).unwrap();
        let live = crate::Stream::new(&ctx).unwrap();
        let mut shadow = Shadow::default();
        shadow.join(&live);
        for _ in 0..200 {
            let gone = crate::Stream::new(&ctx).unwrap();
            shadow.join(&gone);
        }
        assert!(
            shadow.streams.len() < 130,
            "{} entries",
            shadow.streams.len()
        );
        assert_eq!(
            shadow.stream(live.id()).upgrade().map(|s| s.id()),
            Some(live.id())
        );
        assert!(shadow.stream(live.id() + 1).upgrade().is_none());
    }

    #[test]
    fn partial_ranges_split_and_forget_removes() {
        let mut shadow = Shadow::default();
        let mut a = VectorClock::new(1);
        a.own = 1;
        shadow.record(0, 100, true, &access(1, 1), &a);
        shadow.record(40, 60, true, &access(1, 1), &a);
        shadow.record(90, 120, false, &access(1, 1), &a);
        assert_eq!(shadow.segments(), 5); // 0-40, 40-60, 60-90, 90-100, 100-120
        let b = VectorClock::new(2);
        let mut ranges = Vec::new();
        shadow.conflicts(30, 110, false, &b, |c| ranges.push((c.from, c.to)));
        ranges.sort();
        assert_eq!(ranges, [(30, 40), (40, 60), (60, 90), (90, 100)]);
        shadow.forget(0, 100);
        assert_eq!(shadow.segments(), 1, "only 100-120 is left");
        assert_eq!(count(&shadow, 0, 100, true, &b), 0);
        assert_eq!(
            count(&shadow, 100, 120, true, &b),
            1,
            "outside the freed range"
        );
    }
}
