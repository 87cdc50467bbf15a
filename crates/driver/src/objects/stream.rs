//! Streams: in-order queues of GPU work, with priorities and counters.
//!
//! Copies, callbacks and kernel launches are features (`features/copy.rs`,
//! `callback.rs`, `launch.rs`), enqueued through the enqueue protocol
//! (`enqueue/`); this file holds the handle itself.

use crate::ground::error::{Error, Result};
use crate::objects::completion_trail::{CompletionTrail, TrailSearch};
use crate::objects::context::Context;
use crate::objects::event::{Event, EventFlags};
use crate::objects::event_pool::{EventPool, PooledEvent};
use crate::objects::metrics::{Counters, StreamMetrics};
use crate::objects::priority::StreamPriority;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sys::{CUstream, CUstream_flags};

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// Timing event pairs waiting for the GPU (from the context's event pool),
/// in record order: the stream's completion trail, by their end events.
type Timings = CompletionTrail<(PooledEvent, PooledEvent)>;

/// A CUDA stream: work enqueued on it runs in order; work on different streams
/// may overlap.
///
/// Streams are always created non-blocking (`CU_STREAM_NON_BLOCKING`: they do
/// not synchronize with the legacy default stream) and are handed out as
/// `Arc<Stream>`, since buffers keep their home stream alive. Every method takes
/// `&self` and may be called from any thread.
///
/// ```
/// use cuda_streams_driver::{Context, Stream, StreamPriority};
/// let ctx = Context::new(0).unwrap();
/// let high = Stream::new_with_priority(&ctx, StreamPriority::High).unwrap();
/// let low = Stream::new_with_priority(&ctx, StreamPriority::Low).unwrap();
/// assert!(high.priority().unwrap() < low.priority().unwrap());
/// assert_eq!(high.priority().unwrap(), ctx.priority_range().greatest);
/// high.synchronize().unwrap();
/// assert!(high.query().unwrap());
/// assert_ne!(high.id(), low.id());
/// ```
pub struct Stream {
    /// Itself, for [`Stream::to_arc`].
    me: std::sync::Weak<Stream>,
    ctx: Arc<Context>,
    raw: CUstream,
    owned: bool,
    id: u64,
    pub(crate) counters: Arc<Counters>,
    timings: Mutex<Timings>,
    /// The context's event pool, once this stream needed an event.
    pub(crate) pool: std::sync::OnceLock<Arc<EventPool>>,
    /// The id of the capture this stream takes part in (0: none).
    pub(crate) capture: AtomicU64,
    /// Orders enqueues against the stream entering a capture (the enqueue
    /// protocol's gate, `enqueue/gate.rs`).
    pub(crate) gate: CaptureGate,
    /// Told before the next work item ([`Stream::observe_next_work`]).
    pub(crate) observers: Mutex<Vec<Arc<dyn WorkObserver>>>,
    /// Whether `observers` may be non-empty: the only cost on the enqueue
    /// path while nothing observes the stream.
    pub(crate) observed: AtomicBool,
    /// Its clock for the stream-order tracker (`order/`).
    pub(crate) order: crate::enqueue::order::TrackedStream,
    /// Its enqueue count and latest mark (`latest_mark.rs`).
    pub(crate) latest: crate::objects::mark_state::LatestMark,
    /// Created by this crate ([`Stream::new`] and kin) and never lent to
    /// another library ([`Stream::lent_out`]): nothing enqueues on it
    /// unseen, so it may keep a latest mark.
    made_here: AtomicBool,
    /// What keeps a borrowed handle valid (another library's stream object,
    /// see `interop`, or the SM partition a stream was made in): dropped
    /// after this stream.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The per-stream lock of the enqueue protocol's capture gate
/// (`enqueue/gate.rs`): shared by enqueues, exclusive for a stream entering
/// a capture.
#[derive(Default)]
pub(crate) struct CaptureGate(pub(crate) std::sync::RwLock<()>);

/// Told when a piece of work is about to be enqueued on a stream: after the
/// waits that order it (on its buffers' allocations and on other streams'
/// uses of them) and right before the work's own driver call. A profiler
/// records the start of a scope there, so that waiting on other streams is
/// not counted as the scope's work ([`Stream::observe_next_work`]).
///
/// "Work" is a copy, memset, prefetch, kernel launch or host callback
/// enqueued through this crate; event waits and records are not work.
pub trait WorkObserver: Send + Sync {
    /// Called once per [`Stream::observe_next_work`], on the thread that
    /// enqueues the work. It may record events on `stream`, and must not
    /// enqueue work there. A panic is caught and logged.
    fn before_work(&self, stream: &Stream);
}

// SAFETY: CUDA streams may be used from any thread; the raw handle is only
// passed to the driver, and all other state is atomics or behind a Mutex.
unsafe impl Send for Stream {}
// SAFETY: as above: enqueueing on one stream from several threads is allowed by
// CUDA (each call is atomic with respect to the queue).
unsafe impl Sync for Stream {}

impl Stream {
    /// A stream of [`StreamPriority::Normal`] priority.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        Self::new_with_priority(ctx, StreamPriority::Normal)
    }

