//! Per stream: its clock, its steps in flight (checked and recorded, their
//! driver call not returned yet), and the points taken of it (what an event
//! record or a host wait covers), which wait for other threads' steps below
//! one that landed.

use super::clock::{Past, Vc, VectorClock};
use super::flying::FlyingSlots;
use super::kept::THIS_THREAD;
use super::tracker::Shadow;
use crate::objects::context::Context;
use crate::objects::event_pool::PooledEvent;
use crate::objects::stream::Stream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

/// Per stream: its clock, and the host knowledge it has taken in.
///
/// The state is guarded by its context's shadow lock, not a lock of its
/// own: an operation checks its accesses and takes its step under the one
/// lock ([`TrackedStream::lock`] gives both), which is what most of `check`'s
/// cost per operation was (an uncontended lock and unlock are two atomic
/// read-modify-writes). Records, waits and host waits of the streams of
/// one context share that lock too; they lock nothing else of the tracker
/// but the event.
pub(crate) struct TrackedStream {
    /// The context whose shadow lock guards `state`: the stream's own, for
    /// its whole life (so the same lock every time).
    home: Arc<Context>,
    /// Read and written only while `home`'s shadow is locked.
    state: std::cell::UnsafeCell<StreamState>,
    /// Steps in flight ([`StreamState::in_flight`]) held outside the lock, so
    /// that the end of a driver call releases its step with one store instead
    /// of a lock. Only the holder of `state` fills a slot, and only the step's
    /// [`InFlight`](super::InFlight) empties it; a fourth concurrent enqueue
    /// on one stream goes to `in_flight` under the lock.
    pub(super) flying: FlyingSlots,
    /// Bumped by every lock of `state`: a point kept by this thread
    /// ([`KeptPoint`](super::KeptPoint)) is the stream's as long as this has
    /// not moved.
    pub(super) changes: AtomicU64,
}

// SAFETY: `state` is only reached through `TrackedStream::lock`, which holds
// the shadow lock of `home` (never changed) while the reference it hands
// out lives, so no two threads touch it at once; everything in it is
// `Send`. The other fields are atomics and an `Arc`.
unsafe impl Sync for TrackedStream {}

/// A stream's state, borrowed under its context's shadow lock, which this
/// holds (and gives out too, for the operation's check and record).
pub(super) struct Held<'a> {
    /// The context whose shadow this locks.
    home: &'a Arc<Context>,
    shadow: MutexGuard<'a, Shadow>,
    state: std::ptr::NonNull<StreamState>,
    _state: std::marker::PhantomData<&'a mut StreamState>,
}

impl Held<'_> {
    /// The stream's state and its context's shadow, both borrowed at once.
    #[inline]
    pub(super) fn split(&mut self) -> (&mut StreamState, &mut Shadow) {
        // SAFETY: `state` points into the stream this borrows, whose state
        // `shadow`'s lock guards ([`TrackedStream::lock`]); `&mut self` makes
        // this the only reference for its length.
        (unsafe { self.state.as_mut() }, &mut self.shadow)
    }

    /// The context's shadow.
    #[inline]
    pub(super) fn shadow(&mut self) -> &mut Shadow {
        &mut self.shadow
    }

    /// The state of `other`, another stream of the same context, which
    /// this lock guards too; `None` for a stream of another context. Its
    /// kept points stay valid ([`TrackedStream::changes`] is not bumped):
    /// only its mark may be touched this way, never its clock.
    #[inline]
    pub(super) fn mark_of(&mut self, other: &Stream) -> Option<&mut Option<Arc<PooledEvent>>> {
        if !Arc::ptr_eq(&other.order.home, self.home) {
            return None;
        }
        // SAFETY: `other`'s state is guarded by `home`'s shadow lock, which
        // this holds; `&mut self` keeps this the only reference made
        // through this guard for its length (the holder's own state is a
        // different stream's: a stream never waits for itself, and if it
        // were the same, `split`'s reference cannot be alive meanwhile).
        Some(unsafe { &mut (*other.order.state.get()).mark })
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = StreamState;
    #[inline]
    fn deref(&self) -> &StreamState {
        // SAFETY: as in `Held::split`, shared for the length of `&self`.
        unsafe { self.state.as_ref() }
    }
}

impl std::ops::DerefMut for Held<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut StreamState {
        self.split().0
    }
}

