//! What the tracker counts: per context, the races it found and the waits
//! it inserted ([`OrderStats`]); in tests, the locks each operation takes.

#[cfg(test)]
thread_local! {
    /// Locks of the tracker's state taken on this thread, for the tests that
    /// count what an operation costs.
    pub(super) static LOCKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Count one lock of the tracker's state (in tests; nothing otherwise).
#[inline(always)]
pub(super) fn counted() {
    #[cfg(test)]
    LOCKS.with(|n| n.set(n.get() + 1));
}

/// What the tracker has done in one context.
///
/// ```
/// use cuda_streams_driver::Context;
/// let stats = Context::new(0).unwrap().ordering_stats();
/// let _ = (stats.reports, stats.inserted_waits);
/// let shown = cuda_streams_driver::OrderStats { reports: 2, inserted_waits: 1 };
/// assert_eq!(shown.to_string(), "ordering: 2 race(s) found, 1 wait(s) inserted");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderStats {
    /// Races found (refused, reported or repaired).
    pub reports: u64,
    /// Waits inserted by [`OrderPolicy::Auto`](super::OrderPolicy::Auto).
    pub inserted_waits: u64,
}

impl std::fmt::Display for OrderStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ordering: {} race(s) found, {} wait(s) inserted",
            self.reports, self.inserted_waits
        )
    }
}
