//! One background thread that runs callbacks when events complete.
//!
//! Events are not tied to a stream the waiter knows, so it polls
//! `cuEventQuery`: right away after a new wait, then with a back-off that
//! doubles from [`MIN_BACKOFF`] up to a cap (default [`DEFAULT_MAX_BACKOFF`])
//! while nothing completes. With nothing pending it sleeps on a condvar and
//! uses no CPU.

use crate::error::{Error, Result};
use crate::pool::PooledEvent;
use driver::Event;
use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The first sleep between polls once quick polls found nothing.
pub const MIN_BACKOFF: Duration = Duration::from_micros(20);
/// The longest sleep between polls, unless set with
/// [`AsyncEventWaiter::with_max_backoff`].
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_micros(500);
/// Polls that only yield the thread before the first sleep: events often
/// complete within microseconds of being waited on.
const QUICK_POLLS: u32 = 16;

/// Something holding an event alive: the waiter keeps it until the event has
/// completed, and drops it just before running the callback (or when the wait
/// is cancelled).
///
/// `event()` and `Drop` run on the waiter's thread. A panic in either is
/// caught, counted in [`WaiterMetrics::event_panics`] and logged (a `tracing`
/// error); the waiter keeps serving the other waits. A wait whose `event()`
/// panics is treated like one whose query failed: its callback runs at once,
/// since nothing will tell when that event completes.
///
/// Implemented for [`Event`], [`PooledEvent`] and `Arc`s of them; implement
/// it to keep other things alive until the event completes, such as the host
/// buffer a copy reads:
///
/// ```
/// use cuda_streams_event_coord::{AsyncEventWaiter, WaitEvent};
/// use driver::{Context, Event, Stream};
/// use std::sync::mpsc;
///
/// struct Upload {
///     done: Event,
///     _staging: Vec<u8>, // freed only after `done` completes
/// }
///
/// impl WaitEvent for Upload {
///     fn event(&self) -> &Event {
///         &self.done
///     }
/// }
///
/// # fn main() -> cuda_streams_event_coord::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let upload = Upload { done: stream.record_event()?, _staging: vec![0; 64] };
/// let waiter = AsyncEventWaiter::new();
/// let (tx, rx) = mpsc::channel();
/// waiter.wait_async(upload, move || tx.send(()).unwrap());
/// rx.recv().unwrap();
/// assert_eq!(waiter.metrics().fired, 1);
/// # Ok(())
/// # }
/// ```
pub trait WaitEvent: Send + 'static {
    /// The event to wait for.
    fn event(&self) -> &Event;
}

impl WaitEvent for Event {
    fn event(&self) -> &Event {
        self
    }
}

impl WaitEvent for PooledEvent {
    fn event(&self) -> &Event {
        self
    }
}

impl WaitEvent for Arc<Event> {
    fn event(&self) -> &Event {
        self
    }
}

impl WaitEvent for Arc<PooledEvent> {
    fn event(&self) -> &Event {
        self
    }
}

/// Identifies one [`AsyncEventWaiter::wait_async`] call, for
/// [`AsyncEventWaiter::cancel_wait`].
///
/// ```
/// use cuda_streams_event_coord::AsyncEventWaiter;
/// use driver::{Context, Stream};
/// use std::sync::mpsc;
/// # fn main() -> cuda_streams_event_coord::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// // Hold the stream with a host callback, so the event behind it cannot complete yet.
/// let (open, gate) = mpsc::channel::<()>();
/// stream.add_callback(move || {
///     let _ = gate.recv(); // returns when `open` is dropped
/// })?;
/// let waiter = AsyncEventWaiter::new();
/// let id = waiter.wait_async(stream.record_event()?, || unreachable!("cancelled"));
/// assert_eq!(id.to_string(), format!("wait {}", id.0));
/// assert!(waiter.cancel_wait(id)); // not fired: its callback will never run
/// assert!(!waiter.cancel_wait(id)); // already cancelled
/// drop(open);
/// stream.synchronize()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitId(pub u64);

