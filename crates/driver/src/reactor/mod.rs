//! The reactor: one thread per context that wakes every future of this crate.
//!
//! A wait is a *slot*, a `u32` in mapped pinned memory. After the awaited
//! work the stream writes the slot's next sequence number into it
//! (`cuStreamWriteValue32`) and records a small event. The reactor thread
//! reads the slots of pending waits (plain memory reads, no driver call),
//! wakes the waker of each slot whose number arrived, and every so often
//! queries the events: an event that fails carries the stream's sticky error,
//! which wakes the future with that error (a faulted stream writes nothing).
//!
//! How the thread waits is the [`WakeMode`]: spinning, spinning briefly then
//! parking with back-off, or parking until a host function enqueued after the
//! flag wakes it. With nothing pending it parks without a timeout: no CPU.
//! A wait pending for long gets longer parks ([`backoff`]), so that waiting
//! for seconds costs a few hundred wake-ups a second, not tens of thousands.
//! The default mode also learns how long waits on each stream take
//! ([`predict`]): it parks through most of a wait it has seen before and
//! spins only around the moment the wait is due.
//!
//! A slot whose future was dropped before it fired is *cancelled*: it stays
//! watched until its write lands (or its stream fails), because a write still
//! in flight must not land in a slot that a new wait already uses. Then it is
//! free again. So dropping a future never leaks a slot, and a leaked future
//! (`mem::forget`) leaks only its slot, never soundness: futures hold no
//! memory the GPU writes except the reactor's own slots, which live as long
//! as the context.

mod backoff;
mod predict;

use crate::context::Context;
use crate::error::{Error, Result};
use backoff::Backoff;
use predict::{WaitPredictor, Window};
use std::ffi::c_void;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};
use sys::{
    CU_MEMHOSTALLOC_DEVICEMAP, CUcontext, CUdeviceptr, CUevent, CUevent_flags, CUresult, CUstream,
    CUstream_flags, Driver,
};

/// Slots per chunk of mapped pinned memory (16 KiB).
const SLOTS_PER_CHUNK: usize = 4096;
/// Streams the reactor creates to watch events of streams it does not know.
const MAX_WATCH_STREAMS: usize = 8;

/// How the reactor thread waits while waits are pending.
///
/// Latency and CPU pull against each other; `benches/benches/futures.rs`
/// measures every mode against busy polling (see `docs/async.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive] // more mechanisms may come (e.g. blocking-sync events)
pub enum WakeMode {
    /// Spin for [`ReactorConfig::spin`] after each new wait or completion,
    /// then park with a back-off from [`ReactorConfig::min_park`] doubling to
    /// [`ReactorConfig::max_park`]; once every such wait has been pending
    /// for long, on to [`ReactorConfig::long_park`]. The default.
    ///
    /// With [`ReactorConfig::predict`] (on by default), a wait on a stream
    /// or event whose recent waits the reactor has seen is instead parked
    /// through until shortly before it is due, and spun on only around
    /// that moment; one that runs late falls back to the back-off.
    #[default]
    Adaptive,
    /// Spin for as long as any wait is pending: the lowest latency, one core
    /// busy while waiting.
    Spin,
    /// Park until a host function (`cuLaunchHostFunc`) enqueued after each
    /// flag wakes the thread: no CPU while waiting, the latency of the
    /// driver's callback thread.
    HostFn,
}

