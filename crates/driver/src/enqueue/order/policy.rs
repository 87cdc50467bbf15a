//! Which [`OrderPolicy`] a context runs under: where it comes from
//! (`CUDA_STREAMS_ORDERING`, the driver's default, [`Context::set_ordering`]),
//! which policies each driver accepts, and what a switch keeps.
//!
//! On the software driver a race between two streams is two worker threads
//! touching the same host memory: a data race in Rust's sense. So there
//! only the policies that stop every unordered conflicting pair before it
//! runs (`Check`, which refuses the later operation, and `Auto`, which makes
//! it wait) are accepted, and a switch never forgets what the tracker knows.
//! On a GPU an unordered pair gives a wrong result, not undefined behaviour
//! in the host program, so every policy is accepted and `Off` is the default.

use crate::ground::error::{Error, Result};
use crate::ground::select::DriverKind;
use crate::objects::context::Context;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once any context turns tracking on: until then, labels cost nothing.
pub(super) static EVER_ON: AtomicBool = AtomicBool::new(false);

/// What a context does with two conflicting accesses (a write and another
/// access to the same bytes, on different streams) that have no order
/// between them. Set per context ([`Context::set_ordering`]) or for every
/// context of the process by `CUDA_STREAMS_ORDERING=off|check|report|auto`
/// ([`ORDERING_SETTING`]).
///
/// The software driver accepts only the policies that keep every such pair
/// from running: `Check` (its default) and `Auto`. `Off` and `Report` would
/// let two stream workers touch the same host memory at once, a data race,
/// and are refused with [`Error::OrderPolicyRefused`].
///
/// Not `non_exhaustive`: code that matches on it should hear about a new
/// policy.
///
/// ```
/// use cuda_streams_driver::{Context, OrderPolicy};
/// let ctx = Context::new(0).unwrap();
/// // The software driver checks by default; a GPU does not.
/// if !ctx.loaded_driver().is_gpu() && std::env::var_os("CUDA_STREAMS_ORDERING").is_none() {
///     assert_eq!(ctx.ordering(), OrderPolicy::Check);
/// }
/// assert_eq!(OrderPolicy::parse("Auto").unwrap(), OrderPolicy::Auto);
/// assert_eq!(OrderPolicy::Auto.to_string(), "auto");
/// assert!(OrderPolicy::parse("sometimes").is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OrderPolicy {
    /// Track nothing: one branch per enqueue. The default on a GPU; refused
    /// on the software driver.
    Off,
    /// Refuse the later operation with [`Error::UnorderedAccess`] before the
    /// driver sees it. The default on the software driver, where a race
    /// between two stream workers would be a data race on host memory.
    Check,
    /// Log each race as a `tracing` warning (target
    /// `cuda_streams_driver::order`) and let the work through. Refused on
    /// the software driver, where the work let through would be a data race.
    Report,
    /// Make the later operation's stream wait for the earlier one's (one
    /// event per stream to wait for; nothing when an order exists).
    Auto,
}

impl OrderPolicy {
    /// Parse `off`, `check`, `report` or `auto` (any case, surrounding
    /// spaces allowed).
    pub fn parse(value: &str) -> std::result::Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(Self::Off),
            "check" => Ok(Self::Check),
            "report" => Ok(Self::Report),
            "auto" => Ok(Self::Auto),
            other => Err(format!(
                "unknown ordering policy {other:?}: expected off, check, report or auto"
            )),
        }
    }

    /// Whether `driver` accepts this policy: a GPU every one, the software
    /// driver only those that keep an unordered conflicting pair from
    /// running (see the module's documentation).
    pub(crate) fn accepted_on(self, driver: DriverKind) -> bool {
        match driver {
            DriverKind::Cuda => true,
            DriverKind::Soft => matches!(self, Self::Check | Self::Auto),
        }
    }

    pub(super) const fn to_u8(self) -> u8 {
        self as u8
    }

    pub(super) fn from_u8(raw: u8) -> Self {
        match raw {
            0 => Self::Off,
            1 => Self::Check,
            2 => Self::Report,
            _ => Self::Auto,
        }
    }
}

/// The name [`OrderPolicy::parse`] and `CUDA_STREAMS_ORDERING` take.
impl std::fmt::Display for OrderPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::Check => "check",
            Self::Report => "report",
            Self::Auto => "auto",
        })
    }
}

