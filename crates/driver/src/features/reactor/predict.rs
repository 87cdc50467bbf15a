//! Learned wait lengths: when the reactor should watch a wait closely.
//!
//! Most waits repeat: a training step, a batch upload, a kernel of the same
//! size every iteration. The reactor remembers how long the last few waits
//! on the same stream (or event) took, parks until shortly before the next
//! one is due, and spins only in a window around that moment. A wait that
//! outlives its window falls back to the back-off parks, so a wrong guess
//! costs latency, never a lost wake-up.

use std::collections::HashMap;
use std::time::Duration;

/// Waits remembered per key.
const HISTORY: usize = 4;
/// Keys remembered before the table starts over (events are many).
const MAX_KEYS: usize = 4096;

/// The recent wait lengths of each stream or event.
#[derive(Default)]
pub(super) struct WaitPredictor {
    recent: HashMap<usize, Recent>,
}

#[derive(Default)]
struct Recent {
    lengths: [Duration; HISTORY],
    filled: usize,
    next: usize,
}

/// When to watch a wait closely, as offsets from its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) start: Duration,
    pub(super) end: Duration,
}

impl WaitPredictor {
    /// The window for the next wait on `key`: around the shortest of its
    /// recent lengths (shortest, so that one slow outlier does not make the
    /// reactor late for the usual case), widened on both sides by `lead`
    /// or a sixteenth of the length, whichever is longer (OS wake-ups of a
    /// parked thread overshoot by microseconds).
    pub(super) fn window(&self, key: usize, lead: Duration) -> Option<Window> {
        let recent = self.recent.get(&key)?;
        let shortest = recent.lengths[..recent.filled].iter().min()?;
        let lead = lead.max(*shortest / 16);
        Some(Window {
            start: shortest.saturating_sub(lead),
            end: *shortest + lead,
        })
    }

    /// A wait on `key` finished `length` after it was registered.
    pub(super) fn observe(&mut self, key: usize, length: Duration) {
        if self.recent.len() >= MAX_KEYS && !self.recent.contains_key(&key) {
            self.recent.clear();
        }
        let recent = self.recent.entry(key).or_default();
        recent.lengths[recent.next] = length;
        recent.next = (recent.next + 1) % HISTORY;
        recent.filled = (recent.filled + 1).min(HISTORY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn unknown_keys_have_no_window() {
        let mut p = WaitPredictor::default();
        p.observe(1, 200 * US);
        assert_eq!(p.window(2, 10 * US), None);
    }

    #[test]
    fn the_window_surrounds_the_shortest_recent_wait() {
        let mut p = WaitPredictor::default();
        for length in [220, 200, 260] {
            p.observe(7, length * US);
        }
        // 200 µs / 16 = 12.5 µs > the 10 µs lead.
        let w = p.window(7, 10 * US).unwrap();
        assert_eq!(w.start, 200 * US - 12_500 * Duration::from_nanos(1));
        assert_eq!(w.end, 200 * US + 12_500 * Duration::from_nanos(1));
        // Short waits: the lead dominates and the window starts at once.
        p.observe(8, 4 * US);
        let w = p.window(8, 10 * US).unwrap();
        assert_eq!((w.start, w.end), (Duration::ZERO, 14 * US));
    }

    #[test]
    fn only_the_last_waits_count() {
        let mut p = WaitPredictor::default();
        p.observe(3, 50 * US);
        for _ in 0..HISTORY {
            p.observe(3, 1000 * US);
        }
        // The 50 µs wait has left the history.
        let w = p.window(3, 10 * US).unwrap();
        assert_eq!(w.start, 1000 * US - 62_500 * Duration::from_nanos(1));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut p = WaitPredictor::default();
        for key in 0..(MAX_KEYS + 10) {
            p.observe(key, US);
        }
        assert!(p.recent.len() <= MAX_KEYS);
        assert!(p.window(MAX_KEYS + 9, US).is_some());
    }
}
