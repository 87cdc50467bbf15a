//! The one device's primary context and the per-thread current context.
//!
//! There is a single context (the primary context of device 0). What the
//! software driver does enforce, as a GPU does, is that a thread has made it
//! current (`cuCtxSetCurrent`) before calls that need one: that is the bug an
//! upper layer makes when it forgets to bind the context on a new thread, and it
//! should fail here, not first on the H200.

use crate::errors::{Status, code, write_out};
use crate::handles::mint;
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use sys::{CUcontext, CUdevice, CUresult};

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

static RETAINED: AtomicUsize = AtomicUsize::new(0);

/// The primary context's handle value (minted once).
pub(crate) fn primary() -> usize {
    static PRIMARY: OnceLock<usize> = OnceLock::new();
    *PRIMARY.get_or_init(mint)
}

/// `CUDA_ERROR_INVALID_CONTEXT` unless this thread has the (retained) primary
/// context current.
pub(crate) fn require() -> Status {
    if CURRENT.with(Cell::get) == primary() && RETAINED.load(Ordering::Acquire) > 0 {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }
}

/// `CUDA_ERROR_INVALID_DEVICE` unless `dev` is device 0.
pub(crate) fn check_device(dev: CUdevice) -> Status {
    if dev == 0 {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }
}

/// `CUDA_ERROR_INVALID_CONTEXT` unless `ctx` is the primary context (or null,
/// which CUDA reads as "the current one" in the peer calls).
pub(crate) fn check_context(ctx: CUcontext) -> Status {
    if ctx.is_null() || ctx as usize == primary() {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    }
}

pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    code((|| {
        check_device(dev)?;
        // SAFETY: pctx is null or writable per the API.
        unsafe { write_out(pctx, primary() as CUcontext) }?;
        RETAINED.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    code((|| {
        check_device(dev)?;
        RETAINED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)
    })())
}

pub(crate) unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    let ctx = ctx as usize;
    if ctx != 0 && (ctx != primary() || RETAINED.load(Ordering::Acquire) == 0) {
        return CUresult::CUDA_ERROR_INVALID_CONTEXT;
    }
    CURRENT.with(|current| current.set(ctx));
    CUresult::CUDA_SUCCESS
}

pub(crate) unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    let current = CURRENT.with(Cell::get) as CUcontext;
    // SAFETY: pctx is null or writable per the API.
    code(unsafe { write_out(pctx, current) })
}

pub(crate) unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    code((|| {
        require()?;
        crate::stream::synchronize_all();
        crate::memory::trim_pool_at_sync();
        crate::faults::context_fault()
    })())
}

/// CUDA's range on the H200: 0 is the least priority, -5 the greatest.
pub(crate) const LEAST_PRIORITY: c_int = 0;
/// See [`LEAST_PRIORITY`].
pub(crate) const GREATEST_PRIORITY: c_int = -5;

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
