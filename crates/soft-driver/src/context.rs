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
//!
//! The entry points that change contexts (retain, release, make current, peer
//! access, synchronize) are `context_api`'s; this file is what every call
//! asks of the current context.

use crate::device::device_count;
use crate::errors::{Status, fail};
use crate::green_contexts::{device_of_context, green_of_context};
use crate::handles::{lock, mint};
use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::c_int;
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
        (0..device_count())
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

/// The handle of the context current on this thread (0: none).
pub(crate) fn current_handle() -> usize {
    CURRENT.with(Cell::get)
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
    let ctx = CURRENT.with(Cell::get);
    match device_of(ctx) {
        Some(dev) => (primary(dev).retained.load(Ordering::Acquire) > 0).then_some(dev),
        // A green context's handle stands for its device while it lives.
        None => device_of_context(ctx),
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
        None if let Some(dev) = device_of_context(ctx as usize) => Ok(dev),
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

/// CUDA's range on the H200: 0 is the least priority, -5 the greatest.
pub(crate) const LEAST_PRIORITY: c_int = 0;
/// See [`LEAST_PRIORITY`].
pub(crate) const GREATEST_PRIORITY: c_int = -5;

/// The handle of `dev`'s primary context (a checked ordinal), minted once.
pub(crate) fn primary_handle(dev: CUdevice) -> usize {
    primary(dev).handle
}

/// Count one more retain of `dev`'s primary context (a checked ordinal).
pub(crate) fn retain_primary(dev: CUdevice) {
    primary(dev).retained.fetch_add(1, Ordering::AcqRel);
}

/// Count one release of `dev`'s primary context (a checked ordinal):
/// `Ok(true)` when that was its last retain. The context is then gone, and
/// so is its peer access, both ways; `CUDA_ERROR_INVALID_CONTEXT` when it
/// was not retained.
pub(crate) fn release_primary(dev: CUdevice) -> Result<bool, CUresult> {
    let before = primary(dev)
        .retained
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if before != 1 {
        return Ok(false);
    }
    if let Some(peers) = lock(&PEERS).as_mut() {
        peers.retain(|&(from, to)| from != dev && to != dev);
    }
    Ok(true)
}

/// Let kernels and memsets of `dev` touch memory of `peer`; `false` when
/// they already could.
pub(crate) fn enable_peer_access(dev: CUdevice, peer: CUdevice) -> bool {
    lock(&PEERS)
        .get_or_insert_with(HashSet::new)
        .insert((dev, peer))
}

/// Take back what [`enable_peer_access`] gave; `false` when it was not given.
pub(crate) fn disable_peer_access(dev: CUdevice, peer: CUdevice) -> bool {
    lock(&PEERS)
        .as_mut()
        .is_some_and(|peers| peers.remove(&(dev, peer)))
}

/// Make the context with handle `ctx` (a live one, or 0 for none) current on
/// this thread.
pub(crate) fn set_current(ctx: usize) {
    CURRENT.with(|current| current.set(ctx));
}

/// The green context (its handle) whose context is current on this thread,
/// or 0 when a primary context (or none) is.
pub(crate) fn current_green() -> usize {
    green_of_context(current_handle())
}
