//! The common GPU timeline: one base event, and signed distances between
//! timing events.
//!
//! `cuEventElapsedTime` answers in `f32` milliseconds, whose resolution
//! degrades with the distance (about 0.25 ms after an hour). Measuring every
//! event from the base would blur long sessions, so a mark is measured from the
//! nearest mark already resolved (its stream's latest, or the latest of any
//! stream for a stream's first mark) and only the very first from the base.

use crate::error::Result;
use driver::{Context, Event, Stream};
use events::PooledEvent;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

impl Mark {
    pub(crate) fn new(seq: u64, event: PooledEvent) -> Self {
        Self {
            seq,
            event,
            ns: AtomicU64::new(UNRESOLVED),
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

/// The base event every time is measured from, on a stream of its own.
pub(crate) struct Clock {
    base: Event,
    /// Keeps the base's stream alive for as long as the base may be used.
    _stream: Arc<Stream>,
    /// The latest mark resolved on any stream: a close reference for a
    /// stream's first mark.
    recent: Mutex<Option<Arc<Mark>>>,
}

impl Clock {
    /// Record the base on a fresh (idle) stream and wait for it, so that every
    /// event recorded afterwards on any stream completes after it.
    pub(crate) fn start(ctx: &Arc<Context>) -> Result<Self> {
        let stream = Stream::new(ctx)?;
        let base = Event::timing(ctx)?;
        base.record(&stream)?;
        base.synchronize()?;
        Ok(Self {
            base,
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
        Ok(ns)
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