/// The reactor's waiting policy, set with [`Reactor::set_config`].
///
/// ```
/// use cuda_streams_driver::{ReactorConfig, WakeMode};
/// let quiet = ReactorConfig::default().with_mode(WakeMode::HostFn);
/// assert_eq!(quiet.mode, WakeMode::HostFn);
/// assert!(ReactorConfig::default().min_park <= ReactorConfig::default().max_park);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ReactorConfig {
    /// How the thread waits.
    pub mode: WakeMode,
    /// [`WakeMode::Adaptive`]: how long to spin after activity.
    pub spin: Duration,
    /// [`WakeMode::Adaptive`]: the first park after spinning.
    pub min_park: Duration,
    /// [`WakeMode::Adaptive`]: the longest park while a wait is young.
    pub max_park: Duration,
    /// [`WakeMode::Adaptive`]: the longest park once every pending wait
    /// has been pending long. Past `max_park` the park keeps doubling, but
    /// never beyond a 128th of how long the youngest wait has been pending,
    /// so it delays a wait by under 0.8% of its length, and waits shorter
    /// than 128 × `max_park` never see it. Default 1 ms: a wait pending for
    /// seconds wakes the thread about 1000 times a second instead of 31 000.
    /// At or under `max_park`, the back-off stops at `max_park`.
    pub long_park: Duration,
    /// How often pending waits' events are queried for errors (and for
    /// completion, should a flag be missed).
    pub error_check: Duration,
    /// [`WakeMode::Adaptive`]: learn how long waits on each stream (or
    /// event) take, and spin only around the moment the next one is due.
    pub predict: bool,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        Self {
            mode: WakeMode::Adaptive,
            // Chosen by the H200's numbers (docs/async.md): 8-32 µs parks
            // keep the reactor thread at 0.19 of a core while a wait is
            // pending; 4-16 µs cost 0.31 for no lower latency (a parked
            // executor's wake-up dominates).
            spin: Duration::from_micros(10),
            min_park: Duration::from_micros(8),
            max_park: Duration::from_micros(32),
            // Also the error check's period: a longer park would check less.
            long_park: Duration::from_millis(1),
            error_check: Duration::from_millis(1),
            predict: true,
        }
    }
}

impl ReactorConfig {
    /// The same policy with `mode`.
    pub const fn with_mode(self, mode: WakeMode) -> Self {
        Self { mode, ..self }
    }

    /// The same policy with [`ReactorConfig::predict`] set to `predict`.
    pub const fn with_prediction(self, predict: bool) -> Self {
        Self { predict, ..self }
    }
}

/// Counters of a context's reactor, from [`Reactor::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReactorStats {
    /// Waits whose future is still waiting.
    pub pending: usize,
    /// Slots not free: pending, completed but not yet collected by their
    /// future, and cancelled ones whose write has not landed yet.
    pub slots_in_use: usize,
    /// Slots allocated (mapped pinned memory, grown in chunks of 4096).
    pub slot_capacity: usize,
    /// Waits completed (successfully or with an error).
    pub completed: u64,
    /// Waits that completed with an error.
    pub failed: u64,
    /// Futures dropped before their wait completed.
    pub cancelled: u64,
    /// Streams created to watch events.
    pub watch_streams: usize,
    /// Rounds the thread made over the pending slots.
    pub scans: u64,
    /// Times the thread parked with a timeout while slots were watched:
    /// each ends in a wake-up (its timeout, a new wait, a host function).
    /// Spinning rounds are not parks; see `scans`.
    pub parks: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// A future waits.
    Pending,
    /// Its future was dropped; the write may still land.
    Cancelled,
    /// Finished with this code; the future has not collected it yet.
    Done(CUresult),
}

struct Slot {
    seq: u32,
    state: SlotState,
    waker: Option<Waker>,
    /// Recorded after the flag write: its query carries the stream's error.
    event: CUevent,
    /// The watch stream this wait uses, if any.
    watch: Option<usize>,
    /// When the flag write was enqueued.
    registered: Instant,
    /// The stream or event waited on, for [`WaitPredictor`].
    key: usize,
    /// When to watch it closely, if its key has a history.
    window: Option<Window>,
}

struct Chunk {
    host: *mut u32,
    device: CUdeviceptr,
}

struct WatchStream {
    raw: CUstream,
    pending: usize,
}

struct State {
    chunks: Vec<Chunk>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots the thread watches: pending and cancelled.
    watched: Vec<u32>,
    spare_events: Vec<CUevent>,
    watch_streams: Vec<WatchStream>,
    config: ReactorConfig,
    predictor: WaitPredictor,
    /// Set by new waits, so the thread spins again.
    activity: bool,
    shutdown: bool,
    thread: Option<(Thread, JoinHandle<()>)>,
    stats: ReactorStats,
}

struct Shared {
    driver: &'static Driver,
    ctx: CUcontext,
    state: Mutex<State>,
}

// SAFETY: the raw pointers (slot memory, events, streams, the context) are
// only handed to the thread-safe driver or read atomically, always under the
// Mutex or through atomics; the slot memory lives until `shutdown`.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flag(state: &State, slot: u32) -> &AtomicU32 {
        let (chunk, offset) = (
            slot as usize / SLOTS_PER_CHUNK,
            slot as usize % SLOTS_PER_CHUNK,
        );
        // SAFETY: the chunk holds SLOTS_PER_CHUNK aligned u32s of mapped pinned
        // memory that stay allocated while `state` exists; the GPU (or the
        // software driver) only writes them with 4-byte stores, and we only
        // read them atomically.
        unsafe { AtomicU32::from_ptr(state.chunks[chunk].host.add(offset)) }
    }

    fn kick(state: &State) {
        if let Some((thread, _)) = &state.thread {
            thread.unpark();
        }
    }
}