    /// A stream whose priority class is mapped onto the device's range
    /// ([`crate::PriorityRange::value`]): `High` = the greatest priority,
    /// `Low` = the least, `Normal` = the midpoint rounded toward the least.
    pub fn new_with_priority(ctx: &Arc<Context>, priority: StreamPriority) -> Result<Arc<Self>> {
        Self::create(ctx, ctx.priority_range().value(priority))
    }

    /// A stream with a raw CUDA priority, which must lie in the device's range.
    pub fn with_raw_priority(ctx: &Arc<Context>, priority: i32) -> Result<Arc<Self>> {
        let range = ctx.priority_range();
        if !range.contains(priority) {
            return Err(Error::InvalidPriority {
                value: priority,
                least: range.least,
                greatest: range.greatest,
            });
        }
        Self::create(ctx, priority)
    }

    fn create(ctx: &Arc<Context>, priority: i32) -> Result<Arc<Self>> {
        ctx.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        // SAFETY: writes one stream handle through a valid pointer; the context is current.
        ctx.check(unsafe { (ctx.driver().cuStreamCreateWithPriority)(&mut raw, flags, priority) })?;
        // SAFETY: `raw` was just created in `ctx` and is owned by the new
        // Stream; no other code has its handle.
        Ok(unsafe { Self::build(ctx, raw, true, None, true) })
    }

    /// Wrap a stream handle made elsewhere (cust, cudarc, raw driver calls).
    ///
    /// # Safety
    /// `raw` must be a stream of `ctx` (or null, the legacy default stream) that
    /// stays valid for the life of the returned `Stream`. With `owned = true`
    /// the `Stream` destroys it on drop, so nothing else may destroy it.
    pub unsafe fn from_raw(ctx: &Arc<Context>, raw: CUstream, owned: bool) -> Arc<Self> {
        // SAFETY: the caller's contract, unchanged.
        unsafe { Self::from_raw_with_owner(ctx, raw, owned, None) }
    }

    /// [`Stream::from_raw`], keeping `owner` (whatever keeps `raw` valid)
    /// until the returned `Stream` is dropped.
    ///
    /// # Safety
    /// As [`Stream::from_raw`]; `raw` stays valid while `owner` lives.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) unsafe fn from_raw_with_owner(
        ctx: &Arc<Context>,
        raw: CUstream,
        owned: bool,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Arc<Self> {
        // SAFETY: the caller's contract, unchanged.
        unsafe { Self::build(ctx, raw, owned, owner, false) }
    }

