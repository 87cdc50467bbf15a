//! `StreamProfiler`: the entry point.

use crate::clock::GpuTimebase;
use crate::cupti::CuptiBackend;
use crate::error::{Error, Result};
use crate::memory::{MemoryLog, MemorySample};
use crate::report::{ComprehensiveReport, StreamReport};
use crate::sampler_state::SamplerState;
use crate::scope::{ScopeGuard, ScopeStart};
use crate::shared::Shared;
use crate::timed_op::Name;
use crate::timeline::StreamSlot;
use crate::trace::{self, Process, StreamTrack};
use dashmap::DashMap;
use driver::EventPool;
use driver::{Context, Stream};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Timing events the pool of [`StreamProfiler::new`] creates up front.
const INITIAL_TIMING_EVENTS: usize = 64;

/// The environment variable [`StreamProfiler::new`] reads to pick a
/// [`Backend`]: `events` (the default) or `cupti`.
pub const BACKEND_ENV: &str = "CUDA_STREAMS_PROFILER_BACKEND";

/// [`BACKEND_ENV`] as a setting of the workspace's one environment parser
/// (`cuda_streams_sys::env`), which `cuda-streams info` lists.
pub const BACKEND_SETTING: driver::sys::env::Setting = driver::sys::env::Setting {
    name: BACKEND_ENV,
    aliases: &[],
    default: "events",
    about: "the profiler's backend: events or cupti",
};

/// Where a profiler's GPU times come from.
///
/// ```
/// use cuda_streams_profiler::{Backend, StreamProfiler};
/// use cuda_streams_profiler::driver::Context;
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let profiler = StreamProfiler::with_backend(&ctx, Backend::Cupti)?;
/// if profiler.backend() == Backend::Cupti {
///     assert!(profiler.backend_fallback().is_none());
/// } else {
///     // No CUPTI here (the software driver, or no libcupti): events, and why.
///     assert_eq!(profiler.backend(), Backend::Events);
///     println!("{}", profiler.backend_fallback().unwrap());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Timing events recorded on the streams at scope boundaries (works on
    /// every driver; one event per boundary).
    Events,
    /// CUPTI's activity records: the GPU start and end of every kernel, copy
    /// and memset, with nothing recorded on the streams. Needs a GPU and
    /// `libcupti.so.13`, opened at run time.
    Cupti,
}

impl Backend {
    /// The backend `CUDA_STREAMS_PROFILER_BACKEND` names (`events` when unset).
    /// A value that is not UTF-8 is an error naming the variable, like any
    /// other bad value.
    pub fn from_env() -> Result<Self> {
        match BACKEND_SETTING.from_env() {
            Ok(None) => Ok(Self::Events),
            Ok(Some(found)) => Self::parse(&found.value),
            Err(err) => Err(Error::InvalidBackend { value: err.value }),
        }
    }

    /// A backend by name: `events` (or empty) or `cupti`, any case;
    /// anything else is [`Error::InvalidBackend`] naming it.
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "events" | "event" => Ok(Self::Events),
            "cupti" => Ok(Self::Cupti),
            _ => Err(Error::InvalidBackend {
                value: value.to_string(),
            }),
        }
    }
}