/// A context's reactor: the thread and slots behind every future of this
/// crate. Get it with [`Context::reactor`]; it starts on the first wait.
///
/// ```
/// use cuda_streams_driver::{Context, Stream, WakeMode};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let reactor = ctx.reactor();
/// reactor.set_config(reactor.config().with_mode(WakeMode::Spin));
/// let done = stream.completion()?;
/// drop(done); // cancelled: its slot is freed once the write lands
/// stream.synchronize()?;
/// assert_eq!(reactor.stats().pending, 0);
/// # Ok(())
/// # }
/// ```
pub struct Reactor {
    shared: Arc<Shared>,
}

/// What [`Reactor::register`] hands a future.
pub(crate) struct Ticket {
    pub(crate) slot: u32,
    pub(crate) seq: u32,
}

/// Where a wait's flag is written.
pub(crate) enum Target {
    /// At the current end of this stream.
    Stream(CUstream),
    /// After this event, on a watch stream.
    Event(CUevent),
}

impl Reactor {
    pub(crate) fn new(driver: &'static Driver, ctx: CUcontext) -> Self {
        Self {
            shared: Arc::new(Shared {
                driver,
                ctx,
                state: Mutex::new(State {
                    chunks: Vec::new(),
                    slots: Vec::new(),
                    free: Vec::new(),
                    watched: Vec::new(),
                    spare_events: Vec::new(),
                    watch_streams: Vec::new(),
                    config: ReactorConfig::default(),
                    predictor: WaitPredictor::default(),
                    activity: false,
                    shutdown: false,
                    thread: None,
                    stats: ReactorStats::default(),
                }),
            }),
        }
    }

    /// The current policy.
    pub fn config(&self) -> ReactorConfig {
        self.shared.lock().config
    }

    /// Change the policy; it applies from the thread's next round.
    pub fn set_config(&self, config: ReactorConfig) {
        let mut state = self.shared.lock();
        state.config = config;
        Shared::kick(&state);
    }

