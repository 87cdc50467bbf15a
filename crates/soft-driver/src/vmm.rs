//! Virtual memory management with shareable handles: physical memory in a
//! memfd, address ranges reserved with `mmap`, and mappings of one onto the
//! other (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`,
//! `cuMemExportToShareableHandle`, `cuMemImportFromShareableHandle`, and
//! their releases).
//!
//! The physical memory of an allocation is a memfd, so two real processes
//! share it: exporting hands out a duplicate of its descriptor (CUDA's
//! `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), importing adopts one. The
//! kernel counts the references, as CUDA's driver does: the memory lives
//! until every handle, descriptor and mapping in every process is gone, and a
//! process that exits drops its share.
//!
//! A trailer page after the data says whose memory it is (magic, device,
//! size), so an import refuses a descriptor that is not one of ours, or whose
//! size is not what its trailer says.

use crate::errors::{code, fail, write_out};
use crate::handles::{Registry, lock};
use crate::ipc_event::fd_size;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationHandleType,
    CUmemAllocationProp, CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocationType,
    CUresult, CUuuid,
};

/// The granularity of sizes, offsets and addresses: the host's page.
pub(crate) const GRANULARITY: usize = 4096;

const TRAILER_MAGIC: u64 = u64::from_le_bytes(*b"CSSVMMv1");

/// Physical memory: a memfd of `size` bytes plus a trailer page.
struct Physical {
    fd: OwnedFd,
    size: usize,
    device: i32,
    /// Created here (counted against the device), not imported.
    created: bool,
    /// `cuMemCreate` asked for POSIX descriptors: it may be exported.
    exportable: bool,
}

static PHYSICAL: Registry<Physical> = Registry::new();

/// A mapping's physical memory, kept alive by the mapping (CUDA frees
/// physical memory once it is released *and* unmapped).
struct Mapping {
    size: usize,
    _physical: Arc<Physical>,
}

#[derive(Default)]
struct Ranges {
    /// Reserved ranges by base: their size.
    reserved: BTreeMap<usize, usize>,
    /// Mapped ranges by base.
    mapped: BTreeMap<usize, Mapping>,
}

static RANGES: Mutex<Ranges> = Mutex::new(Ranges {
    reserved: BTreeMap::new(),
    mapped: BTreeMap::new(),
});

fn invalid(detail: String) -> CUresult {
    fail(CUresult::CUDA_ERROR_INVALID_VALUE, detail)
}

