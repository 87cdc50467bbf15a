//! Each device's primary context, the per-thread current context, and peer
//! access between contexts.
//!
//! There is one context per device (its primary context); its handle is
//! minted once per device. What the software driver does enforce, as a GPU
//! does, is that a thread has made one current (`cuCtxSetCurrent`) before calls
//! that need one: that is the bug an upper layer makes when it forgets to bind
//! the context on a new thread, and it should fail here, not first on the
//! H200. The current context decides the device of new streams, events and
//! allocations.
//!
//! Peer access (`cuCtxEnablePeerAccess`) lets kernels and memsets of the
//! current context's device touch memory of the peer context's device; without
//! it they fault, as on a GPU. Copies need no peer access (the driver stages
//! them, as CUDA does for `cuMemcpyPeerAsync`). Releasing a primary context for
//! the last time forgets its peer access, as destroying it does on a GPU.
//!
//! Nor may a host function (`cuLaunchHostFunc`) call the driver: CUDA says such
//! a call may fail with `CUDA_ERROR_NOT_PERMITTED` (or deadlock). Here the
//! context calls and every call that needs a current context always fail so
//! from a host function, and are counted ([`refused_in_host_functions`]), so a
//! driver call made from a callback fails in tests instead of on the H200.

use crate::errors::{Status, code, fail, write_out};
use crate::handles::lock;
use crate::handles::mint;
use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use sys::{CUcontext, CUdevice, CUresult};

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// Set while a stream worker runs a host function on this thread.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

static REFUSED_IN_HOST_FNS: AtomicUsize = AtomicUsize::new(0);

/// Peer access enabled: (accessing device, owning device).
static PEERS: Mutex<Option<HashSet<(CUdevice, CUdevice)>>> = Mutex::new(None);

/// One device's primary context: its handle and how often it is retained.
struct Primary {
    handle: usize,
    retained: AtomicUsize,
}

fn primaries() -> &'static [Primary] {
    static PRIMARIES: OnceLock<Vec<Primary>> = OnceLock::new();
    PRIMARIES.get_or_init(|| {
        (0..crate::device::device_count())
            .map(|_| Primary {
                handle: mint(),
                retained: AtomicUsize::new(0),
            })
            .collect()
    })
}

/// How many times the primary contexts are retained, over every device
/// (`cuDevicePrimaryCtxRetain` less `cuDevicePrimaryCtxRelease`): 0 once
/// every retain was released.
///
/// ```
/// // Nothing has retained a context in this process yet.
/// assert_eq!(cuda_streams_soft_driver::primary_context_retains(), 0);
/// ```
pub fn primary_context_retains() -> usize {
    primaries()
        .iter()
        .map(|p| p.retained.load(Ordering::Acquire))
        .sum()
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

/// The primary context of `dev` (a checked ordinal).
fn primary(dev: CUdevice) -> &'static Primary {
    &primaries()[dev as usize]
}

/// The device whose primary context has handle `ctx`, if it is one.
fn device_of(ctx: usize) -> Option<CUdevice> {
    primaries()
        .iter()
        .position(|p| p.handle == ctx)
        .map(|dev| dev as CUdevice)
}

/// The device of the context current on this thread, or
/// `CUDA_ERROR_INVALID_CONTEXT` when none (or a released one) is current.
pub(crate) fn require() -> Result<CUdevice, CUresult> {
    not_in_host_function("a call that needs a current context")?;
    current_device().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// The device of the current context, if one is current and retained.
fn current_device() -> Option<CUdevice> {
    let dev = device_of(CURRENT.with(Cell::get))?;
    (primary(dev).retained.load(Ordering::Acquire) > 0).then_some(dev)
}

/// `CUDA_ERROR_INVALID_DEVICE` unless `dev` is a device ordinal.
pub(crate) fn check_device(dev: CUdevice) -> Status {
    if (0..crate::device::device_count()).contains(&dev) {
        Ok(())
    } else {
        Err(fail(
            CUresult::CUDA_ERROR_INVALID_DEVICE,
            format!(
                "device {dev} does not exist: the software driver has {} device(s) (set {})",
                crate::device::device_count(),
                crate::device::DEVICES_ENV
            ),
        ))
    }
}

/// The device of context `ctx`, a retained primary context (or null, which
/// CUDA reads as "the current one" in the peer calls); else
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub(crate) fn check_context(ctx: CUcontext) -> Result<CUdevice, CUresult> {
    if ctx.is_null() {
        return require();
    }
    match device_of(ctx as usize) {
        Some(dev) if primary(dev).retained.load(Ordering::Acquire) > 0 => Ok(dev),
        _ => Err(fail(
            CUresult::CUDA_ERROR_INVALID_CONTEXT,
            format!("{:#x} is not a live context", ctx as usize),
        )),
    }
}

/// Whether kernels and memsets on device `from` may touch memory of device
/// `to`: the same device, or peer access enabled from `from`'s context to `to`'s.
pub(crate) fn can_access(from: CUdevice, to: CUdevice) -> bool {
    from == to
        || lock(&PEERS)
            .as_ref()
            .is_some_and(|peers| peers.contains(&(from, to)))
}

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
        let mut peers = lock(&PEERS);
        if !peers.get_or_insert_with(HashSet::new).insert((dev, peer)) {
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
        let removed = lock(&PEERS)
            .as_mut()
            .is_some_and(|peers| peers.remove(&(dev, peer)));
        if removed {
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
        let primary = primary(dev);
        // SAFETY: pctx is null or writable per the API.
        unsafe { write_out(pctx, primary.handle as CUcontext) }?;
        primary.retained.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    code((|| {
        not_in_host_function("cuDevicePrimaryCtxRelease")?;
        check_device(dev)?;
        let before = primary(dev)
            .retained
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if before == 1 {
            // The context is gone: so is its peer access, both ways, and
            // its sticky error (a new context starts clean, as on a GPU).
            if let Some(peers) = lock(&PEERS).as_mut() {
                peers.retain(|&(from, to)| from != dev && to != dev);
            }
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
        let dev = require()?;
        crate::stream::refuse_during_capture("cuCtxSynchronize")?;
        crate::stream::synchronize_all(dev);
        crate::memory::trim_pool_at_sync();
        crate::faults::context_fault(dev)
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
