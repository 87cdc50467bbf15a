//! `Auto`'s repair: an operation that races waits for each stream it races
//! with, through that stream's mark (one event per stream, recorded again
//! only by its only holder; [`offer_mark`] lends the engine's) or a fresh
//! one.

use super::clock::{Knows, Past, VectorClock};
use super::in_flight::InFlight;
use super::kept::{KeptPoint, learn_kept};
use super::policy::OrderPolicy;
use super::step::{commit_step, record_if_ordered};
use super::stream_state::Held;
use super::touch::Touch;
use super::tracker::Access;
use crate::ground::error::Result;
use crate::objects::event_pool::PooledEvent;
use crate::objects::stream::Stream;
use smallvec::SmallVec;
use std::sync::Arc;

/// `Auto`'s repair of an operation on memory of its stream's own context, which
/// [`record_or_races`](super::step::record_or_races) found racing with `races`
/// (per stream, the latest step raced with; `held` still locked since): wait
/// for each stream it races with, then record it as the stream's next step,
/// returned in flight. When no access was recorded meanwhile and the waits
/// cover every race found, nothing is looked up again; otherwise it is checked
/// again. `None` leaves the operation to the general way (a stream gone, a wait
/// that fell short: a step still in flight on another thread).
///
/// One list, of the streams to wait for, holds all it carries from one
/// lock to the next (a mark taken out, the event to put back, one to let
/// go). What a single wait teaches is learnt under the second lock from
/// the point its mark was recorded at, where this thread keeps it, else
/// from the record read after the wait; several waits' records gather in
/// the copy of the clock kept to skip covered waits, joined in one pass.
pub(super) fn repair<'s>(
    stream: &'s Stream,
    mut access: Access,
    touches: &[Touch],
    mut held: Held<'_>,
    races: &[(u64, u32)],
) -> Result<Option<InFlight<'s>>> {
    let home = stream.context();
    let (state, shadow) = held.split();
    let mut wait_for: SmallVec<[WaitFor; 2]> = SmallVec::new();
    for &(id, step) in races {
        // A stream that is gone cannot be waited for: the general way
        // refuses.
        let Some(earlier) = shadow.live_stream(id) else {
            return Ok(None);
        };
        wait_for.push(WaitFor {
            id,
            step,
            earlier,
            mark: None,
            put_back: None,
            let_go: None,
        });
    }
    let version = shadow.version();
    // One report per repaired operation.
    shadow.stats.reports += 1;
    // What the stream knows now, to skip a wait that an earlier wait of
    // this repair covered (its mark knew of the other stream).
    let mut knows = (wait_for.len() > 1).then(|| (state.clock.clone(), Arc::clone(&state.host)));
    // The marks of the streams to wait for that share this lock, taken out
    // now rather than under a lock of their own, and so that no other
    // thread takes them meanwhile.
    let mut shared = false;
    for entry in &mut wait_for {
        if let Some(mark) = held.mark_of(&entry.earlier) {
            entry.mark = Some(mark.take());
            shared = true;
        }
    }
    drop(held);
    // What the eager record waited for knows, learnt under the lock taken
    // below (a stream learns eager records only, as `waited` does); with
    // several waits, `knows` gathers what they all knew.
    let mut snapshot = VectorClock::new(0);
    let mut learnt = false;
    let mut kept = None;
    let mut waits = 0;
    for entry in &mut wait_for {
        if let Some((clock, host)) = &knows
            && (Past { clock, host }).knows(entry.id, entry.step)
        {
            // Covered by an earlier wait: its mark goes back untouched.
            entry.put_back = entry.mark.take().flatten();
            continue;
        }
        let earlier = &*entry.earlier;
        let shares = entry.mark.is_some();
        let mark = match entry.mark.take() {
            Some(mark) => mark,
            // A stream of another context: its mark is under its lock.
            None => earlier.order.lock().mark.take(),
        };
        let (event, at_kept) = mark_covering(earlier, entry.step, mark)?;
        stream.wait_event_unlearned(&event)?;
        waits += 1;
        match (&mut knows, at_kept) {
            // One wait, for a record written from the point this thread
            // keeps: learnt from there under the lock below.
            (None, Some(at_kept)) => kept = Some(at_kept),
            // Else read right after the wait, as `waited` does.
            (knows, _) => {
                if event.order.read_into(&mut snapshot) == Some(false) {
                    match knows {
                        Some((clock, _)) => learnt |= clock.learn(&snapshot),
                        None => learnt = true,
                    }
                }
            }
        }
        tracing::trace!(
            target: "cuda_streams_driver::order",
            "stream {} now waits for stream {}",
            stream.id(),
            earlier.id()
        );
        if shares {
            entry.put_back = Some(event);
        } else {
            let mut slot = earlier.order.lock();
            entry.let_go = put_back_mark(&mut slot.mark, earlier, event);
        }
    }
    #[cfg(test)]
    tests::between_waits_and_record();
    let mut held = stream.order.lock();
    if shared {
        for entry in &mut wait_for {
            if let Some(event) = entry.put_back.take() {
                let mark = held
                    .mark_of(&entry.earlier)
                    .expect("a stream of this context");
                entry.let_go = put_back_mark(mark, &entry.earlier, event);
            }
        }
    }
    let (state, shadow) = held.split();
    shadow.stats.inserted_waits += waits;
    if state.captured.is_none() {
        match (&knows, &kept) {
            // Its clock then, and what every wait taught on top.
            (Some((clock, _)), _) if learnt => state.clock.learn_all(&clock.others),
            (None, Some(kept)) => learn_kept(&mut state.clock, kept),
            (None, None) if learnt => state.clock.learn(&snapshot),
            _ => false,
        };
    }
    state.learn_host();
    // The step the access will be: the waits' learning moved the clock.
    access.counter = state.clock.own + 1;
    let past = state.past();
    // Clocks and the host's knowledge only grow: with the shadow as it was,
    // the races found were the only ones, and they are ordered now.
    let settled = shadow.version() == version && wait_for.iter().all(|w| past.knows(w.id, w.step));
    if settled {
        for &touch in touches {
            let (lo, hi) = touch.range();
            shadow.record(lo, hi, touch.write, &access, &past);
        }
    } else if !record_if_ordered(shadow, touches, &access, &past) {
        return Ok(None);
    }
    Ok(Some(commit_step(state, stream, home.id(), shadow)))
}

