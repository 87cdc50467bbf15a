//! Every setting this crate reads from the environment, from every layer
//! (the driver's choice on the ground, the order policy of the enqueue
//! protocol), listed and checked together.

use crate::ground::error::Result;

/// Every setting this crate reads from the environment, with the software
/// driver's: [`crate::DRIVER_SETTING`], `CUDA_STREAMS_SOFT_DEVICES`,
/// `CUDA_STREAMS_SOFT_CAPACITY_MB`, `CUDA_STREAMS_SOFT_SHUFFLE`,
/// [`crate::ORDERING_SETTING`] and [`crate::PDL_SETTING`].
///
/// ```
/// use cuda_streams_driver::DRIVER_SETTINGS;
/// let names: Vec<_> = DRIVER_SETTINGS.iter().map(|s| s.name).collect();
/// assert_eq!(
///     names,
///     [
///         "CUDA_STREAMS_DRIVER",
///         "CUDA_STREAMS_SOFT_DEVICES",
///         "CUDA_STREAMS_SOFT_CAPACITY_MB",
///         "CUDA_STREAMS_SOFT_SHUFFLE",
///         "CUDA_STREAMS_ORDERING",
///         "CUDA_STREAMS_PDL",
///     ]
/// );
/// ```
pub const DRIVER_SETTINGS: [sys::env::Setting; 6] = [
    crate::ground::select::DRIVER_SETTING,
    soft_driver::DEVICES_SETTING,
    soft_driver::CAPACITY_SETTING,
    soft_driver::SHUFFLE_SETTING,
    crate::enqueue::order::ORDERING_SETTING,
    crate::features::pdl_policy::PDL_SETTING,
];

/// Check every setting in [`DRIVER_SETTINGS`], whichever driver would be
/// selected: the first bad value is an error naming its variable.
///
/// ```
/// // Unset or valid in the doctest's environment.
/// cuda_streams_driver::check_env().unwrap();
/// ```
pub fn check_env() -> Result<()> {
    crate::ground::select::DriverChoice::from_env()?;
    soft_driver::check_env()?;
    crate::enqueue::order::policy_from_env()?;
    crate::features::pdl_policy::PdlPolicy::from_env()?;
    Ok(())
}
