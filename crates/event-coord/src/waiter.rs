//! One background thread that runs callbacks when events complete.
//!
//! Built on the driver's futures: each wait is an [`Event::wait_async`]
//! future, woken by the context's reactor (a stream writes a flag into mapped
//! pinned memory after the event; the reactor thread sees it). The waker
//! queues the wait's id and wakes this thread, which polls that future and
//! runs the callback. The reactor is the one mechanism that watches the GPU:
//! this thread neither polls `cuEventQuery` nor wakes on a timer. It waits on
//! a condvar without a timeout, and wakes only for a new wait, a
//! cancellation, a reactor wake-up or shutdown, so it uses no CPU while
//! nothing is ready (the reactor's thread does the watching, see
//! `docs/async.md`).

use crate::{Error, Result};
use driver::Completion;
use driver::Event;
use driver::PooledEvent;
use driver::panic_message;
use std::collections::HashMap;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::thread::JoinHandle;

/// Something holding an event alive: the waiter keeps it until the event has
/// completed, and drops it just before running the callback (or when the wait
/// is cancelled).
///
/// Implemented for [`Event`], [`PooledEvent`] and `Arc`s of them; implement
/// it to keep other things alive until the event completes, such as the host
/// buffer a copy reads:
///
/// ```
/// use cuda_streams_event_coord::{AsyncEventWaiter, WaitEvent};
/// use cuda_streams_event_coord::driver::{Context, Event, Stream};
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
/// use cuda_streams_event_coord::driver::{Context, Stream};
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
/// use cuda_streams_event_coord::driver::{Context, Stream};
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
/// let line = metrics.to_string(); // one line for logs and reports
/// assert!(line.starts_with("event waiter: 0 pending, 1 fired, 0 cancelled"), "{line}");
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
    /// Waits that failed (the event's stream failed, or the wait could not
    /// be started); the callback ran anyway (the event will not complete
    /// more than that).
    pub query_errors: u64,
    /// Rounds in which the thread polled futures: one per batch of new waits
    /// and of reactor wake-ups it picked up together. The thread has no timed
    /// rounds, so this does not grow while a wait is pending and nothing
    /// completes (before the reactor woke it, it also polled every pending
    /// wait every 500 µs).
    pub polls: u64,
}

type Callback = Box<dyn FnOnce(std::result::Result<(), WaitError>) + Send + 'static>;

/// Why a wait of [`AsyncEventWaiter::wait_async_result`] ended without its
/// event completing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The event's stream failed (its work did not complete), or the wait
    /// could not be started.
    #[error("the waited-on work failed: {0}")]
    Failed(#[from] driver::Error),
    /// The waited-on value's [`WaitEvent::event`] panicked (caught).
    #[error("the waited-on value panicked when asked for its event: {message}")]
    EventPanicked {
        /// The panic's message.
        message: String,
    },
}

struct Wait {
    id: WaitId,
    event: Box<dyn WaitEvent>,
    callback: Callback,
    /// Why the event will not complete, once the waiter knows.
    failed: Option<WaitError>,
    /// The reactor's wait, started by the thread when it picks the wait up.
    completion: Option<Completion>,
    waker: Waker,
}

#[derive(Default)]
struct Queue {
    /// Waits handed over but not yet picked up by the thread.
    incoming: Vec<Wait>,
    /// Waits not yet fired or cancelled.
    live: HashSet<WaitId>,
    /// Waits whose future was woken since the thread last looked.
    woken: Vec<WaitId>,
    shutdown: bool,
}

/// Queues its wait's id and wakes the waiter's thread.
struct WakeWait {
    id: WaitId,
    shared: Arc<Shared>,
}

