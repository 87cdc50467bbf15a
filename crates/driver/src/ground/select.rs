//! Choosing between the CUDA driver and the software driver.
//!
//! `CUDA_STREAMS_DRIVER=cuda|soft|auto` (default `auto`): `auto` takes the GPU when
//! `libcuda.so.1` loads and a device answers, and the software driver otherwise,
//! saying which in one log line. `cuda` never falls back: without a GPU it is an
//! error, so a GPU test run cannot pass on the software driver by accident.

use crate::ground::error::{Error, Result};
use crate::ground::loaded_driver::{DriverKind, LoadedDriver};
use std::sync::OnceLock;
use sys::{CUresult, Driver};

/// The environment variable that selects the driver.
pub const DRIVER_ENV: &str = "CUDA_STREAMS_DRIVER";

/// `CUDA_STREAMS_DRIVER` as a setting (for listings such as `cuda-streams info`).
pub const DRIVER_SETTING: sys::env::Setting = sys::env::Setting {
    name: DRIVER_ENV,
    aliases: &[],
    default: "auto",
    about: "the driver: cuda, soft or auto (the GPU when one answers)",
};

/// What the user asked for, usually through `CUDA_STREAMS_DRIVER`.
///
/// ```
/// use cuda_streams_driver::DriverChoice;
/// assert_eq!(DriverChoice::parse("CUDA").unwrap(), DriverChoice::Cuda);
/// assert_eq!(DriverChoice::parse("software").unwrap(), DriverChoice::Soft);
/// assert_eq!(DriverChoice::parse("").unwrap(), DriverChoice::Auto);
/// let err = DriverChoice::parse("tpu").unwrap_err();
/// assert!(err.to_string().contains("tpu"), "{err}");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DriverChoice {
    /// The GPU, or an error.
    Cuda,
    /// The software driver.
    Soft,
    /// The GPU when one answers, else the software driver.
    #[default]
    Auto,
}

impl DriverChoice {
    /// Parse `cuda`, `soft` or `auto` (case-insensitive).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "cuda" | "gpu" => Ok(Self::Cuda),
            "soft" | "software" => Ok(Self::Soft),
            "auto" | "" => Ok(Self::Auto),
            _ => Err(Error::InvalidDriverChoice {
                value: value.to_string(),
            }),
        }
    }

    /// The choice made by `CUDA_STREAMS_DRIVER`, `Auto` when it is unset.
    pub fn from_env() -> Result<Self> {
        match DRIVER_SETTING.from_env()? {
            Some(found) => Self::parse(&found.value),
            None => Ok(Self::Auto),
        }
    }
}

/// The process-wide driver, selected from `CUDA_STREAMS_DRIVER` on first use.
///
/// ```
/// let driver = cuda_streams_driver::driver().unwrap();
/// println!("running on the {} driver", driver.name());
/// ```
pub fn driver() -> Result<LoadedDriver> {
    static SELECTED: OnceLock<std::result::Result<LoadedDriver, String>> = OnceLock::new();
    // The error is kept as text because `Error` is not `Clone`; the first caller
    // gets the typed error, later ones the same message.
    let mut first_error = None;
    let selected = SELECTED.get_or_init(|| match DriverChoice::from_env().and_then(select) {
        Ok(driver) => {
            log_selection(&driver);
            Ok(driver)
        }
        Err(err) => {
            let text = err.to_string();
            first_error = Some(err);
            Err(text)
        }
    });
    match (selected, first_error) {
        (Ok(driver), _) => Ok(*driver),
        (Err(_), Some(err)) => Err(err),
        (Err(text), None) => Err(Error::Selection(text.clone())),
    }
}

/// Select a driver without caching it: loads libcuda (and initialises it) when
/// the choice allows the GPU. The software driver is refused, with the error
/// naming the variable, while one of its settings
/// (`cuda_streams_soft_driver::check_env`) is bad.
pub fn select(choice: DriverChoice) -> Result<LoadedDriver> {
    match choice {
        DriverChoice::Soft => soft(),
        DriverChoice::Cuda => cuda(),
        DriverChoice::Auto => cuda().or_else(|_| soft()),
    }
}

fn soft() -> Result<LoadedDriver> {
    soft_driver::check_env()?;
    Ok(LoadedDriver {
        table: soft_driver::driver(),
        kind: DriverKind::Soft,
    })
}

fn cuda() -> Result<LoadedDriver> {
    static CUDA: OnceLock<Driver> = OnceLock::new();
    let table = match CUDA.get() {
        Some(table) => table,
        None => {
            let loaded = Driver::load()?;
            CUDA.get_or_init(|| loaded)
        }
    };
    // SAFETY: cuInit takes flags (which must be 0) and no pointers.
    let code = unsafe { (table.cuInit)(0) };
    table.check(code).map_err(Error::NoDevice)?;
    let mut count = 0;
    // SAFETY: cuDeviceGetCount writes one int through a valid pointer.
    let code = unsafe { (table.cuDeviceGetCount)(&mut count) };
    table.check(code).map_err(Error::NoDevice)?;
    if count == 0 {
        return Err(Error::NoDevice(
            CUresult::CUDA_ERROR_NO_DEVICE.result().unwrap_err(),
        ));
    }
    Ok(LoadedDriver {
        table,
        kind: DriverKind::Cuda,
    })
}

fn log_selection(driver: &LoadedDriver) {
    tracing::info!(driver = driver.name(), "driver selected");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!(DriverChoice::parse("cuda").unwrap(), DriverChoice::Cuda);
        assert_eq!(DriverChoice::parse("SOFT").unwrap(), DriverChoice::Soft);
        assert_eq!(DriverChoice::parse("auto").unwrap(), DriverChoice::Auto);
        let err = DriverChoice::parse("vulkan").unwrap_err();
        assert!(err.to_string().contains("\"vulkan\""), "{err}");
    }

    #[test]
    fn soft_is_always_available() {
        let driver = select(DriverChoice::Soft).unwrap();
        assert_eq!(driver.kind, DriverKind::Soft);
    }

    #[test]
    fn cuda_without_a_gpu_is_an_error_not_a_fallback() {
        match select(DriverChoice::Cuda) {
            Ok(driver) => assert_eq!(driver.kind, DriverKind::Cuda),
            Err(err) => assert!(matches!(err, Error::Load(_) | Error::NoDevice(_)), "{err}"),
        }
    }
}
