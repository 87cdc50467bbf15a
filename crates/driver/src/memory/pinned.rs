//! Page-locked host memory, the source and destination of asynchronous copies.

use super::sealed::HostAccess;
use super::tracker::UseTracker;
use super::{DeviceCopy, byte_size};
use crate::context::Context;
use crate::error::Result;
use crate::stream::Stream;
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

    /// Allocate and fill with a copy of `data`.
    pub fn from_slice(ctx: &Arc<Context>, data: &[T]) -> Result<Self> {
        let mut buffer = Self::new(ctx, data.len())?;
        buffer.as_mut_slice()?.copy_from_slice(data);
        Ok(buffer)
    }

    /// The contents, after waiting for the enqueued copies that write them.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.tracker.wait_host(&self.ctx, false)?;
        // SAFETY: `len` initialized values (zeroed at allocation, then written
        // by finished copies); no write is in flight (waited above, and new
        // writes need `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The contents for writing, after waiting for every enqueued copy that
    /// uses them.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.tracker.wait_host(&self.ctx, true)?;
        // SAFETY: as in `as_slice`, and no copy reads them either (waited above).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// The contents copied into a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }

    /// The number of elements (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: zero-length buffers are rejected at allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The host address, for raw calls. Reading or writing through it while a
    /// copy is in flight is a data race; prefer `as_slice`.
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl<T: DeviceCopy> HostAccess<T> for PinnedBuffer<T> {
    fn host_context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn host_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    fn host_len(&self) -> usize {
        self.len
    }

    fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.tracker.record_use(&self.ctx, stream, write)
    }
}

impl<T: DeviceCopy> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        let ready = self
            .ctx
            .bind()
            .and_then(|()| self.tracker.wait_host(&self.ctx, true));
        if let Err(err) = ready {
            // Freeing memory a copy may still touch would be worse than a leak.
            eprintln!(
                "cuda-streams: leaking pinned buffer {:p} ({} bytes): {err}",
                self.ptr,
                self.size_in_bytes()
            );
            return;
        }
        // SAFETY: from cuMemHostAlloc, freed once, after every use finished.
        let code = unsafe { (self.ctx.driver().cuMemFreeHost)(self.ptr.as_ptr().cast()) };
        if let Err(err) = self.ctx.check(code) {
            eprintln!("cuda-streams: freeing pinned buffer {:p}: {err}", self.ptr);
        }
        self.tracker.destroy_events(&self.ctx);
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
