//! [`HostMemPool`]: a memory pool of page-locked host memory
//! (`cuMemPoolCreate` with a `CU_MEM_LOCATION_TYPE_HOST` location, CUDA
//! 12.2 and later), allocated from and freed to in stream order, as the
//! device's default pool ([`MemPool`](super::MemPool)) is. The driver keeps
//! what is freed for reuse, and reuses it on another stream only once the
//! free has completed there.
//!
//! Allocating hands back a raw pointer, which is safe (at worst it leaks);
//! freeing one is `unsafe`, since only the caller knows that nothing can
//! still reach the memory. The pinned host pool's driver backend (the
//! allocator's `HostPool`) lends the memory out as
//! [`PinnedRegion`](super::PinnedRegion)s.

use super::byte_size;
use super::pool::{pool_attribute, set_pool_attribute, trim_pool_to};
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use sys::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUmemPoolProps,
    CUmemoryPool, CUresult, HostPools,
};

/// A pool of page-locked host memory that `ctx`'s device may read and
/// write, with stream-ordered allocation. Dropping it destroys the pool;
/// memory still allocated from it stays valid until freed, as CUDA keeps it.
///
/// ```
/// use cuda_streams_driver::sys::CUmemPool_attribute as Attr;
/// use cuda_streams_driver::{Context, HostMemPool, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = HostMemPool::new(&ctx, 64 << 20)?; // reserves at most 64 MiB
/// let block = pool.allocate_async(&stream, 4096)?;
/// stream.synchronize()?; // the allocation has happened: the host may write
/// // SAFETY: 4096 bytes of host memory, allocated above; no stream uses them.
/// unsafe { block.as_ptr().write_bytes(7, 4096) };
/// assert!(pool.attribute(Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)? >= 4096);
/// // SAFETY: from this pool, freed once, and no work uses it any more.
/// unsafe { pool.free_async(&stream, block)? };
/// stream.synchronize()?;
/// pool.trim_to(0)?;
/// assert_eq!(pool.attribute(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?, 0);
/// # Ok(())
/// # }
/// ```
pub struct HostMemPool {
    ctx: Arc<Context>,
    raw: CUmemoryPool,
    table: &'static HostPools,
}

// SAFETY: a pool handle is an opaque driver object, usable from any thread;
// it is only passed to the (thread-safe) driver, and destroyed once, by Drop.
unsafe impl Send for HostMemPool {}
// SAFETY: as above; nothing is mutated through it on the Rust side.
unsafe impl Sync for HostMemPool {}

