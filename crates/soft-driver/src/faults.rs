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
//! Work of the software NCCL that fails (a buffer no longer live, a send and
//! its receive of different sizes, an aborted communicator) is sticky for its stream only (a GPU would hang or corrupt
//! memory rather than report it). A stream that waits on a stream which
//! failed at or before the point waited for takes that failure as its own
//! sticky error, so work ordered after failed work never runs, not even on
//! another device.
//!
//! These functions take raw stream handles from the software driver's table;
//! a handle from elsewhere is an `INVALID_HANDLE` error.

use crate::memory::{allocation_failures_pending, set_allocation_failures};
use crate::sticky_errors::{forget_all_context_faults, forget_context_faults};
use crate::stream::{STREAMS, Stream};
use std::sync::Arc;
use std::time::Duration;
use sys::{CUresult, CUstream, DriverError};

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
    set_allocation_failures(count);
}

/// How many injected allocation failures are still pending.
pub fn pending_allocation_failures() -> usize {
    allocation_failures_pending()
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
        forget_context_faults(device);
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
    forget_context_faults(device);
}

/// Clear every sticky error and every pending injection.
pub fn reset() {
    set_allocation_failures(0);
    for stream in crate::stream::live() {
        let mut state = stream.state();
        state.clear_fault();
        state.inject_launch_fault = false;
        state.delay = None;
    }
    forget_all_context_faults();
}
