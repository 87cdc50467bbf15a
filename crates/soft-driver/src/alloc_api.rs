//! Allocation entry points: device, stream-ordered, pinned and managed memory.

use crate::context::require;
use crate::device::check_device;
use crate::errors::{code, fail, write_out};
use crate::memory::{
    Kind, allocate, begin_free_async, cancel_free_async, device_capacity, free, info,
};
use crate::ops::{Action, Template};
use crate::stream::resolve;
use std::ffi::{c_uint, c_void};
use sys::{CUdevice, CUdeviceptr, CUmemAttach_flags, CUmemoryPool, CUresult, CUstream};

pub(crate) unsafe extern "C" fn cuMemGetInfo(free: *mut usize, total: *mut usize) -> CUresult {
    code((|| {
        let (free_bytes, total_bytes) = info(require()?);
        // SAFETY: null or writable per the API.
        unsafe { write_out(free, free_bytes) }?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(total, total_bytes) }
    })())
}

/// A device's memory, as `cuMemGetInfo` reports its total (the device's
/// capacity).
pub(crate) unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut usize, dev: CUdevice) -> CUresult {
    if let Err(code) = check_device(dev) {
        return code;
    }
    // SAFETY: null or writable per the API.
    code(unsafe { write_out(bytes, device_capacity(dev)) })
}

/// Allocate and hand the pointer out through `out` (checked first, so that
/// nothing is allocated for a call that cannot return the pointer).
///
/// # Safety
/// `out` is null or writable.
unsafe fn allocate_into(
    out: *mut CUdeviceptr,
    size: usize,
    kind: Kind,
    device: i32,
) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = allocate(size, kind, device)?;
    // SAFETY: non-null; writable per the caller's contract.
    unsafe { write_out(out, ptr as CUdeviceptr) }
}

/// A stream-ordered allocation on `device`: the address is returned at once,
/// and the memory becomes usable when `stream` reaches this point (as
/// memcheck sees it on a GPU): work on other streams must be ordered after it.
///
/// # Safety
/// `out` is null or writable.
unsafe fn allocate_ordered(
    out: *mut CUdeviceptr,
    size: usize,
    stream: &std::sync::Arc<crate::stream::Stream>,
    device: i32,
) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = allocate(size, Kind::Pool, device)?;
    if let Err(err) = stream.submit(&[Template::Act(Action::Ready(ptr))]) {
        let _ = free(ptr, &[Kind::Pool]);
        return Err(err);
    }
    // SAFETY: non-null; writable per the caller's contract.
    unsafe { write_out(out, ptr as CUdeviceptr) }
}

pub(crate) unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    code((|| {
        let dev = require()?;
        // SAFETY: null or writable per the API.
        unsafe { allocate_into(dptr, bytesize, Kind::Device, dev) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemFree(dptr: CUdeviceptr) -> CUresult {
    code(free(
        dptr as usize,
        &[Kind::Device, Kind::Pool, Kind::Managed],
    ))
}

pub(crate) unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let stream = resolve(hStream)?;
        if stream.state().capture.is_some() {
            // SAFETY: null or writable per the API.
            return unsafe {
                crate::graph_memory::allocate_in_capture(dptr, bytesize, &stream, stream.device)
            };
        }
        stream.check_usable()?;
        // From the stream's device's default pool.
        // SAFETY: null or writable per the API.
        unsafe { allocate_ordered(dptr, bytesize, &stream, stream.device) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let pool = crate::pool::resolve_pool(pool)?;
        let stream = resolve(hStream)?;
        let device = match pool {
            crate::pool::Pool::Default(device) => device,
            crate::pool::Pool::Host(handle) => {
                if stream.state().capture.is_some() {
                    return Err(fail(
                        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "cuMemAllocFromPoolAsync: the software driver captures no allocation \
                         from a pool of host memory into a graph",
                    ));
                }
                stream.check_usable()?;
                // SAFETY: null or writable per the API.
                return unsafe {
                    crate::host_pool::allocate_ordered(dptr, bytesize, handle, &stream)
                };
            }
        };
        if stream.state().capture.is_some() {
            // SAFETY: null or writable per the API.
            return unsafe {
                crate::graph_memory::allocate_in_capture(dptr, bytesize, &stream, device)
            };
        }
        stream.check_usable()?;
        // SAFETY: null or writable per the API.
        unsafe { allocate_ordered(dptr, bytesize, &stream, device) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    code((|| {
        require()?;
        let stream = resolve(hStream)?;
        let base = dptr as usize;
        if stream.state().capture.is_some() {
            return crate::graph_memory::free_in_capture(base, &stream);
        }
        stream.check_usable()?;
        begin_free_async(base)?;
        stream
            .submit(&[Template::Act(Action::Free(base))])
            .inspect_err(|_| cancel_free_async(base))
    })())
}

pub(crate) unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    Flags: c_uint,
) -> CUresult {
    code((|| {
        let dev = require()?;
        let known = sys::CU_MEMHOSTALLOC_PORTABLE
            | sys::CU_MEMHOSTALLOC_DEVICEMAP
            | sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        if Flags & !known != 0 || pp.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = allocate(bytesize, Kind::Pinned, dev)?;
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(pp, ptr as *mut c_void) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    code(free(p as usize, &[Kind::Pinned]))
}

pub(crate) unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    code((|| {
        let dev = require()?;
        if flags != CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0
            && flags != CUmemAttach_flags::CU_MEM_ATTACH_HOST.0
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: null or writable per the API.
        unsafe { allocate_into(dptr, bytesize, Kind::Managed, dev) }
    })())
}
