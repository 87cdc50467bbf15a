//! Which launches are programmatic dependent launches: the process's
//! policy (`CUDA_STREAMS_PDL`) and the decision for one launch, from the
//! kernel's declaration and the device. Why a programmatic launch stays
//! ordered, and the launchers, are in `dependent_launch.rs`.

use crate::features::module::Kernel;
use crate::ground::error::{Error, Result};
use crate::objects::context::DeviceInfo;
use std::sync::OnceLock;

/// Which launches use programmatic dependent launch, for the process
/// (`CUDA_STREAMS_PDL`, [`PDL_SETTING`]).
///
/// ```
/// use cuda_streams_driver::PdlPolicy;
/// assert_eq!(PdlPolicy::parse("opt-in"), Ok(PdlPolicy::OptIn));
/// assert_eq!(PdlPolicy::default(), PdlPolicy::OptIn);
/// assert!(PdlPolicy::parse("always").unwrap_err().contains("off, opt-in or declared"));
/// ```
///
/// Not `#[non_exhaustive]`: the three cover every launch (none, those
/// asked, all that may).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PdlPolicy {
    /// No launch is programmatic; launches asked to be launch plain.
    Off,
    /// Only the launches asked for one at a time.
    #[default]
    OptIn,
    /// Those, and every checked launch of a kernel that declares
    /// `cudaGridDependencySynchronize`, where the device has PDL.
    Declared,
}

impl PdlPolicy {
    /// The policy `value` names: `off`, `opt-in` or `declared`.
    pub fn parse(value: &str) -> std::result::Result<Self, String> {
        match value.trim() {
            "off" => Ok(Self::Off),
            "opt-in" => Ok(Self::OptIn),
            "declared" => Ok(Self::Declared),
            other => Err(format!(
                "{other:?} is no programmatic dependent launch policy: expected off, opt-in or \
                 declared"
            )),
        }
    }

    /// The process's policy: `CUDA_STREAMS_PDL`, read once, or
    /// [`PdlPolicy::OptIn`]. A value that does not parse is an error naming
    /// it, at every launch that would need it.
    pub fn from_env() -> Result<Self> {
        match Self::read_env() {
            Ok(policy) => Ok(*policy),
            Err(err) => Err(Error::from(err.clone())),
        }
    }

    /// The setting, read once per process.
    #[inline]
    fn read_env() -> &'static std::result::Result<PdlPolicy, sys::env::EnvError> {
        static FROM_ENV: OnceLock<std::result::Result<PdlPolicy, sys::env::EnvError>> =
            OnceLock::new();
        FROM_ENV.get_or_init(|| match PDL_SETTING.from_env()? {
            None => Ok(Self::default()),
            Some(found) => Self::parse(&found.value).map_err(|reason| found.error(reason)),
        })
    }

    /// [`PdlPolicy::from_env`] where the setting is valid, without building
    /// a `Result` around it: what a launch reads (`None` sends it to
    /// `from_env` for the error).
    #[inline]
    pub(crate) fn cached() -> Option<Self> {
        Self::read_env().as_ref().ok().copied()
    }
}

/// `CUDA_STREAMS_PDL`: which launches use programmatic dependent launch.
pub const PDL_SETTING: sys::env::Setting = sys::env::Setting {
    name: "CUDA_STREAMS_PDL",
    aliases: &[],
    default: "opt-in",
    about: "programmatic dependent launch: off, opt-in (launches that ask) or declared (every \
            kernel that declares cudaGridDependencySynchronize)",
};

/// What a launch asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dependency {
    /// A plain launch (programmatic only under [`PdlPolicy::Declared`]).
    Stream,
    /// A programmatic dependent launch, asked for.
    Programmatic,
}

impl Dependency {
    /// Whether the launch of `kernel` on `device` is programmatic, or why
    /// it is refused.
    #[inline]
    pub(crate) fn resolve(self, kernel: &Kernel, device: &DeviceInfo) -> Result<bool> {
        let declares_sync = kernel.declares_grid_dependency_sync();
        if self == Self::Stream && !declares_sync {
            return Ok(false);
        }
        // A launch that asks, of a kernel that may, on a device that can,
        // under a policy that lets it: `decide`'s answer without its call.
        if self == Self::Programmatic
            && declares_sync
            && device.compute_capability.0 >= 9
            && matches!(
                PdlPolicy::cached(),
                Some(PdlPolicy::OptIn | PdlPolicy::Declared)
            )
        {
            return Ok(true);
        }
        decide(
            PdlPolicy::from_env()?,
            self,
            kernel.name(),
            kernel.declares_grid_dependency_sync(),
            device,
        )
    }
}

/// The decision, from plain values.
fn decide(
    policy: PdlPolicy,
    asked: Dependency,
    kernel: &str,
    declares_sync: bool,
    device: &DeviceInfo,
) -> Result<bool> {
    let supported = device.compute_capability.0 >= 9;
    match asked {
        Dependency::Programmatic if !declares_sync => Err(Error::NoGridDependencySync {
            kernel: kernel.to_string(),
        }),
        Dependency::Programmatic if policy == PdlPolicy::Off => Ok(false),
        Dependency::Programmatic if !supported => Err(Error::ProgrammaticLaunchUnsupported {
            ordinal: device.ordinal,
            name: device.name.clone(),
            compute_capability: device.compute_capability,
        }),
        Dependency::Programmatic => Ok(true),
        Dependency::Stream => Ok(policy == PdlPolicy::Declared && declares_sync && supported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(major: u32) -> DeviceInfo {
        DeviceInfo {
            ordinal: 3,
            name: "Old GPU".into(),
            compute_capability: (major, 0),
            ..DeviceInfo::default()
        }
    }

    #[test]
    fn each_policy_decides_as_documented() {
        use Dependency::{Programmatic, Stream};
        use PdlPolicy::{Declared, Off, OptIn};
        let hopper = device(9);
        let ask = |policy, asked, sync| decide(policy, asked, "k", sync, &hopper);
        // Asked: programmatic unless off; never for a kernel without sync.
        assert!(ask(OptIn, Programmatic, true).unwrap());
        assert!(ask(Declared, Programmatic, true).unwrap());
        assert!(!ask(Off, Programmatic, true).unwrap());
        for policy in [Off, OptIn, Declared] {
            let err = ask(policy, Programmatic, false).unwrap_err();
            assert!(matches!(err, Error::NoGridDependencySync { ref kernel } if kernel == "k"));
        }
        // Plain: programmatic only under `declared`, for a kernel with sync.
        assert!(!ask(Off, Stream, true).unwrap());
        assert!(!ask(OptIn, Stream, true).unwrap());
        assert!(ask(Declared, Stream, true).unwrap());
        assert!(!ask(Declared, Stream, false).unwrap());
    }

    #[test]
    fn a_device_below_9_0_refuses_a_request_and_launches_the_policy_plain() {
        let ampere = device(8);
        let err = decide(
            PdlPolicy::OptIn,
            Dependency::Programmatic,
            "k",
            true,
            &ampere,
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("device 3 (Old GPU) has 8.0"), "{message}");
        assert!(!decide(PdlPolicy::Declared, Dependency::Stream, "k", true, &ampere).unwrap());
        // Off: the request launches plain, on any device.
        assert!(!decide(PdlPolicy::Off, Dependency::Programmatic, "k", true, &ampere).unwrap());
    }
}
