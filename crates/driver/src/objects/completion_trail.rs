//! The one completion trail: "how far has the GPU got on this stream".
//!
//! A [`CompletionTrail`] holds entries in the order their completion events
//! were recorded on one stream. Events on one stream complete in that order,
//! so the entries the GPU has passed are a prefix, found with a few
//! `cuEventQuery`s instead of one per entry:
//!
//! - [`TrailSearch::Exact`]: the newest (all passed: one query), else the oldest
//!   (none passed: two), else a bisection between them.
//! - [`TrailSearch::Guess`]: for hot paths, where a query costs as much as the
//!   bookkeeping it saves (about 0.25 µs on the H200 machine). The trail
//!   remembers how far the GPU trailed the newest entry at the last look
//!   (its *lag*), queries the entry that far back, and when the GPU has not
//!   passed it, looks twice as far back, and so on. One query while the
//!   guess holds; what the GPU passed beyond the guess waits for the next
//!   look.
//!
//! Waiting for an entry goes through the context's reactor
//! ([`CompletionTrail::wait_for`], with the futures), never a sleep loop.
//!
//! The engine's retirement, the profiler's timelines, the pipeline's timing
//! events, the stream pool's callbacks and [`Stream::timed`](crate::Stream::timed)
//! all keep one of these.

use crate::ground::error::Result;
use crate::objects::event::Event;
use std::cell::Cell;
use std::collections::VecDeque;
use std::collections::vec_deque;
use std::fmt;

/// How thoroughly [`CompletionTrail::passed`] looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive] // another strategy may come (e.g. by a stream's clock)
pub enum TrailSearch {
    /// Every entry the GPU has passed: newest, oldest, then a bisection.
    Exact,
    /// From the trail's last lag, looking further back while not passed:
    /// one query while the guess holds; may report fewer than passed.
    Guess,
}

/// Entries in the order their completion events were recorded on one
/// stream, with how far the GPU has got through them.
///
/// Each entry names its completion event through a closure given to each
/// call (so an entry may be an id whose event lives elsewhere); an entry
/// without one (`None`) counts as passed.
///
/// ```
/// use cuda_streams_driver::{CompletionTrail, Context, TrailSearch, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut trail = CompletionTrail::new();
/// for step in 0..4 {
///     trail.push((step, stream.mark()?));
/// }
/// trail.wait_for(3, |(_, event)| Some(&**event))?; // through the reactor
/// assert_eq!(trail.passed(TrailSearch::Exact, |(_, event)| Some(&**event))?, 4);
/// let done: Vec<u32> = trail
///     .take_passed(TrailSearch::Exact, |(_, event)| Some(&**event))?
///     .map(|(step, _)| step)
///     .collect();
/// assert_eq!(done, [0, 1, 2, 3]);
/// assert!(trail.is_empty());
/// # Ok(())
/// # }
/// ```
pub struct CompletionTrail<T> {
    entries: VecDeque<T>,
    /// How many entries the GPU trailed the newest by at the last look.
    lag: Cell<usize>,
}

impl<T> Default for CompletionTrail<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> CompletionTrail<T> {
    /// An empty trail.
    pub const fn new() -> Self {
        Self {
            entries: VecDeque::new(),
            lag: Cell::new(0),
        }
    }

    /// A trail over `entries` (oldest first), keeping their capacity: a
    /// caller recycling one trail's storage for the next.
    pub fn from_entries(entries: VecDeque<T>) -> Self {
        Self {
            entries,
            lag: Cell::new(0),
        }
    }

    /// The entries, oldest first, with their storage.
    pub fn into_entries(self) -> VecDeque<T> {
        self.entries
    }

