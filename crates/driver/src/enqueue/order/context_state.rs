//! Per context: its policy, and the accesses to its memory (the shadow,
//! whose lock also guards the state of the context's streams).

use super::policy::{EVER_ON, OrderPolicy};
use super::stats::{OrderStats, counted};
use super::tracker::Shadow;
use crate::objects::context::Context;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Per context: the policy, and the accesses to the context's memory.
pub(crate) struct ContextOrder {
    pub(super) policy: AtomicU8,
    shadow: Mutex<Shadow>,
}

impl ContextOrder {
    pub(crate) fn new(policy: OrderPolicy) -> Self {
        if policy != OrderPolicy::Off {
            EVER_ON.store(true, Ordering::Relaxed);
        }
        Self {
            policy: AtomicU8::new(policy.to_u8()),
            shadow: Mutex::default(),
        }
    }

    /// The policy; `Off` is the one branch the enqueue path pays.
    #[inline]
    pub(crate) fn policy(&self) -> OrderPolicy {
        OrderPolicy::from_u8(self.policy.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.policy.load(Ordering::Relaxed) != OrderPolicy::Off.to_u8()
    }

    /// Set the policy without asking the driver: for the unit tests that
    /// measure `Off` on the software driver, on work that has no
    /// conflicting pair (which `Context::set_ordering` refuses, since it
    /// cannot know that).
    #[cfg(test)]
    pub(crate) fn force(&self, policy: OrderPolicy) {
        self.policy.store(policy.to_u8(), Ordering::Relaxed);
    }

    pub(super) fn shadow(&self) -> MutexGuard<'_, Shadow> {
        counted();
        self.shadow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count in the context's [`OrderStats`], taking the shadow lock (the
    /// paths that do not hold it already: captures, the general repair).
    pub(super) fn count(&self, f: impl FnOnce(&mut OrderStats)) {
        f(&mut self.shadow().stats);
    }
}

impl Context {
    /// Races found and waits inserted in this context so far.
    pub fn ordering_stats(&self) -> OrderStats {
        self.order.shadow().stats
    }

    /// Forget the accesses recorded to `bytes` bytes at `address` (memory
    /// this context freed, or is about to hand to a new owner), so the next
    /// owner's uses are not compared with the last one's.
    ///
    /// # Safety
    /// No work enqueued so far may still use the memory unordered with
    /// the next owner's work: every use has completed, or the memory goes
    /// back to the driver after the uses (a stream-ordered free).
    /// Forgetting memory that is still in use hides races the tracker
    /// would refuse, and on the software driver a race is a data race.
    pub unsafe fn forget_accesses(&self, address: u64, bytes: usize) {
        forget(self, address, bytes);
    }
}

/// See [`Context::forget_accesses`]; called by this crate's frees.
pub(crate) fn forget(ctx: &Context, address: u64, bytes: usize) {
    if ctx.order.is_on() {
        ctx.order
            .shadow()
            .forget(address, address.saturating_add(bytes as u64));
    }
}
