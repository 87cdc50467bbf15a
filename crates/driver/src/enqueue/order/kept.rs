//! What the tracker keeps per thread ([`ThisThread`]): above all the point
//! of a stream that this thread's latest enqueue on it took ([`KeptPoint`]),
//! for the records right after the step (its buffers' use events, the
//! engine's completion event) to take without locking the stream again.

use super::clock::{self, VectorClock};
use crate::objects::stream::Stream;
use std::sync::atomic::Ordering;

/// Which point of a stream the thread that enqueued its latest step keeps
/// (the clock is in [`ThisThread::clock`]), taken at that enqueue under the
/// stream's lock, for the records that follow
/// the step (its buffers' use events, the engine's completion event) to
/// take without locking the stream again.
///
/// Valid while nothing locked the stream since
/// ([`TrackedStream::changes`](super::TrackedStream::changes) unmoved: no other
/// step, wait or capture changed its clock), and once the step has landed (its
/// driver call returned): then the stream's snapshot would be this point or
/// know more (steps of other threads that were in flight under this one may
/// have landed meanwhile, which a record may leave out: it knows less, never
/// more, than the driver queued before it).
#[derive(Clone, Copy, Default)]
pub(crate) struct KeptPoint {
    pub(super) stream: u64,
    pub(super) changes: u64,
    /// 0 when nothing is kept (steps start at 1).
    pub(super) step: u32,
    pub(super) landed: bool,
}

/// What the tracker keeps per thread, in one thread-local (one access
/// per step and per landing rather than one per field). Plain data with
/// no destructor, so an access is a load of the thread's base, no state
/// check.
pub(super) struct ThisThread {
    /// Steps of this thread in flight, on any stream (each
    /// [`InFlight`](super::InFlight) alive): a point taken meanwhile does not
    /// wait for other threads' steps
    /// ([`TrackedStream::landed_above_in_flight`](super::TrackedStream::landed_above_in_flight)).
    pub(super) steps_in_flight: std::cell::Cell<u32>,
    /// The point kept ([`KeptPoint`]).
    pub(super) kept: std::cell::Cell<KeptPoint>,
    /// The clock of the point in `kept`: written in place at each step,
    /// and records are written from it, so it is never copied whole.
    /// Reached only through [`ThisThread::clock`] and
    /// [`ThisThread::clock_mut`] (no borrow flag to check and set at each).
    clock: std::cell::UnsafeCell<clock::Flat>,
    /// Whether [`labelled`](super::labelled) set a label on this thread: an
    /// operation without one (the common case) reads no other thread-local.
    pub(super) labelled: std::cell::Cell<bool>,
}

impl ThisThread {
    /// Read the kept clock with `read`, which must not reach this
    /// thread's `THIS_THREAD` (it is given plain data and writes at most
    /// an event's record).
    #[inline(always)]
    pub(super) fn clock<R>(&self, read: impl FnOnce(&clock::Flat) -> R) -> R {
        // SAFETY: `self` is this thread's `THIS_THREAD` (not `Sync`, so
        // no other thread reaches it); `clock` is reached only here and in
        // `clock_mut`, whose callers' closures never reach `THIS_THREAD`,
        // so no `&mut` to it is alive while this reference is.
        read(unsafe { &*self.clock.get() })
    }

    /// Write the kept clock with `write`, under the same rule as
    /// [`ThisThread::clock`].
    #[inline(always)]
    fn clock_mut<R>(&self, write: impl FnOnce(&mut clock::Flat) -> R) -> R {
        // SAFETY: as in `clock`: no other reference to it is alive while
        // `write` runs.
        write(unsafe { &mut *self.clock.get() })
    }
}

thread_local! {
    pub(super) static THIS_THREAD: ThisThread = const {
        ThisThread {
            steps_in_flight: std::cell::Cell::new(0),
            kept: std::cell::Cell::new(KeptPoint { stream: 0, changes: 0, step: 0, landed: false }),
            clock: std::cell::UnsafeCell::new(clock::Flat::EMPTY),
            labelled: std::cell::Cell::new(false),
        }
    };
}

