//! An event's latest record as the tracker saw it, read without a lock.
//!
//! Every record writes it (the use event after an operation, the engine's
//! completion events) and every wait for the event reads it. Under a lock
//! each would cost two atomic read-modify-writes; this is a sequence lock
//! instead. A record takes the write side with one compare-and-swap (two
//! records of one event on two threads still exclude each other) and
//! releases it with a store; a reader loads the sequence, the fields and
//! the sequence again, and reads again if a record overlapped. The fields
//! are atomics, so an overlapped read is a retry, never a data race. The
//! clock is kept inline, as a stream's clock is (`clock.rs`); a clock too
//! large for that (a stream that learned of more than seven others) goes
//! to a mutex beside, read under the same sequence.

use super::clock::{Agent, Flat, INLINE, VectorClock};
use super::stats::counted;

use crate::ground::sync::{AtomicU32, AtomicU64, Mutex, Ordering, fence, spin_loop, yield_now};

/// `head`'s flags, above the own counter (bits 0..32) and the number of
/// inline entries (bits 32..40).
const RECORDED: u64 = 1 << 40;
const CAPTURED: u64 = 1 << 41;
const SPILLED: u64 = 1 << 42;

/// Per event: the clock of the stream at its latest record, and whether
/// that record was captured into a graph (then the clock is the stream's
/// clock within the graph, which only streams of that capture may wait for).
///
/// Boxed, so an `Event` stays small (events are made once and pooled).
#[derive(Default)]
pub(crate) struct EventOrder(Box<Recorded>);

impl std::ops::Deref for EventOrder {
    type Target = Recorded;
    #[inline]
    fn deref(&self) -> &Recorded {
        &self.0
    }
}

/// The fields of an [`EventOrder`].
pub(crate) struct Recorded {
    /// Even while no record writes, odd while one does; each record adds 2.
    seq: AtomicU64,
    /// The own counter, the number of entries, the flags above.
    head: AtomicU64,
    agent: AtomicU64,
    /// The clock's entries (the other streams it knows of), `head` says
    /// how many.
    entries: [Entry; INLINE],
    /// The clock of a record whose entries do not fit inline.
    spilled: Mutex<Option<Box<VectorClock>>>,
}

/// One entry of a recorded clock: another stream, and its step known.
struct Entry(AtomicU64, AtomicU32);

impl Default for Recorded {
    fn default() -> Self {
        Self {
            seq: AtomicU64::new(0),
            head: AtomicU64::new(0),
            agent: AtomicU64::new(0),
            entries: std::array::from_fn(|_| Entry(AtomicU64::new(0), AtomicU32::new(0))),
            spilled: Mutex::new(None),
        }
    }
}

/// Wait a little for a record in progress on another thread (a few dozen
/// stores) to finish.
#[inline]
fn back_off(tries: &mut u32) {
    // Under loom both yield to the model's other threads.
    *tries += 1;
    if *tries < 64 {
        spin_loop();
    } else {
        // The writer was preempted: let it run.
        yield_now();
    }
}

impl Recorded {
    /// The event was recorded at `clock` (`captured`: in a capture), the
    /// point [`super::record_point`] took. `exclusive`: by the holder of
    /// the event's only handle, so no other record can overlap this one.
    #[inline]
    pub(crate) fn set(&self, clock: &VectorClock, captured: bool, exclusive: bool) {
        let seq = self.begin(exclusive);
        let flags = RECORDED | if captured { CAPTURED } else { 0 };
        match clock.others.inline() {
            Some((agents, counters)) => {
                self.write(seq, (clock.agent, clock.own, agents, counters), flags);
            }
            None => self.write_spilled(seq, clock, flags),
        }
    }

    /// [`Recorded::set`] at the eager point this thread kept, written from
    /// where it is kept ([`ThisThread::clock`](super::kept::ThisThread::clock)).
    pub(crate) fn set_flat(&self, flat: &Flat, exclusive: bool) {
        let seq = self.begin(exclusive);
        self.write(seq, flat.parts(), RECORDED);
    }

