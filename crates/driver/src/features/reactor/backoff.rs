//! How long the reactor parks while waits it cannot foresee are pending.
//!
//! After activity (a new wait, a completion) the park starts at
//! [`ReactorConfig::min_park`] and doubles up to [`ReactorConfig::max_park`]:
//! a short wait's flag is seen within tens of microseconds. Parking that
//! briefly for as long as a wait of seconds is pending costs the thread a
//! sixth of a core (tens of thousands of wake-ups a second), so once every
//! such wait has been pending long, the park keeps doubling, up to
//! [`ReactorConfig::long_park`] and never past a [`LONG_PARK_SHARE`]th of
//! how long the youngest of them has been pending. A wake-up the longer
//! park delays is then late by at most that share of the wait's length, and
//! waits shorter than `LONG_PARK_SHARE × max_park` (4 ms by default, longer than the
//! events bench's 3 ms waits) see the
//! short parks only, exactly as before.

use super::config::ReactorConfig;
use std::time::Duration;

/// A long park is at most this share (1/128) of how long the youngest wait
/// has been pending, so the delay it adds stays under 0.8% of the wait.
pub(super) const LONG_PARK_SHARE: u32 = 128;

/// The doubling park of [`super::WakeMode::Adaptive`].
#[derive(Debug, Default)]
pub(super) struct Backoff {
    next: Duration,
}

impl Backoff {
    /// Activity: start again from the shortest park.
    pub(super) fn reset(&mut self, config: &ReactorConfig) {
        self.next = config.min_park;
    }

    /// The park to take now, while the youngest wait with no learned
    /// window has been pending for `youngest`; the one after doubles it.
    pub(super) fn park(&mut self, config: &ReactorConfig, youngest: Duration) -> Duration {
        let ceiling = ceiling(config, youngest);
        let now = self.next.clamp(config.min_park.min(ceiling), ceiling);
        self.next = now.saturating_mul(2).min(ceiling);
        now
    }
}

/// The longest park while the youngest wait has been pending for `youngest`.
fn ceiling(config: &ReactorConfig, youngest: Duration) -> Duration {
    let short = config.max_park.max(config.min_park);
    short.max(config.long_park.min(youngest / LONG_PARK_SHARE))
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// The parks a wait pending from 0 for `span` gets, on a simulated
    /// clock where each park lasts exactly its timeout.
    fn parks_over(config: &ReactorConfig, span: Duration) -> Vec<Duration> {
        let mut backoff = Backoff::default();
        backoff.reset(config);
        let (mut age, mut parks) = (Duration::ZERO, Vec::new());
        while age < span {
            let park = backoff.park(config, age);
            parks.push(park);
            age += park;
        }
        parks
    }

    #[test]
    fn short_waits_keep_the_short_parks() {
        let config = ReactorConfig::default();
        let short = LONG_PARK_SHARE * config.max_park;
        let parks = parks_over(&config, short);
        assert_eq!(&parks[..4], &[8 * US, 16 * US, 32 * US, 32 * US]);
        assert!(parks.iter().all(|&p| p <= config.max_park), "{parks:?}");
    }

    #[test]
    fn long_waits_park_up_to_the_bound_and_a_share_of_their_age() {
        let config = ReactorConfig::default();
        let mut backoff = Backoff::default();
        backoff.reset(&config);
        let mut age = Duration::ZERO;
        let mut count = 0;
        while age < Duration::from_secs(1) {
            let park = backoff.park(&config, age);
            assert!(
                park <= config.max_park.max(age / LONG_PARK_SHARE),
                "a {park:?} park at {age:?} delays the wait by more than its share"
            );
            assert!(park <= config.long_park);
            age += park;
            count += 1;
        }
        assert_eq!(backoff.park(&config, age), config.long_park);
        // 32 µs parks would take 31 250 wake-ups; the long parks about 1 450.
        assert!(count < 1_600, "{count} wake-ups in a second");
        assert!(count > 1_000, "{count}: no park is longer than long_park");
    }

    #[test]
    fn activity_brings_back_the_short_parks() {
        let config = ReactorConfig::default();
        let mut backoff = Backoff::default();
        backoff.reset(&config);
        let old = Duration::from_secs(5);
        for _ in 0..20 {
            backoff.park(&config, old);
        }
        assert_eq!(backoff.park(&config, old), config.long_park);
        backoff.reset(&config);
        assert_eq!(backoff.park(&config, old), config.min_park);
        // A young wait joins: its age, not the old one's, sets the ceiling.
        backoff.reset(&config);
        let parks: Vec<_> = (0..6).map(|_| backoff.park(&config, 100 * US)).collect();
        assert_eq!(parks, [8, 16, 32, 32, 32, 32].map(|n| n * US));
    }

    #[test]
    fn a_long_park_no_longer_than_max_park_is_the_plain_back_off() {
        let config = ReactorConfig {
            long_park: Duration::ZERO,
            ..ReactorConfig::default()
        };
        let parks = parks_over(&config, Duration::from_millis(100));
        assert!(parks.iter().all(|&p| p <= config.max_park));
        // min_park above max_park: min_park wins, as it always did.
        let odd = ReactorConfig {
            min_park: 50 * US,
            max_park: 10 * US,
            long_park: Duration::ZERO,
            ..ReactorConfig::default()
        };
        assert!(
            parks_over(&odd, Duration::from_millis(1))
                .iter()
                .all(|&p| p == 50 * US)
        );
    }
}