/// Keep the point of `stream` after its step `step` (just taken, its `clock`
/// read under the stream's lock), for [`kept_point`] once the step lands.
/// Nothing is kept of a clock too large to keep inline.
///
/// `under_another`: another step of the stream (below this one) was in
/// flight when this one was taken. Then the point right after this step
/// would leave this step out: none is kept, and a record after it takes
/// its point the general way, which waits for that step to land
/// ([`TrackedStream::settled`](super::TrackedStream::settled)).
/// Also counts the step in flight on this thread (the same thread-local).
#[inline]
pub(super) fn keep_point(stream: &Stream, clock: &VectorClock, step: u32, under_another: bool) {
    THIS_THREAD.with(|this| {
        this.steps_in_flight.set(this.steps_in_flight.get() + 1);
        let kept = !under_another && this.clock_mut(|kept| kept.set(clock, step));
        this.kept.set(if kept {
            KeptPoint {
                stream: stream.id(),
                changes: stream.order.changes.load(Ordering::Relaxed),
                step,
                landed: false,
            }
        } else {
            KeptPoint::default()
        });
    });
}

/// A step of this thread's left flight: counted out, and when it is step
/// `step` of `stream` (`landed`: its slot emptied, not under the lock), a
/// point kept at it may serve.
#[inline]
pub(super) fn land_kept(stream: &Stream, step: u32, landed: bool) {
    THIS_THREAD.with(|this| {
        // Saturating: dropped on another thread than it was made on, the
        // count only makes that thread's points wait less.
        this.steps_in_flight
            .set(this.steps_in_flight.get().saturating_sub(1));
        let mut kept = this.kept.get();
        if landed && kept.stream == stream.id() && kept.step == step {
            kept.landed = true;
            this.kept.set(kept);
        }
    });
}

/// The point this thread kept of `stream`, if still valid ([`KeptPoint`]).
#[inline]
pub(super) fn kept_point(stream: &Stream) -> Option<KeptPoint> {
    let kept = THIS_THREAD.with(|t| t.kept.get());
    // Acquire: pairs with the bump of a lock whose holder's changes happen
    // before this record.
    let valid = kept.landed
        && kept.stream == stream.id()
        && kept.changes == stream.order.changes.load(Ordering::Acquire);
    valid.then_some(kept)
}

/// Whether `kept` is still the point this thread keeps: the same stream
/// and step (steps only rise, so no later point of the stream, nor one of
/// another, matches both).
#[inline]
pub(super) fn still_kept_by(this: &ThisThread, kept: &KeptPoint) -> bool {
    let now = this.kept.get();
    now.step == kept.step && now.stream == kept.stream
}

#[cfg(test)]
pub(super) fn still_kept(kept: &KeptPoint) -> bool {
    THIS_THREAD.with(|this| still_kept_by(this, kept))
}

/// `clock` learns the point `kept`, which a record waited for was written from
/// ([`recorded`](super::record_and_wait::recorded)), read where this thread
/// keeps it; nothing if it no longer does (knowing less is always true).
#[inline]
pub(super) fn learn_kept(clock: &mut VectorClock, kept: &KeptPoint) -> bool {
    THIS_THREAD.with(|this| still_kept_by(this, kept) && this.clock(|flat| clock.learn_flat(flat)))
}

#[cfg(test)]
mod tests {
    use super::super::check::before_enqueue;
    use super::super::context_state::forget;
    use super::super::in_flight::InFlight;
    use super::super::policy::OrderPolicy;
    use super::super::record_and_wait::record_point;
    use super::super::tests::{locks, streams, under, write_of_4_bytes};
    use super::super::touch::Touch;
    use super::*;