impl HostMemPool {
    /// A pool of host memory for `ctx`'s device that reserves at most
    /// `max_bytes` (0: the driver's default), the device given read and
    /// write access (`cuMemPoolSetAccess`), so that its copies and kernels
    /// use the memory directly. Fails with
    /// [`Error::HostPoolsUnsupported`] on a driver before CUDA 12.2, or one
    /// that refuses pools of host memory.
    pub fn new(ctx: &Arc<Context>, max_bytes: usize) -> Result<Self> {
        let table = ctx.loaded_driver().host_pools()?;
        ctx.bind()?;
        let props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
            maxSize: max_bytes,
            ..CUmemPoolProps::default()
        };
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: writes one pool handle through a valid pointer; `props` is
        // a valid CUmemPoolProps (its reserved bytes zero); the context is
        // current.
        let code = unsafe { (table.cuMemPoolCreate)(&mut raw, &props) };
        if code == CUresult::CUDA_ERROR_NOT_SUPPORTED {
            return Err(Error::HostPoolsUnsupported {
                driver_version: crate::result::driver_version(ctx.loaded_driver()).unwrap_or(0),
                missing: vec!["pools with a CU_MEM_LOCATION_TYPE_HOST location (not supported)"],
            });
        }
        ctx.check(code)?;
        // Destroyed by Drop from here on, also when the access fails.
        let pool = Self {
            ctx: Arc::clone(ctx),
            raw,
            table,
        };
        let access = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.ordinal(),
            },
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: a live pool; one descriptor read through a valid pointer.
        ctx.check(unsafe { (table.cuMemPoolSetAccess)(raw, &access, 1) })?;
        Ok(pool)
    }

    /// `bytes` of the pool's memory, in stream order on `stream`
    /// (`cuMemAllocFromPoolAsync`): usable by work enqueued on `stream`
    /// after this call, and by the host once `stream` has passed it.
    /// Memory freed on another stream is reused only once that free has
    /// completed, unless `stream` was ordered after it. Enqueued through
    /// the enqueue protocol, which refuses it while `stream` captures.
    /// Zero bytes are refused, naming the value; past the pool's cap the
    /// driver's out-of-memory error is returned.
    pub fn allocate_async(&self, stream: &Stream, bytes: usize) -> Result<NonNull<u8>> {
        byte_size::<u8>("HostMemPool allocation", bytes)?;
        stream.check_context_id("a HostMemPool", self.ctx.id())?;
        let mut ptr: CUdeviceptr = 0;
        let raw = self.raw;
        stream.enqueue_raw("HostMemPool::allocate_async", |driver, stream| {
            // SAFETY: writes one address through a valid pointer; the pool
            // is live and the stream is live and of the current context
            // (bound by the protocol).
            unsafe { (driver.cuMemAllocFromPoolAsync)(&mut ptr, bytes, raw, stream) }
        })?;
        NonNull::new(ptr as *mut u8)
            .ok_or_else(|| Error::Driver(sys::DriverError::new(CUresult::CUDA_ERROR_OUT_OF_MEMORY)))
    }

    /// Give back memory from [`allocate_async`](Self::allocate_async) in
    /// stream order on `stream` (`cuMemFreeAsync`), through the enqueue
    /// protocol (refused while `stream` captures). The pool reuses it on
    /// `stream` at once, and on other streams once `stream` has passed the
    /// free.
    ///
    /// # Safety
    /// `ptr` came from this pool's `allocate_async` and is freed once; every
    /// use of it (the host's included) is ordered before this point of
    /// `stream`, and nothing uses it after.
    pub unsafe fn free_async(&self, stream: &Stream, ptr: NonNull<u8>) -> Result<()> {
        stream.check_context_id("a HostMemPool", self.ctx.id())?;
        let address = ptr.as_ptr() as CUdeviceptr;
        stream.enqueue_raw("HostMemPool::free_async", |driver, stream| {
            // SAFETY: the caller's contract; the stream is live and its
            // context current (bound by the protocol).
            unsafe { (driver.cuMemFreeAsync)(address, stream) }
        })
    }

    /// One attribute (`cuMemPoolGetAttribute`), as
    /// [`MemPool::attribute`](super::MemPool::attribute) reads it.
    pub fn attribute(&self, attribute: CUmemPool_attribute) -> Result<u64> {
        pool_attribute(&self.ctx, self.raw, attribute)
    }

    /// Set one attribute (`cuMemPoolSetAttribute`), as
    /// [`MemPool::set_attribute`](super::MemPool::set_attribute) does.
    pub fn set_attribute(&self, attribute: CUmemPool_attribute, value: u64) -> Result<()> {
        set_pool_attribute(&self.ctx, self.raw, attribute, value)
    }

    /// Give the pool's unused memory back to the host, keeping at least
    /// `keep` bytes reserved (`cuMemPoolTrimTo`). Memory an allocation
    /// holds, or a free not yet reached by its stream, is never released.
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        trim_pool_to(&self.ctx, self.raw, keep)
    }

    /// The context whose device may use the memory.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw handle (for interop).
    pub fn as_raw(&self) -> CUmemoryPool {
        self.raw
    }
}

impl Drop for HostMemPool {
    fn drop(&mut self) {
        let (table, raw) = (self.table, self.raw);
        self.ctx.release_in_drop(
            format_args!("host memory pool {raw:p}"),
            "destroying",
            // SAFETY: the pool is this value's and destroyed once, here;
            // memory still allocated from it stays valid until freed (CUDA
            // releases the pool after the last free).
            |_| unsafe { (table.cuMemPoolDestroy)(raw) },
        );
    }
}

impl fmt::Debug for HostMemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemPool")
            .field("raw", &self.raw)
            .field("context", &self.ctx.id())
            .finish()
    }
}
