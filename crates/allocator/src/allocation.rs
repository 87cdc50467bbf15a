//! The allocation handle: device memory that frees itself, in stream order, on drop.

use crate::config::Backend;
use crate::error::{Error, Result};
use crate::shared::{Shared, Slot, check};
use driver::sys::CUdeviceptr;
use driver::{DeviceCopy, Stream};
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// Device memory from a [`crate::StreamOrderedAllocator`], tied to the stream
/// it was allocated for (its *home stream*).
///
/// Dropping it frees the memory in stream order: the block is reusable at once
/// by later allocations on the home stream (whose work runs after everything
/// already queued there), and by other streams only once the home stream is
/// proven past the free. Uses on other streams must be declared with
/// [`Allocation::record_stream`]; the block then also waits for them.
///
/// After [`crate::StreamOrderedAllocator::free_for_stream`] the handle is
/// *dead*: its memory was freed, [`Allocation::device_ptr`] and the copy
/// methods return [`Error::DeadAllocation`], and dropping it does nothing
/// (never a double free, even if the address has been handed out again).
///
/// # Using it in kernels and copies
/// [`Allocation::device_ptr`] gives the address. Passing it to a kernel goes
/// through `driver::KernelArg::raw_pointer`, which is `unsafe` because the
/// driver layer cannot track this memory: the caller promises the allocation
/// outlives the kernel, which holds when the kernel runs on the home stream
/// (the free is ordered after it) or on a stream declared with
/// [`Allocation::record_stream`]. The methods below (memsets, synchronous
/// copies) need no `unsafe`.
///
/// ```
/// use cuda_streams_allocator::StreamOrderedAllocator;
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let (stream, reader) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// let data = allocator.allocate_for_stream(&stream, 1000)?;
/// assert_eq!((data.size(), data.block_size()), (1000, 1024));
/// assert_eq!(data.stream_id(), stream.id());
/// data.memset_u8_async(3)?;
/// let mut back = vec![0u8; 1000];
/// data.copy_to_host(&mut back)?; // on the home stream, so after the memset
/// assert!(back.iter().all(|&byte| byte == 3));
/// // Work on `reader` uses it too: its block waits for `reader` once freed.
/// data.record_stream(&reader)?;
/// assert!(data.is_live());
/// drop(data);
/// assert_eq!(allocator.stats().live_allocations, 0);
/// # Ok(())
/// # }
/// ```
pub struct Allocation {
    /// The home stream's slot, which also holds the allocator's shared state.
    pub(crate) slot: Arc<Slot>,
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    pub(crate) block: usize,
    pub(crate) id: u64,
}

impl Allocation {
    #[inline]
    fn shared(&self) -> &Shared {
        &self.slot.shared
    }

    /// The device address, or [`Error::DeadAllocation`] after `free_for_stream`.
    pub fn device_ptr(&self) -> Result<CUdeviceptr> {
        if self.is_live() {
            Ok(self.ptr)
        } else {
            Err(self.dead())
        }
    }

    /// Whether the memory is still this handle's (not freed by `free_for_stream`).
    pub fn is_live(&self) -> bool {
        let mut st = self.slot.lock();
        match self.shared().backend {
            Backend::Caching => st.arena.live_mut(self.ptr, self.id).is_some(),
            Backend::DriverPool { .. } => {
                matches!(st.pool_live.get(&self.ptr), Some(live) if live.id == self.id)
            }
        }
    }