fn os_error(what: &str) -> CUresult {
    fail(
        CUresult::CUDA_ERROR_OPERATING_SYSTEM,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
}

/// The device a property places memory on, checked.
///
/// # Safety
/// `prop` is null or points at a valid `CUmemAllocationProp`.
unsafe fn device_of(prop: *const CUmemAllocationProp, call: &str) -> Result<(i32, bool), CUresult> {
    // SAFETY: null or valid, per the caller.
    let prop = unsafe { prop.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if prop.type_ != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(invalid(format!(
            "{call}: only pinned device memory (CU_MEM_ALLOCATION_TYPE_PINNED on CU_MEM_LOCATION_TYPE_DEVICE) is supported"
        )));
    }
    let device = prop.location.id;
    crate::device::check_device(device)?;
    let handles = prop.requestedHandleTypes.0;
    let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
    if handles & !posix != 0 {
        return Err(invalid(format!(
            "{call}: handle types {handles:#x} asked; the software driver shares only POSIX file descriptors"
        )));
    }
    Ok((device, handles & posix != 0))
}

pub(crate) unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    _option: CUmemAllocationGranularity_flags,
) -> CUresult {
    code((|| {
        // SAFETY: per the API.
        unsafe { device_of(prop, "cuMemGetAllocationGranularity") }?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(granularity, GRANULARITY) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    code((|| {
        crate::context::require()?;
        // SAFETY: per the API.
        let (device, exportable) = unsafe { device_of(prop, "cuMemCreate") }?;
        if flags != 0 || handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(invalid(format!(
                "cuMemCreate: size {size} is not a non-zero multiple of the granularity {GRANULARITY}"
            )));
        }
        crate::sticky_errors::check_context(device)?;
        let in_use = crate::memory::device_memory_in_use(device);
        let capacity = crate::memory::device_capacity(device);
        if in_use.saturating_add(size) > capacity {
            return Err(fail(
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "cuMemCreate of {size} bytes exceeds software device {device}'s capacity: \
                     {in_use} of {capacity} bytes in use"
                ),
            ));
        }
        // SAFETY: a NUL-terminated name; memfd_create's flags.
        let raw =
            unsafe { libc::memfd_create(c"cuda-streams-soft-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_error("memfd_create for cuMemCreate"));
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let total = size + GRANULARITY;
        // SAFETY: a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), total as libc::off_t) } != 0 {
            return Err(os_error("sizing the memfd of cuMemCreate"));
        }
        let mut trailer = [0u8; 24];
        trailer[0..8].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
        trailer[8..16].copy_from_slice(&(size as u64).to_le_bytes());
        trailer[16..20].copy_from_slice(&device.to_le_bytes());
        // SAFETY: writes 24 bytes from a local buffer at the trailer's offset.
        let wrote = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                trailer.as_ptr() as *const c_void,
                24,
                size as libc::off_t,
            )
        };
        if wrote != 24 {
            return Err(os_error("writing the memfd's trailer"));
        }
        let physical = Physical {
            fd,
            size,
            device,
            created: true,
            exportable,
        };
        let id = PHYSICAL.insert(Arc::new(physical));
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(handle, id as CUmemGenericAllocationHandle) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // Mappings keep the memory (their `Arc`) until they are unmapped.
    code(PHYSICAL.remove(handle as usize).map(drop))
}

pub(crate) unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    code((|| {
        if ptr.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(invalid(format!(
                "cuMemAddressReserve: size {size} is not a non-zero multiple of the granularity {GRANULARITY}"
            )));
        }
        if alignment > GRANULARITY {
            return Err(invalid(format!(
                "cuMemAddressReserve: alignment {alignment} above {GRANULARITY} is not supported"
            )));
        }
        // The hint is only a hint, as for CUDA.
        let _ = addr;
        // SAFETY: a fresh, inaccessible anonymous mapping at an address the
        // kernel picks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_error("reserving an address range"));
        }
        lock(&RANGES).reserved.insert(base as usize, size);
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(ptr, base as CUdeviceptr) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    code((|| {
        let base = ptr as usize;
        let mut ranges = lock(&RANGES);
        if ranges.reserved.get(&base) != Some(&size) {
            return Err(invalid(format!(
                "cuMemAddressFree: [{base:#x}, +{size}) is not a reserved range"
            )));
        }
        if ranges.mapped.range(base..base + size).next().is_some() {
            return Err(invalid(format!(
                "cuMemAddressFree: [{base:#x}, +{size}) is still mapped; cuMemUnmap first"
            )));
        }
        ranges.reserved.remove(&base);
        // SAFETY: the range was reserved by cuMemAddressReserve and nothing
        // is mapped in it any more.
        unsafe { libc::munmap(base as *mut c_void, size) };
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    code((|| {
        let physical = PHYSICAL.get(handle as usize)?;
        let base = ptr as usize;
        if flags != 0 || offset != 0 || size != physical.size {
            return Err(invalid(format!(
                "cuMemMap: the software driver maps whole allocations: size {size} (the \
                 allocation's is {}), offset {offset} (must be 0)",
                physical.size
            )));
        }
        let mut ranges = lock(&RANGES);
        let inside = ranges
            .reserved
            .range(..=base)
            .next_back()
            .is_some_and(|(&start, &len)| base + size <= start + len);
        if !inside {
            return Err(invalid(format!(
                "cuMemMap: [{base:#x}, +{size}) is not inside a reserved range"
            )));
        }
        let overlaps = ranges
            .mapped
            .range(..base + size)
            .next_back()
            .is_some_and(|(&start, mapping)| start + mapping.size > base);
        if overlaps {
            return Err(invalid(format!(
                "cuMemMap: [{base:#x}, +{size}) is already mapped"
            )));
        }
        // SAFETY: the range lies inside a reservation of ours with nothing
        // mapped in it; MAP_FIXED replaces its inaccessible pages.
        let mapped = unsafe {
            libc::mmap(
                base as *mut c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                physical.fd.as_raw_fd(),
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(os_error("cuMemMap"));
        }
        let counted = if physical.created { size } else { 0 };
        crate::memory::register_mapped(base, size, physical.device, counted);
        ranges.mapped.insert(
            base,
            Mapping {
                size,
                _physical: physical,
            },
        );
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    code((|| {
        let base = ptr as usize;
        let mut ranges = lock(&RANGES);
        match ranges.mapped.get(&base) {
            Some(mapping) if mapping.size == size => {}
            _ => {
                return Err(invalid(format!(
                    "cuMemUnmap: [{base:#x}, +{size}) is not a mapping"
                )));
            }
        }
        crate::memory::unregister_mapped(base);
        // SAFETY: the range was mapped by cuMemMap inside a reservation;
        // back to inaccessible reserved pages.
        let back = unsafe {
            libc::mmap(
                base as *mut c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if back == libc::MAP_FAILED {
            return Err(os_error("cuMemUnmap"));
        }
        ranges.mapped.remove(&base);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    code((|| {
        if desc.is_null() || count == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `count` descriptors at `desc`, per the API.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for desc in descs {
            crate::device::check_device(desc.location.id)?;
        }
        let base = ptr as usize;
        let ranges = lock(&RANGES);
        let covered = ranges
            .mapped
            .range(..=base)
            .next_back()
            .is_some_and(|(&start, mapping)| base + size <= start + mapping.size);
        if !covered {
            return Err(invalid(format!(
                "cuMemSetAccess: [{base:#x}, +{size}) is not mapped"
            )));
        }
        // Every device may touch it already: the software devices share the
        // host's memory (peer rules still apply to kernels, by owner).
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: CUmemAllocationHandleType,
    flags: u64,
) -> CUresult {
    code((|| {
        let physical = PHYSICAL.get(handle as usize)?;
        if handle_type != CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            || flags != 0
        {
            return Err(invalid(format!(
                "cuMemExportToShareableHandle: handle type {:#x}; the software driver exports POSIX file descriptors only",
                handle_type.0
            )));
        }
        if !physical.exportable {
            return Err(invalid(
                "cuMemExportToShareableHandle: the allocation was not created with \
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in requestedHandleTypes"
                    .into(),
            ));
        }
        // SAFETY: duplicates a descriptor we hold; the copy is the caller's.
        let copy = unsafe { libc::fcntl(physical.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(os_error("duplicating the allocation's descriptor"));
        }
        // SAFETY: an int out-pointer for POSIX descriptors, per the API.
        unsafe { write_out(shareable as *mut i32, copy) }
    })())
}

pub(crate) unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: CUmemAllocationHandleType,
) -> CUresult {
    code((|| {
        if handle_type != CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(invalid(format!(
                "cuMemImportFromShareableHandle: handle type {:#x}; the software driver imports POSIX file descriptors only",
                handle_type.0
            )));
        }
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // CUDA passes the descriptor as the pointer's value; the caller keeps it.
        let number = os_handle as usize as i32;
        // SAFETY: duplicates the caller's descriptor (an invalid one fails).
        let copy = unsafe { libc::fcntl(number, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(invalid(format!(
                "cuMemImportFromShareableHandle: {number} is not an open file descriptor"
            )));
        }
        // SAFETY: a descriptor just duplicated, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(copy) };
        let (size, device) = read_trailer(&fd).ok_or_else(|| {
            invalid(format!(
                "cuMemImportFromShareableHandle: descriptor {number} is not memory exported by the \
                 software driver (cuMemExportToShareableHandle)"
            ))
        })?;
        let physical = Physical {
            fd,
            size,
            device,
            created: false,
            exportable: true,
        };
        let id = PHYSICAL.insert(Arc::new(physical));
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(handle, id as CUmemGenericAllocationHandle) }
    })())
}

/// `(size, device)` from an exported memfd's trailer, when it is one.
fn read_trailer(fd: &OwnedFd) -> Option<(usize, i32)> {
    let total = usize::try_from(fd_size(fd)?).ok()?;
    let size = total.checked_sub(GRANULARITY)?;
    let mut trailer = [0u8; 24];
    // SAFETY: reads 24 bytes into a local buffer of 24.
    let read = unsafe {
        libc::pread(
            fd.as_raw_fd(),
            trailer.as_mut_ptr() as *mut c_void,
            24,
            size as libc::off_t,
        )
    };
    if read != 24 {
        return None;
    }
    let magic = u64::from_le_bytes(trailer[0..8].try_into().ok()?);
    let said = u64::from_le_bytes(trailer[8..16].try_into().ok()?);
    let device = i32::from_le_bytes(trailer[16..20].try_into().ok()?);
    (magic == TRAILER_MAGIC && said == size as u64 && size > 0).then_some((size, device))
}

/// A software device's UUID: the same in every process, since the software
/// devices are the same everywhere.
pub(crate) unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: i32) -> CUresult {
    code((|| {
        crate::device::check_device(dev)?;
        let mut bytes = *b"cuda-streams-sw\0";
        bytes[15] = dev as u8;
        let mut out = CUuuid::default();
        for (slot, byte) in out.bytes.iter_mut().zip(bytes) {
            *slot = byte as std::ffi::c_char;
        }
        // SAFETY: null or writable per the API.
        unsafe { write_out(uuid, out) }
    })())
}
