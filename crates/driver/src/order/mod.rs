//! Stream order, checked and inferred: happens-before over the bytes every
//! operation touches.
//!
//! Every enqueue that touches memory goes through `enqueue.rs`, which knows
//! the bytes each operation reads and writes; every ordering edge (stream
//! order, event record and wait, joins and forks, which are events, host
//! waits, graph launches) goes through this crate too. This module keeps a
//! vector clock per stream and per event record (`clock.rs`) and, per
//! context, the last write and the unordered reads of each byte range
//! (`tracker.rs`). An access that conflicts with one not in its past is a
//! [`Race`], which the context's [`OrderPolicy`] refuses, reports or repairs.
//!
//! The host is one agent: a completion observed on any thread (a stream or
//! event synchronized, a query that answered "done", a future that resolved)
//! orders the work every thread enqueues afterwards. Threads synchronise
//! with each other in ways this crate cannot see (channels, joins), so it
//! assumes they do; a completion that has not happened yet is never assumed.
//!
//! `docs/ordering.md` describes the model, what is and is not checked, and
//! the cost of each policy.

mod capture;
mod clock;
mod policy;
mod recorded;
mod report;
mod tracker;

pub(crate) use capture::CaptureOrder;
pub use policy::{ORDERING_SETTING, OrderPolicy};
pub(crate) use policy::{initial_policy, policy_from_env, refusal_message};
pub(crate) use recorded::EventOrder;
pub use report::{Race, RaceOp};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::event_pool::PooledEvent;
use crate::stream::Stream;
pub(crate) use clock::Clock;
use clock::{Knows, Past, Vc};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tracker::{Access, Shadow};

#[cfg(test)]
thread_local! {
    /// Locks of the tracker's state taken on this thread, for the tests that
    /// count what an operation costs.
    static LOCKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Count one lock of the tracker's state (in tests; nothing otherwise).
#[inline(always)]
fn counted() {
    #[cfg(test)]
    LOCKS.with(|n| n.set(n.get() + 1));
}

/// Set once any context turns tracking on: until then, labels cost nothing.
static EVER_ON: AtomicBool = AtomicBool::new(false);

/// Per context: the policy, and the accesses to the context's memory.
pub(crate) struct ContextOrder {
    policy: AtomicU8,
    shadow: Mutex<Shadow>,
}

impl ContextOrder {
    pub(crate) fn new(policy: OrderPolicy) -> Self {
        if policy != OrderPolicy::Off {
            EVER_ON.store(true, Ordering::Relaxed);
        }
        Self {
            policy: AtomicU8::new(policy.to_u8()),
            shadow: Mutex::default(),
        }
    }

    /// The policy; `Off` is the one branch the enqueue path pays.
    #[inline]
    pub(crate) fn policy(&self) -> OrderPolicy {
        OrderPolicy::from_u8(self.policy.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.policy.load(Ordering::Relaxed) != OrderPolicy::Off.to_u8()
    }

    /// Set the policy without asking the driver: for the unit tests that
    /// measure `Off` on the software driver, on work that has no
    /// conflicting pair (which `Context::set_ordering` refuses, since it
    /// cannot know that).
    #[cfg(test)]
    pub(crate) fn force(&self, policy: OrderPolicy) {
        self.policy.store(policy.to_u8(), Ordering::Relaxed);
    }

    fn shadow(&self) -> MutexGuard<'_, Shadow> {
        counted();
        self.shadow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count in the context's [`OrderStats`], taking the shadow lock (the
    /// paths that do not hold it already: captures, the general repair).
    fn count(&self, f: impl FnOnce(&mut OrderStats)) {
        f(&mut self.shadow().stats);
    }
}

/// What the tracker has done in one context.
///
/// ```
/// use cuda_streams_driver::Context;
/// let stats = Context::new(0).unwrap().ordering_stats();
/// let _ = (stats.reports, stats.inserted_waits);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderStats {
    /// Races found (refused, reported or repaired).
    pub reports: u64,
    /// Waits inserted by [`OrderPolicy::Auto`].
    pub inserted_waits: u64,
}

impl Context {
    /// Races found and waits inserted in this context so far.
    pub fn ordering_stats(&self) -> OrderStats {
        self.order.shadow().stats
    }

    /// Forget the accesses recorded to `bytes` bytes at `address` (memory
    /// this context freed, or is about to hand to a new owner), so the next
    /// owner's uses are not compared with the last one's.
    ///
    /// # Safety
    /// No work enqueued so far may still use the memory unordered with
    /// the next owner's work: every use has completed, or the memory goes
    /// back to the driver after the uses (a stream-ordered free).
    /// Forgetting memory that is still in use hides races the tracker
    /// would refuse, and on the software driver a race is a data race.
    pub unsafe fn forget_accesses(&self, address: u64, bytes: usize) {
        forget(self, address, bytes);
    }
}

/// See [`Context::forget_accesses`]; called by this crate's frees.
pub(crate) fn forget(ctx: &Context, address: u64, bytes: usize) {
    if ctx.order.is_on() {
        ctx.order
            .shadow()
            .forget(address, address.saturating_add(bytes as u64));
    }
}

/// Per stream: its clock, and the host knowledge it has taken in.
///
/// The state is guarded by its context's shadow lock, not a lock of its
/// own: an operation checks its accesses and takes its step under the one
/// lock ([`StreamOrder::lock`] gives both), which is what most of `check`'s
/// cost per operation was (an uncontended lock and unlock are two atomic
/// read-modify-writes). Records, waits and host waits of the streams of
/// one context share that lock too; they lock nothing else of the tracker
/// but the event.
pub(crate) struct StreamOrder {
    /// The context whose shadow lock guards `state`: the stream's own, for
    /// its whole life (so the same lock every time).
    home: Arc<Context>,
    /// Read and written only while `home`'s shadow is locked.
    state: std::cell::UnsafeCell<StreamState>,
    /// Steps in flight ([`StreamState::in_flight`]) held outside the lock,
    /// so that the end of a driver call releases its step with one store
    /// instead of a lock. 0 is a free slot (steps start at 1). Only the
    /// holder of `state` fills a slot, and only the step's [`InFlight`]
    /// empties it; a fourth concurrent enqueue on one stream goes to
    /// `in_flight` under the lock.
    flying: [AtomicU32; FLYING],
    /// Bumped by every lock of `state`: a point kept by this thread
    /// ([`KeptPoint`]) is the stream's as long as this has not moved.
    changes: AtomicU64,
}

// SAFETY: `state` is only reached through `StreamOrder::lock`, which holds
// the shadow lock of `home` (never changed) while the reference it hands
// out lives, so no two threads touch it at once; everything in it is
// `Send`. The other fields are atomics and an `Arc`.
unsafe impl Sync for StreamOrder {}

/// A stream's state, borrowed under its context's shadow lock, which this
/// holds (and gives out too, for the operation's check and record).
struct Held<'a> {
    /// The context whose shadow this locks.
    home: &'a Arc<Context>,
    shadow: MutexGuard<'a, Shadow>,
    state: std::ptr::NonNull<StreamState>,
    _state: std::marker::PhantomData<&'a mut StreamState>,
}

