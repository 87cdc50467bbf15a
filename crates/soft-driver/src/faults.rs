//! Fault injection, for tests: make the software driver fail the way a GPU
//! does, on demand.
//!
//! A failed launch leaves a *sticky* error, as a faulting kernel does on a
//! GPU: afterwards every call on that stream (submissions, query, synchronize,
//! events recorded on it) and `cuCtxSynchronize` answer
//! `CUDA_ERROR_LAUNCH_FAILED`. An illegal address (a kernel, copy or memset
//! touching memory that is not live, not yet usable in stream order, or too
//! short) is sticky for the whole context, as on a GPU: every stream answers
//! `CUDA_ERROR_ILLEGAL_ADDRESS` from then on. On a GPU the only way out is to
//! destroy the context; here tests call [`clear`] (one stream) or [`reset`]
//! (everything).
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
static CONTEXT_FAULT: Mutex<Option<Fault>> = Mutex::new(None);
/// An illegal address poisons the whole context, as on a GPU: every stream
/// then answers with it (checked on every submission, hence the flag).
static CONTEXT_POISONED: AtomicBool = AtomicBool::new(false);

fn stream(handle: CUstream) -> Result<Arc<Stream>, DriverError> {
    STREAMS
        .get(handle as usize)
        .map_err(|code| code.result().unwrap_err())
}

/// Make the next `cuLaunchKernel` on `stream` fail: the launch call itself
/// succeeds (errors of kernels are asynchronous), and when the worker reaches
/// it the stream takes the sticky error `CUDA_ERROR_LAUNCH_FAILED`.
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
    {
        let stream = self::stream(stream)?;
        let mut state = stream.state();
        state.fault = None;
        state.inject_launch_fault = false;
        state.delay = None;
    }
    if crate::stream::live()
        .iter()
        .all(|s| s.state().fault.is_none())
    {
        *lock(&CONTEXT_FAULT) = None;
        CONTEXT_POISONED.store(false, Ordering::Release);
    }
    Ok(())
}

/// Clear every sticky error and every pending injection.
pub fn reset() {
    FAIL_ALLOCATIONS.store(0, Ordering::Release);
    for stream in crate::stream::live() {
        let mut state = stream.state();
        state.fault = None;
        state.inject_launch_fault = false;
        state.delay = None;
    }
    *lock(&CONTEXT_FAULT) = None;
    CONTEXT_POISONED.store(false, Ordering::Release);
}

/// Consume one injected allocation failure, if any is pending.
pub(crate) fn take_allocation_failure() -> bool {
    FAIL_ALLOCATIONS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// A stream faulted: the context is faulted too (for `cuCtxSynchronize`).
/// An illegal address also poisons every other stream of the context, as on
/// a GPU; injected launch failures stay with their stream (a test tool).
pub(crate) fn note_context_fault(fault: &Fault) {
    lock(&CONTEXT_FAULT).get_or_insert_with(|| fault.clone());
    if fault.code == CUresult::CUDA_ERROR_ILLEGAL_ADDRESS {
        CONTEXT_POISONED.store(true, Ordering::Release);
    }
}

/// The illegal address that poisoned the context, if one did.
pub(crate) fn poison() -> Option<Fault> {
    if !CONTEXT_POISONED.load(Ordering::Acquire) {
        return None;
    }
    lock(&CONTEXT_FAULT).clone()
}

/// The context's sticky error, for `cuCtxSynchronize`.
pub(crate) fn context_fault() -> Result<(), CUresult> {
    match lock(&CONTEXT_FAULT).as_ref() {
        Some(fault) => Err(crate::errors::fail(fault.code, fault.detail.clone())),
        None => Ok(()),
    }
}