    /// Counters so far.
    pub fn stats(&self) -> ReactorStats {
        let state = self.shared.lock();
        let mut stats = state.stats.clone();
        stats.slot_capacity = state.slots.len();
        stats.slots_in_use = state.slots.len() - state.free.len();
        stats.pending = state
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Pending)
            .count();
        stats.watch_streams = state.watch_streams.len();
        stats
    }

    /// Enqueue a flag write for a new wait at `target` (the context is
    /// current: callers bind).
    pub(crate) fn register(&self, ctx: &Context, target: Target) -> Result<Ticket> {
        let driver = self.shared.driver;
        let (slot, seq, device, event, watch, mode) = {
            let mut state = self.shared.lock();
            self.ensure_thread(&mut state)?;
            let slot = match state.free.pop() {
                Some(slot) => slot,
                None => self.grow(ctx, &mut state)?,
            };
            let event = match state.spare_events.pop() {
                Some(event) => event,
                None => match create_event(ctx) {
                    Ok(event) => event,
                    Err(err) => {
                        state.free.push(slot);
                        return Err(err);
                    }
                },
            };
            let watch = match target {
                Target::Stream(_) => None,
                Target::Event(_) => match self.watch_stream(ctx, &mut state) {
                    Ok(index) => Some(index),
                    Err(err) => {
                        state.free.push(slot);
                        state.spare_events.push(event);
                        return Err(err);
                    }
                },
            };
            let entry = &mut state.slots[slot as usize];
            entry.seq = entry.seq.wrapping_add(1);
            let seq = entry.seq;
            let chunk = &state.chunks[slot as usize / SLOTS_PER_CHUNK];
            let device = chunk.device + 4 * (slot as usize % SLOTS_PER_CHUNK) as CUdeviceptr;
            (slot, seq, device, event, watch, state.config.mode)
        };
        let stream = match (&target, watch) {
            (Target::Stream(stream), _) => *stream,
            (Target::Event(_), Some(index)) => self.shared.lock().watch_streams[index].raw,
            (Target::Event(_), None) => unreachable!("event waits get a watch stream"),
        };
        let enqueued = (|| {
            if let Target::Event(user_event) = target {
                // SAFETY: both handles are live; flags 0 is CU_EVENT_WAIT_DEFAULT.
                // Once enqueued, the wait holds even if the event is destroyed.
                ctx.check(unsafe { (driver.cuStreamWaitEvent)(stream, user_event, 0) })?;
            }
            // SAFETY: `device` is a 4-byte aligned slot inside mapped pinned
            // memory the reactor keeps until the context is dropped (after a
            // synchronize, so after this write).
            ctx.check(unsafe { (driver.cuStreamWriteValue32)(stream, device, seq, 0) })
        })();
        let mut state = self.shared.lock();
        if let Err(err) = enqueued {
            // Nothing was written: the slot is free again.
            state.free.push(slot);
            state.spare_events.push(event);
            if let Some(index) = watch {
                state.watch_streams[index].pending -= 1;
            }
            return Err(err);
        }
        // SAFETY: both handles are live; the context is current.
        let recorded = ctx.check(unsafe { (driver.cuEventRecord)(event, stream) });
        let mut kicked = Ok(());
        if recorded.is_ok() && mode == WakeMode::HostFn {
            let payload = Arc::into_raw(Arc::clone(&self.shared));
            // SAFETY: the stream is live; `wake_reactor` takes back exactly
            // this `Arc` when (and only when) the driver runs it.
            let code = unsafe {
                (driver.cuLaunchHostFunc)(stream, Some(wake_reactor), payload as *mut c_void)
            };
            if let Err(err) = ctx.check(code) {
                // SAFETY: refused, so it will never run: the Arc is still ours.
                drop(unsafe { Arc::from_raw(payload) });
                kicked = Err(err);
            }
        }
        let key = match target {
            Target::Stream(stream) => stream as usize,
            Target::Event(event) => event as usize,
        };
        let config = state.config;
        let window = (config.predict && config.mode == WakeMode::Adaptive)
            .then(|| state.predictor.window(key, config.spin))
            .flatten();
        let entry = &mut state.slots[slot as usize];
        entry.waker = None;
        entry.watch = watch;
        entry.registered = Instant::now();
        entry.key = key;
        entry.window = window;
        match &recorded {
            Ok(()) => entry.event = event,
            // Not recorded: the slot has no event to query.
            Err(_) => {
                entry.event = std::ptr::null_mut();
                state.spare_events.push(event);
            }
        }
        let outcome = recorded.and(kicked);
        let entry = &mut state.slots[slot as usize];
        // On failure the write is enqueued and may land: the slot stays
        // watched until then (or until its event reports the stream failed).
        entry.state = match outcome {
            Ok(()) => SlotState::Pending,
            Err(_) => SlotState::Cancelled,
        };
        state.watched.push(slot);
        state.activity = true;
        Shared::kick(&state);
        outcome.map(|()| Ticket { slot, seq })
    }

    /// Poll a wait: `Some(code)` once finished (the slot is then free),
    /// otherwise the waker is stored.
    pub(crate) fn poll(&self, ticket: &Ticket, waker: &Waker) -> Option<CUresult> {
        let mut state = self.shared.lock();
        let slot = ticket.slot as usize;
        match state.slots[slot].state {
            SlotState::Done(code) => {
                self.release(&mut state, ticket.slot);
                Some(code)
            }
            SlotState::Pending => {
                // The flag may have landed since the thread last looked.
                if Shared::flag(&state, ticket.slot).load(Ordering::Acquire) == ticket.seq {
                    state.stats.completed += 1;
                    let entry = &state.slots[slot];
                    let (key, length) = (entry.key, entry.registered.elapsed());
                    state.predictor.observe(key, length);
                    self.release(&mut state, ticket.slot);
                    return Some(CUresult::CUDA_SUCCESS);
                }
                let entry = &mut state.slots[slot];
                match &mut entry.waker {
                    Some(old) if old.will_wake(waker) => {}
                    other => *other = Some(waker.clone()),
                }
                None
            }
            SlotState::Free | SlotState::Cancelled => {
                unreachable!("a ticket's slot is pending or done until its future lets go")
            }
        }
    }

    /// The future of `ticket` was dropped before collecting its outcome.
    pub(crate) fn cancel(&self, ticket: &Ticket) {
        let mut state = self.shared.lock();
        let slot = ticket.slot as usize;
        match state.slots[slot].state {
            SlotState::Pending => {
                state.slots[slot].state = SlotState::Cancelled;
                state.slots[slot].waker = None;
                state.stats.cancelled += 1;
            }
            SlotState::Done(_) => self.release(&mut state, ticket.slot),
            SlotState::Free | SlotState::Cancelled => {}
        }
    }

    /// Free a finished slot (it is no longer watched).
    fn release(&self, state: &mut State, slot: u32) {
        let entry = &mut state.slots[slot as usize];
        entry.state = SlotState::Free;
        entry.waker = None;
        let event = std::mem::replace(&mut entry.event, std::ptr::null_mut());
        let watch = entry.watch.take();
        if !event.is_null() {
            state.spare_events.push(event);
        }
        if let Some(index) = watch {
            state.watch_streams[index].pending -= 1;
        }
        state.watched.retain(|&s| s != slot);
        state.free.push(slot);
    }

    fn ensure_thread(&self, state: &mut State) -> Result<()> {
        if state.thread.is_some() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let handle = std::thread::Builder::new()
            .name("cuda-streams-reactor".into())
            .spawn(move || run(&shared))
            .map_err(|err| Error::ReactorThread(err.to_string()))?;
        state.thread = Some((handle.thread().clone(), handle));
        Ok(())
    }

    fn grow(&self, ctx: &Context, state: &mut State) -> Result<u32> {
        let driver = self.shared.driver;
        let mut host = std::ptr::null_mut();
        let bytes = SLOTS_PER_CHUNK * 4;
        // SAFETY: writes one pointer through a valid pointer; the context is current.
        ctx.check(unsafe { (driver.cuMemHostAlloc)(&mut host, bytes, CU_MEMHOSTALLOC_DEVICEMAP) })?;
        // Freshly allocated memory is uninitialised; the slots start at 0.
        // SAFETY: `bytes` bytes at `host` belong to this allocation.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut device = 0;
        // SAFETY: `host` is a live mapped pinned allocation; writes one pointer.
        let code = unsafe { (driver.cuMemHostGetDevicePointer)(&mut device, host, 0) };
        if let Err(err) = ctx.check(code) {
            // SAFETY: allocated just above, never used.
            unsafe { (driver.cuMemFreeHost)(host) };
            return Err(err);
        }
        let first = state.slots.len() as u32;
        state.chunks.push(Chunk {
            host: host.cast(),
            device,
        });
        state.slots.extend((0..SLOTS_PER_CHUNK).map(|_| Slot {
            seq: 0,
            state: SlotState::Free,
            waker: None,
            event: std::ptr::null_mut(),
            watch: None,
            registered: Instant::now(),
            key: 0,
            window: None,
        }));
        // Hand out low slots first (popped from the end).
        state
            .free
            .extend((first + 1..first + SLOTS_PER_CHUNK as u32).rev());
        Ok(first)
    }

    /// A watch stream with nothing pending, a new one, or the least busy.
    fn watch_stream(&self, ctx: &Context, state: &mut State) -> Result<usize> {
        let index = match state.watch_streams.iter().position(|w| w.pending == 0) {
            Some(index) => index,
            None if state.watch_streams.len() < MAX_WATCH_STREAMS => {
                let mut raw = std::ptr::null_mut();
                let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
                let greatest = ctx.priority_range().greatest;
                // SAFETY: writes one handle through a valid pointer; the context is current.
                ctx.check(unsafe {
                    (self.shared.driver.cuStreamCreateWithPriority)(&mut raw, flags, greatest)
                })?;
                state.watch_streams.push(WatchStream { raw, pending: 0 });
                state.watch_streams.len() - 1
            }
            None => state
                .watch_streams
                .iter()
                .enumerate()
                .min_by_key(|(_, w)| w.pending)
                .map(|(index, _)| index)
                .unwrap_or(0),
        };
        state.watch_streams[index].pending += 1;
        Ok(index)
    }

    /// Stop the thread and free the slots, events and watch streams. The
    /// context calls this from its Drop after synchronizing, so every write
    /// has landed; no future exists any more (each holds the context).
    pub(crate) fn shutdown(&self) {
        let thread = {
            let mut state = self.shared.lock();
            state.shutdown = true;
            Shared::kick(&state);
            state.thread.take()
        };
        if let Some((_, handle)) = thread
            && handle.join().is_err()
        {
            tracing::error!("the reactor thread panicked");
        }
        let driver = self.shared.driver;
        let mut state = self.shared.lock();
        let mut events: Vec<CUevent> = std::mem::take(&mut state.spare_events);
        events.extend(
            state
                .slots
                .iter_mut()
                .map(|s| std::mem::replace(&mut s.event, std::ptr::null_mut()))
                .filter(|e| !e.is_null()),
        );
        for event in events {
            // SAFETY: live events owned by the reactor, destroyed once.
            unsafe { (driver.cuEventDestroy)(event) };
        }
        for watch in state.watch_streams.drain(..) {
            // SAFETY: a stream the reactor created, destroyed once.
            unsafe { (driver.cuStreamDestroy)(watch.raw) };
        }
        for chunk in state.chunks.drain(..) {
            // SAFETY: from cuMemHostAlloc, freed once; the context was
            // synchronized, so no write into it is pending.
            unsafe { (driver.cuMemFreeHost)(chunk.host.cast()) };
        }
        state.slots.clear();
        state.free.clear();
        state.watched.clear();
    }
}

