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
//!
//! # The files
//!
//! This file is [`Reactor`], the handle that registers, polls and cancels
//! waits. `slots`: the slot table and the rest of the reactor's state,
//! under one lock. `thread`: the thread's rounds over the watched slots and
//! its waits between them, with `backoff` (how long it parks) and `predict`
//! (when a wait is due). `config` ([`WakeMode`], [`ReactorConfig`]) and
//! `stats` ([`ReactorStats`]): what the reactor is told, and what it tells.

mod backoff;
mod config;
mod predict;
mod slots;
mod stats;
mod thread;

pub use config::{ReactorConfig, WakeMode};
pub use stats::ReactorStats;

use crate::ground::error::{Error, Result};
use crate::objects::context::{Context, ContextService};
use predict::WaitPredictor;
use slots::{
    Chunk, MAX_WATCH_STREAMS, SLOTS_PER_CHUNK, Shared, Slot, SlotState, State, WatchStream,
};
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Instant;
use sys::{
    CU_MEMHOSTALLOC_DEVICEMAP, CUcontext, CUdeviceptr, CUevent, CUevent_flags, CUresult, CUstream,
    CUstream_flags, Driver,
};
use thread::{run, wake_reactor};

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
    fn shutdown(&self) {
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

impl ContextService for Reactor {
    fn context_released(&self) {
        self.shutdown();
    }
}

impl Context {
    /// The reactor that wakes this context's futures (its thread starts on
    /// the first wait). One per context, kept in the context's service slot
    /// and shut down when the context is released.
    pub fn reactor(&self) -> &Reactor {
        self.service(|| Reactor::new(self.driver(), self.as_raw()))
            .expect("a context's service slot holds its reactor and nothing else")
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