    /// The stream over `raw`; `made_here` when this crate created it.
    ///
    /// # Safety
    /// As [`Stream::from_raw_with_owner`].
    unsafe fn build(
        ctx: &Arc<Context>,
        raw: CUstream,
        owned: bool,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
        made_here: bool,
    ) -> Arc<Self> {
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            ctx: Arc::clone(ctx),
            raw,
            owned,
            id,
            order: crate::enqueue::order::TrackedStream::new(id, ctx),
            counters: Arc::default(),
            timings: Mutex::default(),
            pool: std::sync::OnceLock::new(),
            capture: AtomicU64::new(0),
            gate: CaptureGate::default(),
            observers: Mutex::default(),
            observed: AtomicBool::new(false),
            latest: Default::default(),
            made_here: AtomicBool::new(made_here),
            owner,
        })
    }

    /// A stream this crate created in `raw`'s SM partition, which `owner`
    /// keeps alive (`objects/partition.rs`).
    ///
    /// # Safety
    /// `raw` is a stream of `ctx`'s device, owned by the returned `Stream`,
    /// valid while `owner` lives.
    pub(crate) unsafe fn in_partition(
        ctx: &Arc<Context>,
        raw: CUstream,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Self> {
        // SAFETY: the caller's contract.
        unsafe { Self::build(ctx, raw, true, Some(owner), true) }
    }

    /// What keeps this stream's handle valid, if it is a `T`.
    #[inline]
    pub(crate) fn owner<T: 'static>(&self) -> Option<&T> {
        self.owner.as_ref()?.downcast_ref()
    }

    /// Whether this crate created the stream (see `made_here`).
    pub(crate) fn made_here(&self) -> bool {
        self.made_here.load(Ordering::Acquire)
    }

    /// The stream's handle is being given to another library (cudarc,
    /// cust), which may enqueue on it without this crate seeing: it keeps
    /// no latest mark from now on, so a fork or a wait on it always records
    /// a fresh event after whatever was enqueued there.
    #[cfg_attr(
        not(any(feature = "cudarc", test)),
        expect(dead_code, reason = "only the cudarc interop lends a stream out")
    )]
    pub(crate) fn lent_out(&self) {
        self.made_here.store(false, Ordering::Release);
        self.forget_latest_mark();
    }

    /// A weak handle to this stream (the tracker's, for `Auto`).
    pub(crate) fn weak(&self) -> std::sync::Weak<Stream> {
        self.me.clone()
    }

    /// Another handle to this stream. Every `Stream` lives in an `Arc`
    /// (the constructors return one), so code given `&Stream` can keep it.
    pub fn to_arc(&self) -> Arc<Stream> {
        // `&self` proves a strong reference exists.
        self.me
            .upgrade()
            .expect("a Stream is only reachable through its Arc")
    }

    /// The priority the driver reports for this stream (`cuStreamGetPriority`).
    pub fn priority(&self) -> Result<i32> {
        self.ctx.bind()?;
        let mut priority = 0;
        // SAFETY: writes one int through a valid pointer; the stream is live.
        let code = unsafe { (self.ctx.driver().cuStreamGetPriority)(self.raw, &mut priority) };
        self.ctx.check(code)?;
        Ok(priority)
    }

    /// Whether the driver reports the stream as non-blocking (`cuStreamGetFlags`).
    pub fn is_non_blocking(&self) -> Result<bool> {
        self.ctx.bind()?;
        let mut flags = 0;
        // SAFETY: writes one unsigned int through a valid pointer; the stream is live.
        let code = unsafe { (self.ctx.driver().cuStreamGetFlags)(self.raw, &mut flags) };
        self.ctx.check(code)?;
        Ok(flags & CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0)
    }

    /// Whether all work enqueued so far has finished (`NOT_READY` is `false`).
    ///
    /// Refused ([`Error::StreamCapturing`]) while the stream is being captured
    /// into a graph, as is [`Stream::synchronize`].
    pub fn query(&self) -> Result<bool> {
        // Held through the driver call, as in `synchronize`.
        let _out_of_captures = self.hold_out_of_captures("Stream::query")?;
        self.ctx.bind()?;
        let point = crate::enqueue::order::stream_point(self);
        // SAFETY: the stream is live; the context is current.
        let code = unsafe { (self.ctx.driver().cuStreamQuery)(self.raw) };
        let done = self.ctx.check_ready(code)?;
        if done {
            crate::enqueue::order::completed(point);
        }
        Ok(done)
    }

    /// Block the calling thread until all work enqueued so far has finished.
    /// A callback of the stream that panicked and was not reported yet makes
    /// it return [`Error::CallbackPanicked`] once (see [`Stream::add_callback`]).
    ///
    /// Refused ([`Error::StreamCapturing`]) while the stream captures; a
    /// capture begun on it from another thread meanwhile waits for this to
    /// return (synchronizing a capturing stream would invalidate the
    /// capture).
    pub fn synchronize(&self) -> Result<()> {
        // Held through the driver call: a capture begun meanwhile on another
        // thread would be invalidated by it.
        let _out_of_captures = self.hold_out_of_captures("Stream::synchronize")?;
        self.ctx.bind()?;
        let point = crate::enqueue::order::stream_point(self);
        // SAFETY: the stream is live; the context is current.
        let code = unsafe { (self.ctx.driver().cuStreamSynchronize)(self.raw) };
        self.ctx.check(code)?;
        crate::enqueue::order::completed(point);
        self.harvest_timings();
        // A callback that panicked fails the synchronize, once.
        self.report_callback_panics(u64::MAX)
    }

    /// Record a fresh plain event at the stream's current end (for handing to
    /// another stream's [`Stream::wait_event`]).
    pub fn record_event(&self) -> Result<Event> {
        let event = Event::new(&self.ctx, EventFlags::PLAIN)?;
        event.record(self)?;
        Ok(event)
    }

    /// Whether the stream is being captured into a graph (it began a
    /// [`crate::Capture`] or was forked into one). Work enqueued through the
    /// stream's own methods is then refused; it goes through the capture.
    #[inline]
    pub fn is_capturing(&self) -> bool {
        self.capture_id() != 0
    }

    /// `Err` ([`Error::StreamCapturing`], naming `operation`) while the
    /// stream is capturing. This is a snapshot: a capture may begin right
    /// after it returns. Code that enqueues with raw driver calls takes
    /// [`Stream::enqueue_gate`] instead, which holds captures off until it
    /// is dropped.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// assert!(stream.check_not_capturing("my raw call").is_ok());
    /// let capture = stream.begin_capture().unwrap();
    /// let err = stream.check_not_capturing("my raw call").unwrap_err();
    /// assert!(err.to_string().contains("my raw call"), "{err}");
    /// drop(capture);
    /// ```
    pub fn check_not_capturing(&self, operation: &'static str) -> Result<()> {
        self.refuse_if_capturing(operation)
    }

    /// The id of the capture the stream takes part in, 0 when none.
    #[inline]
    pub(crate) fn capture_id(&self) -> u64 {
        self.capture.load(Ordering::Acquire)
    }

    /// `Err` naming `operation` while the stream is capturing. Inlined down
    /// to one test: every enqueue's gate asks.
    #[inline]
    pub(crate) fn refuse_if_capturing(&self, operation: &'static str) -> Result<()> {
        if self.is_capturing() {
            Err(self.capturing_refusal(operation))
        } else {
            Ok(())
        }
    }

    #[cold]
    fn capturing_refusal(&self, operation: &'static str) -> Error {
        Error::StreamCapturing {
            operation,
            stream: self.id,
        }
    }

    /// A small process-unique id (never 0), cheap to hash and compare.
    #[inline]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The raw handle (for interop). It stays owned as given to `from_raw`.
    pub fn as_raw(&self) -> CUstream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Whether the stream destroys its handle on drop.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// A snapshot of the counters. Folds in timing sections the GPU has passed.
    pub fn metrics(&self) -> StreamMetrics {
        self.harvest_timings();
        self.counters.snapshot(self.id)
    }

    /// The stream's counters as a handle that outlives the stream.
    pub fn counters(&self) -> crate::objects::metrics::StreamCounters {
        crate::objects::metrics::StreamCounters::new(self.id, Arc::clone(&self.counters))
    }

    /// How many operations were enqueued so far: [`StreamMetrics::operations_count`]
    /// without the rest of the snapshot (the sum of five counters).
    pub fn operation_count(&self) -> u64 {
        self.counters.operations()
    }

    /// Call `observer` once, right before the next work item enqueued on this
    /// stream (after the waits that order it); see [`WorkObserver`]. Several
    /// observers may wait at once; each is called once, in the order given.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream, WorkObserver};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    ///
    /// /// Remembers how many operations preceded the observed work.
    /// struct Before(AtomicU64);
    /// impl WorkObserver for Before {
    ///     fn before_work(&self, stream: &Stream) {
    ///         self.0.store(stream.operation_count(), Ordering::Relaxed);
    ///     }
    /// }
    /// let ctx = Context::new(0).unwrap();
    /// let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    /// let mut buf = DeviceBuffer::<u32>::new_async(&a, 256).unwrap();
    /// a.synchronize().unwrap();
    /// let before = Arc::new(Before(AtomicU64::new(u64::MAX)));
    /// b.observe_next_work(before.clone());
    /// // The memset on `b` first waits for the allocation on `a`: the observer
    /// // runs after that wait (one operation on `b`) and before the memset.
    /// b.memset_u32_async(&mut buf, 1).unwrap();
    /// assert_eq!(before.0.load(Ordering::Relaxed), 1);
    /// assert_eq!(b.operation_count(), 2);
    /// ```
    pub fn observe_next_work(&self, observer: Arc<dyn WorkObserver>) {
        let mut observers = self.observers.lock().unwrap_or_else(|p| p.into_inner());
        observers.push(observer);
        self.observed.store(true, Ordering::Release);
    }

    /// [`crate::Error::CallbackPanicked`] for the panics not reported yet of
    /// this stream's callbacks numbered up to `through` (`u64::MAX`: all),
    /// so each panic is reported once.
    pub(crate) fn report_callback_panics(&self, through: u64) -> Result<()> {
        self.counters.report_panics(self.id, through)
    }

    /// Count a kernel launch made outside this crate's API.
    pub fn record_kernel_launch(&self) {
        self.counters.kernel_launch();
    }

    /// Count a memory transfer of `bytes` made outside this crate's API.
    pub fn record_memory_transfer(&self, bytes: usize) {
        self.counters.transfer(bytes);
    }

    /// Raise the peak-memory mark to at least `bytes`.
    pub fn update_peak_memory(&self, bytes: usize) {
        self.counters.update_peak(bytes as u64);
    }

    /// Add one measured operation latency (e.g. from [`Event::elapsed`]).
    pub fn record_latency(&self, elapsed: Duration) {
        self.counters.latency(elapsed);
    }

    /// Run `f`, which enqueues work on this stream, between two timing events.
    /// The GPU time between them is added to the latency metrics once the GPU
    /// has passed the end (seen by [`Stream::metrics`] or
    /// [`Stream::synchronize`]); the host does not wait here.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let mut buf = DeviceBuffer::<u32>::new_async(&stream, 1024).unwrap();
    /// stream.timed(|s| s.memset_u32_async(&mut buf, 7)).unwrap();
    /// stream.synchronize().unwrap();
    /// let m = stream.metrics();
    /// assert_eq!(m.timed_operations, 1);
    /// assert!(m.average_latency.is_some());
    /// ```
    pub fn timed<R>(&self, f: impl FnOnce(&Stream) -> Result<R>) -> Result<R> {
        // A snapshot, not the gate: `f` is the caller's code, which may
        // begin a capture (its later work is then refused, as it should be).
        self.refuse_if_capturing("Stream::timed")?;
        let pool = self.event_pool();
        let (start, end) = (pool.acquire_event(true)?, pool.acquire_event(true)?);
        start.record(self)?;
        let result = f(self);
        end.record(self)?;
        self.lock_timings().push((start, end));
        result
    }

    /// Fold finished timing sections into the counters: the prefix of the
    /// trail the GPU has passed, found by its end events.
    fn harvest_timings(&self) {
        let mut timings = self.lock_timings();
        if timings.is_empty() {
            return;
        }
        let passed = match timings.passed(TrailSearch::Exact, |(_, end)| Some(&**end)) {
            Ok(passed) => passed,
            Err(err) => {
                // A failed stream: its sections will never be timed.
                tracing::warn!("timing on stream {}: {err}", self.id);
                timings.take_all();
                return;
            }
        };
        for (start, end) in timings.take_front(passed) {
            match Event::elapsed(&start, &end) {
                Ok(elapsed) => self.counters.latency(elapsed),
                Err(err) => tracing::warn!("timing on stream {}: {err}", self.id),
            }
        }
    }

    fn lock_timings(&self) -> std::sync::MutexGuard<'_, Timings> {
        self.timings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Return the callbacks that panicked and were not reported yet (here, by
    /// [`Stream::synchronize`] or by a completion future) as an error.
    ///
    /// Panics in callbacks are caught (they cannot unwind into the driver),
    /// counted in [`StreamMetrics::callback_panics`], logged once per stream,
    /// and reported once.
    pub fn check_callback_panics(&self) -> Result<()> {
        match self.counters.take_panics() {
            None => Ok(()),
            Some((count, message)) => Err(Error::CallbackPanicked {
                stream: self.id,
                count,
                message,
            }),
        }
    }

    /// `Ok` when `other` is this stream's context.
    #[inline]
    pub(crate) fn check_context(&self, what: &'static str, other: &Context) -> Result<()> {
        self.check_context_id(what, other.id())
    }

    /// `Ok` when `id` is this stream's context's id; otherwise an error that
    /// names both devices when `id` is a context of another device.
    #[inline]
    pub(crate) fn check_context_id(&self, what: &'static str, id: u64) -> Result<()> {
        self.ctx.check_context_id(what, id)
    }

    /// `Ok` when `other` runs on this stream's driver (any device of it):
    /// for what may cross devices (event waits, peer copies).
    pub(crate) fn check_driver(&self, what: &'static str, other: &Context) -> Result<()> {
        if other.kind() == self.ctx.kind() {
            Ok(())
        } else {
            Err(Error::ContextMismatch {
                what,
                expected: self.ctx.id(),
                found: other.id(),
            })
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Timing events go first: they only need the context.
        let timings = std::mem::take(&mut *self.lock_timings());
        drop(timings);
        if !self.owned {
            return;
        }
        // Work already enqueued still runs to completion, as CUDA specifies.
        let what = format_args!("stream {}", self.id);
        self.ctx.release_in_drop(what, "destroying", |driver| {
            // SAFETY: the stream is owned by `self` and destroyed once.
            unsafe { (driver.cuStreamDestroy)(self.raw) }
        });
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id)
            .field("raw", &self.raw)
            .field("owned", &self.owned)
            .finish()
    }
}