impl fmt::Debug for Reactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reactor")
            .field("stats", &self.stats())
            .finish()
    }
}

fn create_event(ctx: &Context) -> Result<CUevent> {
    let mut event = std::ptr::null_mut();
    let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    // SAFETY: writes one handle through a valid pointer; the context is current.
    ctx.check(unsafe { (ctx.driver().cuEventCreate)(&mut event, flags) })?;
    Ok(event)
}

/// The host function of [`WakeMode::HostFn`]: unpark the reactor thread.
unsafe extern "C" fn wake_reactor(data: *mut c_void) {
    // SAFETY: `data` is the Arc leaked by `register`, handed over exactly once.
    let shared = unsafe { Arc::from_raw(data as *const Shared) };
    let _ = catch_unwind(AssertUnwindSafe(|| Shared::kick(&shared.lock())));
}

/// Shorten timer slack so that parks of a few microseconds last about that
/// long (Linux rounds sleeps of ordinary threads up by 50 µs by default).
fn tighten_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects this thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

/// The reactor thread.
fn run(shared: &Shared) {
    tighten_timer_slack();
    // SAFETY: the context outlives the thread (its Drop joins it first).
    let bound = unsafe { (shared.driver.cuCtxSetCurrent)(shared.ctx) };
    if bound != CUresult::CUDA_SUCCESS {
        tracing::error!(?bound, "the reactor thread could not bind its context");
    }
    let mut last_activity = Instant::now();
    let mut last_check = Instant::now();
    let mut backoff = Backoff::default();
    let mut wakers = Vec::new();
    loop {
        let next = {
            let mut state = shared.lock();
            if state.shutdown {
                return;
            }
            let now = Instant::now();
            let check_events = now.duration_since(last_check) >= state.config.error_check;
            if check_events {
                last_check = now;
            }
            let plan = scan(shared, &mut state, now, check_events, &mut wakers);
            if plan.finished || std::mem::take(&mut state.activity) {
                last_activity = now;
                backoff.reset(&state.config);
            }
            let next = next_wait(&state.config, &plan, now, last_activity, &mut backoff);
            if let Next::Park(_) = next {
                state.stats.parks += 1;
            }
            next
        };
        for waker in wakers.drain(..) {
            // A waker is user code (an executor's); it must not take the
            // reactor down.
            if catch_unwind(AssertUnwindSafe(|| waker.wake())).is_err() {
                tracing::error!("a waker panicked; the reactor goes on");
            }
        }
        match next {
            Next::Sleep => {
                std::thread::park();
                last_activity = Instant::now();
            }
            Next::Spin => std::hint::spin_loop(),
            Next::Park(timeout) => std::thread::park_timeout(timeout),
        }
    }
}

