//! Unified (managed) memory: one address valid on the host and the device.

use super::sealed::{HostAccess, HostUse};
use super::tracker::UseTracker;
use super::{DeviceCopy, DeviceMemory, DeviceMemoryMut, byte_size};
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use sys::{CUdeviceptr, CUmemAttach_flags};

/// `len` values of `T` in managed memory (`cuMemAllocManaged`, attached
/// globally), zeroed.
///
/// Usable as device memory (copies, memsets, kernel arguments) and as host
/// memory for asynchronous copies; [`crate::Stream::prefetch_to_device_async`] and
/// [`crate::Stream::prefetch_to_host_async`] move its pages ahead of use. Every
/// stream use records an event (one per buffer and stream); host access waits
/// as for [`crate::PinnedBuffer`], and Drop waits for all uses before `cuMemFree`.
/// Host access while a kernel runs elsewhere needs a device with concurrent
/// managed access (`DeviceInfo::concurrent_managed_access`, true on the H200).
///
/// ```
/// use cuda_streams_driver::{Context, Stream, UnifiedBuffer};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut data = UnifiedBuffer::<u32>::new(&ctx, 256).unwrap();
/// data.as_mut_slice().unwrap().fill(9);
/// stream.prefetch_to_device_async(&data).unwrap();
/// stream.memset_u32_async(&mut data, 3).unwrap();
/// stream.prefetch_to_host_async(&data).unwrap();
/// assert!(data.as_slice().unwrap().iter().all(|&v| v == 3));
/// ```
pub struct UnifiedBuffer<T: DeviceCopy> {
    ctx: Arc<Context>,
    ptr: CUdeviceptr,
    len: usize,
    tracker: UseTracker,
    _marker: PhantomData<T>,
}

impl<T: DeviceCopy> UnifiedBuffer<T> {
    /// Allocate `len` zeroed values.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>("UnifiedBuffer", len)?;
        ctx.bind()?;
        let mut ptr: CUdeviceptr = 0;
        let flags = CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0;
        // SAFETY: writes one pointer through a valid pointer; the context is current.
        ctx.check(unsafe { (ctx.driver().cuMemAllocManaged)(&mut ptr, bytes, flags) })?;
        let buffer = Self {
            ctx: Arc::clone(ctx),
            ptr,
            len,
            tracker: UseTracker::default(),
            _marker: PhantomData,
        };
        // Fresh memory is uninitialized; Rust may not read it as `T`.
        // SAFETY: `bytes` bytes at `ptr` belong to this allocation, which is
        // host-accessible and not yet used by any stream.
        unsafe { std::ptr::write_bytes(buffer.ptr as usize as *mut u8, 0, bytes) };
        Ok(buffer)
    }

    common_accessors!();

    /// The (device and host) address, for raw calls.
    pub fn as_device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

host_side!(UnifiedBuffer);

// SAFETY: `len` values at `ptr` belong to this managed allocation of `ctx`;
// every use records its stream's event, and Drop waits for all of them before
// `cuMemFree`. Host slices wait for writes (`as_slice`) or for every use
// (`as_mut_slice`), and a write needs `&mut self`, which no slice can outlive.
unsafe impl<T: DeviceCopy> DeviceMemory for UnifiedBuffer<T> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    fn device_len(&self) -> usize {
        self.len
    }

    fn context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        // Another device's stream only for peer copies (the driver layer
        // checks the device of every other use before this hook).
        stream.check_driver("the unified buffer", &self.ctx)
    }

    fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.tracker.record_use(stream, write)
    }
}

// SAFETY: `&mut self` excludes every host slice (they borrow `self`).
unsafe impl<T: DeviceCopy> DeviceMemoryMut for UnifiedBuffer<T> {}

impl<T: DeviceCopy> HostAccess<T> for UnifiedBuffer<T> {
    fn host_ptr(&self) -> *mut T {
        self.ptr as usize as *mut T
    }

    fn host_len(&self) -> usize {
        self.len
    }
}

impl<T: DeviceCopy> Drop for UnifiedBuffer<T> {
    fn drop(&mut self) {
        // Freed after every use (waited for below): the next owner of the
        // address starts afresh.
        crate::enqueue::order::forget(&self.ctx, self.ptr, self.size_in_bytes());
        if let Err(err) = self.tracker.wait_host(&self.ctx, true) {
            tracing::warn!(
                "leaking unified buffer {:#x} ({} bytes): {err}",
                self.ptr,
                self.size_in_bytes()
            );
            return;
        }
        // SAFETY: from cuMemAllocManaged, freed once, after every use finished.
        let code = unsafe { (self.ctx.driver().cuMemFree)(self.ptr) };
        if let Err(err) = self.ctx.check(code) {
            tracing::warn!("freeing unified buffer {:#x}: {err}", self.ptr);
        }
        self.tracker.release_events();
    }
}

impl<T: DeviceCopy> fmt::Debug for UnifiedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnifiedBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}