    /// Take the write side: the sequence made odd. Shared, with one
    /// compare-and-swap (two records of one event on two threads exclude
    /// each other); `exclusive` (the caller holds the event's only handle,
    /// so no other record can overlap this one), with a store. Returns the
    /// even sequence it found.
    #[inline]
    fn begin(&self, exclusive: bool) -> u64 {
        let seq = if exclusive {
            // Relaxed: whatever handed this thread the only handle (the
            // pool, a move, the lock it is recorded under) ordered the
            // previous record before this.
            let seq = self.seq.load(Ordering::Relaxed);
            debug_assert!(
                seq.is_multiple_of(2),
                "a record overlapped an exclusive one"
            );
            self.seq.store(seq + 1, Ordering::Relaxed);
            seq
        } else {
            // The write side: counted as the lock it replaces.
            counted();
            let mut tries = 0;
            loop {
                let seq = self.seq.load(Ordering::Relaxed);
                if seq.is_multiple_of(2)
                    && self
                        .seq
                        .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    break seq;
                }
                back_off(&mut tries);
            }
        };
        // The odd sequence is seen before any field written next by a
        // reader that sees one of them (its acquire fence pairs with this).
        fence(Ordering::Release);
        seq
    }

    /// Write a record whose entries are inline (agent, own counter, the
    /// entries' agents and counters), the write side taken (`seq` + 1
    /// stored), and release it.
    #[inline]
    fn write(
        &self,
        seq: u64,
        (agent, own, agents, counters): (Agent, u32, &[Agent], &[u32]),
        flags: u64,
    ) {
        for (entry, (&agent, &counter)) in self.entries.iter().zip(agents.iter().zip(counters)) {
            entry.0.store(agent, Ordering::Relaxed);
            entry.1.store(counter, Ordering::Relaxed);
        }
        self.agent.store(agent, Ordering::Relaxed);
        let head = u64::from(own) | (agents.len().min(INLINE) as u64) << 32 | flags;
        self.head.store(head, Ordering::Relaxed);
        // Release: a reader that sees this even sequence sees every field.
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// [`Recorded::write`] of a clock too large to keep inline (rare): out
    /// of line, so the common write stays small.
    #[cold]
    #[inline(never)]
    fn write_spilled(&self, seq: u64, clock: &VectorClock, flags: u64) {
        counted();
        let mut spilled = self.spilled.lock().unwrap_or_else(|p| p.into_inner());
        *spilled = Some(Box::new(clock.clone()));
        self.head.store(flags | SPILLED, Ordering::Relaxed);
        drop(spilled);
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// The latest record's clock, and whether it was captured; `None`
    /// before the first record.
    pub(crate) fn get(&self) -> Option<(VectorClock, bool)> {
        let mut clock = VectorClock::new(0);
        self.read_into(&mut clock).map(|captured| (clock, captured))
    }

    /// Read the latest record's clock into `out`; whether it was captured,
    /// `None` (and `out` as it was) before the first record.
    #[inline]
    pub(crate) fn read_into(&self, out: &mut VectorClock) -> Option<bool> {
        self.read(|head, this| {
            if head & RECORDED == 0 {
                return None;
            }
            if head & SPILLED != 0 {
                counted();
                let spilled = this.spilled.lock().unwrap_or_else(|p| p.into_inner());
                // Always set while the flag is (under the same sequence).
                out.clone_from(spilled.as_deref()?);
            } else {
                out.agent = this.agent.load(Ordering::Relaxed);
                out.own = head as u32;
                let len = ((head >> 32) as u8 as usize).min(INLINE);
                out.others.set_inline(len, |i| {
                    let entry = &this.entries[i];
                    (
                        entry.0.load(Ordering::Relaxed),
                        entry.1.load(Ordering::Relaxed),
                    )
                });
            }
            Some(head & CAPTURED != 0)
        })
    }

    /// [`Recorded::read_into`] into plain data, for a wait's learn: no
    /// clock built and dropped. `Some(Some(captured))` when the record's
    /// entries were inline (then `out` is it), `Some(None)` for a record
    /// too large for that (read it with [`Recorded::read_into`]), `None`
    /// before the first record.
    #[inline]
    pub(crate) fn read_flat(&self, out: &mut Flat) -> Option<Option<bool>> {
        self.read(|head, this| {
            if head & RECORDED == 0 {
                return None;
            }
            if head & SPILLED != 0 {
                return Some(None);
            }
            let len = ((head >> 32) as u8 as usize).min(INLINE);
            out.set_inline(this.agent.load(Ordering::Relaxed), head as u32, len, |i| {
                let entry = &this.entries[i];
                (
                    entry.0.load(Ordering::Relaxed),
                    entry.1.load(Ordering::Relaxed),
                )
            });
            Some(Some(head & CAPTURED != 0))
        })
    }

    /// Whether the latest record is an eager one on stream `agent` that
    /// covers its step `step`.
    pub(crate) fn covers(&self, agent: Agent, step: u32) -> bool {
        self.read(|head, this| {
            head & RECORDED != 0
                && head & CAPTURED == 0
                && head as u32 >= step
                && this.agent.load(Ordering::Relaxed) == agent
        })
    }

    /// `read` of the fields (given `head`), retried until no record
    /// overlapped it.
    #[inline]
    fn read<R>(&self, mut read: impl FnMut(u64, &Self) -> R) -> R {
        let mut tries = 0;
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                let got = read(self.head.load(Ordering::Relaxed), self);
                // Pairs with the writer's release fence: if a field read
                // above was written by a record, the sequence read next
                // shows that record begun.
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return got;
                }
            }
            back_off(&mut tries);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    fn clock(agent: Agent, own: u32, other: (Agent, u32)) -> VectorClock {
        let mut clock = VectorClock::new(agent);
        clock.own = own;
        clock.others.raise(other.0, other.1);
        clock
    }

    fn same(a: &VectorClock, b: &VectorClock) -> bool {
        a.agent == b.agent && a.own == b.own && a.others == b.others
    }

    /// Two records of one event on two threads and a read on a third: the
    /// read sees nothing or one record whole, never a mix, and the event
    /// ends with one of the two records whole.
    #[test]
    fn loom_a_read_sees_one_whole_record_while_two_records_race() {
        loom::model(|| {
            let order = Arc::new(EventOrder::default());
            let (a, b) = (clock(1, 5, (7, 1)), clock(2, 9, (8, 3)));
            let writers: Vec<_> = [(a.clone(), false), (b.clone(), true)]
                .into_iter()
                .map(|point| {
                    let order = Arc::clone(&order);
                    loom::thread::spawn(move || order.set(&point.0, point.1, false))
                })
                .collect();
            match order.get() {
                None => {}
                Some((seen, captured)) => assert!(
                    (same(&seen, &a) && !captured) || (same(&seen, &b) && captured),
                    "a mixed record: {seen:?}"
                ),
            }
            for writer in writers {
                writer.join().unwrap();
            }
            let (last, captured) = order.get().expect("recorded");
            assert!(same(&last, &a) || same(&last, &b), "{last:?}");
            // Only the eager record (a's) covers its stream's step.
            assert_eq!(order.covers(last.agent, last.own), !captured);
        });
    }

    /// One writer holding the event's only handle records twice with no
    /// read-modify-write while another thread reads: the read sees nothing
    /// or one record whole.
    #[test]
    fn loom_a_read_sees_one_whole_record_of_a_lone_writer() {
        loom::model(|| {
            let order = Arc::new(EventOrder::default());
            let (a, b) = (clock(1, 5, (7, 1)), clock(2, 9, (8, 3)));
            let writer = {
                let (order, a, b) = (Arc::clone(&order), a.clone(), b.clone());
                loom::thread::spawn(move || {
                    order.set(&a, false, true);
                    order.set(&b, false, true);
                })
            };
            if let Some((seen, _)) = order.get() {
                assert!(
                    same(&seen, &a) || same(&seen, &b),
                    "a mixed record: {seen:?}"
                );
            }
            writer.join().unwrap();
            assert!(same(&order.get().expect("recorded").0, &b));
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A clock kept inline and one too large for that both come back
    /// whole, with the captured flag; `covers` reads the eager record.
    #[test]
    fn a_record_comes_back_whole_inline_or_spilled() {
        let order = EventOrder::default();
        assert!(order.get().is_none() && !order.covers(0, 0));
        let mut small = VectorClock::new(3);
        small.own = 4;
        small.others.raise(1, 2);
        order.set(&small, false, false);
        let (got, captured) = order.get().unwrap();
        assert!(!captured && got.agent == 3 && got.own == 4 && got.others == small.others);
        assert!(order.covers(3, 4) && !order.covers(3, 5) && !order.covers(1, 1));
        let mut large = VectorClock::new(5);
        large.own = 6;
        for agent in 10..30 {
            large.others.raise(agent, agent as u32);
        }
        order.set(&large, true, false);
        let (got, captured) = order.get().unwrap();
        assert!(captured && got.agent == 5 && got.own == 6 && got.others == large.others);
        assert!(
            !order.covers(5, 1),
            "a captured record covers no eager step"
        );
        // Back to inline: the spilled clock is not read any more.
        order.set(&small, false, false);
        assert_eq!(order.get().unwrap().0.others, small.others);
        // Written from a kept point, at its own counter, eager, whole: one
        // entry fewer than the record before it.
        let mut kept = VectorClock::new(7);
        kept.own = 3;
        let mut flat = Flat::EMPTY;
        assert!(flat.set(&kept, 9));
        order.set(&large, true, true);
        order.set_flat(&flat, true);
        let (got, captured) = order.get().unwrap();
        assert!(!captured && got.agent == 7 && got.own == 9 && got.others.len() == 0);
        assert!(order.covers(7, 9) && !order.covers(7, 10));
        assert!(!flat.set(&large, 1), "a spilled clock is not kept");
    }

    /// Records racing on several threads with reads: each read sees one
    /// record whole (its agent names its clock's contents).
    #[test]
    fn reads_racing_records_see_whole_records() {
        let order = EventOrder::default();
        let record = |agent: Agent| {
            let mut clock = VectorClock::new(agent);
            clock.own = agent as u32;
            for other in 0..agent % 10 {
                clock.others.raise(100 + other, agent as u32);
            }
            clock
        };
        std::thread::scope(|scope| {
            for thread in 0..3u64 {
                let order = &order;
                scope.spawn(move || {
                    for i in 0..2_000u64 {
                        let agent = thread * 10_000 + i + 1;
                        order.set(&record(agent), false, false);
                        if let Some((seen, _)) = order.get() {
                            let whole = record(seen.agent);
                            assert!(
                                seen.own == whole.own && seen.others == whole.others,
                                "a mixed record: {seen:?}"
                            );
                        }
                    }
                });
            }
        });
    }
}
