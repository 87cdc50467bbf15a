//! Remembering which streams used a buffer, with one event per (buffer, stream).
//!
//! Each use on a tracked stream re-records that stream's event after the
//! operation, so the event always marks the stream's last use. Freeing waits on
//! these events (stream-ordered for device memory, on the host otherwise) and
//! host access waits on the ones that may write. The events come from the
//! context's pool ([`crate::Context::event_pool`]) and go back when the
//! buffer is dropped.

use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::event_pool::PooledEvent;
use crate::objects::stream::Stream;
use std::sync::{Mutex, MutexGuard};

/// What a stream's recorded uses may still be doing to the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Pending {
    /// Nothing: the host has waited for the event since the last use.
    Idle,
    /// Only reads.
    Read,
    /// At least one write.
    Write,
}

struct Use {
    stream: u64,
    event: PooledEvent,
    pending: Pending,
}

#[derive(Default)]
struct Inner {
    uses: Vec<Use>,
    /// Recorded on the home stream at the first use elsewhere: a point after
    /// the stream-ordered allocation, which other streams wait for. Boxed:
    /// few buffers ever need it, and every buffer moves this struct (a pool
    /// hit hands one out and takes it back), so it stays a pointer wide.
    ready: Option<Box<PooledEvent>>,
}

/// The per-buffer record of uses on streams.
#[derive(Default)]
pub(crate) struct UseTracker {
    inner: Mutex<Inner>,
}

impl UseTracker {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before a first use on `stream` (not `home`) of memory allocated in
    /// stream order on `home`: make `stream` wait until `home` has passed the
    /// allocation. Later uses on the same stream are already ordered.
    pub(crate) fn order_after_home(&self, home: &Stream, stream: &Stream) -> Result<()> {
        let mut inner = self.lock();
        if inner.uses.iter().any(|u| u.stream == stream.id()) {
            return Ok(());
        }
        match &mut inner.ready {
            Some(ready) => stream.wait_event(ready),
            // Kept where it is recorded, before the wait: a failed wait
            // leaves the mark for the next first use, as a failed wait does
            // for a kept one.
            ready @ None => stream
                .wait_for_home(
                    home,
                    "a first use elsewhere of a buffer whose home stream",
                    move |home| {
                        let ready = ready;
                        Ok(&***ready.insert(Box::new(home.mark()?)))
                    },
                )
                .map(drop),
        }
    }

    /// After enqueueing a use on `stream`: re-record the stream's event there.
    ///
    /// When the event cannot be recorded the use cannot be tracked, so this
    /// waits for the stream on the host before returning the error: nothing
    /// untracked is left in flight.
    pub(crate) fn record_use(&self, stream: &Stream, write: bool) -> Result<()> {
        let mut inner = self.lock();
        let index = match inner.uses.iter().position(|u| u.stream == stream.id()) {
            Some(index) => index,
            None => match stream.event_pool().acquire_event(false) {
                Ok(event) => {
                    inner.uses.push(Use {
                        stream: stream.id(),
                        event,
                        pending: Pending::Idle,
                    });
                    inner.uses.len() - 1
                }
                Err(err) => return Err(wait_untracked(stream, err)),
            },
        };
        let entry = &mut inner.uses[index];
        // Recorded only here, under this lock, and never handed out: no
        // other record of it can overlap this one, so it is recorded as
        // its only holder (no atomic read-modify-write on the event).
        if let Err(err) = entry.event.record_counted(stream, true) {
            return Err(wait_untracked(stream, err));
        }
        let kind = if write { Pending::Write } else { Pending::Read };
        entry.pending = entry.pending.max(kind);
        Ok(())
    }

    /// Block the host until the recorded uses that may write have finished
    /// (all uses when `all`).
    pub(crate) fn wait_host(&self, ctx: &Context, all: bool) -> Result<()> {
        // Binding first refuses callers inside a stream callback before they
        // take the lock: a host thread holding it may be waiting for that very
        // callback.
        ctx.bind()?;
        let mut inner = self.lock();
        let threshold = if all { Pending::Read } else { Pending::Write };
        for entry in inner.uses.iter_mut().filter(|u| u.pending >= threshold) {
            entry.event.synchronize()?;
            entry.pending = Pending::Idle;
        }
        Ok(())
    }

    /// Make `home` wait (without blocking the host) for every recorded use.
    /// Returns `false` when some use could be neither ordered nor waited for:
    /// the memory must then not be freed.
    pub(crate) fn order_before_free(&self, home: &Stream) -> bool {
        let inner = self.lock();
        for entry in inner.uses.iter().filter(|u| u.pending > Pending::Idle) {
            if let Err(err) = home.wait_event(&entry.event) {
                tracing::warn!(
                    "ordering a free after stream {}: {err}; waiting on the host",
                    entry.stream
                );
                if let Err(err) = entry.event.synchronize() {
                    tracing::warn!("waiting for stream {}: {err}", entry.stream);
                    return false;
                }
            }
        }
        true
    }

    /// Hand over the event of each stream whose recorded uses may still be
    /// running, with the stream's id, and forget every use: for an owner
    /// that waits for them later instead of on the host now (a pool that
    /// reuses the memory once each event has completed).
    ///
    /// Through `&mut self`, so no other thread holds the tracker and no lock
    /// is taken: its owner's drop is on a pool's hit path.
    pub(crate) fn take_pending<U>(&mut self, each: impl FnMut((u64, PooledEvent)) -> U) -> Vec<U> {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        inner.ready = None;
        // Nothing used it (a pool hit handed straight back): return before
        // building an iterator chain, which costs a pool hit more than the
        // rest of the drop.
        if inner.uses.is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut inner.uses)
            .into_iter()
            .filter(|u| u.pending > Pending::Idle)
            .map(|u| (u.stream, u.event))
            .map(each)
            .collect()
    }

    /// Give the events back to their pool (the owner calls this last, from
    /// its Drop; no driver call).
    pub(crate) fn release_events(&self) {
        let mut inner = self.lock();
        inner.uses.clear();
        inner.ready = None;
    }

    /// How many streams other than the home stream have used the buffer.
    pub(crate) fn stream_count(&self) -> usize {
        self.lock().uses.len()
    }
}

/// A use could not be tracked: wait for the stream so that nothing untracked
/// is left in flight, and return the original error.
fn wait_untracked(
    stream: &Stream,
    err: crate::ground::error::Error,
) -> crate::ground::error::Error {
    if let Err(sync_err) = stream.synchronize() {
        tracing::warn!(
            "stream {} could not be waited for after an untracked use: {sync_err}",
            stream.id()
        );
    }
    err
}
