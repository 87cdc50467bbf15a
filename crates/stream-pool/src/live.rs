//! Live state from the driver: which streams are idle, how much work the busy
//! ones still hold, and waiting for one to become idle.

use crate::error::Result;
use crate::layout::Span;
use crate::pool::{Slot, StreamPool};
use driver::{Event, Stream, StreamPriority};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The first sleep between query rounds of `wait_for_any_ready`.
const FIRST_BACKOFF: Duration = Duration::from_micros(20);
/// The longest sleep between query rounds: the most a ready stream is noticed late.
const MAX_BACKOFF: Duration = Duration::from_millis(1);

/// What the pool has seen a stream pass.
///
/// `passed` is a count of the stream's operations (its
/// `StreamMetrics::operations_count`) known to be finished: set when a query
/// finds the stream idle, or when the probe event recorded after that many
/// operations completes. Operations enqueued minus `passed` is the live work.
#[derive(Default)]
pub(crate) struct Probe {
    passed: AtomicU64,
    marker: Mutex<Option<(Event, u64)>>,
}

impl Probe {
    /// Work still ahead on a busy stream that had `enqueued` operations:
    /// advances `passed` when the marker has completed and moves the marker
    /// to the stream's current end. At least 1 (the stream is busy).
    fn busy_load(&self, stream: &Stream, enqueued: u64) -> u64 {
        // A getter never waits on another: when the marker is being moved,
        // the last known `passed` is good enough.
        if let Ok(mut marker) = self.marker.try_lock() {
            let done = match &*marker {
                Some((event, ops)) => event.query().ok().map(|finished| (finished, *ops)),
                None => Some((true, self.passed.load(Relaxed))),
            };
            if let Some((true, ops)) = done {
                self.passed.fetch_max(ops, Relaxed);
                *marker = Self::remark(marker.take(), stream, enqueued);
            }
        }
        enqueued.saturating_sub(self.passed.load(Relaxed)).max(1)
    }

    fn remark(old: Option<(Event, u64)>, stream: &Stream, enqueued: u64) -> Option<(Event, u64)> {
        let event = match old {
            Some((event, _)) => event,
            None => Event::plain(stream.context()).ok()?,
        };
        event.record(stream).ok()?;
        Some((event, enqueued))
    }
}

impl StreamPool {
    /// Live work on slot `index`: `Some(0)` when idle, `None` when the driver
    /// could not be asked (the stream then counts as unavailable).
    fn live_load(&self, index: usize) -> Option<u64> {
        let Slot { stream, probe, .. } = &self.slots[index];
        // Read before the query: everything counted so far was enqueued before it.
        let enqueued = stream.metrics().operations_count;
        if stream.query().ok()? {
            probe.passed.fetch_max(enqueued, Relaxed);
            return Some(0);
        }
        Some(probe.busy_load(stream, enqueued))
    }

    /// `span`'s slots from a rotating start, so equal candidates take turns.
    fn rotated(&self, span: Span) -> impl Iterator<Item = usize> + use<> {
        let offset = self.scan_cursor.next();
        (0..span.len as usize).map(move |k| span.nth(offset + k))
    }

    /// The first idle stream of `span`, else the one with the least live work.
    pub(crate) fn least_loaded(&self, span: Span) -> Arc<Stream> {
        let mut best: Option<(u64, usize)> = None;
        for index in self.rotated(span) {
            match self.live_load(index) {
                Some(0) => return self.stream_at(index),
                Some(load) if best.is_none_or(|(least, _)| load < least) => {
                    best = Some((load, index));
                }
                _ => {}
            }
        }
        let index = best.map_or(span.start as usize, |(_, index)| index);
        self.stream_at(index)
    }

    /// An idle stream of the most urgent class that has one; all busy: the
    /// High class in turn.
    pub(crate) fn most_urgent_idle(&self) -> Arc<Stream> {
        for class in StreamPriority::ALL {
            let span = self.class_span(class);
            let idle = self
                .rotated(span)
                .find(|&index| self.slots[index].class == class && self.is_idle(index));
            if let Some(index) = idle {
                return self.stream_at(index);
            }
        }
        self.get_priority_stream_in_turn(StreamPriority::High)
    }

    fn is_idle(&self, index: usize) -> bool {
        self.live_load(index) == Some(0)
    }

    /// Whether any shared stream is idle (all its work has finished).
    pub fn has_ready_streams(&self) -> Result<bool> {
        for slot in self.slots.iter() {
            if slot.stream.query()? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The shared streams that are idle now.
    pub fn ready_streams(&self) -> Result<Vec<Arc<Stream>>> {
        let mut ready = Vec::new();
        for slot in self.slots.iter() {
            if slot.stream.query()? {
                ready.push(Arc::clone(&slot.stream));
            }
        }
        Ok(ready)
    }

    /// Wait until some shared stream is idle and return it, or `Ok(None)`
    /// when `timeout` passes first (`None`: wait as long as it takes).
    ///
    /// Between query rounds the thread sleeps, 20 µs at first and doubling
    /// up to 1 ms, so a long wait costs almost no CPU; a stream that becomes
    /// idle is noticed at most about 1 ms late.
    pub fn wait_for_any_ready(&self, timeout: Option<Duration>) -> Result<Option<Arc<Stream>>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut backoff = FIRST_BACKOFF;
        loop {
            for index in self.rotated(self.all()) {
                let slot = &self.slots[index];
                if slot.stream.query()? {
                    return Ok(Some(Arc::clone(&slot.stream)));
                }
            }
            let mut sleep = backoff;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                sleep = sleep.min(left);
            }
            std::thread::sleep(sleep);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
