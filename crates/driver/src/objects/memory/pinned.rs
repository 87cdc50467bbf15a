//! Page-locked host memory, the source and destination of asynchronous copies.

use super::sealed::{HostAccess, HostUse};
use super::tracker::UseTracker;
use super::{DeviceCopy, byte_size};
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// `len` values of `T` in page-locked host memory (`cuMemHostAlloc`), zeroed.
///
/// Asynchronous copies to and from host memory take `PinnedBuffer`s (or
/// [`crate::UnifiedBuffer`]s). Each copy records an event on its stream (one
/// per buffer and stream, re-recorded), and host access waits for them:
/// [`PinnedBuffer::as_slice`] for the copies that write this buffer,
/// [`PinnedBuffer::as_mut_slice`] and Drop for all of them. So the host never
/// sees a half-written buffer, and the memory outlives every copy using it.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let host = PinnedBuffer::from_slice(&ctx, &[5u8; 64]).unwrap();
/// let mut device = DeviceBuffer::<u8>::new_async(&stream, 64).unwrap();
/// let mut back = PinnedBuffer::<u8>::new(&ctx, 64).unwrap();
/// stream.copy_from_host_async(&mut device, &host).unwrap();
/// stream.copy_to_host_async(&mut back, &device).unwrap();
/// // No synchronize needed: host access waits for the copy that writes `back`.
/// assert_eq!(back.as_slice().unwrap(), &[5u8; 64]);
/// ```
pub struct PinnedBuffer<T: DeviceCopy> {
    ctx: Arc<Context>,
    ptr: NonNull<T>,
    len: usize,
    tracker: UseTracker,
}

// SAFETY: the buffer owns its allocation (like a Box<[T]>), `T` is Send + Sync
// (DeviceCopy), and the tracker is Send + Sync.
unsafe impl<T: DeviceCopy> Send for PinnedBuffer<T> {}
// SAFETY: shared access only reads host memory after waiting for device writes;
// writes need `&mut self`.
unsafe impl<T: DeviceCopy> Sync for PinnedBuffer<T> {}

impl<T: DeviceCopy> PinnedBuffer<T> {
    /// Allocate `len` zeroed values.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>("PinnedBuffer", len)?;
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer; flags 0; the context is current.
        ctx.check(unsafe { (ctx.driver().cuMemHostAlloc)(&mut raw, bytes, 0) })?;
        let ptr = NonNull::new(raw.cast::<T>()).ok_or(sys::DriverError::new(
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        ))?;
        // Freshly allocated memory is uninitialized; Rust may not read it as `T`.
        // SAFETY: `bytes` bytes at `ptr` belong to this allocation.
        unsafe { std::ptr::write_bytes(ptr.as_ptr().cast::<u8>(), 0, bytes) };
        Ok(Self {
            ctx: Arc::clone(ctx),
            ptr,
            len,
            tracker: UseTracker::default(),
        })
    }

    common_accessors!();

    /// The host address, for raw calls. Reading or writing through it while a
    /// copy is in flight is a data race; prefer `as_slice`.
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }
}

host_side!(PinnedBuffer);

impl<T: DeviceCopy> HostAccess<T> for PinnedBuffer<T> {
    fn host_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    fn host_len(&self) -> usize {
        self.len
    }
}

impl<T: DeviceCopy> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // Freed after every use (waited for below): the next owner of the
        // address starts afresh.
        crate::enqueue::order::forget(&self.ctx, self.ptr.as_ptr() as u64, self.size_in_bytes());
        if let Err(err) = self.tracker.wait_host(&self.ctx, true) {
            // Freeing memory a copy may still touch would be worse than a leak.
            tracing::warn!(
                "leaking pinned buffer {:p} ({} bytes): {err}",
                self.ptr,
                self.size_in_bytes()
            );
            return;
        }
        // SAFETY: from cuMemHostAlloc, freed once, after every use finished.
        let code = unsafe { (self.ctx.driver().cuMemFreeHost)(self.ptr.as_ptr().cast()) };
        if let Err(err) = self.ctx.check(code) {
            tracing::warn!("freeing pinned buffer {:p}: {err}", self.ptr);
        }
        self.tracker.release_events();
    }
}

impl<T: DeviceCopy> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}
