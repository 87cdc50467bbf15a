//! Copies, memsets and prefetch: ordered stream work on host memory.
//!
//! Pointers that claim to be device memory must lie inside a live allocation
//! (checked at the call, `CUDA_ERROR_INVALID_VALUE` with a detail otherwise,
//! and again when the worker runs the operation); host pointers are trusted,
//! as CUDA trusts them. Copies may involve memory of any device (the driver
//! stages them when no peer access is enabled, as CUDA does); a memset writes
//! only memory its stream's device may access.

use crate::context::{check_context, require};
use crate::errors::{code, fail};
use crate::memory::{Kind, check_device, check_device_access, owner};
use crate::ops::{Action, Template};
use crate::stream::resolve;
use std::ffi::{c_uchar, c_uint, c_void};
use sys::{CUcontext, CUdeviceptr, CUmemLocation, CUmemLocationType, CUresult, CUstream};

fn host(ptr: *const c_void, len: usize) -> Result<usize, CUresult> {
    if ptr.is_null() && len > 0 {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "null host pointer",
        ));
    }
    Ok(ptr as usize)
}

fn copy(
    dst: usize,
    src: usize,
    len: usize,
    dst_device: bool,
    src_device: bool,
    stream: CUstream,
) -> Result<(), CUresult> {
    require()?;
    let stream = resolve(stream)?;
    if dst_device {
        check_device(dst, len, "copy destination")?;
    }
    if src_device {
        check_device(src, len, "copy source")?;
    }
    stream.submit(&[Template::Act(Action::Copy {
        dst,
        src,
        len,
        dst_device,
        src_device,
    })])
}

fn device_to_device(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    copy(dst as usize, src as usize, len, true, true, stream)
}

/// Submit `action`, a memset of `count` values `width` bytes wide at `dst`,
/// once the stream, the alignment and then the range have been checked.
fn memset(
    stream: CUstream,
    dst: CUdeviceptr,
    count: usize,
    width: usize,
    action: Action,
) -> Result<(), CUresult> {
    require()?;
    let stream = resolve(stream)?;
    let dst = dst as usize;
    if !dst.is_multiple_of(width) {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!(
                "{}-bit memset destination {dst:#x} is not {width}-byte aligned",
                width * 8
            ),
        ));
    }
    let len = count
        .checked_mul(width)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    check_device_access(dst, len, stream.device, "memset destination")?;
    stream.submit(&[Template::Act(action)])
}

pub(crate) unsafe extern "C" fn cuMemcpyHtoDAsync(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    code(
        host(srcHost, ByteCount)
            .and_then(|src| copy(dstDevice as usize, src, ByteCount, true, false, hStream)),
    )
}

pub(crate) unsafe extern "C" fn cuMemcpyDtoHAsync(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    code(
        host(dstHost, ByteCount)
            .and_then(|dst| copy(dst, srcDevice as usize, ByteCount, false, true, hStream)),
    )
}

pub(crate) unsafe extern "C" fn cuMemcpyDtoDAsync(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    code(device_to_device(dstDevice, srcDevice, ByteCount, hStream))
}

pub(crate) unsafe extern "C" fn cuMemcpyPeerAsync(
    dstDevice: CUdeviceptr,
    dstContext: CUcontext,
    srcDevice: CUdeviceptr,
    srcContext: CUcontext,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let dst_dev = check_context(dstContext)?;
        let src_dev = check_context(srcContext)?;
        // Each pointer must be memory of its context's device, as the call
        // promises the driver.
        for (ptr, dev, what) in [
            (dstDevice, dst_dev, "cuMemcpyPeerAsync destination"),
            (srcDevice, src_dev, "cuMemcpyPeerAsync source"),
        ] {
            let found = owner(ptr as usize, ByteCount, what)?;
            if found != dev {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "{what} {ptr:#x} is memory of device {found}, not of its context's \
                         device {dev}"
                    ),
                ));
            }
        }
        device_to_device(dstDevice, srcDevice, ByteCount, hStream)
    })())
}

pub(crate) unsafe extern "C" fn cuMemsetD8Async(
    dstDevice: CUdeviceptr,
    uc: c_uchar,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    let action = Action::Set8 {
        dst: dstDevice as usize,
        value: uc,
        count: N,
    };
    code(memset(hStream, dstDevice, N, 1, action))
}

pub(crate) unsafe extern "C" fn cuMemsetD32Async(
    dstDevice: CUdeviceptr,
    ui: c_uint,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    let action = Action::Set32 {
        dst: dstDevice as usize,
        value: ui,
        count: N,
    };
    code(memset(hStream, dstDevice, N, 4, action))
}

pub(crate) unsafe extern "C" fn cuMemPrefetchAsync(
    devPtr: CUdeviceptr,
    count: usize,
    location: CUmemLocation,
    flags: c_uint,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let stream = resolve(hStream)?;
        let to_device = location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        let to_host = location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST
            || location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA
            || location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
        if to_device {
            crate::device::check_device(location.id)?;
        }
        if !(to_device || to_host) || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let kind = check_device(devPtr as usize, count, "prefetch range")?;
        if kind != Kind::Managed {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("prefetch of {devPtr:#x}: only managed memory can be prefetched"),
            ));
        }
        // Managed memory is already where the software device reads it: the
        // prefetch is an ordered no-op.
        stream.submit(&[Template::Act(Action::Nop)])
    })())
}
