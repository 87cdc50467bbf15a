//! The result layer, as in cudarc (raw `sys`, `result`, safe types): one
//! checked wrapper per raw driver call that a crate above needs and no safe
//! type of this crate covers. Each binds the context first and turns the
//! `CUresult` into [`Error`](crate::Error), with the driver's description.
//!
//! The crates above call the driver through these and the safe types only,
//! never through the function table ([`Context::driver`] stays for interop
//! with other libraries). Allocating hands back a raw pointer, which is safe
//! (at worst it leaks); freeing one is `unsafe`, since only the caller knows
//! that no work can still reach the memory.
//!
//! ```
//! use cuda_streams_driver::{Context, Stream, result};
//! # fn main() -> cuda_streams_driver::Result<()> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! assert!(result::driver_version(ctx.loaded_driver())? >= 12000);
//! let ptr = result::mem_alloc_async(&stream, 256)?;
//! // SAFETY: from `mem_alloc_async` on this stream, never used, freed once.
//! unsafe { result::mem_free_async(&stream, ptr)? };
//! stream.synchronize()?;
//! # Ok(())
//! # }
//! ```

pub use crate::ground::driver_calls::{device_count, driver_version};
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use sys::CUdeviceptr;

/// `bytes` of device memory from `cuMemAlloc`, usable on every stream of
/// `ctx` at once. Free it with [`mem_free`].
pub fn mem_alloc(ctx: &Context, bytes: usize) -> Result<CUdeviceptr> {
    ctx.bind()?;
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: writes one device pointer through a valid pointer; the context
    // is current.
    ctx.check(unsafe { (ctx.driver().cuMemAlloc)(&mut ptr, bytes) })?;
    Ok(ptr)
}

/// Give back memory from [`mem_alloc`] (`cuMemFree`).
///
/// # Safety
/// `ptr` came from [`mem_alloc`] on `ctx`, is freed once, and no work that
/// can still run (on any stream) uses it.
pub unsafe fn mem_free(ctx: &Context, ptr: CUdeviceptr) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller's contract.
    ctx.check(unsafe { (ctx.driver().cuMemFree)(ptr) })
}

/// `bytes` of page-locked host memory from `cuMemHostAlloc` (flags 0),
/// uninitialised. Free it with [`mem_free_host`].
pub fn mem_host_alloc(ctx: &Context, bytes: usize) -> Result<*mut std::ffi::c_void> {
    ctx.bind()?;
    let mut ptr = std::ptr::null_mut();
    // SAFETY: writes one pointer through a valid pointer; flags 0; the
    // context is current.
    ctx.check(unsafe { (ctx.driver().cuMemHostAlloc)(&mut ptr, bytes, 0) })?;
    Ok(ptr)
}

/// Give back memory from [`mem_host_alloc`] (`cuMemFreeHost`).
///
/// # Safety
/// `ptr` came from [`mem_host_alloc`] on `ctx`, is freed once, and no work
/// that can still run (on any stream) uses it.
pub unsafe fn mem_free_host(ctx: &Context, ptr: *mut std::ffi::c_void) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller's contract.
    ctx.check(unsafe { (ctx.driver().cuMemFreeHost)(ptr) })
}

/// `bytes` of device memory from the device's default pool, in stream order
/// on `stream` (`cuMemAllocAsync`): usable by work enqueued on `stream`
/// after this call. Enqueued through the enqueue protocol, which refuses it
/// with [`Error::StreamCapturing`](crate::Error::StreamCapturing) while
/// `stream` captures (the driver would record the allocation as a node of
/// the graph). Free it with [`mem_free_async`].
pub fn mem_alloc_async(stream: &Stream, bytes: usize) -> Result<CUdeviceptr> {
    stream.allocate_raw(bytes, "result::mem_alloc_async")
}

/// Give back memory from [`mem_alloc_async`] in stream order on `stream`
/// (`cuMemFreeAsync`), through the enqueue protocol (refused while `stream`
/// captures, as [`mem_alloc_async`] is).
///
/// # Safety
/// `ptr` came from [`mem_alloc_async`] on a stream of `stream`'s context and
/// is freed once; every use of it is ordered before this point of `stream`
/// (by stream order, or by waits the caller enqueued), and nothing uses it
/// after.
pub unsafe fn mem_free_async(stream: &Stream, ptr: CUdeviceptr) -> Result<()> {
    stream.enqueue_raw("result::mem_free_async", |driver, raw| {
        // SAFETY: the caller's contract; the stream is live and its context
        // current (bound by the protocol).
        unsafe { (driver.cuMemFreeAsync)(ptr, raw) }
    })
}

/// Copy `bytes` from device address `src` to device address `dst` in stream
/// order on `stream` (`cuMemcpyDtoDAsync`), unseen by the buffers' use
/// trackers and the stream-order tracker: work another library does on
/// memory it does not hand over as a [`DeviceMemory`](crate::DeviceMemory).
/// Safe code copies with [`Stream::copy_device_to_device_async`]. Enqueued
/// through the enqueue protocol (refused while `stream` captures).
///
/// # Safety
/// Both ranges are live device memory of `stream`'s context, `bytes` long,
/// and stay alive until `stream` has passed the copy; no other work writes
/// `src`, or touches `dst`, unordered with it.
pub unsafe fn memcpy_dtod_async(
    stream: &Stream,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> Result<()> {
    stream.enqueue_raw("result::memcpy_dtod_async", |driver, raw| {
        // SAFETY: the caller's contract; the stream is live and its context
        // current (bound by the protocol).
        unsafe { (driver.cuMemcpyDtoDAsync)(dst, src, bytes, raw) }
    })
}
