//! The one ordering between "is this stream capturing?" and the driver call
//! that enqueues work on it.
//!
//! Eager work keeps its resources only until it has run: a one-shot callback
//! frees its closure, a buffer's use is tracked so that its free waits for
//! it, `copy_to_host` waits for its copy before it hands the slice back. If
//! a capture began between the check and the driver call, the driver would
//! record that work into a graph that keeps none of those resources, and
//! every replay would touch memory nobody owns any more. So the check, the
//! driver call and the use tracking happen while the stream's gate is held
//! shared, and the only steps that turn a stream into a capturing one
//! (beginning a capture, forking a stream into one) hold it exclusively.
//!
//! Ending a capture needs no gate: eager work is refused while the flag is
//! set, and the capture's own methods take `&mut Capture`, as does ending it.
//!
//! An enqueue never waits at the gate. When a capture is beginning it is
//! refused as if the capture had begun: it arrived after `begin_capture` was
//! called, so that is the order it takes. This is also why the gate cannot
//! deadlock: an enqueue made while another is in progress on the same thread
//! (an observer's, or a buffer ordered after its home stream) only tries. The
//! one wait is `begin_capture`'s, for the enqueues in flight; a
//! [`crate::WorkObserver`] runs inside one, so it may not begin a capture.

use crate::enqueue::observers;
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use std::sync::{RwLockReadGuard, TryLockError};

/// Proof that a stream is not capturing and cannot begin to while this
/// lives ([`Stream::enqueue_gate`]). Work enqueued on the stream meanwhile
/// runs eagerly, never into a graph.
#[must_use = "the stream may begin a capture as soon as the gate is dropped"]
pub struct EnqueueGate<'a> {
    /// `None` for an event's record or wait, which passes without holding
    /// the gate ([`Stream::pass_gate_for_mark`]).
    _shared: Option<RwLockReadGuard<'a, ()>>,
    stream: u64,
    /// Told when the gate goes, after the enqueue's driver calls: the
    /// stream's latest mark no longer covers its end (`latest_mark.rs`).
    /// `None` for a record, which adds no work to the stream's end.
    latest: Option<&'a crate::objects::mark_state::LatestMark>,
}

impl Drop for EnqueueGate<'_> {
    fn drop(&mut self) {
        if let Some(latest) = self.latest {
            latest.enqueued();
        }
    }
}

impl std::fmt::Debug for EnqueueGate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnqueueGate")
            .field("stream", &self.stream)
            .finish()
    }
}

impl Stream {
    /// Hold the stream out of captures: `Err` ([`Error::StreamCapturing`],
    /// naming `operation`) when it is capturing or a capture is beginning
    /// on it, otherwise a guard during which no capture can begin on it
    /// (`begin_capture` and `Capture::fork` wait for the guard). It never
    /// waits.
    ///
    /// This crate takes it around every enqueue of work, from the capture
    /// check through the driver call and the tracking of buffer uses. Code
    /// that enqueues on a stream with raw driver calls (NCCL, another
    /// library's kernels) gets it from [`Stream::enqueue_external`] or
    /// [`Stream::prepare_uses`], or takes it around its calls itself, so
    /// that its work cannot slip into a capture that keeps none of its
    /// buffers. Beginning
    /// a capture on the stream while holding its gate on the same thread
    /// waits forever, as locking a held `Mutex` does.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// {
    ///     let _gate = stream.enqueue_gate("my raw call").unwrap();
    ///     // ... raw driver calls on stream.as_raw() run eagerly here ...
    /// }
    /// let capture = stream.begin_capture().unwrap();
    /// let err = stream.enqueue_gate("my raw call").unwrap_err();
    /// assert!(err.to_string().contains("my raw call"), "{err}");
    /// drop(capture);
    /// ```
    #[inline]
    pub fn enqueue_gate(&self, operation: &'static str) -> Result<EnqueueGate<'_>> {
        let shared = match self.gate.0.try_read() {
            Ok(shared) => shared,
            // Nothing is left half done under this lock: a panic while it
            // was held changed no state it guards.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(self.capturing_error(operation)),
        };
        self.refuse_if_capturing(operation)?;
        Ok(EnqueueGate {
            _shared: Some(shared),
            stream: self.id(),
            latest: Some(&self.latest),
        })
    }

    /// [`Stream::enqueue_gate`] for a call that adds no work to the stream
    /// but must not run while it captures (a synchronization, which would
    /// invalidate the capture): held from the check through the call, so
    /// that a capture begun on another thread waits for it.
    #[inline]
    pub(crate) fn hold_out_of_captures(&self, operation: &'static str) -> Result<EnqueueGate<'_>> {
        let mut gate = self.enqueue_gate(operation)?;
        // Nothing is enqueued: the stream's latest mark still covers its end.
        gate.latest = None;
        Ok(gate)
    }

    /// The gate as an event's record or wait passes it: without holding it,
    /// and never refused. In a capture a record or a wait is an edge of the
    /// graph, which CUDA allows, and it keeps no resource that a replay
    /// could find freed; nor may a capture's own fork wait at the gate it
    /// holds exclusively. `ends_latest_mark`: the work is a wait, after
    /// which the stream's latest mark no longer covers its end (a record
    /// adds nothing to the end).
    #[inline]
    pub(crate) fn pass_gate_for_mark(&self, ends_latest_mark: bool) -> EnqueueGate<'_> {
        EnqueueGate {
            _shared: None,
            stream: self.id(),
            latest: ends_latest_mark.then_some(&self.latest),
        }
    }

    /// Run `enter` (which makes the stream capturing) with the gate held
    /// exclusively: after every enqueue in flight on the stream, before any
    /// later one.
    pub(crate) fn enter_capture<R>(
        &self,
        operation: &'static str,
        enter: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if observers::inside_one() {
            // The enqueue this observer runs inside holds a gate (maybe this
            // one) until the observer returns.
            return Err(Error::CaptureInsideEnqueue {
                operation,
                stream: self.id(),
            });
        }
        let _exclusive = self.gate.0.write().unwrap_or_else(|p| p.into_inner());
        // A mark kept before the capture is not reused after it.
        self.enqueued();
        enter()
    }

    fn capturing_error(&self, operation: &'static str) -> Error {
        Error::StreamCapturing {
            operation,
            stream: self.id(),
        }
    }
}
