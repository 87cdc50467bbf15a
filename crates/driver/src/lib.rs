//! Safe RAII layer over the CUDA driver: the same code runs on NVIDIA's driver
//! and on the software driver.

mod error;
mod select;

pub use error::{Error, Result};
pub use select::{DRIVER_ENV, DriverChoice, DriverKind, LoadedDriver, driver, select};