impl Wake for WakeWait {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.lock().woken.push(self.id);
        self.shared.wake.notify_one();
    }
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
/// use cuda_streams_event_coord::driver::{Context, Stream};
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
    ///
    /// How quickly a callback follows its event is the context's reactor's
    /// policy ([`driver::Reactor::set_config`]), shared with every future of
    /// that context.
    pub fn try_new() -> Result<AsyncEventWaiter> {
        let shared = Arc::new(Shared::default());
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("cuda-streams-event-waiter".into())
            .spawn(move || run(&for_thread))
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
    ///
    /// The callback also runs when the wait fails (the event's stream
    /// failed: its work did not complete), so that nobody waits for it
    /// forever; it cannot tell. Use [`AsyncEventWaiter::wait_async_result`]
    /// wherever the callback hands out the work's results.
    pub fn wait_async<E, F>(&self, event: E, callback: F) -> WaitId
    where
        E: WaitEvent,
        F: FnOnce() + Send + 'static,
    {
        self.wait_async_result(event, move |_outcome| callback())
    }

    /// [`AsyncEventWaiter::wait_async`], telling the callback whether the
    /// work before the event completed: `Err` when the event's stream failed
    /// (a launch failure is sticky for the context, as on a GPU) or the wait
    /// could not be started, so failed work is never taken for finished work.
    ///
    /// ```
    /// use cuda_streams_event_coord::AsyncEventWaiter;
    /// use cuda_streams_event_coord::driver::{Context, Stream};
    /// use std::sync::mpsc;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let waiter = AsyncEventWaiter::new();
    /// let (tx, rx) = mpsc::channel();
    /// waiter.wait_async_result(stream.record_event()?, move |outcome| {
    ///     tx.send(outcome.is_ok()).unwrap();
    /// });
    /// assert!(rx.recv()?, "the work before the event completed");
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_async_result<E, F>(&self, event: E, callback: F) -> WaitId
    where
        E: WaitEvent,
        F: FnOnce(std::result::Result<(), WaitError>) + Send + 'static,
    {
        let id = WaitId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let wait = Wait {
            id,
            event: Box::new(event),
            callback: Box::new(callback),
            failed: None,
            completion: None,
            waker: Waker::from(Arc::new(WakeWait {
                id,
                shared: Arc::clone(&self.shared),
            })),
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
            // The thread lets go of the wait's event and callback now, not
            // whenever something else wakes it.
            self.shared.wake.notify_one();
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
            // The thread catches callback panics, so joining cannot fail
            // except through a bug; never panic in drop.
            if thread.join().is_err() {
                tracing::error!("the async event waiter's thread panicked");
            }
        }
    }
}

/// The background thread: pick up waits, start their futures, poll the
/// woken ones, fire.
fn run(shared: &Arc<Shared>) {
    let mut pending: HashMap<WaitId, Wait> = HashMap::new();
    let mut discarded: Vec<Wait> = Vec::new();
    loop {
        let (fresh, woken) = {
            let mut queue = shared.lock();
            loop {
                // Cancelled waits leave without firing: dropping a wait drops
                // its future, which cancels the reactor's wait. Their events
                // and callbacks are user values, dropped below, outside the
                // lock (a panicking Drop must not poison it).
                let gone: Vec<WaitId> = pending
                    .keys()
                    .filter(|id| !queue.live.contains(id))
                    .copied()
                    .collect();
                discarded.extend(gone.iter().filter_map(|id| pending.remove(id)));
                let (fresh, cancelled): (Vec<Wait>, Vec<Wait>) =
                    std::mem::take(&mut queue.incoming)
                        .into_iter()
                        .partition(|w| queue.live.contains(&w.id));
                discarded.extend(cancelled);
                let woken = std::mem::take(&mut queue.woken);
                if !fresh.is_empty() || !woken.is_empty() || !discarded.is_empty() {
                    break (fresh, woken);
                }
                if pending.is_empty() && queue.shutdown {
                    return;
                }
                // Sleep until a wait, a cancellation, a reactor wake-up or
                // shutdown comes. No timeout: the reactor watches the GPU
                // (its flags, and its event queries for failed streams) and
                // wakes each pending wait's future once it sees it ready, so
                // this thread has nothing to look at in between.
                queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        };
        for wait in discarded.drain(..) {
            discard(shared, wait);
        }
        shared.polls.fetch_add(1, Ordering::Relaxed);
        let mut finished = Vec::new();
        for mut wait in fresh {
            start(shared, &mut wait);
            poll(shared, wait, &mut pending, &mut finished);
        }
        for id in woken {
            if let Some(wait) = pending.remove(&id) {
                poll(shared, wait, &mut pending, &mut finished);
            }
        }
        if !finished.is_empty() {
            fire(shared, finished);
        }
    }
}

/// Start the reactor's wait for `wait`'s event. User code runs here (the
/// `WaitEvent::event` accessor), so panics are caught: a wait that cannot
/// start is treated as a failed query, and its callback runs.
fn start(shared: &Shared, wait: &mut Wait) {
    let started = catch_unwind(AssertUnwindSafe(|| wait.event.event().wait_async()));
    match started {
        Ok(Ok(completion)) => wait.completion = Some(completion),
        Ok(Err(err)) => {
            shared.query_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "async waiter: waiting for the event of {}: {err}; running its callback",
                wait.id
            );
            wait.failed = Some(err.into());
        }
        Err(payload) => {
            shared.event_panics.fetch_add(1, Ordering::Relaxed);
            let why = panic_message(payload.as_ref());
            tracing::warn!(
                "async waiter: the event of {} panicked: {why}; running its callback",
                wait.id,
            );
            wait.failed = Some(WaitError::EventPanicked { message: why });
            // Dropping a panic payload can itself panic.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        }
    }
}

/// Poll `wait`'s future: finished waits go to `finished`, others back to
/// `pending` (their waker brings them back).
fn poll(
    shared: &Shared,
    mut wait: Wait,
    pending: &mut HashMap<WaitId, Wait>,
    finished: &mut Vec<Wait>,
) {
    let Some(completion) = wait.completion.as_mut() else {
        finished.push(wait);
        return;
    };
    let waker = wait.waker.clone();
    match Pin::new(completion).poll(&mut TaskContext::from_waker(&waker)) {
        Poll::Pending => {
            pending.insert(wait.id, wait);
        }
        Poll::Ready(outcome) => {
            if let Err(err) = outcome {
                shared.query_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "async waiter: the event of {} failed: {err}; running its callback",
                    wait.id
                );
                wait.failed = Some(err.into());
            }
            wait.completion = None;
            finished.push(wait);
        }
    }
}

