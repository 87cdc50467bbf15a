//! A stream's latest mark: an event recorded at the stream's end, kept with
//! how many enqueues the stream had seen then, so that a fork or a wait that
//! needs "everything enqueued on this stream so far" waits on it instead of
//! recording a new event (a `cuEventRecord`, hundreds of ns on a GPU) while
//! nothing has been enqueued on the stream since. The engine keeps each
//! operation's completion event here ([`Stream::record_latest`]), so a fork
//! right after an operation costs no record of its own.
//!
//! Why reuse is sound:
//! - A wait takes the event's state when it is enqueued (CUDA's
//!   `cuStreamWaitEvent`; the software driver resolves the event's latest
//!   record at submit too), so the mark may be recorded again later, by
//!   anyone, without changing a wait made before.
//! - "Nothing enqueued since": every enqueue on a stream through this crate
//!   bumps the stream's enqueue count *after* its driver call (the enqueue
//!   gate, which every piece of work and every raw caller holds around its
//!   calls; waits; the stream-ordered allocator's calls; entering a
//!   capture). The mark reads the count *before* its record. An enqueue
//!   whose call came after the record bumps after it, so the count differs
//!   and the mark is not reused; one whose bump the read saw made its call
//!   before the record, which covers it.
//! - "Still this stream's point": the event's record count
//!   ([`Event::record_alone`]) must be what it was right after the mark's
//!   record; a record of the event anywhere since changes it. It is checked
//!   again after the waits, and a fresh mark is waited on as well if it
//!   moved meanwhile.
//! - Streams wrapped from elsewhere ([`Stream::from_raw`]) never keep a mark,
//!   nor do streams lent to another library (`Stream::to_cudarc`): other
//!   code enqueues on them unseen. Nor does a stream while it
//!   captures, or an event recorded in a capture.
//!
//! The stream holds its mark (one event, and so its pool) until the next
//! one, [`Stream::forget_latest_mark`], or its own drop.

use crate::ground::error::Result;
use crate::objects::event_pool::{PooledEvent, UniqueEvent};
use crate::objects::mark_state::Kept;
use crate::objects::stream::Stream;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A reusable mark, with the record count to check once it has been waited
/// on.
pub(crate) struct Reused {
    pub(crate) event: Arc<PooledEvent>,
    records: u64,
}

impl Reused {
    /// Whether no record of the event has been made since the check: the
    /// waits made on it meanwhile took the stream's point.
    pub(crate) fn still_current(&self) -> bool {
        self.event.record_count() == self.records
    }
}

