//! `cuda-streams info`: what driver answered and what each device is.
//!
//! This talks to the raw function table on purpose: it must work, and say
//! something useful, even where the safe layer cannot create a context.

use driver::{DriverChoice, DriverKind, LoadedDriver};
use std::ffi::{CStr, c_char};
use sys::{CUdevice, CUdevice_attribute};

pub(crate) fn run() -> Result<(), String> {
    let choice = DriverChoice::from_env().map_err(|e| e.to_string())?;
    let loaded = match driver::select(choice) {
        Ok(loaded) => loaded,
        Err(err) => {
            // Asked for the GPU and there is none: say so plainly, and succeed,
            // because "no GPU here" is an answer, not a failure of this command.
            println!("No CUDA driver could be used on this machine: {err}");
            return Ok(());
        }
    };
    if choice == DriverChoice::Auto && loaded.kind == DriverKind::Soft {
        println!(
            "No GPU answered (libcuda.so.1 did not load or found no device); using the software driver."
        );
    }
    print(&loaded).map_err(|e| e.to_string())
}

fn print(loaded: &LoadedDriver) -> Result<(), sys::DriverError> {
    let d = loaded.table;
    // SAFETY: every call below passes valid out-pointers of the declared types.
    unsafe {
        d.check((d.cuInit)(0))?;
        let mut version = 0;
        d.check((d.cuDriverGetVersion)(&mut version))?;
        let mut count = 0;
        d.check((d.cuDeviceGetCount)(&mut count))?;
        println!("driver:          {} (version {version})", loaded.name());
        println!("devices:         {count}");
        for ordinal in 0..count {
            let mut device: CUdevice = 0;
            d.check((d.cuDeviceGet)(&mut device, ordinal))?;
            print_device(loaded, ordinal, device)?;
        }
    }
    Ok(())
}

/// # Safety
/// `device` must be a device handle from `cuDeviceGet` on this driver.
unsafe fn print_device(
    loaded: &LoadedDriver,
    ordinal: i32,
    device: CUdevice,
) -> Result<(), sys::DriverError> {
    let d = loaded.table;
    let attribute = |attribute: CUdevice_attribute| -> Result<i32, sys::DriverError> {
        let mut value = 0;
        // SAFETY: a valid device and an out-pointer to one int.
        d.check(unsafe { (d.cuDeviceGetAttribute)(&mut value, attribute, device) })?;
        Ok(value)
    };
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer holds 256 bytes and the length passed says so.
    d.check(unsafe { (d.cuDeviceGetName)(name.as_mut_ptr(), name.len() as i32, device) })?;
    // SAFETY: cuDeviceGetName writes a NUL-terminated string within the buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut total = 0usize;
    // SAFETY: an out-pointer to one size_t.
    d.check(unsafe { (d.cuDeviceTotalMem)(&mut total, device) })?;
    let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let engines = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)?;
    let pools = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
    let managed = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)?;

    // The priority range is a property of a context: bind the primary one briefly.
    let mut context = std::ptr::null_mut();
    // SAFETY: valid device and out-pointer; the context is released below.
    d.check(unsafe { (d.cuDevicePrimaryCtxRetain)(&mut context, device) })?;
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: `context` was just retained; the out-pointers are valid ints.
    let range = unsafe {
        d.check((d.cuCtxSetCurrent)(context))
            .and_then(|()| d.check((d.cuCtxGetStreamPriorityRange)(&mut least, &mut greatest)))
    };
    // SAFETY: releases the reference retained above, exactly once.
    let released = d.check(unsafe { (d.cuDevicePrimaryCtxRelease)(device) });
    range?;
    released?;

    println!("device {ordinal}:        {name}");
    println!("  compute capability: {major}.{minor}");
    println!("  multiprocessors:    {sms}");
    println!(
        "  memory:             {:.1} GiB ({total} bytes)",
        total as f64 / (1u64 << 30) as f64
    );
    println!("  async copy engines: {engines}");
    println!("  stream priorities:  {least} (least) to {greatest} (greatest)");
    println!(
        "  memory pools:       {}",
        if pools != 0 {
            "supported"
        } else {
            "not supported"
        }
    );
    println!(
        "  managed memory:     {}",
        if managed != 0 {
            "concurrent access"
        } else {
            "no concurrent access"
        }
    );
    if loaded.kind == DriverKind::Soft {
        println!(
            "  (software driver: device memory is host memory, capped at the capacity above; \
             set CUDA_STREAMS_SOFT_CAPACITY_MB to change it)"
        );
    }
    Ok(())
}
