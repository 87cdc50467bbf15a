//! Remembering which streams used a buffer, with one event per (buffer, stream).
//!
//! Each use on a tracked stream re-records that stream's event after the
//! operation, so the event always marks the stream's last use. Freeing waits on
//! these events (stream-ordered for device memory, on the host otherwise) and
//! host access waits on the ones that may write.

use crate::context::Context;
use crate::error::Result;
use crate::stream::Stream;
use std::sync::{Mutex, MutexGuard};
use sys::{CUevent, CUevent_flags};

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
    event: CUevent,
    pending: Pending,
}

#[derive(Default)]
struct Inner {
    uses: Vec<Use>,
    /// Recorded on the home stream at the first use elsewhere: a point after
    /// the stream-ordered allocation, which other streams wait for.
    ready: Option<CUevent>,
}

/// The per-buffer record of uses on streams.
#[derive(Default)]
pub(crate) struct UseTracker {
    inner: Mutex<Inner>,
}

// SAFETY: the raw event handles are only passed to the (thread-safe) driver,
// always under the Mutex.
unsafe impl Send for UseTracker {}
// SAFETY: as above; all access goes through the Mutex.
unsafe impl Sync for UseTracker {}

impl UseTracker {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before a first use on `stream` (not `home`) of memory allocated in
    /// stream order on `home`: make `stream` wait until `home` has passed the
    /// allocation. Later uses on the same stream are already ordered.
    pub(crate) fn order_after_home(
        &self,
        ctx: &Context,
        home: &Stream,
        stream: &Stream,
    ) -> Result<()> {
        let mut inner = self.lock();
        if inner.uses.iter().any(|u| u.stream == stream.id()) {
            return Ok(());
        }
        let ready = match inner.ready {
            Some(ready) => ready,
            None => {
                let event = create_event(ctx)?;
                // SAFETY: both handles are live; the context is current (callers bind).
                let code = unsafe { (ctx.driver().cuEventRecord)(event, home.as_raw()) };
                if let Err(err) = ctx.check(code) {
                    destroy_event(ctx, event);
                    return Err(err);
                }
                inner.ready = Some(event);
                event
            }
        };
        // SAFETY: both handles are live; flags 0 is CU_EVENT_WAIT_DEFAULT.
        ctx.check(unsafe { (ctx.driver().cuStreamWaitEvent)(stream.as_raw(), ready, 0) })
    }

    /// After enqueueing a use on `stream`: re-record the stream's event there.
    ///
    /// When the event cannot be recorded the use cannot be tracked, so this
    /// waits for the stream on the host before returning the error: nothing
    /// untracked is left in flight.
    pub(crate) fn record_use(&self, ctx: &Context, stream: &Stream, write: bool) -> Result<()> {
        let mut inner = self.lock();
        let index = match inner.uses.iter().position(|u| u.stream == stream.id()) {
            Some(index) => index,
            None => match create_event(ctx) {
                Ok(event) => {
                    inner.uses.push(Use {
                        stream: stream.id(),
                        event,
                        pending: Pending::Idle,
                    });
                    inner.uses.len() - 1
                }
                Err(err) => return Err(wait_untracked(ctx, stream, err)),
            },
        };
        let entry = &mut inner.uses[index];
        // SAFETY: both handles are live; the context is current (callers bind).
        let code = unsafe { (ctx.driver().cuEventRecord)(entry.event, stream.as_raw()) };
        if let Err(err) = ctx.check(code) {
            return Err(wait_untracked(ctx, stream, err));
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
            // SAFETY: the event is live; the context is current.
            ctx.check(unsafe { (ctx.driver().cuEventSynchronize)(entry.event) })?;
            entry.pending = Pending::Idle;
        }
        Ok(())
    }

    /// Make `home` wait (without blocking the host) for every recorded use.
    /// Returns `false` when some use could be neither ordered nor waited for:
    /// the memory must then not be freed.
    pub(crate) fn order_before_free(&self, ctx: &Context, home: &Stream) -> bool {
        let inner = self.lock();
        for entry in inner.uses.iter().filter(|u| u.pending > Pending::Idle) {
            // SAFETY: both handles are live; flags 0 is CU_EVENT_WAIT_DEFAULT.
            let code = unsafe { (ctx.driver().cuStreamWaitEvent)(home.as_raw(), entry.event, 0) };
            if let Err(err) = ctx.check(code) {
                tracing::warn!(
                    "ordering a free after stream {}: {err}; waiting on the host",
                    entry.stream
                );
                // SAFETY: the event is live; the context is current.
                let code = unsafe { (ctx.driver().cuEventSynchronize)(entry.event) };
                if let Err(err) = ctx.check(code) {
                    tracing::warn!("waiting for stream {}: {err}", entry.stream);
                    return false;
                }
            }
        }
        true
    }

    /// Destroy the events (the owner calls this last, from its Drop).
    pub(crate) fn destroy_events(&self, ctx: &Context) {
        let mut inner = self.lock();
        for entry in inner.uses.drain(..) {
            destroy_event(ctx, entry.event);
        }
        if let Some(ready) = inner.ready.take() {
            destroy_event(ctx, ready);
        }
    }

    /// How many streams other than the home stream have used the buffer.
    pub(crate) fn stream_count(&self) -> usize {
        self.lock().uses.len()
    }
}

fn create_event(ctx: &Context) -> Result<CUevent> {
    let mut event: CUevent = std::ptr::null_mut();
    let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    // SAFETY: writes one handle through a valid pointer; the context is current.
    ctx.check(unsafe { (ctx.driver().cuEventCreate)(&mut event, flags) })?;
    Ok(event)
}

fn destroy_event(ctx: &Context, event: CUevent) {
    // SAFETY: the event is live and destroyed once; CUDA releases a pending
    // event once it completes, and waits already enqueued on it still hold.
    let code = unsafe { (ctx.driver().cuEventDestroy)(event) };
    if let Err(err) = ctx.check(code) {
        tracing::warn!("destroying a tracking event: {err}");
    }
}

/// A use could not be tracked: wait for the stream so that nothing untracked
/// is left in flight, and return the original error.
fn wait_untracked(ctx: &Context, stream: &Stream, err: crate::Error) -> crate::Error {
    // SAFETY: the stream is live; the context is current.
    let code = unsafe { (ctx.driver().cuStreamSynchronize)(stream.as_raw()) };
    if let Err(sync_err) = ctx.check(code) {
        tracing::warn!(
            "stream {} could not be waited for after an untracked use: {sync_err}",
            stream.id()
        );
    }
    err
}
