//! Shuffling independent work: with `CUDA_STREAMS_SOFT_SHUFFLE` set to a
//! seed, each stream worker pauses before each operation for a while that
//! the seed, the stream and the operation's place in it choose (most not at
//! all, some yield the CPU a few times, a few sleep up to 200 µs). Work on
//! different streams with no order between them then runs in other
//! interleavings from seed to seed, so a missing order shows up as wrong data
//! too where the stream-order check is off. Ordered work is unaffected: a
//! pause delays, it never reorders one stream's queue or skips a wait.
//!
//! A perturbation, not synchronisation: nothing waits for a pause to end.

use std::sync::OnceLock;
use std::time::Duration;
use sys::env::{EnvError, Setting};

/// The variable that turns shuffling on: a seed (a whole number), or `off`.
pub const SHUFFLE_ENV: &str = "CUDA_STREAMS_SOFT_SHUFFLE";

/// `CUDA_STREAMS_SOFT_SHUFFLE` as a setting (for listings such as
/// `cuda-streams info`).
pub const SHUFFLE_SETTING: Setting = Setting {
    name: SHUFFLE_ENV,
    aliases: &[],
    default: "off",
    about: "shuffle independent work across stream workers: a seed, or off",
};

/// The seed from the environment, parsed once; `None` when off.
pub(crate) fn seed_from_env() -> &'static Result<Option<u64>, EnvError> {
    static FROM_ENV: OnceLock<Result<Option<u64>, EnvError>> = OnceLock::new();
    FROM_ENV.get_or_init(|| match SHUFFLE_SETTING.from_env()? {
        Some(found) if found.value.trim().eq_ignore_ascii_case("off") => Ok(None),
        Some(found) => found.parse_int(0..).map(Some),
        None => Ok(None),
    })
}

/// The seed the software driver shuffles with, if `CUDA_STREAMS_SOFT_SHUFFLE`
/// holds one (`None` when unset, `off` or invalid; an invalid value makes
/// `cuInit` fail, naming it).
///
/// ```
/// if std::env::var_os("CUDA_STREAMS_SOFT_SHUFFLE").is_none() {
///     assert_eq!(cuda_streams_soft_driver::shuffle_seed(), None);
/// }
/// ```
pub fn shuffle_seed() -> Option<u64> {
    seed_from_env().as_ref().ok().copied().flatten()
}

/// What a worker does before one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pause {
    yields: u32,
    sleep: Duration,
}

/// The pause before operation `nth` (0, 1, 2 ...) of the stream `stream`.
pub(crate) fn pause(seed: u64, stream: usize, nth: u64) -> Pause {
    let h = mix(mix(seed ^ stream as u64) ^ nth);
    match h % 8 {
        // Most operations start at once: the shuffle must not make the
        // suite slow.
        0..=4 => Pause {
            yields: 0,
            sleep: Duration::ZERO,
        },
        5 | 6 => Pause {
            yields: 1 + ((h >> 8) % 4) as u32,
            sleep: Duration::ZERO,
        },
        _ => Pause {
            yields: 0,
            sleep: Duration::from_micros((h >> 8) % 201),
        },
    }
}

/// Pause before operation `nth` of `stream`, when shuffling.
#[inline]
pub(crate) fn before_operation(stream: usize, nth: u64) {
    if let Ok(Some(seed)) = seed_from_env() {
        let Pause { yields, sleep } = pause(*seed, stream, nth);
        for _ in 0..yields {
            std::thread::yield_now();
        }
        if !sleep.is_zero() {
            std::thread::sleep(sleep);
        }
    }
}

/// splitmix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_depend_on_the_seed_the_stream_and_the_operation_and_stay_short() {
        let pauses =
            |seed, stream| -> Vec<Pause> { (0..256).map(|n| pause(seed, stream, n)).collect() };
        let a = pauses(1, 0x10);
        assert_eq!(a, pauses(1, 0x10), "reproducible from the seed");
        assert_ne!(a, pauses(2, 0x10), "another seed, another interleaving");
        assert_ne!(a, pauses(1, 0x20), "streams pause differently");
        let still = a
            .iter()
            .filter(|p| p.yields == 0 && p.sleep.is_zero())
            .count();
        let slept = a.iter().filter(|p| !p.sleep.is_zero()).count();
        let yielded = a.iter().filter(|p| p.yields > 0).count();
        assert!((96..=224).contains(&still), "most start at once: {still}");
        assert!(slept > 0 && yielded > 0, "{slept} slept, {yielded} yielded");
        assert!(
            a.iter()
                .all(|p| p.yields <= 4 && p.sleep <= Duration::from_micros(200))
        );
    }
}