impl fmt::Display for WaitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wait {}", self.0)
    }
}

/// Counters of an [`AsyncEventWaiter`], from [`AsyncEventWaiter::metrics`].
///
/// ```
/// use cuda_streams_event_coord::AsyncEventWaiter;
/// use driver::{Context, Stream};
/// use std::sync::mpsc;
/// # fn main() -> cuda_streams_event_coord::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let waiter = AsyncEventWaiter::new();
/// let (tx, rx) = mpsc::channel();
/// waiter.wait_async(stream.record_event()?, move || tx.send(()).unwrap());
/// rx.recv().unwrap();
/// let metrics = waiter.metrics();
/// assert_eq!((metrics.pending, metrics.fired, metrics.cancelled), (0, 1, 0));
/// assert_eq!(metrics.panics, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaiterMetrics {
    /// Waits neither fired nor cancelled yet.
    pub pending: usize,
    /// Callbacks started (counted just before each runs).
    pub fired: u64,
    /// Waits cancelled before firing.
    pub cancelled: u64,
    /// Callbacks that panicked, when run or when dropped unrun after a
    /// cancellation (caught; the waiter kept running).
    pub panics: u64,
    /// Panics of [`WaitEvent::event`] or of a waited-on value's `Drop`
    /// (caught; the waiter kept running).
    pub event_panics: u64,
    /// Event queries that failed; the callback ran anyway (the event will not
    /// complete more than that).
    pub query_errors: u64,
    /// Rounds of `cuEventQuery` over the pending waits.
    pub polls: u64,
}

type Callback = Box<dyn FnOnce() + Send + 'static>;

struct Wait {
    id: WaitId,
    event: Box<dyn WaitEvent>,
    callback: Callback,
}

#[derive(Default)]
struct Queue {
    /// Waits handed over but not yet picked up by the thread.
    incoming: Vec<Wait>,
    /// Waits not yet fired or cancelled.
    live: HashSet<WaitId>,
    shutdown: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    next_id: AtomicU64,
    fired: AtomicU64,
    cancelled: AtomicU64,
    panics: AtomicU64,
    event_panics: AtomicU64,
    query_errors: AtomicU64,
    polls: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs callbacks on one background thread when their events complete.
///
/// Each callback runs exactly once, on the waiter's thread (never the
/// caller's, never a driver thread, so it may call the driver), after its
/// event completes, unless cancelled first. A panicking callback is caught,
/// counted in [`WaiterMetrics::panics`], and the waiter keeps going. An event
/// that was never recorded counts as complete, as in CUDA.
///
/// **On drop**, the waiter stops taking waits and its thread runs every
/// pending callback once its event completes, then exits; `drop` joins it.
/// So dropping blocks until pending events complete; call
/// [`cancel_all`](Self::cancel_all) first to drop them instead.
///
/// ```
/// use driver::{Context, Stream};
/// use cuda_streams_event_coord::AsyncEventWaiter;
/// use std::sync::mpsc;
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let waiter = AsyncEventWaiter::new();
/// let (tx, rx) = mpsc::channel();
/// let event = stream.record_event().unwrap();
/// waiter.wait_async(event, move || tx.send("done").unwrap());
/// assert_eq!(rx.recv().unwrap(), "done");
/// ```
pub struct AsyncEventWaiter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl AsyncEventWaiter {
    /// Start the background thread.
    ///
    /// # Panics
    /// If the operating system cannot start a thread (as `std::thread::spawn`);
    /// [`try_new`](Self::try_new) returns that as an error instead.
    pub fn new() -> AsyncEventWaiter {
        match Self::try_new() {
            Ok(waiter) => waiter,
            Err(err) => panic!("{err}"),
        }
    }

    /// Start the background thread, or report why it could not start.
    pub fn try_new() -> Result<AsyncEventWaiter> {
        Self::with_max_backoff(DEFAULT_MAX_BACKOFF)
    }

