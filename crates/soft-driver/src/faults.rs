//! Fault injection, for tests: make the software driver fail the way a GPU
//! does, on demand.
//!
//! An error *during* the work of a stream (a failed launch, a kernel twin
//! that panics, an illegal address in a kernel, copy, memset or stream memory
//! operation) is sticky for the whole context, as on a GPU: from then on every
//! stream of the device answers it on every submission, query and
//! synchronize, events recorded on them answer it, `cuCtxSynchronize` answers
//! it, and so do allocations and the creation of streams and events. Work
//! already queued behind it on any stream of the device does not run (host
//! functions, frees, event markers and waits still do, so nothing waiting on
//! them hangs). On a GPU the only way out is to destroy the context;
//! releasing the device's primary context (its last `Context` dropped)
//! does the same here: a context made afterwards starts clean. Tests may
//! also call [`clear`] (one stream) or [`reset`] (everything). Frees and
//! destroys keep working: nothing here tears the context down to reclaim
//! memory, as destroying it would on a GPU.
//!
//! Errors a call returns at once are not sticky, as on a GPU: an invalid
//! launch configuration, an out-of-memory, a bad handle.
//!
//! Work of the software NCCL that fails (ranks that disagree, an aborted
//! communicator) is sticky for its stream only (a GPU would hang or corrupt
//! memory rather than report it). A stream that waits on a stream which
//! failed at or before the point waited for takes that failure as its own
//! sticky error, so work ordered after failed work never runs, not even on
//! another device.
//!
//! These functions take raw stream handles from the software driver's table;
//! a handle from elsewhere is an `INVALID_HANDLE` error.

use crate::handles::lock;
use crate::ops::Fault;
use crate::stream::{STREAMS, Stream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sys::{CUresult, CUstream, DriverError};

static FAIL_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Each device's context's sticky errors, indexed by device.
static CONTEXTS: Mutex<Vec<ContextFaults>> = Mutex::new(Vec::new());
/// Whether any context is poisoned: checked on every submission and by every
/// worker before each operation, so the common case takes no lock.
static ANY_POISONED: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Default)]
struct ContextFaults {
    /// The first fault of any stream of the context (for `cuCtxSynchronize`).
    first: Option<Fault>,
    /// The fault that poisoned the whole context, if one did.
    poison: Option<Fault>,
}

/// Run `f` on device `device`'s entry, created on first use.
fn with_context<R>(device: i32, f: impl FnOnce(&mut ContextFaults) -> R) -> R {
    let mut all = lock(&CONTEXTS);
    let index = usize::try_from(device).unwrap_or(0);
    if all.len() <= index {
        all.resize_with(index + 1, ContextFaults::default);
    }
    f(&mut all[index])
}

fn stream(handle: CUstream) -> Result<Arc<Stream>, DriverError> {
    STREAMS
        .get(handle as usize)
        .map_err(|code| code.result().unwrap_err())
}

/// Make the next `cuLaunchKernel` on `stream` fail: the launch call itself
/// succeeds (errors of kernels are asynchronous), and when the worker reaches
/// it the stream's context takes the sticky error `CUDA_ERROR_LAUNCH_FAILED`
/// (every stream of the device answers it, see the module's docs).
pub fn fail_next_launch(stream: CUstream) -> Result<(), DriverError> {
    self::stream(stream)?.state().inject_launch_fault = true;
    Ok(())
}

/// Make the next `count` device allocations (`cuMemAlloc`, async and pool
/// allocations, managed memory; not pinned host memory) fail with
/// `CUDA_ERROR_OUT_OF_MEMORY`, whatever the capacity. Replaces any count
/// still pending; 0 cancels.
pub fn fail_next_allocations(count: usize) {
    FAIL_ALLOCATIONS.store(count, Ordering::Release);
}

/// How many injected allocation failures are still pending.
pub fn pending_allocation_failures() -> usize {
    FAIL_ALLOCATIONS.load(Ordering::Acquire)
}

