//! The stream-order policy ([`OrderPolicy`]), the setting that chooses it
//! for a process ([`ORDERING_SETTING`]) and the message of its refusal:
//! plain values that the tracker acts on, so that the error refusing a
//! policy stands on the ground with them. Which policies each driver
//! accepts, and its default, the seam says (`ground/seam.rs`).

use crate::ground::loaded_driver::DriverKind;

/// What a context does with two conflicting accesses (a write and another
/// access to the same bytes, on different streams) that have no order
/// between them. Set per context ([`Context::set_ordering`](crate::Context::set_ordering)) or for every
/// context of the process by `CUDA_STREAMS_ORDERING=off|check|report|auto`
/// ([`ORDERING_SETTING`]).
///
/// The software driver accepts only the policies that keep every such pair
/// from running: `Check` (its default) and `Auto`. `Off` and `Report` would
/// let two stream workers touch the same host memory at once, a data race,
/// and are refused with [`Error::OrderPolicyRefused`](crate::Error::OrderPolicyRefused).
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
    /// Refuse the later operation with [`Error::UnorderedAccess`](crate::Error::UnorderedAccess) before the
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

    pub(crate) const fn to_u8(self) -> u8 {
        self as u8
    }

    /// The policy `to_u8` gave `raw` (any other value reads as `Auto`): one
    /// table lookup, which every enqueue makes.
    #[inline]
    pub(crate) fn from_u8(raw: u8) -> Self {
        const BY_VALUE: [OrderPolicy; 4] = [
            OrderPolicy::Off,
            OrderPolicy::Check,
            OrderPolicy::Report,
            OrderPolicy::Auto,
        ];
        BY_VALUE[usize::from(raw.min(3))]
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

/// The message of [`Error::OrderPolicyRefused`](crate::Error::OrderPolicyRefused).
pub(crate) fn refusal_message(
    policy: &OrderPolicy,
    driver: &DriverKind,
    from_env: &Option<String>,
) -> String {
    let driver = driver.in_messages();
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
            .filter(|&p| DriverKind::Soft.accepts_order_policy(p))
            .collect();
        assert_eq!(soft, [OrderPolicy::Check, OrderPolicy::Auto]);
        assert!(
            all.into_iter()
                .all(|p| DriverKind::Cuda.accepts_order_policy(p))
        );
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
}