/// Run the callbacks of finished waits that were not cancelled meanwhile, in
/// the order the waits were made (polling does not keep it).
///
/// A wait cancelled while the thread started or polled it (outside the
/// lock) may finish all the same; it is discarded like any cancelled wait,
/// outside the lock and with its user values' panics caught. Dropping it
/// inside the lock's filter once let a panicking `Drop` end the thread, so
/// every later wait hung.
fn fire(shared: &Shared, finished: Vec<Wait>) {
    let (mut to_run, cancelled): (Vec<Wait>, Vec<Wait>) = {
        let mut queue = shared.lock();
        finished.into_iter().partition(|w| queue.live.remove(&w.id))
    };
    for wait in cancelled {
        discard(shared, wait);
    }
    to_run.sort_unstable_by_key(|w| w.id);
    for wait in to_run {
        let Wait {
            id,
            event,
            callback,
            failed,
            completion,
            waker,
        } = wait;
        drop((completion, waker));
        // The event has done its job; released and counted first, so a
        // callback that signals someone leaves nothing behind and is already
        // counted. Its Drop is user code: a panic there is caught.
        drop_caught(shared, id, event);
        shared.fired.fetch_add(1, Ordering::Relaxed);
        let outcome = failed.map_or(Ok(()), Err);
        if let Some(why) = caught(move || callback(outcome)) {
            shared.panics.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("async waiter: the callback of {id} panicked: {why}");
        }
    }
}

/// Run user code (a callback, a Drop), catching a panic: its message, if any.
fn caught(f: impl FnOnce()) -> Option<String> {
    let payload = catch_unwind(AssertUnwindSafe(f)).err()?;
    let why = panic_message(payload.as_ref());
    // Dropping a panic payload can itself panic.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    Some(why)
}

/// Drop a waited-on value, which is user code: a panic is caught and counted.
fn drop_caught<T>(shared: &Shared, id: WaitId, value: T) {
    if let Some(why) = caught(move || drop(value)) {
        shared.event_panics.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("async waiter: dropping the event of {id} panicked: {why}");
    }
}

/// A cancelled wait: its event and its callback (never run) are dropped, each
/// caught, since both are user values.
fn discard(shared: &Shared, wait: Wait) {
    let Wait {
        id,
        event,
        callback,
        failed,
        completion,
        waker,
    } = wait;
    drop((completion, waker, failed));
    drop_caught(shared, id, event);
    if let Some(why) = caught(move || drop(callback)) {
        shared.panics.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "async waiter: dropping the callback of cancelled wait {id} panicked: {why}"
        );
    }
}

impl std::fmt::Display for WaiterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "event waiter: {} pending, {} fired, {} cancelled, {} poll(s); \
             {} callback panic(s), {} event panic(s), {} query error(s)",
            self.pending,
            self.fired,
            self.cancelled,
            self.polls,
            self.panics,
            self.event_panics,
            self.query_errors,
        )
    }
}
