//! The common GPU timeline: one base event, and signed distances between
//! timing events.
//!
//! `cuEventElapsedTime` answers in `f32` milliseconds, whose resolution
//! degrades with the distance (about 0.25 ms after an hour). Measuring every
//! event from the base would blur long sessions, so a mark is measured from the
//! nearest mark already resolved (its stream's latest, or the latest of any
//! stream for a stream's first mark) and only the very first from the base.

use crate::error::Result;
use driver::{Context, Event, PooledEvent, Stream};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `Mark::ns` before the mark is resolved.
const UNRESOLVED: u64 = u64::MAX;

/// A timing event recorded on a stream by the profiler: one point of the
/// stream, possibly shared by the end of one operation and the start of the
/// next. Its event goes back to the pool when the last holder drops it.
pub(crate) struct Mark {
    /// Order of recording on its stream (which is the stream's order).
    pub(crate) seq: u64,
    pub(crate) event: PooledEvent,
    /// Nanoseconds after the base event, once resolved.
    ns: AtomicU64,
    /// The host's clock just before the event was recorded: the GPU cannot
    /// have reached it earlier, which calibrates host times onto the GPU
    /// timeline ([`GpuTimebase::host_to_gpu`]).
    pub(crate) host: Instant,
}

impl Mark {
    pub(crate) fn new(seq: u64, event: PooledEvent, host: Instant) -> Self {
        Self {
            seq,
            event,
            ns: AtomicU64::new(UNRESOLVED),
            host,
        }
    }

    pub(crate) fn ns(&self) -> Option<u64> {
        let ns = self.ns.load(Ordering::Acquire);
        (ns != UNRESOLVED).then_some(ns)
    }

    fn set_ns(&self, ns: u64) {
        self.ns.store(ns.min(UNRESOLVED - 1), Ordering::Release);
    }
}

/// The base event every time is measured from, on a stream of its own, and
/// the mapping of host instants onto the GPU timeline.
///
/// The mapping: an event recorded at host time `h` completes at GPU time
/// `g >= h + offset`, where `offset` is the (unknown) distance between the
/// two clocks, so every resolved mark gives an upper bound `g - h` on it, and
/// a mark recorded on an idle stream a tight one (within the time the GPU
/// takes to see a new command). The estimate is the least bound seen so far.
/// It maps the host time at which a scope's first work was enqueued onto
/// the GPU timeline: the work cannot have started before that, so a scope
/// whose start boundary is shared with an earlier one (the GPU may have
/// passed it and sat idle since) starts no earlier than there.
pub(crate) struct GpuTimebase {
    base: Event,
    /// The host's clock just before the base was recorded.
    host_base: Instant,
    /// The least `g - h` seen (ns), starting with the base's own (0).
    offset: AtomicI64,
    /// Keeps the base's stream alive for as long as the base may be used.
    _stream: Arc<Stream>,
    /// The latest mark resolved on any stream: a close reference for a
    /// stream's first mark.
    recent: Mutex<Option<Arc<Mark>>>,
}

impl GpuTimebase {
    /// Record the base on a fresh (idle) stream and wait for it, so that every
    /// event recorded afterwards on any stream completes after it.
    pub(crate) fn start(ctx: &Arc<Context>) -> Result<Self> {
        let stream = Stream::new(ctx)?;
        let base = Event::timing(ctx)?;
        let host_base = Instant::now();
        base.record(&stream)?;
        base.synchronize()?;
        Ok(Self {
            base,
            host_base,
            offset: AtomicI64::new(0),
            _stream: stream,
            recent: Mutex::new(None),
        })
    }

    /// Resolve `mark` (which has completed) relative to `anchor`, a resolved
    /// mark of the same stream, or to the nearest reference there is.
    pub(crate) fn resolve(&self, mark: &Arc<Mark>, anchor: Option<&Arc<Mark>>) -> Result<u64> {
        if let Some(ns) = mark.ns() {
            return Ok(ns);
        }
        let recent = match anchor {
            Some(_) => None,
            None => self
                .recent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        };
        let reference = anchor
            .or(recent.as_ref())
            .and_then(|r| Some((&*r.event as &Event, r.ns()?)));
        let (from, from_ns) = reference.unwrap_or((&self.base, 0));
        let delta = signed_elapsed_ns(from, &mark.event)?;
        let ns = u64::try_from(i128::from(from_ns) + delta).unwrap_or(0);
        mark.set_ns(ns);
        let bound = i128::from(ns) - self.host_ns(mark.host);
        self.offset
            .fetch_min(i64::try_from(bound).unwrap_or(i64::MAX), Ordering::Relaxed);
        Ok(ns)
    }

    /// Nanoseconds from the host base to `at`.
    fn host_ns(&self, at: Instant) -> i128 {
        match at.checked_duration_since(self.host_base) {
            Some(after) => after.as_nanos() as i128,
            None => -(self.host_base.duration_since(at).as_nanos() as i128),
        }
    }

    /// The earliest GPU time (ns after the base) that something enqueued at
    /// host time `at` can have started, by the calibration so far.
    pub(crate) fn host_to_gpu(&self, at: Instant) -> u64 {
        let ns = self.host_ns(at) + i128::from(self.offset.load(Ordering::Relaxed));
        u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
    }

    /// Remember `mark` (resolved) as the latest reference for new streams.
    pub(crate) fn set_recent(&self, mark: &Arc<Mark>) {
        *self.recent.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(mark));
    }
}

/// `to - from` in nanoseconds, negative when `to` completed first.
/// `Event::elapsed` clamps negative times to zero, so a zero is asked again
/// the other way round.
fn signed_elapsed_ns(from: &Event, to: &Event) -> Result<i128> {
    let forward = Event::elapsed(from, to)?;
    if forward > Duration::ZERO {
        return Ok(forward.as_nanos() as i128);
    }
    Ok(-(Event::elapsed(to, from)?.as_nanos() as i128))
}
