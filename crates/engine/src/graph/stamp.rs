//! When an operation was created, read cheaply.
//!
//! Every operation keeps its creation time ([`EventMetadata::creation_time`]),
//! which few callers ever ask for. Reading `Instant::now` for each one costs
//! 30–40 ns on a virtual machine (the H200 machines are ones), more than a
//! tenth of a builder operation's whole bookkeeping. Where the CPU's time
//! stamp counter ticks at a constant rate on every core (x86-64 with the
//! "invariant TSC" CPUID bit, which Linux also trusts for `CLOCK_MONOTONIC`),
//! an operation keeps the counter instead (`rdtsc`, a few ns), and the graph
//! turns it into an `Instant` when the metadata is asked for.
//!
//! The conversion needs no calibration: the graph reads both clocks once when
//! it is made, and again at each conversion, and the ratio of the two spans
//! is the counter's rate. An operation's age is at most the graph's, so the
//! error of that ratio (from reading two clocks a few ns apart) costs at most
//! about as many ns of error in the result, whatever the age.
//! Elsewhere the stamp is `Instant::now` as before.
//!
//! [`EventMetadata::creation_time`]: crate::EventMetadata::creation_time

use std::time::{Duration, Instant};

/// A moment measured from the graph's [`StampOrigin`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Stamp {
    /// A time stamp counter reading.
    Ticks(u64),
    /// Read where the counter cannot be trusted.
    At(Instant),
}

/// The graph's clock: an `Instant` and, where usable, the time stamp counter
/// read at the same moment.
#[derive(Debug)]
pub(super) struct StampOrigin {
    origin: Instant,
    /// The counter at `origin`; `None` where it cannot be used.
    origin_ticks: Option<u64>,
}

impl StampOrigin {
    pub(super) fn new() -> Self {
        StampOrigin {
            origin_ticks: counter::usable().then(counter::read),
            origin: Instant::now(),
        }
    }

    /// Now.
    #[inline]
    pub(super) fn now(&self) -> Stamp {
        match self.origin_ticks {
            Some(_) => Stamp::Ticks(counter::read()),
            None => Stamp::At(Instant::now()),
        }
    }

    /// `stamp` as an `Instant`: never before the clock was made, never after
    /// now.
    pub(super) fn instant(&self, stamp: Stamp) -> Instant {
        let (ticks, origin_ticks) = match (stamp, self.origin_ticks) {
            (Stamp::At(at), _) => return at,
            (Stamp::Ticks(ticks), Some(origin_ticks)) => (ticks, origin_ticks),
            // Not made by this clock; cannot happen (it only makes `At`).
            (Stamp::Ticks(_), None) => return self.origin,
        };
        let now_ticks = counter::read();
        let now = Instant::now();
        let span_ticks = now_ticks.saturating_sub(origin_ticks);
        if span_ticks == 0 {
            return now;
        }
        let span = now.saturating_duration_since(self.origin);
        let age_ticks = now_ticks.saturating_sub(ticks).min(span_ticks);
        // age = span × age_ticks / span_ticks, in u128 so nothing overflows.
        let age_ns = span.as_nanos() * u128::from(age_ticks) / u128::from(span_ticks);
        let age = Duration::from_nanos(u64::try_from(age_ns).unwrap_or(u64::MAX));
        now.checked_sub(age).unwrap_or(self.origin).max(self.origin)
    }
}

#[cfg(target_arch = "x86_64")]
mod counter {
    use std::arch::x86_64::{__cpuid, _rdtsc};
    use std::sync::OnceLock;

    /// Whether the counter ticks at a constant rate, in step on every core
    /// (CPUID leaf 0x8000_0007, EDX bit 8: invariant TSC).
    pub(super) fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            // Leaf 0x8000_0000 says which extended leaves exist.
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
        })
    }

    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 CPU and only reads a counter.
        unsafe { _rdtsc() }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod counter {
    pub(super) fn usable() -> bool {
        false
    }

    pub(super) fn read() -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_between_the_instants_around_it() {
        let clock = StampOrigin::new();
        for _ in 0..3 {
            let before = Instant::now();
            let stamp = clock.now();
            let after = Instant::now();
            // Some time passes before the conversion, as it does for an
            // operation whose metadata is asked for later.
            let spin = Instant::now();
            while spin.elapsed() < Duration::from_millis(5) {
                std::hint::spin_loop();
            }
            let at = clock.instant(stamp);
            // Right to within the ns between two clock reads, unless the
            // thread was preempted between them: allow 1 ms either way (a
            // conversion that ignored the 5 ms since would be off by 5 ms).
            let slack = Duration::from_millis(1);
            assert!(at + slack >= before, "{at:?} is before {before:?}");
            assert!(at <= after + slack, "{at:?} is after {after:?}");
        }
    }

    #[test]
    fn stamps_read_back_in_order() {
        let clock = StampOrigin::new();
        let stamps: Vec<Stamp> = (0..100).map(|_| clock.now()).collect();
        let instants: Vec<Instant> = stamps.iter().map(|&s| clock.instant(s)).collect();
        // Converted at different moments, each within ns of the truth
        // (1 ms allows for a preemption between two clock reads).
        for pair in instants.windows(2) {
            assert!(pair[1] + Duration::from_millis(1) >= pair[0]);
        }
        assert!(instants.iter().all(|&i| i >= clock.origin));
    }
}