/// Profiles work on streams with GPU timestamps.
///
/// Created disabled; [`enable`](Self::enable) starts recording. While
/// disabled every method returns at once after one atomic load, records
/// nothing, and scopes are inert.
///
/// - [`scope`](Self::scope) / [`time`](Self::time): GPU-timed regions. A
///   scope covers its own work only: it starts right before its first work
///   item, after the waits that order that work on other streams (so waiting
///   is not counted), and after anything enqueued before it. Each boundary
///   is a timing event from the [`EventPool`] recorded on the stream, shared
///   by consecutive scopes (the end of one is the start of the next when
///   nothing was enqueued between them): one event per scope, recorded when
///   it ends. When the GPU may have passed a shared boundary and sat idle
///   before the next work arrived, the scope starts no earlier than the host
///   enqueued that work (mapped onto the GPU timeline), so idle time is not
///   counted either.
/// - [`record_operation`](Self::record_operation): a duration measured
///   elsewhere (statistics only; it has no place on the timeline).
/// - Kernel launches and transfers made through the driver layer are counted
///   from the stream's metrics; [`record_kernel_launch`](Self::record_kernel_launch)
///   and [`record_memory_transfer`](Self::record_memory_transfer) add work
///   done outside it.
///
/// Timings are collected without stalling streams: finished operations are
/// resolved (their events queried, converted to times, and given back to the
/// pool) in batches as scopes close, and the rest when a report or trace is
/// asked for, which waits on the host for the GPU to get there. All times are
/// on one timeline that starts at a base event recorded when the first scope
/// opens.
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// profiler.enable();
///
/// let mut buf = DeviceBuffer::<u32>::new_async(&stream, 1 << 16)?;
/// {
///     let _scope = profiler.scope(&stream, "clear")?;
///     stream.memset_u32_async(&mut buf, 0)?;
/// } // the end is recorded here
/// profiler.time(&stream, "fill", |s| s.memset_u32_async(&mut buf, 7))??;
///
/// let report = profiler.get_stream_report(&stream).unwrap();
/// assert_eq!(report.operation_count, 2);
/// assert_eq!(report.operations["fill"].count, 1);
/// println!("{report}");
/// # Ok(())
/// # }
/// ```
pub struct StreamProfiler {
    enabled: AtomicBool,
    /// Why the backend asked for is not the one in use.
    fallback: Option<String>,
    shared: Arc<Shared>,
    slots: DashMap<u64, Arc<StreamSlot>>,
    samplers: Mutex<Vec<Arc<SamplerState>>>,
    memory: Arc<MemoryLog>,
}

