//! The one device's primary context and the per-thread current context.
//!
//! There is a single context (the primary context of device 0). What the
//! software driver does enforce, as a GPU does, is that a thread has made it
//! current (`cuCtxSetCurrent`) before calls that need one: that is the bug an
//! upper layer makes when it forgets to bind the context on a new thread, and it
//! should fail here, not first on the H200.
//!
//! Nor may a host function (`cuLaunchHostFunc`) call the driver: CUDA says such
//! a call may fail with `CUDA_ERROR_NOT_PERMITTED` (or deadlock). Here the
//! context calls and every call that needs a current context always fail so
//! from a host function, and are counted ([`refused_in_host_functions`]), so a
//! driver call made from a callback fails in tests instead of on the H200.

use crate::errors::{Status, code, fail, write_out};
use crate::handles::mint;
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use sys::{CUcontext, CUdevice, CUresult};

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// Set while a stream worker runs a host function on this thread.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

static RETAINED: AtomicUsize = AtomicUsize::new(0);
static REFUSED_IN_HOST_FNS: AtomicUsize = AtomicUsize::new(0);

/// How many times the primary context is retained (`cuDevicePrimaryCtxRetain`
/// less `cuDevicePrimaryCtxRelease`): 0 once every retain was released.
///
/// ```
/// // Nothing has retained the context in this process yet.
/// assert_eq!(cuda_streams_soft_driver::primary_context_retains(), 0);
/// ```
pub fn primary_context_retains() -> usize {
    RETAINED.load(Ordering::Acquire)
}

/// How many driver calls were refused with `CUDA_ERROR_NOT_PERMITTED`
/// because a host function (`cuLaunchHostFunc`) made them, since the process
/// started. Tests assert that it stays 0.
///
/// ```
/// assert_eq!(cuda_streams_soft_driver::refused_in_host_functions(), 0);
/// ```
pub fn refused_in_host_functions() -> usize {
    REFUSED_IN_HOST_FNS.load(Ordering::Acquire)
}

/// Run a host function's body, marking the thread as inside one.
pub(crate) fn as_host_function<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_HOST_FN.with(|flag| flag.set(self.0));
        }
    }
    let _reset = Reset(IN_HOST_FN.with(|flag| flag.replace(true)));
    f()
}

/// `CUDA_ERROR_NOT_PERMITTED` (counted, with a detail naming `call`) when the
/// calling thread is running a host function.
pub(crate) fn not_in_host_function(call: &str) -> Status {
    if IN_HOST_FN.with(Cell::get) {
        REFUSED_IN_HOST_FNS.fetch_add(1, Ordering::AcqRel);
        Err(fail(
            CUresult::CUDA_ERROR_NOT_PERMITTED,
            format!(
                "{call} from inside a host function (cuLaunchHostFunc), where CUDA forbids driver calls"
            ),
        ))
    } else {
        Ok(())
    }
}

/// The primary context's handle value (minted once).
pub(crate) fn primary() -> usize {
    static PRIMARY: OnceLock<usize> = OnceLock::new();
    *PRIMARY.get_or_init(mint)
}

/// `CUDA_ERROR_INVALID_CONTEXT` unless this thread has the (retained) primary
/// context current.
pub(crate) fn require() -> Status {
    not_in_host_function("a call that needs a current context")?;
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
        not_in_host_function("cuDevicePrimaryCtxRetain")?;
        check_device(dev)?;
        // SAFETY: pctx is null or writable per the API.
        unsafe { write_out(pctx, primary() as CUcontext) }?;
        RETAINED.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    code((|| {
        not_in_host_function("cuDevicePrimaryCtxRelease")?;
        check_device(dev)?;
        RETAINED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)
    })())
}

pub(crate) unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    if let Err(code) = not_in_host_function("cuCtxSetCurrent") {
        return code;
    }
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
        crate::stream::refuse_during_capture("cuCtxSynchronize")?;
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
