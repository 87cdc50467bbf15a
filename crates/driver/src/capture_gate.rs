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
//! shared, and the only step that turns a stream into a capturing one
//! (beginning a capture, forking a stream into one) holds it exclusively.
//!
//! Ending a capture needs no gate: eager work is refused while the flag is
//! set, and the capture's own methods take `&mut Capture`, as does ending it.
//!
//! Two rules keep the gate from deadlocking. A thread already inside a gate
//! (a [`crate::WorkObserver`], or ordering a buffer after its home stream)
//! never blocks on another one: it tries, and a stream whose capture is
//! beginning counts as capturing. And such a thread cannot begin a capture,
//! which would wait for the very gate it holds.

use crate::error::{Error, Result};
use crate::stream::Stream;
use std::cell::RefCell;
use std::sync::{RwLock, RwLockReadGuard, TryLockError};

thread_local! {
    /// The streams whose gate this thread holds, innermost last.
    static HELD: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The per-stream lock: shared by enqueues, exclusive for a stream entering
/// a capture.
#[derive(Default)]
pub(crate) struct CaptureGate(RwLock<()>);

/// Proof that a stream is not capturing and cannot begin to while this
/// lives ([`Stream::enqueue_gate`]). Work enqueued on the stream meanwhile
/// runs eagerly, never into a graph.
#[must_use = "the stream may begin a capture as soon as the gate is dropped"]
pub struct EnqueueGate<'a> {
    /// `None` when this thread already held the same stream's gate.
    shared: Option<RwLockReadGuard<'a, ()>>,
    stream: u64,
}

impl std::fmt::Debug for EnqueueGate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnqueueGate")
            .field("stream", &self.stream)
            .field("nested", &self.shared.is_none())
            .finish()
    }
}

impl Drop for EnqueueGate<'_> {
    fn drop(&mut self) {
        if self.shared.is_some() {
            // Gates may be dropped in any order: forget this one, not the last.
            HELD.with(|held| {
                let mut held = held.borrow_mut();
                if let Some(at) = held.iter().rposition(|&id| id == self.stream) {
                    held.remove(at);
                }
            });
        }
    }
}

impl Stream {
    /// Hold the stream out of captures: `Err` ([`Error::StreamCapturing`],
    /// naming `operation`) when it is capturing, otherwise a guard during
    /// which no capture can begin on it (`begin_capture` and `Capture::fork`
    /// wait for the guard).
    ///
    /// This crate takes it around every enqueue of work, from the capture
    /// check through the driver call and the tracking of buffer uses. Code
    /// that enqueues on a stream with raw driver calls (NCCL, another
    /// library's kernels) takes it around its calls, together with
    /// [`Stream::prepare_uses`] and [`Stream::track_uses`], so that its work
    /// cannot slip into a capture that keeps none of its buffers.
    ///
    /// Taken again on the same thread it is free; taken on another stream
    /// while one is held it does not wait, and a stream whose capture is
    /// beginning is refused as capturing.
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
    pub fn enqueue_gate(&self, operation: &'static str) -> Result<EnqueueGate<'_>> {
        let (nested, same) = HELD.with(|held| {
            let held = held.borrow();
            (!held.is_empty(), held.contains(&self.id()))
        });
        if same {
            // The capture flag cannot have changed since the outer gate.
            return Ok(EnqueueGate {
                shared: None,
                stream: self.id(),
            });
        }
        let lock = &self.gate.0;
        let shared = if nested {
            match lock.try_read() {
                Ok(shared) => shared,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                // A capture is beginning (or a fork into one): waiting here
                // could close a cycle with the gate this thread holds.
                Err(TryLockError::WouldBlock) => return Err(self.capturing_error(operation)),
            }
        } else {
            lock.read().unwrap_or_else(|p| p.into_inner())
        };
        self.refuse_if_capturing(operation)?;
        HELD.with(|held| held.borrow_mut().push(self.id()));
        Ok(EnqueueGate {
            shared: Some(shared),
            stream: self.id(),
        })
    }

    /// Run `enter` (which makes the stream capturing) with the gate held
    /// exclusively: after every enqueue in flight on the stream, before any
    /// later one.
    pub(crate) fn enter_capture<R>(
        &self,
        operation: &'static str,
        enter: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if HELD.with(|held| !held.borrow().is_empty()) {
            return Err(Error::CaptureInsideEnqueue {
                operation,
                stream: self.id(),
            });
        }
        let _exclusive = self.gate.0.write().unwrap_or_else(|p| p.into_inner());
        enter()
    }

    fn capturing_error(&self, operation: &'static str) -> Error {
        Error::StreamCapturing {
            operation,
            stream: self.id(),
        }
    }
}