    /// Add an entry whose completion event was just recorded (after every
    /// entry already here).
    pub fn push(&mut self, entry: T) {
        self.entries.push_back(entry);
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, oldest first, as a deque (for searching them, e.g.
    /// `binary_search_by_key` over ids issued in record order).
    pub fn entries(&self) -> &VecDeque<T> {
        &self.entries
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> vec_deque::Iter<'_, T> {
        self.entries.iter()
    }

    /// The entries, oldest first, mutably.
    pub fn iter_mut(&mut self) -> vec_deque::IterMut<'_, T> {
        self.entries.iter_mut()
    }

    /// The oldest entry.
    pub fn front(&self) -> Option<&T> {
        self.entries.front()
    }

    /// The newest entry.
    pub fn back(&self) -> Option<&T> {
        self.entries.back()
    }

    /// The newest entry, mutably.
    pub fn back_mut(&mut self) -> Option<&mut T> {
        self.entries.back_mut()
    }

    /// Entry `index` (0 is the oldest).
    pub fn get(&self, index: usize) -> Option<&T> {
        self.entries.get(index)
    }

    /// How many entries the GPU trailed the newest by at the last look.
    pub fn lag(&self) -> usize {
        self.lag.get()
    }

    /// How many entries, from the oldest, the GPU has passed (see
    /// [`TrailSearch`]). A failed query is returned as the error.
    pub fn passed<'a>(
        &'a self,
        search: TrailSearch,
        event_of: impl Fn(&'a T) -> Option<&'a Event>,
    ) -> Result<usize> {
        self.passed_by(search, |entry| {
            event_of(entry).map_or(Ok(true), |event| event.query())
        })
    }

    /// [`passed`](Self::passed) with the question "has the GPU passed this
    /// entry" answered by `passed_at`, for entries whose events are kept
    /// elsewhere.
    pub fn passed_by<'a>(
        &'a self,
        search: TrailSearch,
        mut passed_at: impl FnMut(&'a T) -> Result<bool>,
    ) -> Result<usize> {
        let entries = &self.entries;
        let len = entries.len();
        if len == 0 {
            self.lag.set(0);
            return Ok(0);
        }
        let mut at = |i: usize| passed_at(&entries[i]);
        let count = match search {
            TrailSearch::Guess => {
                // Query `back` places before the newest; further back while not passed.
                let mut back = self.lag.get().min(len - 1);
                loop {
                    let i = len - 1 - back;
                    if at(i)? {
                        // Next time start a little nearer the newest, so the
                        // guess follows a GPU that catches up.
                        self.lag.set(back - back / 4);
                        return Ok(i + 1);
                    }
                    if i == 0 {
                        break 0;
                    }
                    back = (2 * back + 1).min(len - 1);
                }
            }
            TrailSearch::Exact => {
                if at(len - 1)? {
                    len
                } else if !at(0)? {
                    0
                } else {
                    // entries[lo] passed, entries[hi] not: find the first not passed.
                    let (mut lo, mut hi) = (0, len - 1);
                    while hi - lo > 1 {
                        let mid = lo + (hi - lo) / 2;
                        if at(mid)? {
                            lo = mid;
                        } else {
                            hi = mid;
                        }
                    }
                    hi
                }
            }
        };
        self.lag.set(len - count);
        Ok(count)
    }

    /// Take out the entries the GPU has passed (see [`passed`](Self::passed)),
    /// oldest first.
    pub fn take_passed<'a>(
        &'a mut self,
        search: TrailSearch,
        event_of: impl Fn(&T) -> Option<&Event>,
    ) -> Result<vec_deque::Drain<'a, T>> {
        let count = self.passed(search, &event_of)?;
        Ok(self.entries.drain(..count))
    }

    /// Take out the `count` oldest entries (a count from
    /// [`passed_by`](Self::passed_by)).
    pub fn take_front(&mut self, count: usize) -> vec_deque::Drain<'_, T> {
        let count = count.min(self.entries.len());
        self.entries.drain(..count)
    }

    /// Take out every entry, passed or not.
    pub fn take_all(&mut self) -> vec_deque::Drain<'_, T> {
        self.lag.set(0);
        self.entries.drain(..)
    }

    /// The event to wait on for entry `index` (0 is the oldest) and every
    /// entry before it: that entry's, or the newest before it that has one
    /// (an entry without an event counts as passed). An index past the
    /// newest means the newest; `None` when there is nothing to wait for.
    /// The wait itself goes through the reactor, a layer up
    /// ([`CompletionTrail::wait_for`]).
    pub(crate) fn event_to_wait_for<'a>(
        &'a self,
        index: usize,
        event_of: impl Fn(&'a T) -> Option<&'a Event>,
    ) -> Option<&'a Event> {
        let last = self.entries.len().checked_sub(1)?;
        self.entries
            .range(..=index.min(last))
            .rev()
            .find_map(&event_of)
    }
}

impl<T> Extend<T> for CompletionTrail<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, entries: I) {
        self.entries.extend(entries);
    }
}

impl<T> fmt::Debug for CompletionTrail<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionTrail")
            .field("len", &self.entries.len())
            .field("lag", &self.lag.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trail of plain numbers, where entries below `gpu` count as passed,
    /// and every question asked is counted.
    fn search(len: usize, gpu: usize, lag: usize, how: TrailSearch) -> (usize, usize, usize) {
        let mut trail = CompletionTrail::from_entries((0..len).collect());
        trail.lag.set(lag);
        let asked = Cell::new(0);
        let count = trail
            .passed_by(how, |&i| {
                asked.set(asked.get() + 1);
                Ok(i < gpu)
            })
            .unwrap();
        trail.push(len);
        (count, asked.get(), trail.lag())
    }

    #[test]
    fn exact_finds_the_passed_prefix_at_every_point() {
        for len in 1..40 {
            for gpu in 0..=len {
                let (count, asked, lag) = search(len, gpu, 0, TrailSearch::Exact);
                assert_eq!(count, gpu, "len {len}, gpu at {gpu}");
                assert_eq!(lag, len - gpu);
                // A bisection: about log2(len) questions, never one per entry.
                let bound = 2 + usize::BITS as usize - len.leading_zeros() as usize;
                assert!(asked <= bound, "len {len}, gpu {gpu}: {asked} > {bound}");
            }
        }
    }

    #[test]
    fn a_guess_that_holds_asks_once_and_never_overshoots() {
        // The GPU trails the newest by 5, as at the last look.
        let (count, asked, _) = search(100, 95, 5, TrailSearch::Guess);
        assert_eq!((count, asked), (95, 1));
        for len in 1..30 {
            for gpu in 0..=len {
                for lag in 0..len + 2 {
                    let (count, _, _) = search(len, gpu, lag, TrailSearch::Guess);
                    assert!(count <= gpu, "len {len} gpu {gpu} lag {lag}: {count}");
                    if gpu == len {
                        // All passed: the first question is answered yes.
                        assert!(count >= len - lag.min(len - 1), "len {len} lag {lag}");
                    }
                    if gpu == 0 {
                        assert_eq!(count, 0);
                    }
                }
            }
        }
    }

    #[test]
    fn a_guess_looks_further_back_while_not_passed() {
        // Lag 0 guessed, GPU 40 behind: 0, 1, 3, 7, 15, 31, 63 back.
        let (count, asked, lag) = search(100, 60, 0, TrailSearch::Guess);
        assert_eq!(asked, 7);
        assert_eq!(count, 100 - 63);
        assert_eq!(lag, 63 - 63 / 4);
    }
}
