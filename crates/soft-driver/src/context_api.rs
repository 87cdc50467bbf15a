//! The context entry points (`cuCtx*`, `cuDevicePrimaryCtx*`): retaining
//! and releasing primary contexts, making one current, peer access, and
//! synchronizing a context. What a context is and how calls find the current
//! one is `context`'s; these calls change it, and reach the streams, memory
//! and sticky errors that a context's life touches.

use crate::context::{
    GREATEST_PRIORITY, LEAST_PRIORITY, check_context, current_handle, disable_peer_access,
    enable_peer_access, not_in_host_function, primary_handle, release_primary, require,
    retain_primary, set_current,
};
use crate::device::check_device;
use crate::errors::{code, fail, write_out};
use std::ffi::{c_int, c_uint};
use sys::{CUcontext, CUdevice, CUresult};

pub(crate) unsafe extern "C" fn cuCtxEnablePeerAccess(
    peerContext: CUcontext,
    Flags: c_uint,
) -> CUresult {
    code((|| {
        let dev = require()?;
        if Flags != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuCtxEnablePeerAccess: flags must be 0, not {Flags}"),
            ));
        }
        if peerContext.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_CONTEXT,
                "cuCtxEnablePeerAccess: the peer context is null",
            ));
        }
        let peer = check_context(peerContext)?;
        if peer == dev {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_DEVICE,
                format!("cuCtxEnablePeerAccess: device {dev} cannot be its own peer"),
            ));
        }
        if !enable_peer_access(dev, peer) {
            return Err(fail(
                CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
                format!("peer access from device {dev} to device {peer} is already enabled"),
            ));
        }
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuCtxDisablePeerAccess(peerContext: CUcontext) -> CUresult {
    code((|| {
        let dev = require()?;
        let peer = check_context(peerContext)?;
        if disable_peer_access(dev, peer) {
            Ok(())
        } else {
            Err(fail(
                CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
                format!("peer access from device {dev} to device {peer} is not enabled"),
            ))
        }
    })())
}

pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    code((|| {
        not_in_host_function("cuDevicePrimaryCtxRetain")?;
        check_device(dev)?;
        // SAFETY: pctx is null or writable per the API.
        unsafe { write_out(pctx, primary_handle(dev) as CUcontext) }?;
        retain_primary(dev);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    code((|| {
        not_in_host_function("cuDevicePrimaryCtxRelease")?;
        check_device(dev)?;
        if release_primary(dev)? {
            // The context is gone (its peer access with it): so is its
            // sticky error (a new context starts clean, as on a GPU).
            crate::faults::forget_context(dev);
        }
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    if let Err(code) = not_in_host_function("cuCtxSetCurrent") {
        return code;
    }
    let ctx = ctx as usize;
    if ctx != 0 && check_context(ctx as CUcontext).is_err() {
        return CUresult::CUDA_ERROR_INVALID_CONTEXT;
    }
    set_current(ctx);
    CUresult::CUDA_SUCCESS
}

pub(crate) unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    let current = current_handle() as CUcontext;
    // SAFETY: pctx is null or writable per the API.
    code(unsafe { write_out(pctx, current) })
}

pub(crate) unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    code((|| {
        let dev = require()?;
        crate::stream::refuse_during_capture("cuCtxSynchronize")?;
        crate::stream::synchronize_all(dev);
        crate::memory::trim_pool_at_sync();
        crate::sticky_errors::context_fault(dev)
    })())
}

pub(crate) unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    leastPriority: *mut c_int,
    greatestPriority: *mut c_int,
) -> CUresult {
    if let Err(code) = require() {
        return code;
    }
    // CUDA accepts null for either out-pointer and skips it.
    if !leastPriority.is_null() {
        // SAFETY: non-null, writable per the API.
        unsafe { leastPriority.write(LEAST_PRIORITY) };
    }
    if !greatestPriority.is_null() {
        // SAFETY: non-null, writable per the API.
        unsafe { greatestPriority.write(GREATEST_PRIORITY) };
    }
    CUresult::CUDA_SUCCESS
}