/// How long a point waits at most for other threads' steps in flight below
/// one that landed ([`TrackedStream::settled`]): many driver calls' worth.
const SETTLE_FOR: std::time::Duration = std::time::Duration::from_millis(5);

pub(super) struct StreamState {
    pub(super) clock: VectorClock,
    /// What the host had seen complete at this stream's latest enqueue
    /// (shared with `HOST` until it learns more), and its version.
    pub(super) host: Arc<Vc>,
    pub(super) host_seen: u64,
    /// While the stream takes part in a capture: its clock within the
    /// graph (the capture's records and waits move it, not `clock`).
    pub(super) captured: Option<VectorClock>,
    /// Steps checked and recorded whose driver call has not returned yet,
    /// beyond those in [`TrackedStream::flying`] (rare). Two threads may
    /// enqueue on one stream at once (the enqueue gate is shared), and the
    /// driver may queue their work in the other order than their steps: a
    /// snapshot (an event record, a host wait) knows only the steps below
    /// all of these, which the driver has queued before it.
    /// A `Vec`, not a `SmallVec`: empty but in rare cases, and an empty
    /// `Vec` is read with no branch on where its items are.
    pub(super) in_flight: Vec<u32>,
    /// `Auto`'s last mark on this stream and what it covers: other streams
    /// ordered after a step it covers wait for it instead of a fresh record (a
    /// fork of one stream into several records once). Outside captures. The
    /// event's own record says what it covers
    /// ([`EventOrder::covers`](super::recorded::Recorded::covers)).
    pub(super) mark: Option<Arc<crate::objects::event_pool::PooledEvent>>,
    /// The contexts whose shadows know this stream by its id.
    /// A `Vec` (one allocation per stream): read at every operation,
    /// where a `SmallVec` would branch on where its items are.
    pub(super) joined: Vec<u64>,
}

impl TrackedStream {
    /// The order of stream `id`, a stream of `ctx`.
    pub(crate) fn new(id: u64, ctx: &Arc<Context>) -> Self {
        Self {
            home: Arc::clone(ctx),
            state: std::cell::UnsafeCell::new(StreamState {
                clock: VectorClock::new(id),
                host: Arc::default(),
                host_seen: 0,
                captured: None,
                in_flight: Vec::new(),
                mark: None,
                joined: Vec::new(),
            }),
            flying: Default::default(),
            changes: AtomicU64::new(0),
        }
    }