/// `CUDA_STREAMS_ORDERING`, read once per process, for every context made
/// afterwards.
pub const ORDERING_SETTING: sys::env::Setting = sys::env::Setting {
    name: "CUDA_STREAMS_ORDERING",
    aliases: &[],
    default: "check (soft), off (GPU)",
    about: "stream-order checking: off, check, report or auto (soft: check or auto)",
};

/// The policy `CUDA_STREAMS_ORDERING` asks for, if set, with the value as
/// written (for an error that names it).
fn from_env() -> Result<Option<(OrderPolicy, String)>> {
    type Found = std::result::Result<Option<(OrderPolicy, String)>, sys::env::EnvError>;
    static FROM_ENV: std::sync::OnceLock<Found> = std::sync::OnceLock::new();
    FROM_ENV
        .get_or_init(|| {
            let Some(found) = ORDERING_SETTING.from_env()? else {
                return Ok(None);
            };
            OrderPolicy::parse(&found.value)
                .map(|policy| Some((policy, found.value.clone())))
                .map_err(|reason| found.error(reason))
        })
        .clone()
        .map_err(Error::from)
}

/// The policy `CUDA_STREAMS_ORDERING` asks for, if set (checked as a value
/// only: whether the driver accepts it is [`initial_policy`]'s question).
pub(crate) fn policy_from_env() -> Result<Option<OrderPolicy>> {
    Ok(from_env()?.map(|(policy, _)| policy))
}

/// The policy a new context on `driver` starts under: the one
/// `CUDA_STREAMS_ORDERING` asks for, refused if `driver` does not accept
/// it, or the driver's default (`Check` on the software driver, which is
/// sound by default; `Off` on a GPU).
pub(crate) fn initial_policy(driver: DriverKind) -> Result<OrderPolicy> {
    match from_env()? {
        Some((policy, _)) if policy.accepted_on(driver) => Ok(policy),
        Some((policy, value)) => Err(Error::OrderPolicyRefused {
            policy,
            driver,
            from_env: Some(value),
        }),
        None => Ok(match driver {
            DriverKind::Soft => OrderPolicy::Check,
            DriverKind::Cuda => OrderPolicy::Off,
        }),
    }
}

/// The message of [`Error::OrderPolicyRefused`].
pub(crate) fn refusal_message(
    policy: &OrderPolicy,
    driver: &DriverKind,
    from_env: &Option<String>,
) -> String {
    let driver = match driver {
        DriverKind::Soft => "the software driver",
        DriverKind::Cuda => "the CUDA driver",
    };
    let asked = match from_env {
        Some(value) => format!(
            "{}={value:?} asks for ordering policy {policy}, which {driver} refuses",
            ORDERING_SETTING.name
        ),
        None => format!("ordering policy {policy} is refused on {driver}"),
    };
    format!(
        "{asked}: there each stream is a worker thread, and two of them running \
         conflicting operations with no order between them would touch the same \
         host memory at once (a data race); use check (refuse such an operation) \
         or auto (make it wait)"
    )
}

impl Context {
    /// The context's [`OrderPolicy`].
    pub fn ordering(&self) -> OrderPolicy {
        self.order.policy()
    }