/// Make `stream`'s worker sleep for `delay` before it runs its next operation
/// (the one after whatever it is running now), to widen race windows in tests.
pub fn delay_next_operation(stream: CUstream, delay: Duration) -> Result<(), DriverError> {
    self::stream(stream)?.state().delay = Some(delay);
    Ok(())
}

/// The sticky error of `stream`, with its detail, if it has one.
pub fn stream_fault(stream: CUstream) -> Result<Option<(CUresult, String)>, DriverError> {
    let stream = self::stream(stream)?;
    let state = stream.state();
    Ok(state.fault.as_ref().map(|f| (f.code, f.detail.clone())))
}

/// Clear `stream`'s sticky error and pending injections, and the context's
/// sticky error if no other stream still has one.
pub fn clear(stream: CUstream) -> Result<(), DriverError> {
    let device = {
        let stream = self::stream(stream)?;
        let mut state = stream.state();
        state.clear_fault();
        state.inject_launch_fault = false;
        state.delay = None;
        stream.device
    };
    if crate::stream::live()
        .iter()
        .filter(|s| s.device == device)
        .all(|s| s.state().fault.is_none())
    {
        with_context(device, |context| *context = ContextFaults::default());
        refresh_any_poisoned();
    }
    Ok(())
}

/// The primary context of `device` was released by its last holder: as on
/// a GPU, where that destroys the context and a new one starts clean, its
/// sticky error is gone, and so is that of any stream of the device still
/// alive (on a GPU it would have been destroyed with the context).
pub(crate) fn forget_context(device: i32) {
    for stream in crate::stream::live().iter().filter(|s| s.device == device) {
        stream.state().clear_fault();
    }
    with_context(device, |context| *context = ContextFaults::default());
    refresh_any_poisoned();
}

/// Clear every sticky error and every pending injection.
pub fn reset() {
    FAIL_ALLOCATIONS.store(0, Ordering::Release);
    for stream in crate::stream::live() {
        let mut state = stream.state();
        state.clear_fault();
        state.inject_launch_fault = false;
        state.delay = None;
    }
    lock(&CONTEXTS).clear();
    ANY_POISONED.store(false, Ordering::Release);
}

fn refresh_any_poisoned() {
    let any = lock(&CONTEXTS).iter().any(|c| c.poison.is_some());
    ANY_POISONED.store(any, Ordering::Release);
}

/// Consume one injected allocation failure, if any is pending.
pub(crate) fn take_allocation_failure() -> bool {
    FAIL_ALLOCATIONS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// A stream of `device` faulted: its context is faulted too (for
/// `cuCtxSynchronize`). With `poison` (an error during the work itself, as
/// opposed to one taken over from a stream it waited on, or the software
/// NCCL's), every other stream of the context fails with it too, as on a GPU.
pub(crate) fn note_context_fault(device: i32, fault: &Fault, poison: bool) {
    with_context(device, |context| {
        context.first.get_or_insert_with(|| fault.clone());
        if poison {
            context.poison.get_or_insert_with(|| fault.clone());
        }
    });
    if poison {
        ANY_POISONED.store(true, Ordering::Release);
    }
}

/// The fault that poisoned `device`'s context, if one did.
pub(crate) fn poison(device: i32) -> Option<Fault> {
    if !ANY_POISONED.load(Ordering::Acquire) {
        return None;
    }
    with_context(device, |context| context.poison.clone())
}

/// `device`'s context's sticky error, if it is poisoned: what a call on a
/// faulted context answers on a GPU (allocations, new streams and events).
pub(crate) fn check_context(device: i32) -> Result<(), CUresult> {
    match poison(device) {
        Some(fault) => Err(crate::errors::fail(fault.code, fault.detail)),
        None => Ok(()),
    }
}

/// `device`'s context's sticky error, for `cuCtxSynchronize`: the first fault
/// of any of its streams.
pub(crate) fn context_fault(device: i32) -> Result<(), CUresult> {
    match with_context(device, |context| context.first.clone()) {
        Some(fault) => Err(crate::errors::fail(fault.code, fault.detail)),
        None => Ok(()),
    }
}