/// A stream `Auto` makes an operation wait for, and what its repair
/// carries for it from one lock to the next. Declared before the locks it
/// is carried across, so the events it holds go back to their pool after
/// them.
struct WaitFor {
    id: u64,
    /// The step to cover.
    step: u32,
    /// The stream (alive: one that is gone cannot be waited for, and the
    /// general way refuses).
    earlier: Arc<Stream>,
    /// Its mark, taken out under the repair's first lock when the stream
    /// shares it (same context).
    mark: Option<Option<Arc<PooledEvent>>>,
    /// The event to put back as its mark under the repair's second lock
    /// (same context).
    put_back: Option<Arc<PooledEvent>>,
    /// An event not put back (a newer mark was set meanwhile), let go
    /// after the locks.
    let_go: Option<Arc<PooledEvent>>,
}

/// `Auto`'s repair: `stream` waits for `earlier` up to at least its step
/// `step`, through one event: `earlier`'s last mark when that still covers
/// the step (nothing recorded), else a fresh mark of everything enqueued on
/// `earlier` so far, kept as its last mark. The wait teaches `stream` what
/// the event's record knew ([`waited`](super::waited)).
pub(super) fn order_after(stream: &Stream, earlier: &Stream, step: u32) -> Result<()> {
    // An earlier wait of this repair (for another stream's mark, which knew
    // of this one) may have covered the step already.
    let known = {
        let mut state = stream.order.lock();
        state.learn_host();
        state.past().knows(earlier.id(), step)
    };
    if known {
        return Ok(());
    }
    // Taken out of its slot, so that no other thread takes it meanwhile
    // (its record may be recorded again below, which locks the stream).
    let mark = earlier.order.lock().mark.take();
    let (event, _) = mark_covering(earlier, step, mark)?;
    let unused = put_back_mark(&mut earlier.order.lock().mark, earlier, Arc::clone(&event));
    drop(unused);
    stream.wait_event(&event)?;
    stream.context().order.count(|s| s.inserted_waits += 1);
    tracing::trace!(
        target: "cuda_streams_driver::order",
        "stream {} now waits for stream {}",
        stream.id(),
        earlier.id()
    );
    Ok(())
}