    /// Like [`try_new`](Self::try_new), with the longest sleep between polls
    /// set to `max_backoff` (at least [`MIN_BACKOFF`]): shorter reacts sooner,
    /// longer wakes less while events are pending.
    pub fn with_max_backoff(max_backoff: Duration) -> Result<AsyncEventWaiter> {
        let shared = Arc::new(Shared::default());
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("cuda-streams-event-waiter".into())
            .spawn(move || run(&for_thread, max_backoff.max(MIN_BACKOFF)))
            .map_err(Error::Spawn)?;
        Ok(AsyncEventWaiter {
            shared,
            thread: Some(thread),
        })
    }

    /// Run `callback` on the waiter's thread once `event` completes. The
    /// waiter keeps `event` alive until then, and drops it just before the
    /// callback runs (a pooled event is back in its pool by the time the
    /// callback signals anyone). Callbacks whose events the waiter finds
    /// complete at the same poll run in the order the waits were made, so
    /// waits on events of one stream fire in stream order.
    pub fn wait_async<E, F>(&self, event: E, callback: F) -> WaitId
    where
        E: WaitEvent,
        F: FnOnce() + Send + 'static,
    {
        let id = WaitId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let wait = Wait {
            id,
            event: Box::new(event),
            callback: Box::new(callback),
        };
        {
            let mut queue = self.shared.lock();
            queue.live.insert(id);
            queue.incoming.push(wait);
        }
        self.shared.wake.notify_one();
        id
    }

    /// Cancel a wait: `true` when it had not fired (its callback will never
    /// run), `false` when it already fired, was already cancelled, or is not
    /// this waiter's.
    pub fn cancel_wait(&self, id: WaitId) -> bool {
        let cancelled = self.shared.lock().live.remove(&id);
        if cancelled {
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        cancelled
    }

    /// Cancel every pending wait; returns how many were cancelled.
    pub fn cancel_all(&self) -> usize {
        let count = {
            let mut queue = self.shared.lock();
            let count = queue.live.len();
            queue.live.clear();
            count
        };
        self.shared
            .cancelled
            .fetch_add(count as u64, Ordering::Relaxed);
        self.shared.wake.notify_one();
        count
    }

    /// Counters so far.
    pub fn metrics(&self) -> WaiterMetrics {
        let s = &self.shared;
        WaiterMetrics {
            pending: s.lock().live.len(),
            fired: s.fired.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
            panics: s.panics.load(Ordering::Relaxed),
            event_panics: s.event_panics.load(Ordering::Relaxed),
            query_errors: s.query_errors.load(Ordering::Relaxed),
            polls: s.polls.load(Ordering::Relaxed),
        }
    }
}

impl Default for AsyncEventWaiter {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for AsyncEventWaiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEventWaiter")
            .field("metrics", &self.metrics())
            .finish()
    }
}

impl Drop for AsyncEventWaiter {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // The thread catches the panics of user code, so joining cannot
            // fail except through a bug; never panic in drop.
            if thread.join().is_err() {
                tracing::error!("the async event waiter's thread panicked");
            }
        }
    }
}

