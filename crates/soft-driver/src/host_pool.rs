//! Memory pools of page-locked host memory (`cuMemPoolCreate` with a
//! `CU_MEM_LOCATION_TYPE_HOST` location, CUDA 12.2): their handles, their
//! properties, and their stream-ordered allocations. The bookkeeping
//! (which pools exist, their accounting, which pool each live allocation
//! came from) is `host_pool_registry`'s.
//!
//! An allocation from one (`cuMemAllocFromPoolAsync`) is host memory that
//! every device may use, as `cuMemHostAlloc`'s is, and stream-ordered as the
//! default pools' allocations are: usable once its stream reaches the
//! allocation, and returned when the stream reaches its `cuMemFreeAsync`,
//! not at the call, so no later allocation gets the bytes while work before
//! the free may still touch them. The accounting follows CUDA's pools as the
//! default pools' does (see `memory`): freed bytes stay *reserved* until a
//! trim, or a synchronisation above the release threshold, gives them back;
//! a non-zero `maxSize` caps the reservation. No device's capacity is
//! charged: the memory is the host's.
//!
//! `cuMemPoolSetAccess` is checked and accepted; host memory is every
//! software device's to use, so nothing more comes of it.

use crate::context::require;
use crate::device::check_device;
use crate::errors::{code, fail, write_out};
use crate::handles::mint;
use crate::host_pool_registry::{create, destroy, record, reserve, unreserve};
use crate::memory::{ALIGNMENT, Kind, allocate, free};
use crate::ops::{Action, Template};
use crate::stream::Stream;
use std::sync::Arc;
use sys::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemLocationType, CUmemPoolProps, CUmemoryPool, CUresult,
};

/// A stream-ordered allocation of `size` bytes from pool `handle` on
/// `stream`: counted against the pool's `maxSize`, usable once `stream`
/// reaches this point, its address written to `out`.
///
/// # Safety
/// `out` is null or writable.
pub(crate) unsafe fn allocate_ordered(
    out: *mut CUdeviceptr,
    size: usize,
    handle: usize,
    stream: &Arc<Stream>,
) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "cuMemAllocFromPoolAsync: null pointer for the address",
        ));
    }
    let rounded = size.checked_next_multiple_of(ALIGNMENT).ok_or_else(|| {
        fail(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("allocation of {size} bytes from host memory pool {handle:#x} overflows"),
        )
    })?;
    reserve(handle, size, rounded)?;
    let ptr = match allocate(size, Kind::HostPool, stream.device) {
        Ok(ptr) => ptr,
        Err(err) => {
            unreserve(handle, rounded);
            return Err(err);
        }
    };
    record(ptr, handle, rounded);
    if let Err(err) = stream.submit(&[Template::Act(Action::Ready(ptr))]) {
        // Forgets it in the pool too (`host_pool_registry::released`).
        let _ = free(ptr, &[Kind::HostPool]);
        return Err(err);
    }
    // SAFETY: non-null; writable per the caller's contract.
    unsafe { write_out(out, ptr as CUdeviceptr) }
}

/// Why `props` make no pool of host memory, if they do not.
fn check_props(props: &CUmemPoolProps) -> Result<(), CUresult> {
    let invalid = |detail: String| Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, detail));
    if props.allocType != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED {
        return invalid(format!(
            "cuMemPoolCreate: allocType {} is not CU_MEM_ALLOCATION_TYPE_PINNED (1)",
            props.allocType.0
        ));
    }
    let location = props.location;
    match location.type_ {
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST => {}
        // The software machine has one NUMA node.
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA if location.id == 0 => {}
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA => {
            return invalid(format!(
                "cuMemPoolCreate: host NUMA node {} does not exist: the software driver's \
                 host has node 0 only",
                location.id
            ));
        }
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => {
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                "cuMemPoolCreate: the software driver makes pools of host memory only; device \
                 memory comes from each device's default pool (cuDeviceGetDefaultMemPool)",
            ));
        }
        other => {
            return invalid(format!(
                "cuMemPoolCreate: location type {} is not CU_MEM_LOCATION_TYPE_HOST (2) or \
                 CU_MEM_LOCATION_TYPE_HOST_NUMA (3)",
                other.0
            ));
        }
    }
    if props.handleTypes != CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE {
        return invalid(format!(
            "cuMemPoolCreate: handleTypes {:#x}: a pool of host memory cannot be shared \
             between processes, so it must be 0",
            props.handleTypes.0
        ));
    }
    if props.usage != 0 {
        return invalid(format!(
            "cuMemPoolCreate: usage {:#x}: no usage flag applies to a pool of host memory",
            props.usage
        ));
    }
    if props.reserved.iter().any(|&byte| byte != 0) {
        return invalid("cuMemPoolCreate: the reserved bytes of CUmemPoolProps must be 0".into());
    }
    Ok(())
}

pub(crate) unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    poolProps: *const CUmemPoolProps,
) -> CUresult {
    code((|| {
        require()?;
        if pool.is_null() || poolProps.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "cuMemPoolCreate: null pointer for the pool or its properties",
            ));
        }
        // SAFETY: non-null, and points at a CUmemPoolProps per the API.
        let props = unsafe { poolProps.read_unaligned() };
        check_props(&props)?;
        let handle = mint();
        let max_size = if props.maxSize == 0 {
            usize::MAX
        } else {
            props.maxSize
        };
        create(handle, max_size);
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(pool, handle as CUmemoryPool) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    let handle = pool as usize;
    if crate::pool::check_pool(pool).is_ok() {
        return fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("cuMemPoolDestroy: {handle:#x} is a device's default pool, which stays"),
        );
    }
    if destroy(handle) {
        CUresult::CUDA_SUCCESS
    } else {
        fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("cuMemPoolDestroy: {handle:#x} is not a live memory pool"),
        )
    }
}

pub(crate) unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    code((|| {
        crate::pool::resolve_pool(pool)?;
        if count == 0 {
            return Ok(());
        }
        if map.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuMemPoolSetAccess: null map of {count} descriptor(s)"),
            ));
        }
        // SAFETY: non-null, and `count` descriptors per the API.
        let descriptors = unsafe { std::slice::from_raw_parts(map, count) };
        for (index, desc) in descriptors.iter().enumerate() {
            if desc.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "cuMemPoolSetAccess: descriptor {index} has location type {}, not \
                         CU_MEM_LOCATION_TYPE_DEVICE (1)",
                        desc.location.type_.0
                    ),
                ));
            }
            check_device(desc.location.id)?;
            use CUmemAccess_flags as F;
            if !matches!(
                desc.flags,
                F::CU_MEM_ACCESS_FLAGS_PROT_NONE
                    | F::CU_MEM_ACCESS_FLAGS_PROT_READ
                    | F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            ) {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "cuMemPoolSetAccess: descriptor {index} has access flags {}, not 0, 1 \
                         or 3 (CU_MEM_ACCESS_FLAGS_PROT_*)",
                        desc.flags.0
                    ),
                ));
            }
        }
        Ok(())
    })())
}