    /// A step taken while an earlier one is in flight in another slot
    /// than the first (the first slot freed meanwhile) keeps no point: a
    /// record after it lands still leaves out the earlier one. And a wait
    /// learns every stream its event's record knows, not only the first.
    #[test]
    fn a_step_over_another_in_any_slot_keeps_no_point_and_waits_learn_every_entry() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [stream, x, y, b, c] = streams(&ctx);
        let base = 1 << 58;
        let touch = |i: u64| write_of_4_bytes(&ctx, base + 64 * i);
        fn enqueue(s: &Stream, t: Touch) -> (InFlight<'_>, u32) {
            let flying = before_enqueue(s, "test", &[t], OrderPolicy::Check).unwrap();
            let step = flying.0.as_ref().unwrap().1;
            (flying, step)
        }
        let (first, _) = enqueue(&stream, touch(0));
        let (second, step) = enqueue(&stream, touch(0));
        drop(first);
        // The first slot is free again, the second holds `step`.
        drop(enqueue(&stream, touch(0)));
        let (point, _) = record_point(&stream).unwrap().taken();
        assert_eq!(point.own, step - 1, "a record over a step in flight");
        drop(second);
        // `b` waits for `x` and `y`, then `c` for `b`: `c` knows both.
        let (x_step, y_step) = (enqueue(&x, touch(1)).1, enqueue(&y, touch(2)).1);
        let event = |s: &Stream| {
            let event = crate::Event::new(&ctx, crate::EventFlags::PLAIN).unwrap();
            event.record(s).unwrap();
            event
        };
        b.wait_event(&event(&x)).unwrap();
        b.wait_event(&event(&y)).unwrap();
        c.wait_event(&event(&b)).unwrap();
        let (point, _) = record_point(&c).unwrap().taken();
        assert!(
            point.knows(x.id(), x_step) && point.knows(y.id(), y_step),
            "a wait left out what its record knew: {point:?}"
        );
        for s in [&stream, &x, &y] {
            s.synchronize().unwrap();
        }
        forget(&ctx, base, 192);
    }

    /// The point an enqueue keeps serves its thread's records only once the
    /// step has landed, and only while nothing else changed the stream: a
    /// record made while the driver call is in progress does not cover the
    /// step, and one made after a wait knows what the wait taught.
    #[test]
    fn a_kept_point_serves_only_after_its_step_and_before_any_change() {
        // Under `check` whatever the driver's default (a GPU's is `off`).
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [stream, other] = streams(&ctx);
        let touch = |address| write_of_4_bytes(&ctx, address);
        let (a, b) = (touch(1 << 56), touch((1 << 56) + 64));
        // An operation checked and recorded, its driver call being made,
        // and its step.
        fn enqueue(s: &Stream, t: Touch) -> (InFlight<'_>, u32) {
            let flying = before_enqueue(s, "test", &[t], OrderPolicy::Check).unwrap();
            let step = flying.0.as_ref().unwrap().1;
            (flying, step)
        }
        let (flying, step) = enqueue(&stream, a);
        let (point, _) = record_point(&stream).unwrap().taken();
        assert_eq!(point.own, step - 1, "a record during the driver call");
        drop(flying);
        let step = enqueue(&stream, a).1;
        let mut point = None;
        assert_eq!(locks(|| point = record_point(&stream)), 0, "kept");
        assert_eq!(
            point.unwrap().taken().0.own,
            step,
            "a record after the step"
        );
        // A step landed over an earlier one still in flight: the point kept
        // at it covers neither.
        let (first, step) = enqueue(&stream, a);
        drop(enqueue(&stream, a));
        let (point, _) = record_point(&stream).unwrap().taken();
        assert_eq!(point.own, step - 1, "a record over a step in flight");
        drop(first);
        // Another stream's step, waited for: the next record knows it.
        let other_step = enqueue(&other, b).1;
        let event = crate::Event::new(&ctx, crate::EventFlags::PLAIN).unwrap();
        drop(enqueue(&stream, a));
        event.record(&other).unwrap();
        stream.wait_event(&event).unwrap();
        let (point, _) = record_point(&stream).unwrap().taken();
        assert!(
            point.knows(other.id(), other_step),
            "a record after a wait does not know what the wait taught: {point:?}"
        );
        stream.synchronize().unwrap();
        forget(&ctx, a.address, 128);
    }
}
