//! What the reactor is told: how its thread waits ([`WakeMode`],
//! [`ReactorConfig`]).

use std::time::Duration;

/// How the reactor thread waits while waits are pending.
///
/// Latency and CPU pull against each other; `benches/benches/futures.rs`
/// measures every mode against busy polling (see `docs/async.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive] // more mechanisms may come (e.g. blocking-sync events)
pub enum WakeMode {
    /// Spin for [`ReactorConfig::spin`] after each new wait or completion,
    /// then park with a back-off from [`ReactorConfig::min_park`] doubling to
    /// [`ReactorConfig::max_park`]; once every such wait has been pending
    /// for long, on to [`ReactorConfig::long_park`]. The default.
    ///
    /// With [`ReactorConfig::predict`] (on by default), a wait on a stream
    /// or event whose recent waits the reactor has seen is instead parked
    /// through until shortly before it is due, and spun on only around
    /// that moment; one that runs late falls back to the back-off.
    #[default]
    Adaptive,
    /// Spin for as long as any wait is pending: the lowest latency, one core
    /// busy while waiting.
    Spin,
    /// Park until a host function (`cuLaunchHostFunc`) enqueued after each
    /// flag wakes the thread: no CPU while waiting, the latency of the
    /// driver's callback thread.
    HostFn,
}

/// The reactor's waiting policy, set with
/// [`Reactor::set_config`](super::Reactor::set_config).
///
/// ```
/// use cuda_streams_driver::{ReactorConfig, WakeMode};
/// let quiet = ReactorConfig::default().with_mode(WakeMode::HostFn);
/// assert_eq!(quiet.mode, WakeMode::HostFn);
/// assert!(ReactorConfig::default().min_park <= ReactorConfig::default().max_park);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ReactorConfig {
    /// How the thread waits.
    pub mode: WakeMode,
    /// [`WakeMode::Adaptive`]: how long to spin after activity.
    pub spin: Duration,
    /// [`WakeMode::Adaptive`]: the first park after spinning.
    pub min_park: Duration,
    /// [`WakeMode::Adaptive`]: the longest park while a wait is young.
    pub max_park: Duration,
    /// [`WakeMode::Adaptive`]: the longest park once every pending wait
    /// has been pending long. Past `max_park` the park keeps doubling, but
    /// never beyond a 128th of how long the youngest wait has been pending,
    /// so it delays a wait by under 0.8% of its length, and waits shorter
    /// than 128 × `max_park` never see it. Default 1 ms: a wait pending for
    /// seconds wakes the thread about 1000 times a second instead of 31 000.
    /// At or under `max_park`, the back-off stops at `max_park`.
    pub long_park: Duration,
    /// How often pending waits' events are queried for errors (and for
    /// completion, should a flag be missed).
    pub error_check: Duration,
    /// [`WakeMode::Adaptive`]: learn how long waits on each stream (or
    /// event) take, and spin only around the moment the next one is due.
    pub predict: bool,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        Self {
            mode: WakeMode::Adaptive,
            // Chosen by the H200's numbers (docs/async.md): 8-32 µs parks
            // keep the reactor thread at 0.19 of a core while a wait is
            // pending; 4-16 µs cost 0.31 for no lower latency (a parked
            // executor's wake-up dominates).
            spin: Duration::from_micros(10),
            min_park: Duration::from_micros(8),
            max_park: Duration::from_micros(32),
            // Also the error check's period: a longer park would check less.
            long_park: Duration::from_millis(1),
            error_check: Duration::from_millis(1),
            predict: true,
        }
    }
}

impl ReactorConfig {
    /// The same policy with `mode`.
    pub const fn with_mode(self, mode: WakeMode) -> Self {
        Self { mode, ..self }
    }

    /// The same policy with [`ReactorConfig::predict`] set to `predict`.
    pub const fn with_prediction(self, predict: bool) -> Self {
        Self { predict, ..self }
    }
}