impl Held<'_> {
    /// The stream's state and its context's shadow, both borrowed at once.
    #[inline]
    fn split(&mut self) -> (&mut StreamState, &mut Shadow) {
        // SAFETY: `state` points into the stream this borrows, whose state
        // `shadow`'s lock guards ([`StreamOrder::lock`]); `&mut self` makes
        // this the only reference for its length.
        (unsafe { self.state.as_mut() }, &mut self.shadow)
    }

    /// The context's shadow.
    #[inline]
    fn shadow(&mut self) -> &mut Shadow {
        &mut self.shadow
    }

    /// The state of `other`, another stream of the same context, which
    /// this lock guards too; `None` for a stream of another context. Its
    /// kept points stay valid ([`StreamOrder::changes`] is not bumped):
    /// only its mark may be touched this way, never its clock.
    #[inline]
    fn mark_of(&mut self, other: &Stream) -> Option<&mut Option<Arc<PooledEvent>>> {
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

/// Slots of [`StreamOrder::flying`]: more than the threads that enqueue on
/// one stream at once in any program seen so far.
const FLYING: usize = 3;

/// How long a point waits at most for other threads' steps in flight below
/// one that landed ([`StreamOrder::settled`]): many driver calls' worth.
const SETTLE_FOR: std::time::Duration = std::time::Duration::from_millis(5);

struct StreamState {
    clock: Clock,
    /// What the host had seen complete at this stream's latest enqueue
    /// (shared with `HOST` until it learns more), and its version.
    host: Arc<Vc>,
    host_seen: u64,
    /// While the stream takes part in a capture: its clock within the
    /// graph (the capture's records and waits move it, not `clock`).
    captured: Option<Clock>,
    /// Steps checked and recorded whose driver call has not returned yet,
    /// beyond those in [`StreamOrder::flying`] (rare). Two threads may
    /// enqueue on one stream at once (the enqueue gate is shared), and the
    /// driver may queue their work in the other order than their steps: a
    /// snapshot (an event record, a host wait) knows only the steps below
    /// all of these, which the driver has queued before it.
    /// A `Vec`, not a `SmallVec`: empty but in rare cases, and an empty
    /// `Vec` is read with no branch on where its items are.
    in_flight: Vec<u32>,
    /// `Auto`'s last mark on this stream and what it covers: other streams
    /// ordered after a step it covers wait for it instead of a fresh record
    /// (a fork of one stream into several records once). Outside captures.
    /// The event's own record says what it covers ([`EventOrder::covers`]).
    mark: Option<Arc<crate::event_pool::PooledEvent>>,
    /// The contexts whose shadows know this stream by its id.
    /// A `Vec` (one allocation per stream): read at every operation,
    /// where a `SmallVec` would branch on where its items are.
    joined: Vec<u64>,
}

impl StreamOrder {
    /// The order of stream `id`, a stream of `ctx`.
    pub(crate) fn new(id: u64, ctx: &Arc<Context>) -> Self {
        Self {
            home: Arc::clone(ctx),
            state: std::cell::UnsafeCell::new(StreamState {
                clock: Clock::new(id),
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
    fn lock(&self) -> Held<'_> {
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
    /// ([`StreamOrder::settled`]).
    fn snapshot(&self) -> Clock {
        self.snapshot_settling(self.lock())
    }

    /// [`StreamOrder::snapshot`] from the state locked (`state`), which it
    /// lets go of if it has to wait ([`StreamOrder::settled`]).
    #[inline]
    fn snapshot_settling(&self, state: Held<'_>) -> Clock {
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
    /// instead ([`StreamOrder::settled`]). A thread with a step in flight
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
        self.flying
            .iter()
            .any(|s| s.load(Ordering::Acquire) == step)
            || state.in_flight.contains(&step)
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
    fn settled(&self, landed: u32) -> Clock {
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

    /// [`StreamOrder::snapshot`] with the state locked.
    #[inline]
    fn snapshot_of(&self, state: &StreamState) -> Clock {
        let mut clock = state.clock.clone();
        if let Some(lowest) = self.lowest_in_flight(state) {
            clock.own = clock.own.min(lowest - 1);
        }
        clock
    }

    /// The lowest step in flight, with the state locked.
    #[inline]
    fn lowest_in_flight(&self, state: &StreamState) -> Option<u32> {
        // Acquire: a slot seen free was emptied after its driver call
        // returned, so whatever the caller queues next is queued after it.
        // A free slot (0) reads as the highest step: one `min` per slot.
        let slots = self
            .flying
            .iter()
            .map(|s| s.load(Ordering::Acquire).wrapping_sub(1))
            .fold(u32::MAX, u32::min);
        let lowest = match state.in_flight.iter().min() {
            Some(&beyond) => slots.min(beyond.wrapping_sub(1)),
            None => slots,
        };
        // Steps start at 1, so no step reads as `u32::MAX` here.
        (lowest != u32::MAX).then(|| lowest + 1)
    }

    /// Put `step`, the stream's newest, in flight (with `state` locked):
    /// the slot holding it (`None` when every slot is taken and it is in
    /// `state.in_flight`), and whether another step was in flight then
    /// (every such step is below it). One look at each slot.
    #[inline]
    fn fly(&self, state: &mut StreamState, step: u32) -> (Option<u8>, bool) {
        // Acquire, as in `lowest_in_flight`. Slots are filled only under
        // the lock, so one seen free stays free until filled below; one
        // seen busy that was just emptied only costs the fallback. Each
        // slot loaded once, with no loop: the common case (all free) is a
        // few instructions.
        let [a, b, c] = &self.flying;
        let slots = [
            a.load(Ordering::Acquire),
            b.load(Ordering::Acquire),
            c.load(Ordering::Acquire),
        ];
        let others = !state.in_flight.is_empty() || (slots[0] | slots[1] | slots[2]) != 0;
        let free = slots.iter().position(|&s| s == 0);
        let slot = match free {
            Some(i) => {
                self.flying[i].store(step, Ordering::Relaxed);
                Some(i as u8)
            }
            None => {
                state.in_flight.push(step);
                None
            }
        };
        (slot, others)
    }

    /// The stream joins a capture (it began one, or was forked in): its
    /// clock within the graph starts from nothing (a fork's wait, captured
    /// next, is the graph's first edge into it).
    pub(crate) fn enter_capture(&self) {
        let mut state = self.lock();
        state.captured = Some(Clock::new(state.clock.agent));
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
    fn captured(&self) -> Option<Clock> {
        self.lock().captured.clone()
    }

    /// A node was captured: the next step within the graph.
    fn captured_step(&self) -> Clock {
        let mut state = self.lock();
        let agent = state.clock.agent;
        let clock = state.captured.get_or_insert_with(|| Clock::new(agent));
        clock.own += 1;
        clock.clone()
    }
}

impl StreamState {
    /// Take in what the host has seen complete since the last enqueue.
    #[inline]
    fn learn_host(&mut self) {
        let version = HOST_VERSION.load(Ordering::Acquire);
        if version != self.host_seen {
            self.learn_host_now(version);
        }
    }

    #[cold]
    #[inline(never)]
    fn learn_host_now(&mut self, version: u64) {
        counted();
        self.host = Arc::clone(&HOST.lock().unwrap_or_else(|p| p.into_inner()));
        self.host_seen = version;
    }

    /// What the stream's next operation is ordered after: its clock and
    /// the host's knowledge (call [`StreamState::learn_host`] first).
    #[inline]
    fn past(&self) -> Past<'_> {
        Past {
            clock: &self.clock,
            host: &self.host,
        }
    }
}

/// What every thread has seen complete.
/// Copied on write: streams hold the version they last saw.
static HOST: std::sync::LazyLock<Mutex<Arc<Vc>>> = std::sync::LazyLock::new(Mutex::default);
/// Bumped whenever `HOST` learns something.
static HOST_VERSION: AtomicU64 = AtomicU64::new(0);

fn host_learns(clock: &Clock) {
    counted();
    let mut host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    if !host.covers(clock) {
        Arc::make_mut(&mut host).learn(clock);
        HOST_VERSION.fetch_add(1, Ordering::Release);
    }
}

/// What a record of an event on `stream` will cover, taken just before the
/// driver records it (work queued after this point is not covered).
#[inline]
pub(crate) fn record_point(stream: &Stream) -> Option<Point> {
    if !stream.context().order.is_on() {
        return None;
    }
    if let Some(kept) = kept_point(stream) {
        return Some(Point::Kept(kept));
    }
    // A record captured into a graph happens at each replay, not now: it
    // carries the stream's clock within the graph, never its own.
    let state = stream.order.lock();
    if let Some(captured) = &state.captured {
        return Some(Point::Taken(captured.clone(), true));
    }
    Some(Point::Taken(stream.order.snapshot_settling(state), false))
}

/// What a record covers ([`record_point`]).
pub(crate) enum Point {
    /// The point this thread kept of the stream ([`KeptPoint`]), still
    /// where it was kept: the record is written from there, not copied out
    /// first (an eager point).
    Kept(KeptPoint),
    /// A clock taken from the stream, and whether it was captured.
    Taken(Clock, bool),
}

impl Point {
    /// The clock and whether it was captured (for tests: the kept point
    /// copied out).
    #[cfg(test)]
    fn taken(self) -> (Clock, bool) {
        match self {
            Point::Taken(clock, captured) => (clock, captured),
            Point::Kept(kept) => {
                assert!(still_kept(&kept), "the kept point changed");
                (THIS_THREAD.with(|t| t.clock(clock::Flat::clock)), false)
            }
        }
    }
}

/// Which point of a stream the thread that enqueued its latest step keeps
/// (the clock is in [`ThisThread::clock`]), taken at that enqueue under the
/// stream's lock, for the records that follow
/// the step (its buffers' use events, the engine's completion event) to
/// take without locking the stream again.
///
/// Valid while nothing locked the stream since ([`StreamOrder::changes`]
/// unmoved: no other step, wait or capture changed its clock), and once
/// the step has landed (its driver call returned): then the stream's
/// snapshot would be this point or know more (steps of other threads that
/// were in flight under this one may have landed meanwhile, which a record
/// may leave out: it knows less, never more, than the driver queued
/// before it).
#[derive(Clone, Copy, Default)]
pub(crate) struct KeptPoint {
    stream: u64,
    changes: u64,
    /// 0 when nothing is kept (steps start at 1).
    step: u32,
    landed: bool,
}

/// What the tracker keeps per thread, in one thread-local (one access
/// per step and per landing rather than one per field). Plain data with
/// no destructor, so an access is a load of the thread's base, no state
/// check.
struct ThisThread {
    /// Steps of this thread in flight, on any stream (each [`InFlight`]
    /// alive): a point taken meanwhile does not wait for other threads'
    /// steps ([`StreamOrder::landed_above_in_flight`]).
    steps_in_flight: std::cell::Cell<u32>,
    /// The point kept ([`KeptPoint`]).
    kept: std::cell::Cell<KeptPoint>,
    /// The clock of the point in `kept`: written in place at each step,
    /// and records are written from it, so it is never copied whole.
    /// Reached only through [`ThisThread::clock`] and
    /// [`ThisThread::clock_mut`] (no borrow flag to check and set at each).
    clock: std::cell::UnsafeCell<clock::Flat>,
    /// Whether [`labelled`] set a label on this thread: an operation
    /// without one (the common case) reads no other thread-local.
    labelled: std::cell::Cell<bool>,
}

impl ThisThread {
    /// Read the kept clock with `read`, which must not reach this
    /// thread's `THIS_THREAD` (it is given plain data and writes at most
    /// an event's record).
    #[inline(always)]
    fn clock<R>(&self, read: impl FnOnce(&clock::Flat) -> R) -> R {
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
    static THIS_THREAD: ThisThread = const {
        ThisThread {
            steps_in_flight: std::cell::Cell::new(0),
            kept: std::cell::Cell::new(KeptPoint { stream: 0, changes: 0, step: 0, landed: false }),
            clock: std::cell::UnsafeCell::new(clock::Flat::EMPTY),
            labelled: std::cell::Cell::new(false),
        }
    };
}

/// Keep the point of `stream` after its step `step` (just taken, `state`
/// locked), for [`kept_point`] once the step lands. Nothing is kept of a
/// clock too large to keep inline.
///
/// `under_another`: another step of the stream (below this one) was in
/// flight when this one was taken. Then the point right after this step
/// would leave this step out: none is kept, and a record after it takes
/// its point the general way, which waits for that step to land
/// ([`StreamOrder::settled`]).
/// Also counts the step in flight on this thread (the same thread-local).
#[inline]
fn keep_point(stream: &Stream, state: &StreamState, step: u32, under_another: bool) {
    THIS_THREAD.with(|this| {
        this.steps_in_flight.set(this.steps_in_flight.get() + 1);
        let kept = !under_another && this.clock_mut(|kept| kept.set(&state.clock, step));
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
fn land_kept(stream: &Stream, step: u32, landed: bool) {
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
fn kept_point(stream: &Stream) -> Option<KeptPoint> {
    let kept = THIS_THREAD.with(|t| t.kept.get());
    // Acquire: pairs with the bump of a lock whose holder's changes happen
    // before this record.
    let valid = kept.landed
        && kept.stream == stream.id()
        && kept.changes == stream.order.changes.load(Ordering::Acquire);
    valid.then_some(kept)
}

/// `event` was recorded at `point` ([`record_point`]); `exclusive`: the
/// caller holds the event's only handle, so no other record can overlap
/// this one ([`Event::record_counted`]). Whether the record was written
/// from the kept point of `point`: while this thread keeps it
/// ([`learn_kept`]), it is what the record says. (A flag, not the point:
/// most callers drop it, and a point handed back costs a copy each.)
#[inline]
pub(crate) fn recorded(event: &Event, point: Option<&Point>, exclusive: bool) -> bool {
    // By reference: under `Off` (`None`) nothing is moved.
    match point {
        None => false,
        Some(Point::Taken(clock, captured)) => {
            event.order.set(clock, *captured, exclusive);
            false
        }
        Some(Point::Kept(kept)) => THIS_THREAD.with(|this| {
            if still_kept_by(this, kept) {
                this.clock(|flat| event.order.set_flat(flat, exclusive));
                true
            } else {
                // The thread kept another point since the record's (none
                // of its enqueues runs inside a record's driver call, so
                // this does not happen): a record that knows nothing of
                // the stream is true of any point of it.
                event.order.set(&Clock::new(kept.stream), false, exclusive);
                false
            }
        }),
    }
}

/// Whether `kept` is still the point this thread keeps: the same stream
/// and step (steps only rise, so no later point of the stream, nor one of
/// another, matches both).
#[inline]
fn still_kept_by(this: &ThisThread, kept: &KeptPoint) -> bool {
    let now = this.kept.get();
    now.step == kept.step && now.stream == kept.stream
}

#[cfg(test)]
fn still_kept(kept: &KeptPoint) -> bool {
    THIS_THREAD.with(|this| still_kept_by(this, kept))
}

/// `clock` learns the point `kept`, which a record waited for was written
/// from ([`recorded`]), read where this thread keeps it; nothing if it no
/// longer does (knowing less is always true).
#[inline]
fn learn_kept(clock: &mut Clock, kept: &KeptPoint) -> bool {
    THIS_THREAD.with(|this| still_kept_by(this, kept) && this.clock(|flat| clock.learn_flat(flat)))
}

/// `stream` was made to wait for `event`.
#[inline]
pub(crate) fn waited(stream: &Stream, event: &Event) {
    if stream.context().order.is_on() {
        // Read without a lock (`recorded.rs`), as plain data when its
        // entries are inline (the common case), then learnt under the
        // stream's.
        let mut flat = clock::Flat::EMPTY;
        match event.order.read_flat(&mut flat) {
            None => {}
            Some(Some(captured)) => {
                if let Some(clock) = taught_by_wait(&mut stream.order.lock(), captured) {
                    clock.learn_flat(&flat);
                }
            }
            Some(None) => waited_spilled(stream, event),
        }
    }
}

/// [`waited`] for a record too large to keep inline.
#[cold]
#[inline(never)]
fn waited_spilled(stream: &Stream, event: &Event) {
    {
        let mut snapshot = Clock::new(0);
        let Some(captured) = event.order.read_into(&mut snapshot) else {
            return;
        };
        if let Some(clock) = taught_by_wait(&mut stream.order.lock(), captured) {
            clock.learn(&snapshot);
        }
    }
}

/// The clock of a stream that a wait for a record teaches (`captured`:
/// the record was made in a capture): its clock within its capture, or
/// its own for an eager record; `None` for a mix, which
/// `Stream::wait_event` refuses before it gets here.
#[inline(always)]
fn taught_by_wait(state: &mut StreamState, captured: bool) -> Option<&mut Clock> {
    match (&mut state.captured, captured) {
        (Some(within), true) => Some(within),
        (None, false) => Some(&mut state.clock),
        _ => None,
    }
}

/// The host is about to wait for (or query) everything enqueued on
/// `stream` so far: what it would learn, taken before the wait.
#[inline]
pub(crate) fn stream_point(stream: &Stream) -> Option<Clock> {
    stream
        .context()
        .order
        .is_on()
        .then(|| stream.order.snapshot())
}

/// The host is about to wait for `event`: what it would learn.
#[inline]
pub(crate) fn event_point(event: &Event) -> Option<Clock> {
    if event.context().order.is_on() {
        // A captured record teaches the host nothing about eager work.
        event
            .order
            .get()
            .and_then(|(clock, captured)| (!captured).then_some(clock))
    } else {
        None
    }
}

/// The host saw `point` complete.
#[inline]
pub(crate) fn completed(point: Option<Clock>) {
    if let Some(point) = point {
        host_learns(&point);
    }
}

thread_local! {
    static LABEL: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
    /// The label made last on this thread: an operation labelled as the one
    /// before it (a loop's) shares its string instead of allocating one.
    static LAST_LABEL: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// Run `f` with `label` naming the operations it enqueues on this thread, in
/// the reports of [`OrderPolicy::Check`] and [`OrderPolicy::Report`] (the
/// engine labels each operation this way). Costs nothing while every
/// context's policy is [`OrderPolicy::Off`].
///
/// ```
/// use cuda_streams_driver::{order, Context, DeviceBuffer, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut data = DeviceBuffer::<u32>::new(&ctx, 4).unwrap();
/// order::labelled("clear", || stream.memset_u32_async(&mut data, 0)).unwrap();
/// ```
pub fn labelled<R>(label: &str, f: impl FnOnce() -> R) -> R {
    if label.is_empty() || !EVER_ON.load(Ordering::Relaxed) {
        return f();
    }
    let shared = LAST_LABEL.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some(same) if **same == *label => Arc::clone(same),
            _ => Arc::clone(last.insert(Arc::from(label))),
        }
    });
    let previous = LABEL.with(|l| l.replace(Some(shared)));
    THIS_THREAD.with(|t| t.labelled.set(true));
    let _restore = Restore(previous);
    f()
}

struct Restore(Option<Arc<str>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        THIS_THREAD.with(|t| t.labelled.set(previous.is_some()));
        LABEL.with(|l| *l.borrow_mut() = previous);
    }
}

#[inline]
fn current_label() -> Option<Arc<str>> {
    if !THIS_THREAD.with(|t| t.labelled.get()) {
        return None;
    }
    LABEL.with(|l| l.borrow().clone())
}

/// Bytes an operation touches: `bytes` at `address` in the memory of
/// context `ctx`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Touch {
    pub(crate) ctx: u64,
    pub(crate) address: u64,
    pub(crate) bytes: usize,
    pub(crate) write: bool,
}

impl Touch {
    fn range(self) -> (u64, u64) {
        (self.address, self.address.saturating_add(self.bytes as u64))
    }
}

/// The touches of one operation, on the stack for up to eight buffers.
pub(crate) type Touches = SmallVec<[Touch; 8]>;

/// The shadows of the contexts an operation touches, locked in id order.
/// The stream's own (which guards its state) and the others' (peer memory).
struct Locked<'c> {
    home: u64,
    held: Held<'c>,
    others: SmallVec<[(u64, MutexGuard<'c, Shadow>); 1]>,
}

impl<'c> Locked<'c> {
    /// Lock `stream`'s state and the shadows of `home` (its context) and
    /// `others`, in the order of their ids.
    fn new(stream: &'c Stream, home: &'c Context, others: &'c [Arc<Context>]) -> Self {
        let mut contexts: SmallVec<[&Context; 2]> = SmallVec::new();
        contexts.push(home);
        contexts.extend(others.iter().map(|c| &**c));
        contexts.sort_by_key(|c| c.id());
        let mut held = None;
        let mut guards = SmallVec::new();
        for ctx in contexts {
            if ctx.id() == home.id() {
                held = Some(stream.order.lock());
            } else {
                guards.push((ctx.id(), ctx.order.shadow()));
            }
        }
        Locked {
            home: home.id(),
            held: held.expect("the stream's own context is listed"),
            others: guards,
        }
    }

    /// The stream's state, and the shadow of context `ctx`.
    fn split(&mut self, ctx: u64) -> (&mut StreamState, &mut Shadow) {
        let (state, own) = self.held.split();
        match self.others.iter_mut().find(|(id, _)| *id == ctx) {
            Some((_, shadow)) if ctx != self.home => (state, &mut **shadow),
            _ => (state, own),
        }
    }

    fn versions(&mut self) -> SmallVec<[u64; 2]> {
        let own = self.held.shadow().version();
        let others = self.others.iter().map(|(_, g)| g.version());
        std::iter::once(own).chain(others).collect()
    }

    fn streams(&mut self, id: u64) -> impl Iterator<Item = Weak<Stream>> {
        let own = self.held.shadow().stream(id);
        let others: SmallVec<[Weak<Stream>; 1]> =
            self.others.iter().map(|(_, g)| g.stream(id)).collect();
        std::iter::once(own).chain(others)
    }
}

/// Check the accesses of one operation about to be enqueued on `stream`
/// against every access recorded before it, act on the races as the policy
/// says, and record them. `policy` is the stream context's, not `Off`.
///
/// The common case (memory of the stream's own context, nothing unordered)
/// takes two locks, one lookup per touched range and allocates nothing;
/// anything else goes the general way ([`check_and_repair`]).
pub(crate) fn before_enqueue<'s>(
    stream: &'s Stream,
    what: &'static str,
    touches: &[Touch],
    policy: OrderPolicy,
) -> Result<InFlight<'s>> {
    let home = stream.context();
    if touches.iter().all(|t| t.ctx == home.id()) {
        // The stream's state and the shadow: one lock.
        let mut held = stream.order.lock();
        let (state, shadow) = held.split();
        state.learn_host();
        let access = next_access(state, stream, what);
        if policy != OrderPolicy::Auto {
            if record_if_ordered(shadow, touches, &access, &state.past()) {
                return Ok(commit_step(state, stream, home.id(), shadow));
            }
        } else {
            // The races found on the way are what the repair waits for:
            // each range is looked up once.
            let mut races = SmallVec::new();
            if record_or_races(shadow, touches, &access, &state.past(), &mut races) {
                return Ok(commit_step(state, stream, home.id(), shadow));
            }
            if let Some(in_flight) = repair(stream, access, touches, held, &races)? {
                return Ok(in_flight);
            }
        }
    }
    check_and_repair(stream, what, touches, policy)
}

/// `Auto`'s repair of an operation on memory of its stream's own context,
/// which [`record_or_races`] found racing with `races` (per stream, the
/// latest step raced with; `held` still locked since): wait for each
/// stream it races with, then record it as the stream's next step,
/// returned in flight. When no access was recorded meanwhile and the waits
/// cover every race found, nothing is looked up again; otherwise it is
/// checked again. `None` leaves the operation to the general way (a stream
/// gone, a wait that fell short: a step still in flight on another
/// thread).
///
/// One list, of the streams to wait for, holds all it carries from one
/// lock to the next (a mark taken out, the event to put back, one to let
/// go). What a single wait teaches is learnt under the second lock from
/// the point its mark was recorded at, where this thread keeps it, else
/// from the record read after the wait; several waits' records gather in
/// the copy of the clock kept to skip covered waits, joined in one pass.
fn repair<'s>(
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
    let mut snapshot = Clock::new(0);
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

/// The access `stream`'s next step would make.
#[inline]
fn next_access(state: &StreamState, stream: &Stream, what: &'static str) -> Access {
    Access {
        agent: stream.id(),
        counter: state.clock.own + 1,
        device: stream.context().ordinal(),
        what,
        label: current_label(),
    }
}

/// Record `access` to every touch of one context's `shadow` if none
/// conflicts; whether it did (nothing is recorded otherwise). Inline, as
/// [`commit_step`].
#[inline(always)]
fn record_if_ordered(
    shadow: &mut Shadow,
    touches: &[Touch],
    access: &Access,
    clock: &Past<'_>,
) -> bool {
    if let Some(recorded) = shadow.record_exact_or_races(touches, access, clock, |_, _| {}) {
        return recorded;
    }
    if touches.iter().any(|t| {
        let (lo, hi) = t.range();
        shadow.any_conflict(lo, hi, t.write, clock)
    }) {
        return false;
    }
    for &touch in touches {
        let (lo, hi) = touch.range();
        shadow.record(lo, hi, touch.write, access, clock);
    }
    true
}

/// [`record_if_ordered`] for `Auto`: when an access races, every race of
/// every touch goes into `races` (per stream, the latest step raced with),
/// found in the same lookups, and nothing is recorded; whether it recorded.
#[inline]
fn record_or_races(
    shadow: &mut Shadow,
    touches: &[Touch],
    access: &Access,
    clock: &Past<'_>,
    races: &mut SmallVec<[(u64, u32); 2]>,
) -> bool {
    let exact = shadow.record_exact_or_races(touches, access, clock, |agent, step| {
        note_race(races, agent, step);
    });
    if let Some(recorded) = exact {
        return recorded;
    }
    // Some range is not one whole segment: every range is looked at again
    // below, the races found so far with them.
    races.clear();
    let mut found = |agent: u64, step: u32| note_race(races, agent, step);
    let mut any = false;
    for &touch in touches {
        let (lo, hi) = touch.range();
        shadow.conflicts(lo, hi, touch.write, clock, |conflict| {
            any = true;
            found(conflict.prior.agent, conflict.prior.counter);
        });
    }
    if any {
        return false;
    }
    for &touch in touches {
        let (lo, hi) = touch.range();
        shadow.record(lo, hi, touch.write, access, clock);
    }
    true
}

/// Note a race with `agent`'s step `step` in `races` (per stream, the
/// latest step raced with).
#[inline]
fn note_race(races: &mut SmallVec<[(u64, u32); 2]>, agent: u64, step: u32) {
    match races.iter_mut().find(|(id, _)| *id == agent) {
        Some(entry) => entry.1 = entry.1.max(step),
        None => races.push((agent, step)),
    }
}

/// The access just recorded in `shadow` (of context `ctx`) is the stream's
/// next step, in flight until the driver call returns. Inline: a call
/// costs a good part of what it does.
#[inline(always)]
fn commit_step<'s>(
    state: &mut StreamState,
    stream: &'s Stream,
    ctx: u64,
    shadow: &mut Shadow,
) -> InFlight<'s> {
    join(state, stream, ctx, shadow);
    state.clock.own += 1;
    let step = state.clock.own;
    let (slot, under_another) = stream.order.fly(state, step);
    keep_point(stream, state, step, under_another);
    InFlight(Some((stream, step, slot)))
}

/// Make `shadow` (of context `ctx`) know `stream` by its id, once.
#[inline(always)]
fn join(state: &mut StreamState, stream: &Stream, ctx: u64, shadow: &mut Shadow) {
    // The stream's own context is the first it joins, and the one nearly
    // every operation touches: one comparison.
    if state.joined.first() != Some(&ctx) && !state.joined.contains(&ctx) {
        join_first_time(state, stream, ctx, shadow);
    }
}

#[cold]
#[inline(never)]
fn join_first_time(state: &mut StreamState, stream: &Stream, ctx: u64, shadow: &mut Shadow) {
    shadow.join(stream);
    state.joined.push(ctx);
}

/// `Auto`'s last repair of one operation: the shadows' versions it saw, and
/// per stream it made the operation's stream wait for, the step to cover.
type Repair = (SmallVec<[u64; 2]>, SmallVec<[(u64, u32); 2]>);

/// [`before_enqueue`] the general way: memory of several contexts, and
/// operations that race, which `Check` refuses, `Report` logs and `Auto`
/// repairs (then checks again, unless nothing changed meanwhile).
fn check_and_repair<'s>(
    stream: &'s Stream,
    what: &'static str,
    touches: &[Touch],
    policy: OrderPolicy,
) -> Result<InFlight<'s>> {
    let home = stream.context();
    // Memory of other contexts (peer copies) needs those contexts' shadows.
    let mut others: SmallVec<[Arc<Context>; 1]> = SmallVec::new();
    for &touch in touches {
        if touch.ctx != home.id() && !others.iter().any(|c| c.id() == touch.ctx) {
            match crate::context::by_id(touch.ctx) {
                Some(ctx) => others.push(ctx),
                // A context nobody holds any more: its memory is gone.
                None => return Ok(InFlight(None)),
            }
        }
    }
    let mut repaired: Option<Repair> = None;
    for attempt in 0..4 {
        let mut locked = Locked::new(stream, home, &others);
        locked.held.learn_host();
        // The waits inserted last time cover every conflict found then; if
        // no access was recorded since, there is nothing to look for.
        let settled = repaired.as_ref().is_some_and(|(versions, covered)| {
            *versions == locked.versions()
                && covered
                    .iter()
                    .all(|&(agent, step)| locked.held.past().knows(agent, step))
        });
        if !settled {
            let mut races: SmallVec<[Race; 1]> = SmallVec::new();
            // Per stream to wait for: its id, the step to cover.
            let mut wait_for: SmallVec<[(u64, u32); 2]> = SmallVec::new();
            for &touch in touches {
                let (lo, hi) = touch.range();
                let (state, shadow) = locked.split(touch.ctx);
                shadow.conflicts(lo, hi, touch.write, &state.past(), |conflict| {
                    if policy == OrderPolicy::Auto {
                        note_race(&mut wait_for, conflict.prior.agent, conflict.prior.counter);
                    } else {
                        races.push(race(stream, what, touch, &conflict));
                    }
                });
            }
            if !wait_for.is_empty() {
                // Under `Auto`: one report per repaired operation.
                locked.held.shadow().stats.reports += 1;
                let handles: SmallVec<[(Weak<Stream>, u32); 2]> = wait_for
                    .iter()
                    .map(|&(id, step)| {
                        let live = locked.streams(id).find(|w| w.strong_count() > 0);
                        (live.unwrap_or_default(), step)
                    })
                    .collect();
                let versions = locked.versions();
                drop(locked);
                let refuse = || first_race(stream, what, touches);
                if attempt == 3 {
                    return Err(refuse());
                }
                for (earlier, step) in handles {
                    // A stream that is gone cannot be waited for: refuse.
                    let Some(earlier) = earlier.upgrade() else {
                        return Err(refuse());
                    };
                    order_after(stream, &earlier, step)?;
                }
                repaired = Some((versions, wait_for));
                continue;
            }
            if !races.is_empty() {
                locked.held.shadow().stats.reports += races.len() as u64;
                if policy == OrderPolicy::Report {
                    for race in &races {
                        tracing::warn!(target: "cuda_streams_driver::order", stream = stream.id(), "{race}");
                    }
                } else {
                    let race = races.swap_remove(0);
                    tracing::debug!(target: "cuda_streams_driver::order", "refused: {race}");
                    return Err(Error::UnorderedAccess(Box::new(race)));
                }
            }
        }
        // No race left (or reported): the access is this stream's next step.
        let access = next_access(&locked.held, stream, what);
        for &touch in touches {
            let (lo, hi) = touch.range();
            let (state, shadow) = locked.split(touch.ctx);
            shadow.record(lo, hi, touch.write, &access, &state.past());
        }
        for (ctx, shadow) in &mut locked.others {
            let state = locked.held.split().0;
            join(state, stream, *ctx, shadow);
        }
        let (state, shadow) = locked.held.split();
        return Ok(commit_step(state, stream, home.id(), shadow));
    }
    unreachable!("the last attempt returns")
}

/// The race `conflict` makes with an access to `touch` by `what` on `stream`.
fn race(
    stream: &Stream,
    what: &'static str,
    touch: Touch,
    conflict: &tracker::Conflict<'_>,
) -> Race {
    let (lo, _) = touch.range();
    Race {
        earlier: race_op(conflict.prior, conflict.prior_writes),
        later: RaceOp {
            what,
            label: current_label().map(|l| l.to_string()),
            stream: stream.id(),
            device: stream.context().ordinal(),
            writes: touch.write,
        },
        buffer: lo,
        buffer_bytes: touch.bytes,
        overlap: conflict.from - lo..conflict.to - lo,
    }
}

/// The first race of an operation `Auto` could not repair, as its error.
#[cold]
fn first_race(stream: &Stream, what: &'static str, touches: &[Touch]) -> Error {
    let home = stream.context();
    // Copied out: the stream's lock is its context's shadow lock, and the
    // shadows are locked one at a time below.
    let (clock, host) = {
        let state = stream.order.lock();
        (state.clock.clone(), Arc::clone(&state.host))
    };
    let past = Past {
        clock: &clock,
        host: &host,
    };
    let mut found = None;
    for &touch in touches {
        let shadow = if touch.ctx == home.id() {
            Some(Arc::clone(home))
        } else {
            crate::context::by_id(touch.ctx)
        };
        let Some(ctx) = shadow else { continue };
        let (lo, hi) = touch.range();
        ctx.order
            .shadow()
            .conflicts(lo, hi, touch.write, &past, |conflict| {
                if found.is_none() {
                    found = Some(race(stream, what, touch, &conflict));
                }
            });
        if found.is_some() {
            break;
        }
    }
    match found {
        Some(race) => Error::UnorderedAccess(Box::new(race)),
        // Ordered meanwhile (another thread's wait): say what failed.
        None => Error::UnorderedAccess(Box::new(Race {
            earlier: RaceOp {
                what: "an operation no longer recorded",
                label: None,
                stream: 0,
                device: home.ordinal(),
                writes: true,
            },
            later: RaceOp {
                what,
                label: current_label().map(|l| l.to_string()),
                stream: stream.id(),
                device: home.ordinal(),
                writes: touches.iter().any(|t| t.write),
            },
            buffer: touches.first().map_or(0, |t| t.address),
            buffer_bytes: touches.first().map_or(0, |t| t.bytes),
            overlap: 0..0,
        })),
    }
}

/// A step checked and recorded by [`before_enqueue`] whose driver call is
/// being made: keep it until the call returns (or fails). The slot of
/// [`StreamOrder::flying`] holding the step, or `None` when it is in
/// [`StreamState::in_flight`].
#[must_use = "the step is in flight until this is dropped, after the driver call"]
pub(crate) struct InFlight<'s>(Option<(&'s Stream, u32, Option<u8>)>);

impl InFlight<'_> {
    /// Nothing in flight (the policy is `Off`).
    pub(crate) const NONE: InFlight<'static> = InFlight(None);
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        match self.0 {
            // Release: the driver call returned before the slot is seen
            // free ([`StreamOrder::snapshot_of`]). No lock: only this
            // empties the slot, and only a lock holder fills a free one.
            Some((stream, step, Some(slot))) => {
                stream.order.flying[usize::from(slot)].store(0, Ordering::Release);
                land_kept(stream, step, true);
            }
            // Under the lock, which makes a kept point stale anyway.
            Some((stream, step, None)) => {
                land_kept(stream, step, false);
                stream.order.land(step);
            }
            None => {}
        }
    }
}