/// An event whose record covers `earlier`'s step `step`: `mark` (its mark,
/// taken out of its slot) when its record still covers the step, the same
/// event recorded again when nobody else holds it (no allocation; waits
/// already enqueued on it keep the record they were enqueued against), or
/// a fresh mark of everything enqueued on `earlier` so far.
///
/// Both records are made as the event's only holder
/// ([`Event::record_counted`](crate::objects::event::Event::record_counted) exclusive):
/// no atomic read-modify-write on the event, where a shared record takes three.
/// With the event, the point kept by this thread that a record made here was
/// written from, if it was ([`recorded`](super::record_and_wait::recorded)).
fn mark_covering(
    earlier: &Stream,
    step: u32,
    mark: Option<Arc<PooledEvent>>,
) -> Result<(Arc<PooledEvent>, Option<KeptPoint>)> {
    Ok(match mark {
        Some(event) if event.order.covers(earlier.id(), step) => (event, None),
        // Not offered by the engine, no wait of another thread in progress:
        // the only handle (no other `Arc`, and no `Weak` to make one; only
        // a holder of one could make either).
        Some(event) if Arc::strong_count(&event) == 1 && Arc::weak_count(&event) == 0 => {
            let kept = event.record_at(earlier, true)?;
            (event, kept)
        }
        _ => {
            // A fresh event from the pool, held by value: the only handle.
            let event = earlier.event_pool().acquire_event(false)?;
            let kept = event.record_at(earlier, true)?;
            (Arc::new(event), kept)
        }
    })
}

/// Put `event` back as `earlier`'s mark (`slot`, locked), unless another
/// thread set a newer one or the stream takes part in a capture meanwhile;
/// then it is handed back, for the caller to let go after the lock.
#[must_use = "an event not put back goes to its pool once dropped, after the lock"]
fn put_back_mark(
    slot: &mut Option<Arc<PooledEvent>>,
    earlier: &Stream,
    event: Arc<PooledEvent>,
) -> Option<Arc<PooledEvent>> {
    if slot.is_none() && earlier.capture_id() == 0 {
        *slot = Some(event);
        None
    } else {
        Some(event)
    }
}

