//! The protocol's observers step: right before the driver call of a piece
//! of work, the stream's [`WorkObserver`](crate::WorkObserver)s waiting for
//! it are told (a profiler marks where the work itself starts, after its
//! waits).
//!
//! An observer runs inside an enqueue, which holds the stream's gate, so it
//! may not begin a capture: the thread remembers that it is inside one, and
//! `enter_capture` (`gate.rs`) refuses there instead of waiting forever.

use crate::objects::stream::Stream;
use std::cell::Cell;
use std::sync::atomic::Ordering;

thread_local! {
    /// How many work observers this thread is inside (each inside an enqueue).
    static OBSERVING: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is running a work observer.
pub(crate) fn inside_one() -> bool {
    OBSERVING.with(Cell::get) > 0
}

impl Stream {
    /// Tell the observers waiting for the next work item (see
    /// [`crate::WorkObserver`]): called by every work-enqueueing path, after its
    /// waits and before its driver call.
    #[inline]
    pub(crate) fn before_work(&self) {
        if self.observed.load(Ordering::Acquire) {
            self.notify_observers();
        }
    }

    #[cold]
    fn notify_observers(&self) {
        let (first, rest) = {
            let mut observers = self.observers.lock().unwrap_or_else(|p| p.into_inner());
            self.observed.store(false, Ordering::Release);
            // The usual single observer leaves the list's buffer in place
            // for the next one (no allocation per observed work item).
            let first = (!observers.is_empty()).then(|| observers.remove(0));
            let rest = if observers.is_empty() {
                Vec::new()
            } else {
                std::mem::take(&mut *observers)
            };
            (first, rest)
        };
        // Called without the lock: an observer may ask to observe again.
        // Inside an enqueue, so no observer may begin a capture.
        let _observing = ObservingGuard::enter();
        for observer in first.into_iter().chain(rest) {
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                observer.before_work(self)
            }));
            if called.is_err() {
                tracing::warn!("a work observer on stream {} panicked (caught)", self.id());
            }
        }
    }
}

/// Marks the calling thread as running a [`crate::WorkObserver`] (inside an
/// enqueue) until dropped.
struct ObservingGuard(());

impl ObservingGuard {
    fn enter() -> Self {
        OBSERVING.with(|depth| depth.set(depth.get() + 1));
        Self(())
    }
}

impl Drop for ObservingGuard {
    fn drop(&mut self) {
        OBSERVING.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}