    /// Lock the stream's state: its context's shadow lock (counted once).
    /// Never while holding a shadow lock: the streams of a context share it.
    #[inline]
    pub(super) fn lock(&self) -> Held<'_> {
        let shadow = self.home.order.shadow();
        // Whatever the holder changes, a point kept before is stale. A
        // store, not a read-modify-write: only the holder writes it.
        let changes = self.changes.load(Ordering::Relaxed) + 1;
        self.changes.store(changes, Ordering::Release);
        Held {
            home: &self.home,
            shadow,
            // Not dereferenced here: `Held` hands it out only while
            // `shadow`, the lock guarding it, is held.
            state: std::ptr::NonNull::new(self.state.get()).expect("a field's address"),
            _state: std::marker::PhantomData,
        }
    }

    /// What a point taken now (an event recorded, the host waiting) knows
    /// of this stream: every step whose driver call has returned
    /// ([`TrackedStream::settled`]).
    pub(super) fn snapshot(&self) -> VectorClock {
        self.snapshot_settling(self.lock())
    }

    /// [`TrackedStream::snapshot`] from the state locked (`state`), which it
    /// lets go of if it has to wait ([`TrackedStream::settled`]).
    #[inline]
    pub(super) fn snapshot_settling(&self, state: Held<'_>) -> VectorClock {
        match self.landed_above_in_flight(&state) {
            None => self.snapshot_of(&state),
            Some(landed) => {
                drop(state);
                self.settled(landed)
            }
        }
    }

    /// The highest step whose driver call has returned, when a step below
    /// it is still in flight (another thread's enqueue, whose driver call
    /// has not returned) and this thread has none of its own in flight.
    ///
    /// A point is a prefix of the stream's steps, so a snapshot taken now
    /// would leave out that landed step, which the driver has queued: a
    /// thread that enqueued it, then recorded an event or forked, would be
    /// told its own work is unordered. The point waits for the steps below
    /// instead ([`TrackedStream::settled`]). A thread with a step in flight
    /// of its own (a work observer recording inside an enqueue) never
    /// waits, so no two points wait for each other's steps.
    #[inline]
    fn landed_above_in_flight(&self, state: &StreamState) -> Option<u32> {
        let lowest = self.lowest_in_flight(state)?;
        if THIS_THREAD.with(|t| t.steps_in_flight.get()) > 0 {
            return None;
        }
        // Few steps are ever in flight at once: a short walk down.
        let mut landed = state.clock.own;
        while landed > lowest && self.is_in_flight(state, landed) {
            landed -= 1;
        }
        (landed > lowest).then_some(landed)
    }

    /// Whether `step` is in flight, with the state locked.
    fn is_in_flight(&self, state: &StreamState, step: u32) -> bool {
        self.flying.holds(step) || state.in_flight.contains(&step)
    }

    /// The point of a record or host wait once no step below `landed` is in
    /// flight (their driver calls return within microseconds): then the
    /// snapshot covers `landed` and every step below it.
    ///
    /// Gives up after [`SETTLE_FOR`] and takes the snapshot as it is, which
    /// knows less than the driver queued: never an order that is not there,
    /// at worst a race reported where there was none. That bound is for a
    /// thread whose driver call waits for a lock this one holds (a
    /// profiler's, say), which would otherwise never return.
    #[cold]
    #[inline(never)]
    fn settled(&self, landed: u32) -> VectorClock {
        let started = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            let state = self.lock();
            let below = self.lowest_in_flight(&state).is_some_and(|l| l < landed);
            #[cfg(test)]
            let state_agent = state.clock.agent;
            if !below || started.elapsed() >= SETTLE_FOR {
                if below {
                    tracing::debug!(
                        target: "cuda_streams_driver::order",
                        stream = state.clock.agent,
                        "a point left out step {landed}: a step below it stayed in flight"
                    );
                }
                return self.snapshot_of(&state);
            }
            drop(state);
            #[cfg(test)]
            tests::settling(state_agent);
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// [`TrackedStream::snapshot`] with the state locked.
    #[inline]
    fn snapshot_of(&self, state: &StreamState) -> VectorClock {
        let mut clock = state.clock.clone();
        if let Some(lowest) = self.lowest_in_flight(state) {
            clock.own = clock.own.min(lowest - 1);
        }
        clock
    }

    /// The lowest step in flight, with the state locked.
    #[inline]
    fn lowest_in_flight(&self, state: &StreamState) -> Option<u32> {
        let slots = self.flying.lowest();
        match state.in_flight.iter().min() {
            Some(&beyond) => Some(slots.map_or(beyond, |s| s.min(beyond))),
            None => slots,
        }
    }

    /// Put `step`, the stream's newest, in flight (with `state` locked):
    /// the slot holding it (`None` when every slot is taken and it is in
    /// `state.in_flight`), and whether another step was in flight then
    /// (every such step is below it). One look at each slot.
    #[inline]
    pub(super) fn fly(&self, state: &mut StreamState, step: u32) -> (Option<u8>, bool) {
        let (slot, busy) = self.flying.fill(step);
        if slot.is_none() {
            state.in_flight.push(step);
        }
        (slot, busy || !state.in_flight.is_empty())
    }

    /// A step kept in [`StreamState::in_flight`] was queued.
    #[cold]
    pub(super) fn land(&self, step: u32) {
        let mut state = self.lock();
        if let Some(i) = state.in_flight.iter().position(|s| *s == step) {
            state.in_flight.swap_remove(i);
        }
    }

    /// The stream joins a capture (it began one, or was forked in): its
    /// clock within the graph starts from nothing (a fork's wait, captured
    /// next, is the graph's first edge into it).
    pub(crate) fn enter_capture(&self) {
        let mut state = self.lock();
        state.captured = Some(VectorClock::new(state.clock.agent));
        // Back to its pool once the lock is released.
        let mark = state.mark.take();
        drop(state);
        drop(mark);
    }

    /// The stream left its capture.
    pub(crate) fn leave_capture(&self) {
        let mut state = self.lock();
        state.captured = None;
        let mark = state.mark.take();
        drop(state);
        drop(mark);
    }

    /// Its clock within the graph being captured (`None` outside one).
    pub(super) fn captured(&self) -> Option<VectorClock> {
        self.lock().captured.clone()
    }

    /// A node was captured: the next step within the graph.
    pub(super) fn captured_step(&self) -> VectorClock {
        let mut state = self.lock();
        let agent = state.clock.agent;
        let clock = state
            .captured
            .get_or_insert_with(|| VectorClock::new(agent));
        clock.own += 1;
        clock.clone()
    }
}