    /// Change the context's [`OrderPolicy`] (for every thread using it).
    ///
    /// - A policy the driver does not accept is refused with
    ///   [`Error::OrderPolicyRefused`] and the policy stays as it was: on
    ///   the software driver, `Off` and `Report`.
    /// - Between tracking policies (`Check`, `Report`, `Auto`) the tracker
    ///   keeps what it knows: work in flight when the policy changes is
    ///   checked against (or waited for) as before.
    /// - From `Off` to a tracking policy (on a GPU only: the software
    ///   driver is never `Off`), nothing was recorded while off, so this
    ///   first waits for all of the context's work ([`Context::synchronize`],
    ///   refused while a stream of the context is being captured) and then
    ///   starts from nothing, which is then true. Work that other threads
    ///   enqueue while the switch is under way is not seen by the tracker.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Error, OrderPolicy};
    /// let ctx = Context::new(0).unwrap();
    /// let before = ctx.ordering();
    /// ctx.set_ordering(OrderPolicy::Auto).unwrap();
    /// assert_eq!(ctx.ordering(), OrderPolicy::Auto);
    /// if !ctx.is_gpu() {
    ///     // Two stream workers racing would be a data race on host memory.
    ///     let err = ctx.set_ordering(OrderPolicy::Off).unwrap_err();
    ///     assert!(matches!(err, Error::OrderPolicyRefused { policy: OrderPolicy::Off, .. }));
    ///     assert_eq!(ctx.ordering(), OrderPolicy::Auto);
    /// }
    /// ctx.set_ordering(before).unwrap();
    /// ```
    pub fn set_ordering(&self, policy: OrderPolicy) -> Result<()> {
        if !policy.accepted_on(self.kind()) {
            return Err(Error::OrderPolicyRefused {
                policy,
                driver: self.kind(),
                from_env: None,
            });
        }
        let tracks = policy != OrderPolicy::Off;
        let mut synchronized = false;
        loop {
            let mut shadow = self.order.shadow();
            // Read under the lock, so that a switch by another thread in
            // between is not missed.
            let from_off = tracks && !self.order.is_on();
            if from_off && !synchronized {
                // The shadow holds nothing of the work enqueued while off:
                // once that work has completed, nothing can conflict with
                // it and an empty shadow tells the truth. Waited for outside
                // the lock, which the work's completion may need.
                drop(shadow);
                self.synchronize()?;
                synchronized = true;
                continue;
            }
            if from_off {
                shadow.clear();
                EVER_ON.store(true, Ordering::Relaxed);
            }
            self.order.policy.store(policy.to_u8(), Ordering::Relaxed);
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_software_driver_accepts_only_the_policies_that_stop_a_race() {
        let all = [
            OrderPolicy::Off,
            OrderPolicy::Check,
            OrderPolicy::Report,
            OrderPolicy::Auto,
        ];
        let soft: Vec<_> = all
            .into_iter()
            .filter(|p| p.accepted_on(DriverKind::Soft))
            .collect();
        assert_eq!(soft, [OrderPolicy::Check, OrderPolicy::Auto]);
        assert!(all.into_iter().all(|p| p.accepted_on(DriverKind::Cuda)));
        for policy in all {
            assert_eq!(OrderPolicy::parse(&policy.to_string()), Ok(policy));
            assert_eq!(OrderPolicy::from_u8(policy.to_u8()), policy);
        }
    }

    #[test]
    fn a_refusal_names_the_policy_the_driver_and_the_variable() {
        let from_api = refusal_message(&OrderPolicy::Report, &DriverKind::Soft, &None);
        assert!(
            from_api.starts_with("ordering policy report is refused on the software driver: "),
            "{from_api}"
        );
        assert!(from_api.contains("data race"), "{from_api}");
        let from_env = refusal_message(&OrderPolicy::Off, &DriverKind::Soft, &Some(" OFF".into()));
        assert!(
            from_env.starts_with(
                "CUDA_STREAMS_ORDERING=\" OFF\" asks for ordering policy off, which the software driver refuses: "
            ),
            "{from_env}"
        );
    }

    /// `Off` to a tracking policy waits for the work enqueued while off
    /// before starting from nothing, so the tracker never takes a write
    /// still in flight for finished. (Only a GPU can be `Off`; the software
    /// driver gets there through the tests' back door.)
    #[test]
    fn turning_tracking_on_waits_for_the_work_enqueued_while_off() {
        let (ctx, _policy) = super::super::tests::under(OrderPolicy::Check);
        let [stream, other] = std::array::from_fn(|_| crate::Stream::new(&ctx).unwrap());
        let mut data = crate::DeviceBuffer::<u32>::new(&ctx, 64).unwrap();
        ctx.order.force(OrderPolicy::Off);
        // Holds `stream` until it gives up on a message that never comes:
        // `set_ordering` can only return after that.
        let limit = std::time::Duration::from_millis(300);
        let (_never, held) = std::sync::mpsc::channel::<()>();
        let closed_at = std::time::Instant::now();
        stream
            .add_callback(move || {
                let _ = held.recv_timeout(limit);
            })
            .unwrap();
        stream.memset_u32_async(&mut data, 1).unwrap();
        ctx.set_ordering(OrderPolicy::Check).unwrap();
        assert!(
            stream.query().unwrap(),
            "the write enqueued while off is still in flight after the switch"
        );
        assert!(closed_at.elapsed() >= limit);
        // Nothing is in flight, so the empty shadow is the truth: a write
        // on another stream is ordered after the host's wait.
        other.memset_u32_async(&mut data, 2).unwrap();
        assert_eq!(data.to_vec(&other).unwrap(), [2; 64]);
    }
}
