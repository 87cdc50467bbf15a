//! What a stream keeps for its latest mark (`latest_mark.rs`, which says
//! why reusing a mark is sound): its enqueue count and the kept mark. The
//! stream holds it; the latest mark's methods read it.

use crate::ground::sync::{AtomicBool, UnsafeCell, yield_now};
use crate::objects::event_pool::PooledEvent;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A stream's enqueue count and latest mark.
#[derive(Default)]
pub(crate) struct LatestMark {
    /// Enqueues seen on the stream, bumped after each driver call.
    pub(crate) enqueues: AtomicU64,
    pub(crate) kept: MarkSlot,
}

/// The kept mark behind a try-lock: taking it is one compare-and-swap and
/// giving it back a plain store, where a `Mutex` costs an atomic
/// read-modify-write each way (the engine keeps a mark per operation). No
/// one ever waits for it: a record that finds it taken keeps no mark (the
/// mark already kept stays correct: a record is no enqueue, and that mark's
/// counts still say whether anything was enqueued since it), and a fork
/// that finds it taken records an event of its own. Only
/// [`Stream::forget_latest_mark`], which must let go, retries
/// ([`MarkSlot::take`]); each holder
/// keeps it for a few instructions (no driver call, no drop of an event).
///
/// Generic over what it keeps, so that loom checks the protocol
/// (`mark_state/loom_tests.rs`, docs/testing.md) without a driver behind it:
/// a mark is held by one thread at a time, and every mark put in place is
/// either handed back, taken out once, or still in the slot (none lost,
/// none taken twice).
pub(crate) struct MarkSlot<T = Kept> {
    taken: AtomicBool,
    kept: UnsafeCell<Option<T>>,
}

// SAFETY: `kept` is only reached through `MarkSlot::try_with`, by the one
// thread that set `taken` (acquire) until it clears it (release); what it
// holds moves between threads that way, so it must be `Send` (a `Kept` is:
// an `Arc<PooledEvent>` and counts).
unsafe impl<T: Send> Sync for MarkSlot<T> {}

impl<T> Default for MarkSlot<T> {
    /// An empty slot, free (derived, it would ask `T: Default`).
    fn default() -> Self {
        Self {
            taken: AtomicBool::new(false),
            kept: UnsafeCell::new(None),
        }
    }
}

impl<T> MarkSlot<T> {
    /// `f` on the kept mark, unless another thread holds it now.
    #[inline]
    pub(crate) fn try_with<R>(&self, f: impl FnOnce(&mut Option<T>) -> R) -> Option<R> {
        if self
            .taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        /// Gives the slot back, also if `f` panicked.
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _release = Release(&self.taken);
        // SAFETY: `taken` was false and this thread set it, so no other
        // thread reaches `kept` until `_release` clears it, after `f`.
        Some(self.kept.with_mut(|kept| f(unsafe { &mut *kept })))
    }

    /// Take the kept mark out, waiting for the slot if another thread holds
    /// it (for a few instructions): for a caller that must let go of it.
    pub(crate) fn take(&self) -> Option<T> {
        loop {
            match self.try_with(Option::take) {
                Some(taken) => break taken,
                None => yield_now(),
            }
        }
    }

    /// Put `kept` in place, unless another thread holds the slot now (then
    /// `kept` is handed back). Returns what was replaced, or `kept` if it
    /// was not put: either is dropped by the caller, after the slot is free.
    #[inline]
    pub(crate) fn replace(&self, kept: Option<T>) -> Option<T> {
        let mut kept = Some(kept);
        let replaced = self.try_with(|slot| std::mem::replace(slot, kept.take().flatten()));
        replaced.unwrap_or_else(|| kept.flatten())
    }
}

/// The mark and what must be unchanged for it to be reused.
pub(crate) struct Kept {
    pub(crate) event: Arc<PooledEvent>,
    /// The stream's enqueue count read before the record.
    pub(crate) enqueues: u64,
    /// The event's record count right after the record.
    pub(crate) records: u64,
}

impl LatestMark {
    /// Something was just enqueued on the stream (after its driver call).
    #[inline]
    pub(crate) fn enqueued(&self) {
        self.enqueues.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
