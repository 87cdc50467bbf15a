//! Live state from the driver: which streams are idle, how much work the busy
//! ones still hold, and waiting for one to become idle.
//!
//! Looking never enqueues: the getters only query (`cuStreamQuery`). Waiting
//! goes through the context's reactor, never a sleep loop.

use crate::error::Result;
use crate::layout::Span;
use crate::pool::{Slot, StreamPool};
use driver::{Completion, Stream, StreamPriority};
use std::sync::Arc;
use std::time::Duration;

impl StreamPool {
    /// Live work on slot `index`: `Some(0)` when idle, `None` when the driver
    /// could not be asked (the stream then counts as unavailable).
    fn live_load(&self, index: usize) -> Option<u64> {
        let Slot { stream, probe, .. } = &self.slots[index];
        // Read before the query: everything counted so far was enqueued before it.
        let enqueued = stream.metrics().operations_count;
        if stream.query().ok()? {
            probe.saw_idle(enqueued);
            return Some(0);
        }
        Some(probe.busy_load(enqueued))
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

    /// Wait until some shared stream has finished the work enqueued on it
    /// before this call and return it, or `Ok(None)` when `timeout` passes
    /// first (`None`: wait as long as it takes).
    ///
    /// An idle stream is returned at once (queries only). Otherwise each
    /// stream gets a mark (one pooled event) and the thread parks until the
    /// context's reactor sees the first of them pass: no polling, no sleep,
    /// and the ready stream is noticed when the reactor wakes.
    pub fn wait_for_any_ready(&self, timeout: Option<Duration>) -> Result<Option<Arc<Stream>>> {
        let order: Vec<usize> = self.rotated(self.all()).collect();
        for &index in &order {
            let slot = &self.slots[index];
            if slot.stream.query()? {
                return Ok(Some(Arc::clone(&slot.stream)));
            }
        }
        let mut waits = order
            .iter()
            .map(|&index| Ok(self.slots[index].stream.mark()?.wait_async()?))
            .collect::<Result<Vec<Completion>>>()?;
        match Completion::wait_any(&mut waits, timeout) {
            Ok(Some(k)) => Ok(Some(Arc::clone(&self.slots[order[k]].stream))),
            Ok(None) => Ok(None),
            Err((_, err)) => Err(err.into()),
        }
    }
}
