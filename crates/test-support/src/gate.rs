//! A deterministic "this stream has not got there yet".

use driver::Stream;
use std::sync::mpsc::{Sender, channel};
use std::time::{Duration, Instant};

/// A host callback that holds its stream until [`Gate::open`] (or drop), or
/// until its limit passes, so a broken test fails instead of hanging.
///
/// Work enqueued behind the gate cannot start while it holds, which lets a
/// test observe "not done yet" without racing a timer.
pub struct Gate {
    tx: Option<Sender<()>>,
    closed_at: Instant,
    limit: Duration,
}

impl Gate {
    /// Enqueue a gate on `stream` that opens itself after [`crate::HANG`].
    pub fn close(stream: &Stream) -> Self {
        Self::close_within(stream, crate::HANG)
    }

    /// Enqueue a gate on `stream` that opens itself after `limit`. A short
    /// limit suits a run where launches behind the gate block the host (as
    /// under a sanitizer): the gate must open by itself for the test to go
    /// on; check [`Gate::still_held`] before a "not there yet" assertion.
    pub fn close_within(stream: &Stream, limit: Duration) -> Self {
        let (tx, rx) = channel::<()>();
        let closed_at = Instant::now();
        stream
            .add_callback(move || {
                // Returns when the sender is dropped, or at the limit.
                let _ = rx.recv_timeout(limit);
            })
            .expect("the gate is enqueued");
        Self {
            tx: Some(tx),
            closed_at,
            limit,
        }
    }

    /// Whether the gate is certainly still holding its stream. Its timer
    /// starts when the callback starts, which is after `closed_at`, so an
    /// observation made before this returns `true` was made while it held.
    /// `false` says (on stderr) why a "not there yet" check is skipped.
    pub fn still_held(&self) -> bool {
        let held = self.closed_at.elapsed() < self.limit;
        if !held {
            eprintln!(
                "note: the gate opened itself after {:?} (launches behind it blocked the host, as under a sanitizer); skipping the not-there-yet check",
                self.limit
            );
        }
        held
    }

    /// Let the stream go on.
    pub fn open(mut self) {
        self.tx.take();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.tx.take();
    }
}
