//! Each device's default memory pool: its handle and its attributes, which
//! the pools of host memory (`host_pool_registry`) share.

use crate::context::require;
use crate::device::check_device;
use crate::errors::{code, write_out};
use crate::handles::mint;
use crate::memory::{trim_pool_to, with_pool};
use crate::pool_stats::PoolStats;
use std::ffi::c_void;
use std::sync::OnceLock;
use sys::{CUdevice, CUmemPool_attribute, CUmemoryPool, CUresult};

/// Device `dev`'s default pool handle (a checked ordinal).
fn default_pool(dev: CUdevice) -> usize {
    default_pools()[dev as usize]
}

fn default_pools() -> &'static [usize] {
    static POOLS: OnceLock<Vec<usize>> = OnceLock::new();
    POOLS.get_or_init(|| (0..crate::device::device_count()).map(|_| mint()).collect())
}

/// A pool handle, resolved.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pool {
    /// The default pool of this device.
    Default(CUdevice),
    /// A live pool of host memory (`cuMemPoolCreate`), by handle.
    Host(usize),
}

/// What `pool` is, or `INVALID_HANDLE` for no live pool.
pub(crate) fn resolve_pool(pool: CUmemoryPool) -> Result<Pool, CUresult> {
    if let Ok(dev) = check_pool(pool) {
        return Ok(Pool::Default(dev));
    }
    let handle = pool as usize;
    if crate::host_pool_registry::is_live(handle) {
        Ok(Pool::Host(handle))
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
}

/// Read or change `pool`'s attributes.
fn with_stats<R>(pool: Pool, f: impl FnOnce(&mut PoolStats) -> R) -> Result<R, CUresult> {
    match pool {
        Pool::Default(dev) => Ok(with_pool(dev, f)),
        Pool::Host(handle) => crate::host_pool_registry::with_stats(handle, f),
    }
}

/// The device whose default pool `pool` is, or `INVALID_HANDLE`.
pub(crate) fn check_pool(pool: CUmemoryPool) -> Result<CUdevice, CUresult> {
    default_pools()
        .iter()
        .position(|&handle| handle == pool as usize)
        .map(|dev| dev as CUdevice)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

pub(crate) unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool_out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    code((|| {
        check_device(dev)?;
        require()?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(pool_out, default_pool(dev) as CUmemoryPool) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemPoolTrimTo(
    pool: CUmemoryPool,
    minBytesToKeep: usize,
) -> CUresult {
    code(resolve_pool(pool).and_then(|pool| match pool {
        Pool::Default(dev) => {
            trim_pool_to(dev, minBytesToKeep);
            Ok(())
        }
        Pool::Host(handle) => crate::host_pool_registry::trim_to(handle, minBytesToKeep),
    }))
}

type A = CUmemPool_attribute;

/// What both attribute calls check first: the pool, then the value pointer.
fn check_attribute_args(pool: CUmemoryPool, value: *mut c_void) -> Result<Pool, CUresult> {
    let pool = resolve_pool(pool)?;
    if value.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(pool)
}

fn is_reuse(attr: A) -> Option<usize> {
    match attr {
        A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => Some(0),
        A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => Some(1),
        A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => Some(2),
        _ => None,
    }
}

pub(crate) unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    code((|| {
        let pool = check_attribute_args(pool, value)?;
        if let Some(index) = is_reuse(attr) {
            // SAFETY: for the reuse attributes CUDA passes an int.
            let on = unsafe { value.cast::<i32>().read_unaligned() };
            return with_stats(pool, |stats| stats.reuse[index] = i32::from(on != 0));
        }
        // SAFETY: every other settable attribute is a cuuint64_t.
        let bytes = unsafe { value.cast::<u64>().read_unaligned() };
        with_stats(pool, |stats| match attr {
            A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => {
                stats.release_threshold = bytes;
                Ok(())
            }
            // Only resetting a high watermark (to 0, meaning "to current") is
            // allowed, as in CUDA.
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if bytes == 0 => {
                stats.reserved_high = stats.reserved;
                Ok(())
            }
            A::CU_MEMPOOL_ATTR_USED_MEM_HIGH if bytes == 0 => {
                stats.used_high = stats.used;
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?
    })())
}

pub(crate) unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    code((|| {
        let pool = check_attribute_args(pool, value)?;
        let stats = with_stats(pool, |stats| *stats)?;
        if let Some(index) = is_reuse(attr) {
            // SAFETY: for the reuse attributes CUDA expects an int.
            unsafe { value.cast::<i32>().write_unaligned(stats.reuse[index]) };
            return Ok(());
        }
        let bytes = match attr {
            A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => stats.release_threshold,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => stats.reserved as u64,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => stats.reserved_high as u64,
            A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT => stats.used as u64,
            A::CU_MEMPOOL_ATTR_USED_MEM_HIGH => stats.used_high as u64,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: these attributes are cuuint64_t, per the API.
        unsafe { value.cast::<u64>().write_unaligned(bytes) };
        Ok(())
    })())
}
