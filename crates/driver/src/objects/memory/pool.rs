//! [`MemPool`]: the device's default memory pool, which stream-ordered
//! allocations ([`crate::objects::result::mem_alloc_async`],
//! [`crate::DeviceBuffer::new_async`]) come from, with its attributes and
//! trimming as safe calls.

use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use sys::{CUmemPool_attribute, CUmemoryPool};

/// The default memory pool of a context's device (`cuDeviceGetDefaultMemPool`).
///
/// ```
/// use cuda_streams_driver::sys::CUmemPool_attribute as Attr;
/// use cuda_streams_driver::{Context, DeviceBuffer, MemPool, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// if !ctx.info().memory_pools_supported {
///     return Ok(());
/// }
/// let pool = MemPool::device_default(&ctx)?;
/// pool.set_attribute(Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 1 << 20)?;
/// assert_eq!(pool.attribute(Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)?, 1 << 20);
/// let stream = Stream::new(&ctx)?;
/// let buffer = DeviceBuffer::<u8>::new_async(&stream, 4096)?;
/// assert!(pool.attribute(Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)? >= 4096);
/// drop(buffer);
/// stream.synchronize()?;
/// pool.trim_to(0)?;
/// # Ok(())
/// # }
/// ```
pub struct MemPool {
    ctx: Arc<Context>,
    raw: CUmemoryPool,
}

// SAFETY: a pool handle is an opaque driver object, usable from any thread;
// it is only passed to the (thread-safe) driver, and it lives as long as the
// device (a default pool is never destroyed).
unsafe impl Send for MemPool {}
// SAFETY: as above; nothing is mutated through it on the Rust side.
unsafe impl Sync for MemPool {}

/// The attributes of cuda.h 13.0, each an `int` or a `cuuint64_t`: a value
/// of another attribute could be wider than the `u64` it is read into.
pub(super) fn check_known(attribute: CUmemPool_attribute) -> Result<()> {
    use CUmemPool_attribute as A;
    match attribute {
        A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
        | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
        | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
        | A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
        | A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
        | A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
        | A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT
        | A::CU_MEMPOOL_ATTR_USED_MEM_HIGH => Ok(()),
        other => Err(Error::UnknownPoolAttribute { attribute: other.0 }),
    }
}

impl MemPool {
    /// The default pool of `ctx`'s device.
    pub fn device_default(ctx: &Arc<Context>) -> Result<Self> {
        ctx.bind()?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: writes one pool handle through a valid pointer; the device
        // is the context's, which is current.
        ctx.check(unsafe { (ctx.driver().cuDeviceGetDefaultMemPool)(&mut raw, ctx.device()) })?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// One attribute (`cuMemPoolGetAttribute`); an `int` attribute reads as
    /// 0 or 1.
    pub fn attribute(&self, attribute: CUmemPool_attribute) -> Result<u64> {
        pool_attribute(&self.ctx, self.raw, attribute)
    }

    /// Set one attribute (`cuMemPoolSetAttribute`). The high watermarks
    /// accept only 0, which resets them to the current value.
    pub fn set_attribute(&self, attribute: CUmemPool_attribute, value: u64) -> Result<()> {
        set_pool_attribute(&self.ctx, self.raw, attribute, value)
    }

    /// Give the pool's unused memory back to the device, keeping at least
    /// `keep` bytes reserved (`cuMemPoolTrimTo`). Memory an allocation holds
    /// is never released.
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        trim_pool_to(&self.ctx, self.raw, keep)
    }

    /// The context whose device the pool belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw handle (for interop).
    pub fn as_raw(&self) -> CUmemoryPool {
        self.raw
    }
}

/// `cuMemPoolGetAttribute` on `raw`, a live pool usable in `ctx`: the one
/// reading of an attribute, for [`MemPool`] and
/// [`HostMemPool`](super::HostMemPool).
pub(super) fn pool_attribute(
    ctx: &Context,
    raw: CUmemoryPool,
    attribute: CUmemPool_attribute,
) -> Result<u64> {
    check_known(attribute)?;
    ctx.bind()?;
    let mut value = 0u64;
    // SAFETY: every known attribute is an int or a cuuint64_t, written
    // through a valid pointer to 8 bytes (an int into the low ones); the
    // caller's pool is live.
    let code = unsafe {
        (ctx.driver().cuMemPoolGetAttribute)(
            raw,
            attribute,
            (&mut value as *mut u64).cast::<c_void>(),
        )
    };
    ctx.check(code)?;
    Ok(value)
}

/// `cuMemPoolSetAttribute` on `raw`, as [`pool_attribute`] reads one.
pub(super) fn set_pool_attribute(
    ctx: &Context,
    raw: CUmemoryPool,
    attribute: CUmemPool_attribute,
    value: u64,
) -> Result<()> {
    check_known(attribute)?;
    ctx.bind()?;
    let mut value = value;
    // SAFETY: every known attribute is an int or a cuuint64_t, read from a
    // valid pointer to 8 bytes; the caller's pool is live.
    let code = unsafe {
        (ctx.driver().cuMemPoolSetAttribute)(
            raw,
            attribute,
            (&mut value as *mut u64).cast::<c_void>(),
        )
    };
    ctx.check(code)
}

/// `cuMemPoolTrimTo` on `raw`, a live pool usable in `ctx`.
pub(super) fn trim_pool_to(ctx: &Context, raw: CUmemoryPool, keep: usize) -> Result<()> {
    ctx.bind()?;
    // SAFETY: a live pool handle (the caller's); trimming releases only
    // unused memory.
    ctx.check(unsafe { (ctx.driver().cuMemPoolTrimTo)(raw, keep) })
}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("raw", &self.raw)
            .field("context", &self.ctx.id())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attribute_cuda_h_does_not_define_is_refused_by_name_before_the_driver_sees_it() {
        let ctx = Context::new(0).unwrap();
        if !ctx.info().memory_pools_supported {
            println!("skipped: the device has no memory pools");
            return;
        }
        let pool = MemPool::device_default(&ctx).unwrap();
        let unknown = CUmemPool_attribute(0x7777);
        let err = pool.attribute(unknown).unwrap_err();
        assert!(
            matches!(err, Error::UnknownPoolAttribute { attribute: 0x7777 }),
            "{err}"
        );
        assert!(err.to_string().contains("30583"), "{err}");
        let err = pool.set_attribute(unknown, 0).unwrap_err();
        assert!(matches!(err, Error::UnknownPoolAttribute { .. }), "{err}");
        // The known ones still work.
        pool.attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
            .unwrap();
    }
}