/// Offer `event`, just recorded on `stream` after its latest work, as the
/// stream's mark for [`OrderPolicy::Auto`]: a later operation that must
/// wait for that work then waits for this event instead of recording one
/// (the engine offers each operation's completion event, so an inferred
/// edge costs what an explicit one does). Does nothing unless the stream's
/// context is under `Auto`. Sound whatever the event is: it serves only
/// while its latest record, as the tracker saw it, is on `stream` and
/// covers the work to wait for.
///
/// ```
/// use cuda_streams_driver::{order, Context, OrderPolicy, Stream};
/// use std::sync::Arc;
/// let ctx = Context::new(0).unwrap();
/// ctx.set_ordering(OrderPolicy::Auto).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let done = Arc::new(stream.mark().unwrap());
/// order::offer_mark(&stream, &done);
/// ```
pub fn offer_mark(stream: &Stream, event: &Arc<crate::objects::event_pool::PooledEvent>) {
    if stream.context().order.policy() != OrderPolicy::Auto {
        return;
    }
    let mut state = stream.order.lock();
    if state.captured.is_none() {
        // The mark it replaces goes back to its pool after the lock.
        let replaced = state.mark.replace(Arc::clone(event));
        drop(state);
        drop(replaced);
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::before_enqueue;
    use super::super::context_state::forget;
    use super::super::tests::{buffer, locks, streams, under};
    use super::*;
    use crate::ground::error::Error;
    use std::cell::RefCell;

    /// `Auto` forks one write into four readers with one mark of the
    /// writer, and never reuses a mark that does not cover the write.
    #[test]
    fn auto_reuses_a_mark_only_while_it_covers_the_write() {
        let (ctx, _policy) = under(OrderPolicy::Auto);
        let main = Stream::new(&ctx).unwrap();
        let readers: Vec<_> = (0..4).map(|_| Stream::new(&ctx).unwrap()).collect();
        let mut root = crate::DeviceBuffer::<u32>::new(&ctx, 64).unwrap();
        let mut parts: Vec<_> = (0..4)
            .map(|_| crate::DeviceBuffer::<u32>::new(&ctx, 64).unwrap())
            .collect();
        let cached = |s: &Stream| s.order.lock().mark.as_ref().map(|e| e.as_raw());
        // The context is shared with the other tests: count from here.
        let waits_before = ctx.ordering_stats().inserted_waits;
        for round in 0..2u32 {
            main.memset_u32_async(&mut root, round + 1).unwrap();
            let mut marks = Vec::new();
            for (reader, part) in readers.iter().zip(&mut parts) {
                reader.copy_device_to_device_async(part, &root).unwrap();
                marks.push(cached(&main).expect("a mark of main"));
            }
            assert!(
                marks.iter().all(|m| *m == marks[0]),
                "one mark for the fork: {marks:?}"
            );
            for (reader, part) in readers.iter().zip(&parts) {
                assert_eq!(part.to_vec(reader).unwrap(), [round + 1; 64]);
            }
            // The next round's write is after this mark: a fresh one follows.
        }
        assert_eq!(ctx.ordering_stats().inserted_waits - waits_before, 8);
    }

    thread_local! {
        /// Run once by the next repair on this thread, after its waits and
        /// before it records: another access arriving meanwhile.
        static MEANWHILE: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    pub(super) fn between_waits_and_record() {
        if let Some(meanwhile) = MEANWHILE.with(|m| m.borrow_mut().take()) {
            meanwhile();
        }
    }

    /// A repair whose waits covered every race it found still looks again
    /// when an access arrived meanwhile, and orders the operation after it.
    #[test]
    fn auto_looks_again_when_an_access_arrives_during_its_waits() {
        let (ctx, _policy) = under(OrderPolicy::Auto);
        let [a, c, d] = streams(&ctx);
        // Bytes no allocation has: only these accesses touch them.
        let touch = Touch {
            ctx: ctx.id(),
            address: 1 << 59,
            bytes: 4,
            write: true,
        };
        drop(before_enqueue(&a, "test", &[touch], OrderPolicy::Auto).unwrap());
        let before = ctx.ordering_stats().inserted_waits;
        let late = Arc::clone(&d);
        MEANWHILE.with(|m| {
            *m.borrow_mut() = Some(Box::new(move || {
                // d's write, itself repaired (after a's), lands in the
                // shadow while c's repair is between its waits and its record.
                drop(before_enqueue(&late, "test", &[touch], OrderPolicy::Auto).unwrap());
            }))
        });
        drop(before_enqueue(&c, "test", &[touch], OrderPolicy::Auto).unwrap());
        // c waited for a, d for a, and c, looking again, for d.
        assert_eq!(ctx.ordering_stats().inserted_waits - before, 3);
        let d_step = d.order.lock().clock.own;
        let c_knows_d = {
            let mut state = c.order.lock();
            state.learn_host();
            state.past().knows(d.id(), d_step)
        };
        assert!(c_knows_d, "c's write was recorded unordered with d's");
        forget(&ctx, touch.address, touch.bytes);
    }

    /// A repair that must order a stream after two others waits once when
    /// the first wait covers the second stream too (its mark knew of it),
    /// and the data is right.
    #[test]
    fn auto_does_not_wait_for_what_an_earlier_wait_of_the_repair_covered() {
        let (ctx, _policy) = under(OrderPolicy::Auto);
        let [a, b, c] = streams(&ctx);
        let (mut x, mut y) = (buffer(&ctx), buffer(&ctx));
        a.memset_u32_async(&mut y, 4).unwrap();
        b.wait_stream(&a).unwrap();
        b.memset_u32_async(&mut x, 5).unwrap();
        let before = ctx.ordering_stats().inserted_waits;
        // Writes `x` after b's write (found first), reads `y` after a's,
        // which b's mark covers.
        let steps = |s: &Stream| s.order.lock().clock.own;
        let (a_step, b_step) = (steps(&a), steps(&b));
        c.copy_device_to_device_async(&mut x, &y).unwrap();
        assert_eq!(ctx.ordering_stats().inserted_waits - before, 1);
        // The one wait taught c both writers' steps (through b's mark).
        let knows = |s: &Stream, step| c.order.lock().clock.knows(s.id(), step);
        assert!(
            knows(&b, b_step) && knows(&a, a_step),
            "c did not learn its wait"
        );
        assert_eq!(x.to_vec(&c).unwrap(), [4; 64]);
    }

    /// `Auto` skips its second look only when its waits cover what it
    /// found: a write still in flight on another thread is covered by no
    /// event recorded now, so the repair fails rather than recording an
    /// unordered access.
    #[test]
    fn auto_does_not_take_a_wait_that_misses_an_in_flight_step_as_a_repair() {
        // The repair's mark learns the writer's clock only while the
        // context tracks order at all (a GPU's default is `Off`).
        let (ctx, _policy) = under(OrderPolicy::Check);
        let (writer, reader) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let touch = Touch {
            ctx: ctx.id(),
            address: 1 << 61,
            bytes: 4,
            write: true,
        };
        let writing = before_enqueue(&writer, "test", &[touch], OrderPolicy::Check).unwrap();
        let read = Touch {
            write: false,
            ..touch
        };
        let refused = before_enqueue(&reader, "test", &[read], OrderPolicy::Auto);
        assert!(
            matches!(refused, Err(Error::UnorderedAccess(_))),
            "the read was recorded although no wait covers the write"
        );
        drop(writing);
        // Once the write is queued, a mark covers it.
        drop(before_enqueue(&reader, "test", &[read], OrderPolicy::Auto).unwrap());
        forget(&ctx, touch.address, touch.bytes);
    }

    /// An offered mark serves only while its record is the one offered: an
    /// event re-recorded on another stream is not waited for in its place.
    #[test]
    fn an_offered_mark_recorded_elsewhere_since_is_not_used() {
        let (ctx, _policy) = under(OrderPolicy::Auto);
        let [writer, reader, other] = streams(&ctx);
        let (mut data, mut copy) = (buffer(&ctx), buffer(&ctx));
        let mark = |s: &Stream| s.order.lock().mark.as_ref().map(|e| e.as_raw());
        writer.memset_u32_async(&mut data, 5).unwrap();
        let offered = Arc::new(writer.mark().unwrap());
        offer_mark(&writer, &offered);
        assert_eq!(mark(&writer), Some(offered.as_raw()));
        // Moved to a stream that has nothing to do with the write, and has
        // taken more steps than the writer.
        let mut scratch = crate::DeviceBuffer::<u32>::new(&ctx, 4).unwrap();
        for value in 0..8 {
            other.memset_u32_async(&mut scratch, value).unwrap();
        }
        offered.record(&other).unwrap();
        reader
            .copy_device_to_device_async(&mut copy, &data)
            .unwrap();
        assert_ne!(
            mark(&writer),
            Some(offered.as_raw()),
            "the reader waited for an event that no longer marks the writer"
        );
        assert_eq!(copy.to_vec(&reader).unwrap(), [5; 64]);
        // Offered and still in place, it is waited for with nothing recorded.
        writer.memset_u32_async(&mut data, 6).unwrap();
        let offered = Arc::new(writer.mark().unwrap());
        offer_mark(&writer, &offered);
        reader
            .copy_device_to_device_async(&mut copy, &data)
            .unwrap();
        assert_eq!(mark(&writer), Some(offered.as_raw()));
        assert_eq!(copy.to_vec(&reader).unwrap(), [6; 64]);
    }

    /// `Auto` records its mark again in place only while it holds the
    /// event's only handle (then as the exclusive holder: the record count
    /// moves by one whole record and stays even); a mark someone else holds
    /// keeps its record, and a fresh event marks the stream instead.
    #[test]
    fn auto_records_a_mark_again_only_as_its_only_holder() {
        let (ctx, _policy) = under(OrderPolicy::Auto);
        let [writer, reader] = streams(&ctx);
        let (mut data, mut copy) = (buffer(&ctx), buffer(&ctx));
        let mark = |s: &Stream| s.order.lock().mark.clone();
        writer.memset_u32_async(&mut data, 1).unwrap();
        reader
            .copy_device_to_device_async(&mut copy, &data)
            .unwrap();
        let held = mark(&writer).expect("a fresh mark of the writer");
        assert!(held.record_count().is_multiple_of(2));
        let (first, _) = held.order.get().expect("recorded");
        // Held here too: the next mark cannot be this event recorded again.
        writer.memset_u32_async(&mut data, 2).unwrap();
        reader
            .copy_device_to_device_async(&mut copy, &data)
            .unwrap();
        let (still, _) = held.order.get().expect("recorded");
        assert_eq!(still.own, first.own, "a held mark was recorded again");
        let next = mark(&writer).expect("a mark of the writer");
        assert_ne!(next.as_raw(), held.as_raw(), "a held mark was reused");
        assert_eq!(copy.to_vec(&reader).unwrap(), [2; 64]);
        // Held by the tracker alone: recorded again in place.
        let (raw, count) = (next.as_raw(), next.record_count());
        drop((held, next));
        writer.memset_u32_async(&mut data, 3).unwrap();
        reader
            .copy_device_to_device_async(&mut copy, &data)
            .unwrap();
        let again = mark(&writer).expect("a mark of the writer");
        assert_eq!(again.as_raw(), raw, "the only handle's event is reused");
        assert_eq!(again.record_count(), count + 2, "one whole record");
        assert!(
            again
                .order
                .covers(writer.id(), writer.order.lock().clock.own)
        );
        assert_eq!(copy.to_vec(&reader).unwrap(), [3; 64]);
    }

    /// `Auto`'s repair of a read after another stream's write (the
    /// pipeline's consumer): the operation's two locks of the shadow (the
    /// look that found the race, the record after the wait), and nothing
    /// else: the mark the wait needs and the buffers' use events are
    /// recorded by their event's only holder at points kept on this
    /// thread, and the marks taken and put back cost no lock of their own
    /// (the copy took twelve locks in all before).
    #[test]
    fn auto_repairs_a_read_after_a_write_with_two_locks_of_the_shadow() {
        let (ctx, _policy) = under(OrderPolicy::Auto);
        let [writer, reader] = streams(&ctx);
        let (mut data, mut copy) = (buffer(&ctx), buffer(&ctx));
        // Used before on both streams, in order: the steady state.
        writer.memset_u32_async(&mut data, 1).unwrap();
        reader
            .copy_device_to_device_async(&mut copy, &data)
            .unwrap();
        copy.to_vec(&reader).unwrap();
        // Each stream takes in what the host saw (a lock of the host's
        // knowledge at its next enqueue) before the count.
        reader.memset_u32_async(&mut copy, 0).unwrap();
        writer.wait_stream(&reader).unwrap();
        writer.memset_u32_async(&mut data, 2).unwrap();
        let waits = ctx.ordering_stats().inserted_waits;
        let copied = locks(|| {
            reader
                .copy_device_to_device_async(&mut copy, &data)
                .unwrap();
        });
        assert_eq!(ctx.ordering_stats().inserted_waits - waits, 1, "one wait");
        // The reader learnt the writer's mark, recorded at the point the
        // writer's enqueue kept: its step, and nothing after it. (Read
        // after the copy: a lock of the writer before it would void the
        // point kept.)
        let written = writer.order.lock().clock.own;
        let knows = |step| reader.order.lock().clock.knows(writer.id(), step);
        assert!(
            knows(written) && !knows(written + 1),
            "learnt the wrong point"
        );
        // Two of the shadow. The use events of the two buffers take the
        // point the copy kept and, recorded under their buffer's lock by
        // its only holder, no write side; nor does the mark's record,
        // made by its only holder (4 locks before use events were
        // recorded so).
        assert_eq!(copied, 2, "the repair of a copy and its use events");
        assert_eq!(copy.to_vec(&reader).unwrap(), [2; 64]);
    }
}
