//! Events: points in a stream that the host or other streams can wait for.

use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use sys::{CUevent, CUevent_flags};

/// How an event is created.
///
/// ```
/// use cuda_streams_driver::EventFlags;
/// assert!(!EventFlags::PLAIN.timing);
/// assert!(EventFlags::TIMING.timing);
/// assert!(EventFlags::PLAIN.with_blocking_sync(true).blocking_sync);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EventFlags {
    /// Whether the event records a timestamp (needed by [`Event::elapsed`]).
    /// Plain events are cheaper to record and wait on.
    pub timing: bool,
    /// Whether `synchronize` sleeps instead of spinning.
    pub blocking_sync: bool,
}

impl EventFlags {
    /// No timing, spinning synchronize: the cheapest event, for ordering.
    pub const PLAIN: Self = Self {
        timing: false,
        blocking_sync: false,
    };
    /// With timing, for measuring GPU time.
    pub const TIMING: Self = Self {
        timing: true,
        blocking_sync: false,
    };

    /// The same flags with `blocking_sync` set to `on`.
    pub const fn with_blocking_sync(self, on: bool) -> Self {
        Self {
            blocking_sync: on,
            ..self
        }
    }

    fn raw(self) -> u32 {
        let mut flags = CUevent_flags::CU_EVENT_DEFAULT.0;
        if !self.timing {
            flags |= CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        }
        if self.blocking_sync {
            flags |= CUevent_flags::CU_EVENT_BLOCKING_SYNC.0;
        }
        flags
    }
}

/// A CUDA event. Record it on a stream, then query it, wait for it on the host
/// ([`Event::synchronize`]) or on another stream
/// ([`Stream::wait_event`](crate::Stream::wait_event)). Re-recording moves
/// it to the stream's current end, so events can be pooled.
///
/// ```
/// use cuda_streams_driver::{Context, Event, EventFlags, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let start = Event::new(&ctx, EventFlags::TIMING).unwrap();
/// let end = Event::new(&ctx, EventFlags::TIMING).unwrap();
/// start.record(&stream).unwrap();
/// stream.add_callback(|| std::thread::sleep(std::time::Duration::from_millis(2))).unwrap();
/// end.record(&stream).unwrap();
/// end.synchronize().unwrap();
/// assert!(end.query().unwrap());
/// let elapsed = Event::elapsed(&start, &end).unwrap();
/// assert!(elapsed > std::time::Duration::ZERO);
/// ```
pub struct Event {
    pub(crate) ctx: Arc<Context>,
    pub(crate) raw: CUevent,
    flags: EventFlags,
    pub(crate) recorded: AtomicBool,
    /// Bumped after every record's driver call (and before one by
    /// [`Event::record_alone`]): a stream's latest mark is reused only while
    /// this is unchanged since its record (`latest_mark.rs`).
    pub(crate) records: std::sync::atomic::AtomicU64,
    /// The (even) count of `records` at the start of the latest host wait or
    /// query that found the event complete: while `records` still reads
    /// the same, no record was made since and the event is complete
    /// ([`Event::is_known_complete`]).
    seen_complete: std::sync::atomic::AtomicU64,
    /// The capture the latest record was made in (0: none): such an event
    /// is an edge of a graph, not a point in a stream.
    pub(crate) captured_in: std::sync::atomic::AtomicU64,
    /// Its latest record's clock, for the stream-order tracker.
    pub(crate) order: crate::enqueue::order::EventOrder,
}

// SAFETY: CUDA event handles may be used from any thread; the only other state
// is an atomic.
unsafe impl Send for Event {}
// SAFETY: as above; every method takes `&self` and the driver's event calls are
// thread-safe.
unsafe impl Sync for Event {}