    /// The bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The bytes set aside for it (the request rounded to the size class).
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// The home stream.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.slot.stream
    }

    /// The home stream's id.
    pub fn stream_id(&self) -> u64 {
        self.slot.stream.id()
    }

    /// Declare a use on `stream` (work already enqueued there, or about to be):
    /// the block is not reused until an event recorded on `stream` when the
    /// allocation is freed has completed. Using the home stream is a no-op.
    pub fn record_stream(&self, stream: &Arc<Stream>) -> Result<()> {
        self.shared().check_stream(stream)?;
        if stream.id() == self.stream_id() {
            return Ok(());
        }
        let mut st = self.slot.lock();
        let uses = match self.shared().backend {
            Backend::Caching => st.arena.live_mut(self.ptr, self.id).map(|l| &mut l.uses),
            Backend::DriverPool { .. } => match st.pool_live.get_mut(&self.ptr) {
                Some(live) if live.id == self.id => Some(&mut live.uses),
                _ => None,
            },
        };
        let Some(uses) = uses else {
            return Err(self.dead());
        };
        if !uses.iter().any(|s| s.id() == stream.id()) {
            uses.push(Arc::clone(stream));
        }
        Ok(())
    }

    /// Set every byte to `value`, asynchronously on the home stream.
    pub fn memset_u8_async(&self, value: u8) -> Result<()> {
        self.enqueue(|table, ptr, stream| {
            // SAFETY: `size` bytes at `ptr` belong to this live allocation,
            // which cannot be freed before the stream passes this memset.
            unsafe { (table.cuMemsetD8Async)(ptr, value, self.size, stream) }
        })
    }

    /// Set every 4-byte word to `value`, asynchronously on the home stream.
    /// The size must be a multiple of 4.
    pub fn memset_u32_async(&self, value: u32) -> Result<()> {
        if self.size % 4 != 0 {
            return Err(Error::SizeMismatch {
                operation: "memset_u32_async (whole 4-byte words)",
                expected: self.size,
                actual: self.size / 4 * 4,
            });
        }
        self.enqueue(|table, ptr, stream| {
            // SAFETY: as in memset_u8_async; `size / 4` words fit exactly.
            unsafe { (table.cuMemsetD32Async)(ptr, value, self.size / 4, stream) }
        })
    }

    /// Copy `src` into the allocation on the home stream and wait for that
    /// copy. `src` must fill it exactly.
    pub fn copy_from_host<T: DeviceCopy>(&self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", std::mem::size_of_val(src))?;
        self.enqueue(|table, ptr, stream| {
            // SAFETY: the device side is this live allocation; `src` outlives
            // the copy because we wait for it below before returning.
            unsafe {
                (table.cuMemcpyHtoDAsync)(ptr, src.as_ptr().cast::<c_void>(), self.size, stream)
            }
        })?;
        self.wait_for_home_stream()
    }

    /// Copy the allocation into `dst` on the home stream and wait for that
    /// copy. `dst` must match it exactly.
    pub fn copy_to_host<T: DeviceCopy>(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", std::mem::size_of_val(dst))?;
        let host = dst.as_mut_ptr().cast::<c_void>();
        self.enqueue(|table, ptr, stream| {
            // SAFETY: the device side is this live allocation; `dst` is
            // borrowed mutably until we have waited for the copy below, and
            // `T: DeviceCopy` accepts any bytes.
            unsafe { (table.cuMemcpyDtoHAsync)(host, ptr, self.size, stream) }
        })?;
        self.wait_for_home_stream()
    }

    fn check_len(&self, operation: &'static str, bytes: usize) -> Result<()> {
        if bytes == self.size {
            Ok(())
        } else {
            Err(Error::SizeMismatch {
                operation,
                expected: self.size,
                actual: bytes,
            })
        }
    }

    /// Run one raw enqueue on the home stream while holding the stream's lock,
    /// so `free_for_stream` cannot free the block between the liveness check
    /// and the enqueue.
    fn enqueue(
        &self,
        op: impl FnOnce(
            &driver::sys::Driver,
            CUdeviceptr,
            driver::sys::CUstream,
        ) -> driver::sys::CUresult,
    ) -> Result<()> {
        let mut st = self.slot.lock();
        let live = match self.shared().backend {
            Backend::Caching => st.arena.live_mut(self.ptr, self.id).is_some(),
            Backend::DriverPool { .. } => {
                matches!(st.pool_live.get(&self.ptr), Some(live) if live.id == self.id)
            }
        };
        if !live {
            return Err(self.dead());
        }
        let ctx = &self.shared().ctx;
        ctx.bind()?;
        let table = ctx.driver();
        let code = op(table, self.ptr, self.slot.stream.as_raw());
        drop(st);
        check(table, code)
    }

    fn wait_for_home_stream(&self) -> Result<()> {
        let event = self.shared().record_on(&self.slot.stream)?;
        event.synchronize()?;
        Ok(())
    }

    fn dead(&self) -> Error {
        Error::DeadAllocation {
            ptr: self.ptr,
            stream: self.stream_id(),
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let mut st = self.slot.lock();
        match self.shared().backend {
            Backend::Caching => self.shared().caching_free(&mut st, self.ptr, self.id),
            Backend::DriverPool { .. } => self
                .shared()
                .pool_free(&self.slot, &mut st, self.ptr, self.id),
        }
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("block", &self.block)
            .field("stream", &self.stream_id())
            .finish()
    }
}