impl StreamProfiler {
    /// A disabled profiler with its own event pool on `ctx`, timing with
    /// the backend `CUDA_STREAMS_PROFILER_BACKEND` names (events when unset;
    /// see [`with_backend`](Self::with_backend)). An unknown value is
    /// [`Error::InvalidBackend`].
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        Self::with_backend(ctx, Backend::from_env()?)
    }

    /// A disabled profiler with its own event pool on `ctx`, timing with
    /// `backend` where it can. [`Backend::Cupti`] needs a GPU and CUPTI;
    /// without them the profiler times with events and says why, once, as a
    /// `tracing` warning and in [`backend_fallback`](Self::backend_fallback).
    pub fn with_backend(ctx: &Arc<Context>, backend: Backend) -> Result<Self> {
        let (cupti, fallback) = match backend {
            Backend::Events => (None, None),
            Backend::Cupti => match CuptiBackend::start(ctx) {
                Ok(cupti) => (Some(cupti), None),
                Err(why) => {
                    tracing::warn!(
                        "profiler: CUPTI backend unavailable, timing with events: {why}"
                    );
                    (None, Some(why))
                }
            },
        };
        // The CUPTI backend records no events: its pool starts empty.
        let timing = if cupti.is_some() {
            0
        } else {
            INITIAL_TIMING_EVENTS
        };
        let pool = Arc::new(EventPool::new(ctx, 0, timing)?);
        Ok(Self::build(pool, cupti, fallback))
    }

    /// A disabled profiler taking its timing events from `pool` (the event
    /// backend).
    pub fn with_pool(pool: Arc<EventPool>) -> Self {
        Self::build(pool, None, None)
    }

    fn build(pool: Arc<EventPool>, cupti: Option<CuptiBackend>, fallback: Option<String>) -> Self {
        Self {
            enabled: AtomicBool::new(false),
            fallback,
            shared: Arc::new(Shared::new(pool, cupti)),
            slots: DashMap::new(),
            samplers: Mutex::new(Vec::new()),
            memory: Arc::default(),
        }
    }

    /// Start recording. Work counts of streams already seen restart from
    /// their counters now (work done while disabled is not counted).
    pub fn enable(&self) {
        self.memory.enabled.store(true, Ordering::Relaxed);
        if !self.enabled.swap(true, Ordering::AcqRel) {
            for slot in self.all_slots() {
                let mut state = slot.lock();
                let now = slot.current_metrics();
                state.start_counting(now);
            }
        }
    }

    /// Stop recording. Scopes already open still record their end; what was
    /// recorded stays available to reports.
    pub fn disable(&self) {
        self.memory.enabled.store(false, Ordering::Relaxed);
        if self.enabled.swap(false, Ordering::AcqRel) {
            for slot in self.all_slots() {
                let mut state = slot.lock();
                let now = slot.current_metrics();
                state.stop_counting(&now);
            }
        }
    }

    /// Whether recording is on.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        if self.shared.cupti.is_some() {
            Backend::Cupti
        } else {
            Backend::Events
        }
    }

    /// Why the backend asked for is not in use (CUPTI asked for, events in
    /// use), or `None` when it is.
    pub fn backend_fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// CUPTI backend: work records no scope could claim, because the call
    /// that enqueued them is one the backend does not follow (e.g. a
    /// library's own launch entry point) or CUPTI lost its record. Always 0
    /// with events.
    pub fn unattributed_records(&self) -> u64 {
        self.shared
            .cupti
            .as_ref()
            .map_or(0, CuptiBackend::unattributed)
    }

    /// The pool the timing events come from.
    pub fn pool(&self) -> &Arc<EventPool> {
        &self.shared.pool
    }

    /// Time the work enqueued on `stream` until the returned guard is dropped.
    /// Scopes nest.
    ///
    /// ```
    /// # use cuda_streams_profiler::StreamProfiler;
    /// # use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> cuda_streams_profiler::Result<()> {
    /// # let ctx = Context::new(0)?;
    /// # let stream = Stream::new(&ctx)?;
    /// # let mut buf = DeviceBuffer::<u32>::new_async(&stream, 1024)?;
    /// let profiler = StreamProfiler::new(&ctx)?;
    /// profiler.enable();
    /// {
    ///     let _step = profiler.scope(&stream, "step")?;
    ///     for i in 0..3 {
    ///         let _inner = profiler.scope(&stream, "memset")?;
    ///         stream.memset_u32_async(&mut buf, i)?;
    ///     }
    /// }
    /// let report = profiler.get_stream_report(&stream).unwrap();
    /// assert_eq!(report.operations["memset"].count, 3);
    /// assert!(report.operations["step"].total >= report.operations["memset"].total);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scope<'a>(
        &'a self,
        stream: &'a Stream,
        name: impl Into<Name>,
    ) -> Result<ScopeGuard<'a>> {
        if !self.is_enabled() {
            return Ok(ScopeGuard::inert());
        }
        let ctx = self.shared.pool.context();
        if stream.context().id() != ctx.id() {
            return Err(Error::ContextMismatch {
                stream: stream.id(),
                expected: ctx.id(),
                found: stream.context().id(),
            });
        }
        if let Some(cupti) = &self.shared.cupti {
            let slot = self.slot(stream);
            let opened = cupti.now();
            let depth = slot.open_cupti(opened);
            return Ok(ScopeGuard::open(
                &self.shared,
                stream,
                slot,
                name.into(),
                ScopeStart::Cupti(opened),
                depth,
            ));
        }
        self.clock()?;
        let slot = self.slot(stream);
        let (start, depth) = slot.open(stream);
        let start = ScopeStart::Events(start);
        Ok(ScopeGuard::open(
            &self.shared,
            stream,
            slot,
            name.into(),
            start,
            depth,
        ))
    }

    /// Time the work `f` enqueues on `stream`. The outer `Result` is the
    /// profiler's, the value inside is `f`'s, so `?` twice unwraps both.
    pub fn time<R>(
        &self,
        stream: &Stream,
        name: impl Into<Name>,
        f: impl FnOnce(&Stream) -> R,
    ) -> Result<R> {
        let scope = self.scope(stream, name)?;
        let value = f(stream);
        scope.finish()?;
        Ok(value)
    }

    /// Keep `sampler`'s counts, so reports say how many of its scopes were
    /// not timed. Called by [`sampler`](Self::sampler), which is defined in
    /// `sampler.rs` beside the `Sampler` it makes.
    pub(crate) fn add_sampler(&self, sampler: Arc<SamplerState>) {
        self.samplers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(sampler);
    }

    /// Put `allocator`'s memory on the timeline: while profiling is enabled,
    /// every allocation and free, and the live and reserved bytes after it
    /// per device and per stream, go into the trace as counter tracks and
    /// instant events beside the stream tracks (see `docs/profiler.md`).
    /// Starts the timeline's clock if no scope has yet. The allocator keeps
    /// a small forwarding observer, inert once the profiler is dropped.
    ///
    /// ```
    /// use cuda_streams_profiler::StreamProfiler;
    /// use cuda_streams_profiler::allocator::StreamOrderedAllocator;
    /// use cuda_streams_profiler::driver::{Context, Stream};
    /// # fn main() -> cuda_streams_profiler::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let allocator = StreamOrderedAllocator::new(&ctx)?;
    /// let profiler = StreamProfiler::new(&ctx)?;
    /// profiler.track_memory(&allocator)?;
    /// profiler.enable();
    /// let block = allocator.allocate_for_stream(&stream, 1 << 20)?;
    /// drop(block);
    /// let trace = profiler.to_chrome_trace()?;
    /// assert!(trace.contains(r#""name":"GPU 0 memory","cat":"memory","ph":"C""#));
    /// # Ok(())
    /// # }
    /// ```
    pub fn track_memory(&self, allocator: &allocator::StreamOrderedAllocator) -> Result<()> {
        if self.shared.cupti.is_none() {
            self.clock()?;
        }
        allocator.add_observer(self.memory.observer());
        self.memory.tracking.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Record a duration measured elsewhere (e.g. with host timers or by
    /// another tool). It counts in the statistics but has no place on the
    /// timeline, so it is not in the trace or the overlap figures.
    pub fn record_operation(&self, stream: &Stream, name: impl Into<Name>, duration: Duration) {
        if self.is_enabled() {
            self.slot(stream)
                .lock()
                .external
                .push((name.into(), duration));
        }
    }

    /// Count a kernel launch made outside the driver layer's API (launches
    /// through [`driver::Stream::launch`] are counted already).
    pub fn record_kernel_launch(&self, stream: &Stream) {
        if self.is_enabled() {
            self.slot(stream).lock().manual.kernel_launches += 1;
        }
    }

    /// Count a memory transfer of `bytes` made outside the driver layer's API
    /// (copies through [`driver::Stream`] are counted already).
    pub fn record_memory_transfer(&self, stream: &Stream, bytes: usize) {
        if self.is_enabled() {
            let slot = self.slot(stream);
            let mut state = slot.lock();
            state.manual.memory_transfers += 1;
            state.manual.bytes_transferred += bytes as u64;
        }
    }

    /// The report of one stream, `None` if it was never profiled. Waits on
    /// the host for the GPU to finish the stream's timed operations. A
    /// failure to resolve is logged and leaves them counted in
    /// [`StreamReport::unresolved`]; [`try_stream_report`](Self::try_stream_report)
    /// returns it instead.
    pub fn get_stream_report(&self, stream: &Stream) -> Option<StreamReport> {
        let slot = self.slots.get(&stream.id())?.clone();
        Some(self.report_slot(&slot, true).0)
    }

    /// [`get_stream_report`](Self::get_stream_report), failing when timings
    /// cannot be resolved.
    pub fn try_stream_report(&self, stream: &Stream) -> Result<Option<StreamReport>> {
        let Some(slot) = self.slots.get(&stream.id()).map(|s| s.clone()) else {
            return Ok(None);
        };
        self.resolve_slot(&slot)?;
        Ok(Some(self.report_slot(&slot, false).0))
    }

    /// Every profiled stream, with overlap and concurrency over the GPU
    /// timeline. Waits on the host for all timed operations to finish.
    pub fn get_comprehensive_report(&self) -> ComprehensiveReport {
        let parts = self
            .all_slots()
            .iter()
            .map(|slot| self.report_slot(slot, true))
            .collect();
        ComprehensiveReport::build(
            parts,
            self.error_count(),
            self.timed_by_gpu(),
            self.memory.report(),
        )
    }

    /// Write the timeline as Chrome Trace Event Format JSON (open it in
    /// <https://ui.perfetto.dev> or `chrome://tracing`): one track per stream,
    /// one complete event per timed operation, microseconds after the base
    /// event. Waits on the host for all timed operations to finish.
    pub fn export_chrome_trace(&self, writer: &mut dyn io::Write) -> Result<()> {
        let mut tracks = Vec::new();
        for slot in self.all_slots() {
            self.resolve_slot(&slot)?;
            tracks.push(StreamTrack {
                stream_id: slot.id,
                ops: slot.lock().timed.clone(),
            });
        }
        let ctx = self.shared.pool.context();
        let info = ctx.info();
        let process = Process {
            pid: i64::from(ctx.ordinal()),
            name: format!(
                "GPU {}: {} ({} driver{})",
                ctx.ordinal(),
                info.name,
                ctx.loaded_driver().name(),
                if self.shared.cupti.is_some() {
                    ", times from CUPTI"
                } else {
                    ""
                }
            ),
        };
        let memory: Vec<MemorySample> = match (&self.shared.cupti, self.shared_clock()) {
            (Some(cupti), _) => self
                .memory
                .events()
                .into_iter()
                .map(|(at, event)| MemorySample {
                    ns: cupti.host_ns(at),
                    event,
                })
                .collect(),
            (None, Some(clock)) => self
                .memory
                .events()
                .into_iter()
                .map(|(at, event)| MemorySample {
                    ns: clock.host_to_gpu(at),
                    event,
                })
                .collect(),
            (None, None) => Vec::new(),
        };
        trace::write_trace(writer, &process, tracks, memory).map_err(|source| Error::Io { source })
    }

    /// [`export_chrome_trace`](Self::export_chrome_trace) into a `String`.
    pub fn to_chrome_trace(&self) -> Result<String> {
        let mut out = Vec::new();
        self.export_chrome_trace(&mut out)?;
        Ok(String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Failures met where they could not be returned (a scope guard's drop).
    /// The first is also logged (a `tracing` warning).
    pub fn error_count(&self) -> u64 {
        self.shared.error_count()
    }

    /// Count a failure that cannot be returned (see
    /// [`error_count`](Self::error_count)).
    pub(crate) fn note_error(&self, err: &Error) {
        self.shared.note_error(err);
    }

    /// The base of the timeline, recorded when first needed.
    pub(crate) fn clock(&self) -> Result<&GpuTimebase> {
        self.shared.clock()
    }

    /// The clock if it was started.
    fn shared_clock(&self) -> Option<&GpuTimebase> {
        self.shared.started_clock()
    }

    fn slot(&self, stream: &Stream) -> Arc<StreamSlot> {
        if let Some(slot) = self.slots.get(&stream.id()) {
            return Arc::clone(&slot);
        }
        let counting = self.is_enabled();
        Arc::clone(
            &self
                .slots
                .entry(stream.id())
                .or_insert_with(|| Arc::new(StreamSlot::new(stream, &self.shared, counting))),
        )
    }

    /// A copy of the slot list, so no map lock is held while waiting on the GPU.
    fn all_slots(&self) -> Vec<Arc<StreamSlot>> {
        self.slots.iter().map(|e| Arc::clone(e.value())).collect()
    }

    fn resolve_slot(&self, slot: &StreamSlot) -> Result<()> {
        if slot.lock().pending_len() == 0 {
            return Ok(());
        }
        if let Some(cupti) = &self.shared.cupti {
            // Scopes opened from `cutoff` on keep the records enqueued since.
            let (closed, cutoff) = {
                let mut state = slot.lock();
                let cutoff = state
                    .cupti_open
                    .iter()
                    .copied()
                    .min()
                    .unwrap_or_else(|| cupti.now());
                (std::mem::take(&mut state.cupti_closed), cutoff)
            };
            // Every record of the closed scopes completes before this returns.
            if let Some(stream) = slot.stream.upgrade() {
                stream.synchronize()?;
            }
            let mut timed = Vec::new();
            cupti.resolve(slot.cupti_key, closed, cutoff, &mut timed)?;
            slot.lock().timed.extend(timed);
            return Ok(());
        }
        let clock = self.clock()?;
        slot.lock().resolve(clock, true)
    }

    fn report_slot(&self, slot: &StreamSlot, resolve: bool) -> (StreamReport, Vec<(u64, u64)>) {
        if resolve && let Err(err) = self.resolve_slot(slot) {
            tracing::warn!("resolving stream {}'s timings: {err}", slot.id);
        }
        let state = slot.lock();
        let now = slot.current_metrics();
        let counts = state.counts(&now);
        let skipped: Vec<(String, u64)> = self
            .samplers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|s| (s.name.to_string(), s.skipped(slot.id)))
            .collect();
        StreamReport::build(slot.id, &state, counts, &skipped, self.timed_by_gpu())
    }

    /// Whether the times come from a GPU: the software driver's timing
    /// events read the host's clock.
    fn timed_by_gpu(&self) -> bool {
        self.shared.pool.context().is_gpu()
    }
}

impl std::fmt::Debug for StreamProfiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamProfiler")
            .field("enabled", &self.is_enabled())
            .field("streams", &self.slots.len())
            .field("errors", &self.error_count())
            .finish()
    }
}