impl Event {
    /// Create an event with the given flags.
    pub fn new(ctx: &Arc<Context>, flags: EventFlags) -> Result<Self> {
        ctx.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle through a valid pointer; the context is current.
        ctx.check(unsafe { (ctx.driver().cuEventCreate)(&mut raw, flags.raw()) })?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            raw,
            flags,
            recorded: AtomicBool::new(false),
            records: std::sync::atomic::AtomicU64::new(0),
            seen_complete: std::sync::atomic::AtomicU64::new(0),
            captured_in: std::sync::atomic::AtomicU64::new(0),
            order: crate::enqueue::order::EventOrder::default(),
        })
    }

    /// A plain event (no timing).
    pub fn plain(ctx: &Arc<Context>) -> Result<Self> {
        Self::new(ctx, EventFlags::PLAIN)
    }

    /// A timing event.
    pub fn timing(ctx: &Arc<Context>) -> Result<Self> {
        Self::new(ctx, EventFlags::TIMING)
    }

    /// A record of this event begins elsewhere: its first bump, as
    /// [`Event::record_counted`] makes before its driver call.
    #[cfg(test)]
    pub(crate) fn begin_record_elsewhere(&self) {
        self.records.fetch_add(1, Ordering::SeqCst);
    }

    /// How many records of this event have been made (see
    /// [`Event::record_alone`]).
    pub(crate) fn record_count(&self) -> u64 {
        self.records.load(Ordering::SeqCst)
    }

    /// The capture the latest record was made in, 0 when none.
    pub(crate) fn captured_in(&self) -> u64 {
        self.captured_in.load(Ordering::Acquire)
    }

    /// `Err` naming `operation` when the latest record was made during a
    /// capture: CUDA forbids waiting for such an event on the host.
    pub(crate) fn refuse_if_captured(&self, operation: &'static str) -> Result<()> {
        match self.captured_in() {
            0 => Ok(()),
            capture => Err(crate::ground::error::Error::CapturedEvent { operation, capture }),
        }
    }

    /// Whether the event has completed (`true` also for a never-recorded event,
    /// as in CUDA). Answered without a driver call when the host has seen
    /// the latest record complete already ([`is_known_complete`](Self::is_known_complete)).
    pub fn query(&self) -> Result<bool> {
        self.refuse_if_captured("Event::query")?;
        let point = crate::enqueue::order::event_point(self);
        if self.is_known_complete() {
            // What the wait or query that saw it taught, taught again (this
            // thread's host may not have learnt it).
            crate::enqueue::order::completed(point);
            return Ok(true);
        }
        self.ctx.bind()?;
        let count = self.record_count();
        // SAFETY: the handle is live; the context is current.
        let code = unsafe { (self.ctx.driver().cuEventQuery)(self.raw) };
        let done = self.ctx.check_ready(code)?;
        if done {
            crate::enqueue::order::completed(point);
            self.saw_complete(count);
        }
        Ok(done)
    }

    /// Block the calling thread until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_if_captured("Event::synchronize")?;
        self.ctx.bind()?;
        let point = crate::enqueue::order::event_point(self);
        let count = self.record_count();
        // SAFETY: the handle is live; the context is current.
        let code = unsafe { (self.ctx.driver().cuEventSynchronize)(self.raw) };
        self.ctx.check(code)?;
        crate::enqueue::order::completed(point);
        self.saw_complete(count);
        Ok(())
    }

    /// Whether the host has already seen this event's latest record
    /// complete (a [`synchronize`](Self::synchronize), or a
    /// [`query`](Self::query) that returned `true`, since it was made),
    /// answered without a driver call. `false` says only that it is not
    /// known: ask [`query`](Self::query) then. A never-recorded event is
    /// complete, as in CUDA.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Event, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let event = Event::plain(&ctx)?;
    /// event.record(&stream)?;
    /// event.synchronize()?;
    /// assert!(event.is_known_complete());
    /// event.record(&stream)?; // a new record: not known until asked
    /// assert!(!event.is_known_complete());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_known_complete(&self) -> bool {
        let count = self.record_count();
        count.is_multiple_of(2) && self.seen_complete.load(Ordering::Acquire) == count
    }

    /// The driver found the event complete in a call that began when its
    /// record count read `count`. An even count: no record was in its
    /// driver call then, so the record the call found complete is at least
    /// the one `count` stands for. An odd one proves nothing.
    fn saw_complete(&self, count: u64) {
        if count.is_multiple_of(2) {
            self.seen_complete.store(count, Ordering::Release);
        }
    }

    /// Count a record of this event made by a raw driver call (interop's,
    /// on a stream handle this crate does not wrap) as [`Event::record_counted`]
    /// counts its own: the count then says how many records were made, so
    /// neither a host wait seen before ([`Event::is_known_complete`]) nor a
    /// mark kept of an earlier record (`latest_mark.rs`) stands for it. For
    /// an event nothing else holds (one just taken from a pool): no record
    /// overlaps, and one step of two keeps the count even.
    #[cfg(any(feature = "cudarc", feature = "cust"))]
    pub(crate) fn count_raw_record(&self) {
        self.records.fetch_add(2, Ordering::SeqCst);
    }

    /// GPU time between two completed timing events.
    ///
    /// Errors when either was created without timing or never recorded, and
    /// with `CUDA_ERROR_NOT_READY` when either has not completed yet.
    pub fn elapsed(start: &Event, end: &Event) -> Result<Duration> {
        for (which, event) in [("start", start), ("end", end)] {
            if !event.flags.timing {
                return Err(Error::NotTimingEvent { which });
            }
            if !event.recorded.load(Ordering::Relaxed) {
                return Err(Error::EventNotRecorded { which });
            }
            event.refuse_if_captured("Event::elapsed")?;
        }
        start.ctx.bind()?;
        let mut ms = 0f32;
        // SAFETY: writes one float through a valid pointer; both handles are live.
        start.ctx.check(unsafe {
            (start.ctx.driver().cuEventElapsedTime)(&mut ms, start.raw, end.raw)
        })?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0))
    }

    /// Whether this event records timestamps.
    pub fn is_timing(&self) -> bool {
        self.flags.timing
    }

    /// The flags it was created with.
    pub fn flags(&self) -> EventFlags {
        self.flags
    }

    /// Whether [`Event::record`] has been called at least once.
    pub fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Relaxed)
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw handle (for interop). It stays owned by this `Event`.
    pub fn as_raw(&self) -> CUevent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // CUDA releases a pending event's resources once it completes, so this
        // does not wait.
        let what = format_args!("event {:p}", self.raw);
        self.ctx.release_in_drop(what, "destroying", |driver| {
            // SAFETY: the handle is live and destroyed once.
            unsafe { (driver.cuEventDestroy)(self.raw) }
        });
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.raw)
            .field("flags", &self.flags)
            .field("recorded", &self.is_recorded())
            .finish()
    }
}