/// How the thread waits before its next round.
enum Next {
    /// Nothing is watched: until a new wait unparks it.
    Sleep,
    /// Look again at once.
    Spin,
    /// Until this timeout, or an unpark.
    Park(Duration),
}

fn next_wait(
    config: &ReactorConfig,
    plan: &Plan,
    now: Instant,
    last_activity: Instant,
    backoff: &mut Backoff,
) -> Next {
    if !plan.watching {
        return Next::Sleep;
    }
    match config.mode {
        WakeMode::Spin => Next::Spin,
        WakeMode::Adaptive if plan.due_now => Next::Spin,
        WakeMode::Adaptive
            if plan.youngest_unforeseen.is_some()
                && now.duration_since(last_activity) < config.spin =>
        {
            Next::Spin
        }
        WakeMode::Adaptive => {
            // Waits with no history (or past their window) set the
            // back-off; foreseen ones only cut a park short so that
            // the thread is awake when their window opens.
            let mut timeout = match plan.youngest_unforeseen {
                Some(youngest) => backoff.park(config, youngest),
                None => config.error_check,
            };
            if let Some(next) = plan.next_window {
                timeout = timeout.min(next.saturating_duration_since(now));
            }
            Next::Park(timeout)
        }
        // The host function wakes us; the timeout only serves the
        // error checks (a faulted stream may run no host function).
        WakeMode::HostFn => Next::Park(config.error_check),
    }
}

