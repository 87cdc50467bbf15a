//! The result layer's calls that need no context: the driver's version and
//! its device count, each after `cuInit`. Public through
//! [`result`](crate::result), with the calls on a context or a stream.

use crate::ground::error::Result;
use crate::ground::loaded_driver::LoadedDriver;
use std::ffi::c_int;
use sys::{CUresult, Driver};

/// The version of CUDA the driver implements, as `cuDriverGetVersion`
/// reports it (`1000 * major + 10 * minor`), after `cuInit`.
pub fn driver_version(driver: LoadedDriver) -> Result<i32> {
    // SAFETY: writes one int through a valid pointer.
    init_then_read(driver, |table, out| unsafe {
        (table.cuDriverGetVersion)(out)
    })
}

/// How many devices the driver has (`cuDeviceGetCount`), after `cuInit`.
pub fn device_count(driver: LoadedDriver) -> Result<i32> {
    // SAFETY: writes one int through a valid pointer.
    init_then_read(driver, |table, out| unsafe {
        (table.cuDeviceGetCount)(out)
    })
}

/// `cuInit`, then the one int `read` has the driver write through `out`.
fn init_then_read(
    driver: LoadedDriver,
    read: impl FnOnce(&Driver, &mut c_int) -> CUresult,
) -> Result<i32> {
    let table = driver.table;
    // SAFETY: cuInit takes flags (0) and no pointers.
    table.check(unsafe { (table.cuInit)(0) })?;
    let mut value = 0;
    table.check(read(table, &mut value))?;
    Ok(value)
}