impl Stream {
    /// Record `event` at the current end of this stream and keep it as the
    /// stream's latest mark: until something else is enqueued here,
    /// [`Stream::fork`] and [`Stream::wait_stream`] wait on it instead of
    /// recording an event of their own. The mark replaced goes back to its
    /// pool once nothing else holds it. On a stream wrapped from elsewhere,
    /// or while it captures, this is a plain record.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (main, branch) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let done = Arc::new(ctx.event_pool().acquire_event(false)?);
    /// main.record_latest(&done)?;
    /// main.fork(&[&branch])?; // waits on `done`: no record of its own
    /// branch.synchronize()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn record_latest(&self, event: &Arc<PooledEvent>) -> Result<()> {
        if !self.made_here() {
            return event.record(self);
        }
        let enqueues = self.latest.enqueues.load(Ordering::SeqCst);
        let records = event.record_alone(self)?;
        let kept = match records {
            Some(records) if self.capture_id() == 0 && event.captured_in() == 0 => Some(Kept {
                event: Arc::clone(event),
                enqueues,
                records,
            }),
            // Overlapped by another record of the event, or in a capture.
            _ => None,
        };
        // Back to its pool once the slot is free.
        drop(self.latest.kept.replace(kept));
        Ok(())
    }

    /// [`Stream::record_latest`] for an event nothing else holds, returned
    /// shared once it is recorded and kept. No other thread can record it
    /// meanwhile, and no stream keeps it as its mark (a mark holds a handle),
    /// so no record can overlap this one and no fork can be looking at an
    /// earlier record of it: it is recorded plainly, without the extra
    /// record-count bump that guards a shared event (one atomic
    /// read-modify-write fewer per operation of the engine).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream, UniqueEvent};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (main, branch) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let done = UniqueEvent::new(ctx.event_pool().acquire_event(false)?);
    /// let done = main.record_latest_unique(done)?;
    /// main.fork(&[&branch])?; // waits on `done`: no record of its own
    /// done.synchronize()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn record_latest_unique(&self, event: UniqueEvent) -> Result<Arc<PooledEvent>> {
        if !self.made_here() {
            event.record(self)?;
            return Ok(event.into_arc());
        }
        let enqueues = self.latest.enqueues.load(Ordering::SeqCst);
        event.record_counted(self, true)?;
        // Only this thread can record it: the count is this record's.
        let records = event.record_count();
        let event = event.into_arc();
        let kept = (self.capture_id() == 0 && event.captured_in() == 0).then(|| Kept {
            event: Arc::clone(&event),
            enqueues,
            records,
        });
        // Back to its pool once the slot is free.
        drop(self.latest.kept.replace(kept));
        Ok(event)
    }

    /// Let go of the latest mark (back to its pool once nothing else holds
    /// it): the next fork or `wait_stream` records its own. For a caller
    /// trimming what it holds, such as the engine's
    /// `OperationGraph::retire_completed`.
    pub fn forget_latest_mark(&self) {
        // The slot is held for a few instructions at a time: `take` retries
        // until it is free, so that the mark is surely gone.
        let forgotten = self.latest.kept.take();
        // Back to its pool once the slot is free.
        drop(forgotten);
    }

    /// The latest mark, while nothing has been enqueued on this stream and
    /// the event has not been recorded again since it was kept.
    pub(crate) fn latest_mark(&self) -> Option<Reused> {
        if self.capture_id() != 0 {
            return None;
        }
        // Held by a record right now: that record is at the stream's end,
        // and an event of its own covers it.
        self.latest.kept.try_with(|kept| {
            let kept = kept.as_ref()?;
            let current = kept.enqueues == self.latest.enqueues.load(Ordering::SeqCst)
                && kept.event.record_count() == kept.records;
            current.then(|| Reused {
                event: Arc::clone(&kept.event),
                records: kept.records,
            })
        })?
    }

    /// Make each of `waiters` wait for everything enqueued on this stream so
    /// far: on the latest mark when it still stands, else on a fresh mark
    /// (one event for all). `waiters` must not include this stream. `true`
    /// when no event was recorded.
    pub(crate) fn order_after_me(&self, waiters: &[&Stream]) -> Result<bool> {
        if waiters.is_empty() {
            return Ok(true);
        }
        if let Some(reused) = self.latest_mark() {
            for waiter in waiters {
                waiter.wait_event(&reused.event)?;
            }
            if reused.still_current() {
                return Ok(true);
            }
            // Recorded elsewhere while the waits were made: some may have
            // taken that record's point. Waiting on a fresh mark as well
            // covers this stream; the extra waits only order more.
        }
        let event = self.mark()?;
        for waiter in waiters {
            waiter.wait_event(&event)?;
        }
        Ok(false)
    }

    /// `LatestMark::enqueued` (`mark_state.rs`) for this stream.
    #[inline]
    pub(crate) fn enqueued(&self) {
        self.latest.enqueued();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DeviceBuffer, PinnedBuffer};
    use std::sync::mpsc;

    /// One kind of enqueue on the test's stream.
    type Enqueue<'a> = dyn Fn(&mut DeviceBuffer<u32>, &mut PinnedBuffer<u32>) + 'a;

    /// A plain event of `ctx`'s pool that nothing else holds.
    fn unique(ctx: &Arc<Context>) -> UniqueEvent {
        UniqueEvent::new(ctx.event_pool().acquire_event(false).unwrap())
    }

    fn kept(ctx: &Arc<Context>, stream: &Stream) -> Arc<PooledEvent> {
        let event = Arc::new(ctx.event_pool().acquire_event(false).unwrap());
        stream.record_latest(&event).unwrap();
        event
    }

    /// The mark stands while nothing is enqueued on its stream (a wait made
    /// by another stream on it changes nothing here) and falls with every
    /// kind of enqueue: a check that skipped one would hand a fork a point
    /// before that work.
    #[test]
    fn every_enqueue_retires_the_latest_mark() {
        let ctx = Context::new(0).unwrap();
        let (main, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut buf = DeviceBuffer::<u32>::new(&ctx, 64).unwrap();
        let mut host = PinnedBuffer::<u32>::new(&ctx, 64).unwrap();
        let stands = |what: &str| {
            assert!(main.latest_mark().is_some(), "the mark fell with {what}");
        };
        let fallen = |what: &str| {
            assert!(main.latest_mark().is_none(), "the mark outlived {what}");
        };
        kept(&ctx, &main);
        stands("nothing");
        other.wait_stream(&main).unwrap();
        main.fork(&[&other]).unwrap();
        stands("waits made by another stream on it");
        let enqueues: Vec<(&str, Box<Enqueue<'_>>)> = vec![
            (
                "a memset (tracked work: launches too)",
                Box::new(|b, _| main.memset_u32_async(b, 1).unwrap()),
            ),
            (
                "a copy",
                Box::new(|b, h| main.copy_to_host_async(h, b).unwrap()),
            ),
            (
                "a host callback",
                Box::new(|_, _| main.add_callback(|| {}).unwrap()),
            ),
            (
                "a wait",
                Box::new(|_, _| main.wait_event(&other.mark().unwrap()).unwrap()),
            ),
            (
                "a wait on a stream",
                Box::new(|_, _| main.wait_stream(&other).unwrap()),
            ),
            (
                "a stream-ordered allocation",
                Box::new(|_, _| {
                    let ptr = crate::objects::result::mem_alloc_async(&main, 256).unwrap();
                    // SAFETY: just allocated on `main`, never used, freed once.
                    unsafe { crate::objects::result::mem_free_async(&other, ptr) }.unwrap();
                }),
            ),
            (
                "a buffer allocated on it",
                Box::new(|_, _| {
                    drop(DeviceBuffer::<u32>::new_async(&main, 16).unwrap());
                }),
            ),
            (
                "a capture",
                Box::new(|_, _| {
                    let mut capture = main.begin_capture().unwrap();
                    drop(capture.end().unwrap());
                }),
            ),
            (
                "its raw-call gate",
                Box::new(|_, _| drop(main.enqueue_gate("test").unwrap())),
            ),
        ];
        for (what, enqueue) in &enqueues {
            kept(&ctx, &main);
            stands("its own record");
            enqueue(&mut buf, &mut host);
            fallen(what);
        }
        main.synchronize().unwrap();
        other.synchronize().unwrap();
    }

    /// An event nothing else holds is kept the same way: a fork right after
    /// it records nothing and waits for it, new work retires it, and on a
    /// stream wrapped from elsewhere it is only recorded.
    #[test]
    fn a_unique_event_is_kept_as_the_mark() {
        let ctx = Context::new(0).unwrap();
        let (main, branch) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let fresh = unique(&ctx);
        let event = main.record_latest_unique(fresh).unwrap();
        let records = event.record_count();
        assert!(
            main.order_after_me(&[&branch]).unwrap(),
            "a fresh mark was recorded"
        );
        assert_eq!(event.record_count(), records);
        assert_eq!(Arc::strong_count(&event), 2, "the mark holds it");
        main.add_callback(|| {}).unwrap();
        assert!(main.latest_mark().is_none(), "the mark outlived a callback");
        // SAFETY: `main` outlives the borrowed wrapper, which does not own it.
        let wrapped = unsafe { Stream::from_raw(&ctx, main.as_raw(), false) };
        let fresh = unique(&ctx);
        let event = wrapped.record_latest_unique(fresh).unwrap();
        assert!(event.is_recorded());
        assert!(wrapped.latest_mark().is_none());
        branch.synchronize().unwrap();
        main.synchronize().unwrap();
    }

    /// The mark's slot is never waited for: a record that finds it held
    /// keeps no mark (the one kept before stays, and stays right: a record
    /// is no enqueue), a fork that finds it held records its own event, and
    /// once the slot is free the earlier mark is reused until new work.
    #[test]
    fn a_held_slot_is_skipped_never_waited_for() {
        let ctx = Context::new(0).unwrap();
        let (main, branch) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let earlier = kept(&ctx, &main);
        let held = main.latest.kept.try_with(|_| {
            let fresh = unique(&ctx);
            let later = main.record_latest_unique(fresh).unwrap();
            assert_eq!(Arc::strong_count(&later), 1, "kept while the slot was held");
            assert!(main.latest_mark().is_none(), "read while the slot was held");
            assert!(
                !main.order_after_me(&[&branch]).unwrap(),
                "no fresh mark recorded while the slot was held"
            );
        });
        assert!(held.is_some(), "the slot was taken");
        let reused = main.latest_mark().expect("the earlier mark stands");
        assert!(Arc::ptr_eq(&reused.event, &earlier));
        main.add_callback(|| {}).unwrap();
        assert!(main.latest_mark().is_none(), "the mark outlived a callback");
        branch.synchronize().unwrap();
        main.synchronize().unwrap();
    }

    /// Threads recording marks on one stream and forking from it at once
    /// (the slot taken and refused all the while): each fork still waits
    /// for the work its thread enqueued before it, a host function that
    /// notes its round (host functions, not memory, so that the check is
    /// the GPU order's alone), and a mark forgotten is gone.
    #[test]
    fn forks_stay_ordered_while_threads_record_marks() {
        use std::sync::atomic::AtomicU32;
        let ctx = Context::new(0).unwrap();
        let main = Stream::new(&ctx).unwrap();
        std::thread::scope(|scope| {
            for thread in 0..4u32 {
                let (ctx, main) = (&ctx, &main);
                scope.spawn(move || {
                    let branch = Stream::new(ctx).unwrap();
                    let done = Arc::new(AtomicU32::new(0));
                    let (seen_tx, seen_rx) = mpsc::channel();
                    for round in 1..=50u32 {
                        let on_main = Arc::clone(&done);
                        main.add_callback(move || on_main.store(round, Ordering::SeqCst))
                            .unwrap();
                        main.fork(&[&branch]).unwrap();
                        let (on_branch, seen) = (Arc::clone(&done), seen_tx.clone());
                        branch
                            .add_callback(move || {
                                let _ = seen.send(on_branch.load(Ordering::SeqCst));
                            })
                            .unwrap();
                        drop(main.record_latest_unique(unique(ctx)).unwrap());
                        if round % 10 == 0 {
                            main.forget_latest_mark();
                        }
                        let seen = seen_rx.recv().unwrap();
                        assert!(
                            seen >= round,
                            "thread {thread} round {round}: the branch ran before main's work ({seen})"
                        );
                    }
                    branch.synchronize().unwrap();
                });
            }
        });
        main.forget_latest_mark();
        assert!(main.latest_mark().is_none());
        main.synchronize().unwrap();
    }

    /// Recorded again anywhere, the event no longer marks the stream.
    #[test]
    fn a_later_record_of_the_event_retires_the_mark() {
        let ctx = Context::new(0).unwrap();
        let (main, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let event = kept(&ctx, &main);
        assert!(main.latest_mark().is_some());
        event.record(&other).unwrap();
        assert!(main.latest_mark().is_none());
        // Kept again on `other`: `main` keeps nothing, `other` its record.
        other.record_latest(&event).unwrap();
        assert!(other.latest_mark().is_some());
        assert!(main.latest_mark().is_none());
        // Forgotten by both, it goes back to its pool: only the test's
        // handle holds it.
        other.forget_latest_mark();
        main.forget_latest_mark();
        assert!(other.latest_mark().is_none());
        assert_eq!(Arc::strong_count(&event), 1);
    }

    /// A stream wrapped from elsewhere never keeps a mark: other code
    /// enqueues on it unseen.
    #[test]
    fn a_wrapped_stream_keeps_no_mark() {
        let ctx = Context::new(0).unwrap();
        let made = Stream::new(&ctx).unwrap();
        // SAFETY: `made` outlives the borrowed wrapper, which does not own it.
        let wrapped = unsafe { Stream::from_raw(&ctx, made.as_raw(), false) };
        kept(&ctx, &wrapped);
        assert!(wrapped.latest_mark().is_none());
        kept(&ctx, &made);
        assert!(made.latest_mark().is_some());
    }

    /// A mark whose event is being recorded again elsewhere (its count
    /// bumped before that record's driver call) is not reused, and a record
    /// that began while another was in progress is not alone: no mark is
    /// kept for it.
    #[test]
    fn a_record_in_progress_elsewhere_retires_the_mark() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let event = kept(&ctx, &stream);
        assert!(stream.latest_mark().is_some());
        assert!(
            event.record_count().is_multiple_of(2),
            "no record in progress"
        );
        event.begin_record_elsewhere();
        assert!(stream.latest_mark().is_none(), "reused during a record");
        // Its own record now overlaps the one in progress.
        assert_eq!(event.record_alone(&stream).unwrap(), None);
        stream.record_latest(&event).unwrap();
        assert!(
            stream.latest_mark().is_none(),
            "kept over a record in progress"
        );
        stream.synchronize().unwrap();
        // The record "elsewhere" ends (its second bump): the event goes back
        // to the shared pool with an even count, as its next user expects
        // (left odd, the next test to draw it could keep no mark with it).
        stream.forget_latest_mark();
        event.begin_record_elsewhere();
        assert!(event.record_count().is_multiple_of(2));
    }

    /// A stream lent to another library (cudarc's `to_cudarc`) drops its
    /// mark and keeps none after: that library enqueues on it unseen.
    #[test]
    fn a_stream_lent_out_keeps_no_mark() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        kept(&ctx, &stream);
        assert!(stream.latest_mark().is_some());
        stream.lent_out();
        assert!(stream.latest_mark().is_none());
        kept(&ctx, &stream);
        assert!(stream.latest_mark().is_none());
    }

    /// The fork reuses the mark only while it stands: work enqueued after
    /// the mark (a host callback held until released) holds the branch back.
    #[test]
    fn a_fork_after_new_work_waits_for_that_work() {
        let ctx = Context::new(0).unwrap();
        let (main, branch) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        kept(&ctx, &main);
        main.synchronize().unwrap();
        let (release, held) = mpsc::channel::<()>();
        main.add_callback(move || {
            let _ = held.recv();
        })
        .unwrap();
        main.fork(&[&branch]).unwrap();
        let probe = branch.mark().unwrap();
        assert!(
            !probe.query().unwrap(),
            "the branch passed the fork while main's callback was still held"
        );
        release.send(()).unwrap();
        probe.synchronize().unwrap();
        assert!(main.query().unwrap(), "the branch finished before main");
    }

    /// Right after a kept mark, ordering after the stream records nothing
    /// (the fork's path); after new work it records a fresh mark.
    #[test]
    fn a_fork_right_after_the_mark_records_nothing() {
        let ctx = Context::new(0).unwrap();
        let main = Stream::new(&ctx).unwrap();
        let branches: Vec<_> = (0..3).map(|_| Stream::new(&ctx).unwrap()).collect();
        let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
        let event = kept(&ctx, &main);
        let records = event.record_count();
        assert!(
            main.order_after_me(&refs).unwrap(),
            "a fresh mark was recorded"
        );
        assert_eq!(event.record_count(), records);
        assert!(
            main.order_after_me(&refs).unwrap(),
            "the waits retired the mark"
        );
        main.add_callback(|| {}).unwrap();
        assert!(
            !main.order_after_me(&refs).unwrap(),
            "the mark outlived a callback"
        );
        for branch in &branches {
            branch.synchronize().unwrap();
        }
    }
}
