//! The device, the context and error names through the driver table.

mod common;

use common::*;
use std::ffi::{CStr, c_char};
use sys::{CUdevice_attribute as A, CUresult};

fn attribute(table: &sys::Driver, attr: A) -> i32 {
    let mut value = -1;
    // SAFETY: valid out-pointer, device 0.
    ok(unsafe { (table.cuDeviceGetAttribute)(&mut value, attr, 0) });
    value
}

#[test]
fn the_device_describes_itself() {
    let table = table();
    let (mut count, mut version) = (0, 0);
    let mut name = [0 as c_char; 128];
    // SAFETY: valid out-pointers and buffer length.
    unsafe {
        ok((table.cuDeviceGetCount)(&mut count));
        ok((table.cuDriverGetVersion)(&mut version));
        ok((table.cuDeviceGetName)(
            name.as_mut_ptr(),
            name.len() as i32,
            0,
        ));
    }
    assert!(count >= 1);
    assert!(version >= 13000, "CUDA 13.0 or newer: {version}");
    // SAFETY: NUL-terminated by the driver.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_str().unwrap();
    assert!(!name.is_empty());
    if !is_gpu() {
        assert_eq!(name, soft_driver::DEVICE_NAME);
    }
    assert_eq!(attribute(table, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
    assert_eq!(
        attribute(table, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        1024
    );
    assert!(attribute(table, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) >= 1);
    assert!(attribute(table, A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT) >= 1);
    assert_eq!(
        attribute(table, A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED),
        1
    );
    assert_eq!(
        attribute(table, A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED),
        1
    );
    assert_eq!(
        attribute(table, A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS),
        1
    );
    let mut total = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { (table.cuDeviceTotalMem)(&mut total, 0) });
    assert!(total > 0);
}

#[test]
fn other_ordinals_are_invalid_devices() {
    let table = table();
    let mut count = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { (table.cuDeviceGetCount)(&mut count) });
    let mut dev = 0;
    // SAFETY: valid out-pointer.
    let code = unsafe { (table.cuDeviceGet)(&mut dev, count) };
    expect(code, CUresult::CUDA_ERROR_INVALID_DEVICE);
}

#[test]
fn the_primary_context_is_current_and_refcounted() {
    let table = table();
    let mut current = std::ptr::null_mut();
    let mut again = std::ptr::null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        ok((table.cuCtxGetCurrent)(&mut current));
        ok((table.cuDevicePrimaryCtxRetain)(&mut again, 0));
        ok((table.cuDevicePrimaryCtxRelease)(0));
    }
    assert!(!current.is_null());
    assert_eq!(current, again, "one primary context per device");
}

#[test]
fn every_error_has_a_name_and_a_description() {
    let table = table();
    for code in [
        CUresult::CUDA_SUCCESS,
        CUresult::CUDA_ERROR_INVALID_VALUE,
        CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        CUresult::CUDA_ERROR_INVALID_HANDLE,
        CUresult::CUDA_ERROR_NOT_READY,
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
        CUresult::CUDA_ERROR_NOT_FOUND,
    ] {
        let (mut name, mut text): (*const c_char, *const c_char) =
            (std::ptr::null(), std::ptr::null());
        // SAFETY: valid out-pointers; the strings are static.
        unsafe {
            ok((table.cuGetErrorName)(code, &mut name));
            ok((table.cuGetErrorString)(code, &mut text));
            assert_eq!(
                CStr::from_ptr(name).to_str().unwrap(),
                sys::error_name(code).unwrap()
            );
            assert!(!CStr::from_ptr(text).to_bytes().is_empty());
        }
    }
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: valid out-pointer.
    let code = unsafe { (table.cuGetErrorName)(CUresult(987_654), &mut name) };
    expect(code, CUresult::CUDA_ERROR_INVALID_VALUE);
}