/// The background thread: pick up waits, poll, fire, back off.
fn run(shared: &Shared, max_backoff: Duration) {
    let mut pending: Vec<Wait> = Vec::new();
    let mut quick = 0u32;
    let mut backoff = MIN_BACKOFF;
    let mut cancelled: Vec<Wait> = Vec::new();
    loop {
        {
            let mut queue = shared.lock();
            loop {
                if !queue.incoming.is_empty() {
                    pending.append(&mut queue.incoming);
                    quick = 0;
                    backoff = MIN_BACKOFF;
                }
                // Cancelled waits leave without their event being polled.
                let mut i = 0;
                while i < pending.len() {
                    if queue.live.contains(&pending[i].id) {
                        i += 1;
                    } else {
                        cancelled.push(pending.swap_remove(i));
                    }
                }
                if !pending.is_empty() || !cancelled.is_empty() {
                    break;
                }
                if queue.shutdown {
                    return;
                }
                queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        }
        // Their drops are user code: outside the lock, panics caught.
        for wait in cancelled.drain(..) {
            discard(shared, wait);
        }
        if pending.is_empty() {
            continue;
        }
        let finished = poll(shared, &mut pending);
        if !finished.is_empty() {
            fire(shared, finished);
            quick = 0;
            backoff = MIN_BACKOFF;
            continue;
        }
        if quick < QUICK_POLLS {
            quick += 1;
            std::thread::yield_now();
            continue;
        }
        // Sleep, but wake for a new wait or a cancellation.
        let queue = shared.lock();
        if queue.incoming.is_empty() && queue.live.len() == pending.len() {
            drop(
                shared
                    .wake
                    .wait_timeout(queue, backoff)
                    .unwrap_or_else(|p| p.into_inner()),
            );
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

/// Move the waits whose events have completed out of `pending`.
fn poll(shared: &Shared, pending: &mut Vec<Wait>) -> Vec<Wait> {
    shared.polls.fetch_add(1, Ordering::Relaxed);
    let mut finished = Vec::new();
    let mut i = 0;
    while i < pending.len() {
        let wait = &pending[i];
        let complete = match catch(|| wait.event.event().query()) {
            Ok(Ok(complete)) => complete,
            Ok(Err(err)) => {
                shared.query_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    wait = wait.id.0,
                    "async waiter: querying the event of {}: {err}; running its callback",
                    wait.id
                );
                true
            }
            Err(message) => {
                shared.event_panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    wait = wait.id.0,
                    "async waiter: WaitEvent::event of {} panicked: {message}; running its callback",
                    wait.id
                );
                true
            }
        };
        if complete {
            finished.push(pending.swap_remove(i));
        } else {
            i += 1;
        }
    }
    finished
}

/// Run the callbacks of finished waits that were not cancelled meanwhile, in
/// the order the waits were made (polling does not keep it).
fn fire(shared: &Shared, finished: Vec<Wait>) {
    let mut to_run: Vec<Wait> = {
        let mut queue = shared.lock();
        finished
            .into_iter()
            .filter(|w| queue.live.remove(&w.id))
            .collect()
    };
    to_run.sort_unstable_by_key(|w| w.id);
    for wait in to_run {
        let Wait {
            id,
            event,
            callback,
        } = wait;
        // The event has done its job; released and counted first, so a
        // callback that signals someone leaves nothing behind and is already
        // counted.
        drop_event(shared, id, event);
        shared.fired.fetch_add(1, Ordering::Relaxed);
        if let Err(message) = catch(callback) {
            shared.panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                wait = id.0,
                "async waiter: the callback of {id} panicked: {message}"
            );
        }
    }
}

/// Drop a cancelled wait: its event and its callback, unrun.
fn discard(shared: &Shared, wait: Wait) {
    let Wait {
        id,
        event,
        callback,
    } = wait;
    drop_event(shared, id, event);
    if let Err(message) = catch(move || drop(callback)) {
        shared.panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            wait = id.0,
            "async waiter: dropping the cancelled callback of {id} panicked: {message}"
        );
    }
}

/// Drop what a wait held alive; its `Drop` is user code.
fn drop_event(shared: &Shared, id: WaitId, event: Box<dyn WaitEvent>) {
    if let Err(message) = catch(move || drop(event)) {
        shared.event_panics.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            wait = id.0,
            "async waiter: dropping the event of {id} panicked: {message}"
        );
    }
}

/// Run user code on the waiter's thread, turning a panic into its message.
fn catch<R>(f: impl FnOnce() -> R) -> std::result::Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let message = panic_message(payload.as_ref());
        // Dropping a panic payload can itself panic.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        message
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}