/// What one round over the watched slots found, and so how to wait next.
#[derive(Default)]
struct Plan {
    /// Some wait finished.
    finished: bool,
    /// Slots are still watched.
    watching: bool,
    /// A pending wait is inside its window: spin.
    due_now: bool,
    /// How long the youngest pending wait with no window (or past it) has
    /// been pending; if any, the thread backs off.
    youngest_unforeseen: Option<Duration>,
    /// The earliest window still to open.
    next_window: Option<Instant>,
}

/// One round over the watched slots. Returns whether any finished.
fn scan(
    shared: &Shared,
    state: &mut State,
    now: Instant,
    check_events: bool,
    wakers: &mut Vec<Waker>,
) -> Plan {
    state.stats.scans += 1;
    let mut plan = Plan::default();
    let mut i = 0;
    while i < state.watched.len() {
        let slot = state.watched[i];
        let seq = state.slots[slot as usize].seq;
        let landed = Shared::flag(state, slot).load(Ordering::Acquire) == seq;
        let outcome = if landed {
            Some(CUresult::CUDA_SUCCESS)
        } else if check_events && !state.slots[slot as usize].event.is_null() {
            // SAFETY: a live event owned by the reactor; the context is current.
            match unsafe { (shared.driver.cuEventQuery)(state.slots[slot as usize].event) } {
                CUresult::CUDA_ERROR_NOT_READY => None,
                // Complete after the write: the write is done too.
                CUresult::CUDA_SUCCESS => Some(CUresult::CUDA_SUCCESS),
                error => Some(error),
            }
        } else {
            None
        };
        let Some(code) = outcome else {
            let entry = &state.slots[slot as usize];
            if entry.state == SlotState::Pending {
                match entry.window {
                    Some(window) if now < entry.registered + window.start => {
                        let opens = entry.registered + window.start;
                        plan.next_window = Some(plan.next_window.map_or(opens, |t| t.min(opens)));
                    }
                    Some(window) if now <= entry.registered + window.end => plan.due_now = true,
                    _ => {
                        let age = now.duration_since(entry.registered);
                        plan.youngest_unforeseen =
                            Some(plan.youngest_unforeseen.map_or(age, |y| y.min(age)));
                    }
                }
            }
            i += 1;
            continue;
        };
        plan.finished = true;
        state.watched.swap_remove(i);
        if let Some(index) = state.slots[slot as usize].watch.take() {
            state.watch_streams[index].pending -= 1;
        }
        let entry = &mut state.slots[slot as usize];
        match entry.state {
            SlotState::Pending => {
                if landed {
                    let (key, length) = (entry.key, now.duration_since(entry.registered));
                    state.predictor.observe(key, length);
                }
                let entry = &mut state.slots[slot as usize];
                entry.state = SlotState::Done(code);
                wakers.extend(entry.waker.take());
                state.stats.completed += 1;
                if code != CUresult::CUDA_SUCCESS {
                    state.stats.failed += 1;
                }
            }
            SlotState::Cancelled => {
                entry.state = SlotState::Free;
                let event = std::mem::replace(&mut entry.event, std::ptr::null_mut());
                if !event.is_null() {
                    state.spare_events.push(event);
                }
                state.free.push(slot);
            }
            SlotState::Free | SlotState::Done(_) => {}
        }
    }
    plan.watching = !state.watched.is_empty();
    plan
}