impl StreamState {
    /// What the stream's next operation is ordered after: its clock and
    /// the host's knowledge (call [`StreamState::learn_host`] first).
    #[inline]
    pub(super) fn past(&self) -> Past<'_> {
        Past {
            clock: &self.clock,
            host: &self.host,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::before_enqueue;
    use super::super::context_state::forget;
    use super::super::flying::FLYING;
    use super::super::policy::OrderPolicy;
    use super::super::tests::{buffer, streams, under, write_of_4_bytes};
    use super::super::touch::Touch;
    use super::*;
    use crate::ground::error::Error;
    use std::sync::atomic::AtomicBool;

    /// The stream whose points the test below watches (0: none; stream ids
    /// start at 1). Its own, so no other test's points touch `SETTLING`.
    static WATCHED: AtomicU64 = AtomicU64::new(0);
    /// A point of the watched stream waits for a step in flight below one
    /// that landed ([`TrackedStream::settled`]).
    static SETTLING: AtomicBool = AtomicBool::new(false);
    /// The test landed that step.
    static LANDED: AtomicBool = AtomicBool::new(false);

    /// Called by [`TrackedStream::settled`] each time round, with no lock
    /// held. A point of the watched stream says it waits, then waits for
    /// the test to land the step below: without that, a loaded machine
    /// that leaves the landing thread unscheduled for [`SETTLE_FOR`] makes
    /// the point give up (its bound for a driver call that never returns),
    /// and the test would fail for the scheduler, not the tracker.
    pub(super) fn settling(stream: u64) {
        if WATCHED.load(Ordering::SeqCst) != stream {
            return;
        }
        SETTLING.store(true, Ordering::SeqCst);
        while !LANDED.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }

    /// A step that landed above another thread's step still in flight is
    /// covered by a point taken after it: the point waits for the step below
    /// to land, then covers both (a point is a prefix of the steps, so
    /// taken at once it would cover neither).
    #[test]
    fn a_point_waits_for_another_threads_step_in_flight_below_one_that_landed() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let touch = |address| write_of_4_bytes(&ctx, address);
        let (low, high) = (touch(1 << 60), touch((1 << 60) + 64));
        let before = stream.order.lock().clock.own;
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let taken = AtomicBool::new(false);
        let (on, taken_by_other) = (&stream, &taken);
        WATCHED.store(stream.id(), Ordering::SeqCst);
        std::thread::scope(|scope| {
            // Owns the sender: if it panics, the receive below fails
            // instead of waiting for ever.
            let other = scope.spawn(move || {
                let in_flight = before_enqueue(on, "low", &[low], OrderPolicy::Check).unwrap();
                held_tx.send(()).unwrap();
                // Its driver call returns once the point waits for it (or
                // was taken without waiting, which the assertion below
                // refuses).
                while !SETTLING.load(Ordering::SeqCst) && !taken_by_other.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                drop(in_flight);
                LANDED.store(true, Ordering::SeqCst);
            });
            held_rx.recv().unwrap();
            drop(before_enqueue(&stream, "high", &[high], OrderPolicy::Check).unwrap());
            let point = stream.order.snapshot();
            taken.store(true, Ordering::SeqCst);
            other.join().unwrap();
            assert!(SETTLING.load(Ordering::SeqCst), "the point waited");
            assert_eq!(point.own, before + 2, "the point covers both steps");
        });
        WATCHED.store(0, Ordering::SeqCst);
        // The same from a thread with a step of its own in flight: it does
        // not wait, and leaves out what is above the lowest step in flight.
        let own = before_enqueue(&stream, "own", &[low], OrderPolicy::Check).unwrap();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    drop(before_enqueue(&stream, "high", &[high], OrderPolicy::Check).unwrap())
                })
                .join()
                .unwrap();
        });
        assert_eq!(stream.order.snapshot().own, before + 2);
        drop(own);
        assert_eq!(stream.order.snapshot().own, before + 4);
        forget(&ctx, low.address, low.bytes);
        forget(&ctx, high.address, high.bytes);
    }

    /// Steps in flight, in their slots and beyond them, each keep a point
    /// taken meanwhile from covering it, whichever driver call returns first.
    #[test]
    fn a_point_taken_while_a_step_is_in_flight_does_not_cover_it() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        // Bytes no allocation has, and no other test of device 0's shared
        // context touches: nothing to conflict with.
        let touch = Touch {
            ctx: ctx.id(),
            address: 1 << 57,
            bytes: 4,
            write: true,
        };
        let before = stream.order.lock().clock.own;
        // Two more than the slots: the last two go under the lock.
        let mut flying: Vec<_> = (0..FLYING + 2)
            .map(|_| before_enqueue(&stream, "test", &[touch], OrderPolicy::Check).unwrap())
            .collect();
        let steps = stream.order.lock().clock.own;
        assert_eq!(steps, before + FLYING as u32 + 2);
        // Every driver call is still being made: an event recorded now
        // covers none of them.
        assert_eq!(stream.order.snapshot().own, before);
        // The first step (in a slot) is in flight to the end; the others
        // return last first, the one beyond the slots first of all.
        let first = flying.remove(0);
        while let Some(landed) = flying.pop() {
            drop(landed);
            assert_eq!(
                stream.order.snapshot().own,
                before,
                "the first step is in flight ({} others)",
                flying.len()
            );
        }
        drop(first);
        assert_eq!(stream.order.snapshot().own, steps);
        // Only the lowest step in flight bounds a point: one beyond the
        // slots, alone in flight, does too.
        let held: Vec<_> = (0..FLYING + 1)
            .map(|_| before_enqueue(&stream, "test", &[touch], OrderPolicy::Check).unwrap())
            .collect();
        let mut held = held.into_iter();
        let in_slots: Vec<_> = held.by_ref().take(FLYING).collect();
        drop(in_slots);
        assert_eq!(
            stream.order.snapshot().own,
            steps + FLYING as u32,
            "the step beyond the slots is in flight"
        );
        drop(held);
        assert_eq!(stream.order.snapshot().own, steps + FLYING as u32 + 1);
        forget(&ctx, touch.address, touch.bytes);
    }

    /// Streams of one context share their state's lock with the shadow:
    /// threads enqueueing on two streams at once (two threads per stream),
    /// each recording one shared event after each operation, lose no step
    /// and no access, and the checks after them still see every write.
    #[test]
    fn concurrent_enqueues_and_records_on_streams_of_one_context_keep_every_step() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [a, b, reader] = streams(&ctx);
        let event = crate::Event::new(&ctx, crate::EventFlags::PLAIN).unwrap();
        let steps = |s: &Stream| s.order.lock().clock.own;
        let (from_a, from_b) = (steps(&a), steps(&b));
        const OPS: u32 = 200;
        let mut buffers: Vec<_> = (0..4).map(|_| buffer(&ctx)).collect();
        std::thread::scope(|scope| {
            for (i, data) in buffers.iter_mut().enumerate() {
                let (stream, event) = (if i % 2 == 0 { &a } else { &b }, &event);
                scope.spawn(move || {
                    for value in 0..OPS {
                        stream.memset_u32_async(data, value).unwrap();
                        event.record(stream).unwrap();
                    }
                });
            }
        });
        assert_eq!(steps(&a) - from_a, 2 * OPS, "steps of a lost");
        assert_eq!(steps(&b) - from_b, 2 * OPS, "steps of b lost");
        // The event's record is one of the two streams', whole.
        let (point, captured) = event.order.get().expect("recorded");
        assert!(!captured && (point.agent == a.id() || point.agent == b.id()));
        assert!(point.own <= steps(&a).max(steps(&b)));
        // Every thread's last write is still recorded: unordered, refused.
        for data in &mut buffers {
            let refused = reader.memset_u32_async(data, 9);
            assert!(
                matches!(refused, Err(Error::UnorderedAccess(_))),
                "{refused:?}"
            );
        }
        reader.wait_stream(&a).unwrap();
        reader.wait_stream(&b).unwrap();
        for data in &mut buffers {
            reader.memset_u32_async(data, 9).unwrap();
            assert_eq!(data.to_vec(&reader).unwrap(), [9; 64]);
        }
    }
}