impl StreamOrder {
    /// A step kept in [`StreamState::in_flight`] was queued.
    #[cold]
    fn land(&self, step: u32) {
        let mut state = self.lock();
        if let Some(i) = state.in_flight.iter().position(|s| *s == step) {
            state.in_flight.swap_remove(i);
        }
    }
}

/// `Auto`'s repair: `stream` waits for `earlier` up to at least its step
/// `step`, through one event: `earlier`'s last mark when that still covers
/// the step (nothing recorded), else a fresh mark of everything enqueued on
/// `earlier` so far, kept as its last mark. The wait teaches `stream` what
/// the event's record knew ([`waited`]).
fn order_after(stream: &Stream, earlier: &Stream, step: u32) -> Result<()> {
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
/// ([`Event::record_counted`] exclusive): no atomic read-modify-write on
/// the event, where a shared record takes three. With the event, the point
/// kept by this thread that a record made here was written from, if it
/// was ([`recorded`]).
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
pub fn offer_mark(stream: &Stream, event: &Arc<crate::event_pool::PooledEvent>) {
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

fn race_op(access: &Access, writes: bool) -> RaceOp {
    RaceOp {
        what: access.what,
        label: access.label.as_deref().map(str::to_string),
        stream: access.agent,
        device: access.device,
        writes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that set the policy of device 0's context, which
    /// every test of this crate shares.
    static POLICY: Mutex<()> = Mutex::new(());

    /// A 4-byte write at `address` in `ctx`'s memory.
    fn write_of_4_bytes(ctx: &Context, address: u64) -> Touch {
        Touch {
            ctx: ctx.id(),
            address,
            bytes: 4,
            write: true,
        }
    }

    fn streams<const N: usize>(ctx: &Arc<Context>) -> [Arc<Stream>; N] {
        std::array::from_fn(|_| Stream::new(ctx).unwrap())
    }

    fn buffer(ctx: &Arc<Context>) -> crate::DeviceBuffer<u32> {
        crate::DeviceBuffer::new(ctx, 64).unwrap()
    }

    /// Device 0's context under `policy`, held until the guard drops.
    pub(super) fn under(policy: OrderPolicy) -> (Arc<Context>, MutexGuard<'static, ()>) {
        let guard = POLICY.lock().unwrap_or_else(|p| p.into_inner());
        let ctx = Context::new(0).unwrap();
        ctx.set_ordering(policy).unwrap();
        (ctx, guard)
    }

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

    /// The stream a point waiting for a step in flight below a landed one
    /// last looked at ([`StreamOrder::settled`]).
    static SETTLING: AtomicU64 = AtomicU64::new(0);

    pub(super) fn settling(stream: u64) {
        SETTLING.store(stream, Ordering::SeqCst);
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
        std::thread::scope(|scope| {
            // Owns the sender: if it panics, the receive below fails
            // instead of waiting for ever.
            let other = scope.spawn(move || {
                let in_flight = before_enqueue(on, "low", &[low], OrderPolicy::Check).unwrap();
                held_tx.send(()).unwrap();
                // Its driver call returns once the point waits for it (or
                // was taken without waiting, which the assertion below
                // refuses).
                while SETTLING.load(Ordering::SeqCst) != on.id()
                    && !taken_by_other.load(Ordering::SeqCst)
                {
                    std::hint::spin_loop();
                }
                drop(in_flight);
            });
            held_rx.recv().unwrap();
            drop(before_enqueue(&stream, "high", &[high], OrderPolicy::Check).unwrap());
            let point = stream.order.snapshot();
            taken.store(true, Ordering::SeqCst);
            other.join().unwrap();
            assert_eq!(point.own, before + 2, "the point covers both steps");
        });
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

    /// The host's knowledge orders what it saw complete, and nothing after
    /// it: a write enqueued after the host's wait is still unordered.
    #[test]
    fn the_host_orders_only_what_it_saw_complete() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [a, b] = streams(&ctx);
        let mut data = buffer(&ctx);
        a.memset_u32_async(&mut data, 1).unwrap();
        a.synchronize().unwrap();
        // The step right after the one the host saw complete.
        a.memset_u32_async(&mut data, 3).unwrap();
        // Not seen complete by the host, not waited for by b.
        let refused = b.memset_u32_async(&mut data, 4);
        assert!(
            matches!(refused, Err(Error::UnorderedAccess(_))),
            "{refused:?}"
        );
        a.synchronize().unwrap();
        // b never waited for a; the host did.
        b.memset_u32_async(&mut data, 5).unwrap();
        assert_eq!(data.to_vec(&b).unwrap(), [5; 64]);
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

    /// A label shared with the operation before it is the same label; a
    /// different one is not taken for it.
    #[test]
    fn labels_name_their_own_operation_in_a_loop() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut data = crate::DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
        for _ in 0..2 {
            labelled("fill", || a.memset_u32_async(&mut data, 1)).unwrap();
        }
        let refused = labelled("clear", || b.memset_u32_async(&mut data, 0));
        let Err(Error::UnorderedAccess(race)) = refused else {
            panic!("an unordered write was let through: {refused:?}");
        };
        assert_eq!(race.earlier.label.as_deref(), Some("fill"));
        assert_eq!(race.later.label.as_deref(), Some("clear"));
        a.synchronize().unwrap();
    }

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

    /// A label names what is enqueued inside its scope only, an inner one
    /// hides an outer one until it ends (this thread's flag for "a label
    /// is set" follows), and a write recorded over an earlier write takes
    /// its own label, or none, in place of the earlier one's.
    #[test]
    fn labels_nest_and_a_write_over_a_write_takes_its_own_label() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        assert_eq!(current_label(), None);
        labelled("outer", || {
            assert_eq!(current_label().as_deref(), Some("outer"));
            labelled("inner", || {
                assert_eq!(current_label().as_deref(), Some("inner"));
            });
            labelled("", || {
                assert_eq!(current_label().as_deref(), Some("outer"), "no label given");
            });
            assert_eq!(current_label().as_deref(), Some("outer"), "restored");
        });
        assert_eq!(current_label(), None, "none outside");
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let mut data = crate::DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
        // Each write on `a` is recorded over the one before, then `b`'s
        // unordered write is refused naming the latest.
        let mut earlier_label = |label: Option<&str>| {
            match label {
                Some(label) => labelled(label, || a.memset_u32_async(&mut data, 1)),
                None => a.memset_u32_async(&mut data, 1),
            }
            .unwrap();
            let refused = b.memset_u32_async(&mut data, 0);
            let Err(Error::UnorderedAccess(race)) = refused else {
                panic!("an unordered write was let through: {refused:?}");
            };
            race.earlier.label
        };
        assert_eq!(earlier_label(Some("fill")).as_deref(), Some("fill"));
        assert_eq!(earlier_label(Some("fill")).as_deref(), Some("fill"));
        assert_eq!(earlier_label(Some("refill")).as_deref(), Some("refill"));
        assert_eq!(earlier_label(None), None, "an unlabelled write");
        assert_eq!(earlier_label(Some("fill")).as_deref(), Some("fill"));
        a.synchronize().unwrap();
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

    /// Tracker locks taken on this thread while `f` runs.
    fn locks(f: impl FnOnce()) -> u64 {
        let before = LOCKS.with(std::cell::Cell::get);
        f();
        LOCKS.with(std::cell::Cell::get) - before
    }

    /// What the tracker locks per operation, counted (the uncontended
    /// lock and unlock are two atomic read-modify-writes each, much of
    /// `check`'s cost on a GPU host): an operation on memory used before
    /// takes one lock, its context's shadow, which guards its stream's
    /// clock too; its step lands with no lock; its buffer's use event
    /// takes none (recorded by its only holder); a record takes the write
    /// side of the event's sequence lock (one compare-and-swap), a wait
    /// reads it with no lock and locks only the stream; under `Off` nothing
    /// is locked at all, an event's record and a wait for it included.
    #[test]
    fn an_operation_takes_one_lock_for_its_stream_and_the_shadow() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [stream, other] = streams(&ctx);
        let mut data = buffer(&ctx);
        let event = crate::Event::new(&ctx, crate::EventFlags::PLAIN).unwrap();
        stream.memset_u32_async(&mut data, 0).unwrap();
        let memset = locks(|| stream.memset_u32_async(&mut data, 1).unwrap());
        // The buffer's use event on a stream other than its home takes the
        // point the memset kept, and no write side: it is recorded under
        // its buffer's lock, by its only holder (2 locks before).
        assert_eq!(memset, 1, "a memset under check, and its use event");
        let record = locks(|| event.record(&stream).unwrap());
        assert_eq!(
            record, 1,
            "a record after an operation: the event's write side"
        );
        let wait = locks(|| other.wait_event(&event).unwrap());
        assert_eq!(
            wait, 1,
            "a wait: the stream's (the shadow); the event's is read"
        );
        let record = locks(|| event.record(&other).unwrap());
        assert_eq!(record, 2, "a record after a wait: the stream's point too");
        // The engine's completion events: the only handle, no overlap.
        stream.memset_u32_async(&mut data, 1).unwrap();
        let unique = crate::UniqueEvent::new(ctx.event_pool().acquire_event(false).unwrap());
        let alone = locks(|| drop(stream.record_latest_unique(unique).unwrap()));
        assert_eq!(alone, 0, "a record by the only handle after an operation");
        // `Off` is measured here on the software driver, which refuses it
        // through `set_ordering`: nothing below conflicts (one stream
        // writes, the other only waits), and the switch back synchronizes.
        ctx.order.force(OrderPolicy::Off);
        let off = locks(|| {
            stream.memset_u32_async(&mut data, 2).unwrap();
            event.record(&stream).unwrap();
            other.wait_event(&event).unwrap();
        });
        assert_eq!(off, 0, "tracker work under off");
        other.synchronize().unwrap();
        ctx.set_ordering(OrderPolicy::Check).unwrap();
    }
}
