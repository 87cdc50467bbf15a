//! The IPC table (`sys::Ipc`) through raw calls: physical memory mapped at
//! a reserved range and used by copies, and the refusals of misuse. Where a
//! GPU driver's exact answer is its own, the test asserts only a refusal on
//! the GPU and the software driver's code on the software driver.

mod common;

use common::*;
use sys::{
    CUdeviceptr, CUevent_flags, CUipcEventHandle, CUmemAccess_flags, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationType, CUmemLocation, CUmemLocationType, CUresult, Ipc,
};

fn ipc() -> &'static Ipc {
    cuda_streams_driver::driver().unwrap().ipc().unwrap()
}

fn properties(handle_types: CUmemAllocationHandleType) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handle_types,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        ..CUmemAllocationProp::default()
    }
}

const POSIX_FD: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// A refusal: on the software driver `code`, on a GPU any failure.
#[track_caller]
fn refused(got: CUresult, code: CUresult) {
    if is_gpu() {
        assert_ne!(got, CUresult::CUDA_SUCCESS, "a GPU driver accepted it");
    } else {
        expect(got, code);
    }
}

#[test]
fn mapped_physical_memory_is_device_memory_until_unmapped() {
    let table = table();
    let ipc = ipc();
    let stream = Stream::new(table);
    let prop = properties(POSIX_FD);
    let mut granularity = 0;
    // SAFETY: every pointer is a valid local; every handle is used while live
    // and released once, in reverse order of creation.
    unsafe {
        ok((ipc.cuMemGetAllocationGranularity)(
            &mut granularity,
            &prop,
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        ));
        let size = granularity;
        let mut handle = 0;
        ok((ipc.cuMemCreate)(&mut handle, size, &prop, 0));
        let mut ptr: CUdeviceptr = 0;
        ok((ipc.cuMemAddressReserve)(&mut ptr, 2 * size, 0, 0, 0));
        // Past the end of the reservation.
        refused(
            (ipc.cuMemMap)(ptr + 2 * size as CUdeviceptr, size, 0, handle, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        ok((ipc.cuMemMap)(ptr, size, 0, handle, 0));
        let access = CUmemAccessDesc {
            location: properties(POSIX_FD).location,
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        ok((ipc.cuMemSetAccess)(ptr, size, &access, 1));
        ok((table.cuMemsetD8Async)(ptr, 0x3c, size, stream.raw));
        let mut back = vec![0u8; size];
        ok((table.cuMemcpyDtoHAsync)(
            back.as_mut_ptr().cast(),
            ptr,
            size,
            stream.raw,
        ));
        stream.sync();
        assert!(back.iter().all(|&b| b == 0x3c));
        // Released while mapped: the mapping keeps the memory.
        ok((ipc.cuMemRelease)(handle));
        ok((table.cuMemsetD8Async)(ptr, 0x11, 16, stream.raw));
        stream.sync();
        if !is_gpu() {
            // Mapped memory is freed by unmapping, not by cuMemFree, and
            // a range with a mapping in it is not freed.
            expect((table.cuMemFree)(ptr), CUresult::CUDA_ERROR_INVALID_VALUE);
            expect(
                (ipc.cuMemAddressFree)(ptr, 2 * size),
                CUresult::CUDA_ERROR_INVALID_VALUE,
            );
        }
        ok((ipc.cuMemUnmap)(ptr, size));
        ok((ipc.cuMemAddressFree)(ptr, 2 * size));
    }
}

#[test]
fn only_memory_created_for_descriptors_is_exported() {
    let _table = table();
    let ipc = ipc();
    let prop = properties(CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE);
    let mut granularity = 0;
    // SAFETY: every pointer is a valid local; the handle is released once.
    unsafe {
        ok((ipc.cuMemGetAllocationGranularity)(
            &mut granularity,
            &prop,
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        ));
        let mut handle = 0;
        ok((ipc.cuMemCreate)(&mut handle, granularity, &prop, 0));
        let mut fd: i32 = -1;
        refused(
            (ipc.cuMemExportToShareableHandle)((&mut fd as *mut i32).cast(), handle, POSIX_FD, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        ok((ipc.cuMemRelease)(handle));
        // A released handle is no handle.
        refused(
            (ipc.cuMemExportToShareableHandle)((&mut fd as *mut i32).cast(), handle, POSIX_FD, 0),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
    }
}

#[test]
fn only_interprocess_events_have_handles() {
    let table = table();
    let ipc = ipc();
    let mut plain = std::ptr::null_mut();
    let mut shared = std::ptr::null_mut();
    let mut handle = CUipcEventHandle::default();
    let interprocess =
        CUevent_flags::CU_EVENT_INTERPROCESS.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    // SAFETY: every pointer is a valid local; each event is destroyed once.
    unsafe {
        ok((table.cuEventCreate)(
            &mut plain,
            CUevent_flags::CU_EVENT_DISABLE_TIMING.0,
        ));
        refused(
            (ipc.cuIpcGetEventHandle)(&mut handle, plain),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
        // Interprocess events have no timing, as CUDA requires.
        refused(
            (table.cuEventCreate)(&mut shared, CUevent_flags::CU_EVENT_INTERPROCESS.0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        ok((table.cuEventCreate)(&mut shared, interprocess));
        ok((ipc.cuIpcGetEventHandle)(&mut handle, shared));
        ok((table.cuEventDestroy)(shared));
        ok((table.cuEventDestroy)(plain));
    }
}

#[test]
fn device_uuids_name_each_device_once() {
    let table = table();
    let ipc = ipc();
    let mut count = 0;
    // SAFETY: valid locals.
    unsafe { ok((table.cuDeviceGetCount)(&mut count)) };
    let uuids: Vec<_> = (0..count)
        .map(|dev| {
            let mut uuid = sys::CUuuid::default();
            // SAFETY: a valid local.
            ok(unsafe { (ipc.cuDeviceGetUuid)(&mut uuid, dev) });
            uuid.bytes
        })
        .collect();
    for (i, uuid) in uuids.iter().enumerate() {
        assert!(!uuids[..i].contains(uuid), "device {i} shares a UUID");
    }
    let mut uuid = sys::CUuuid::default();
    // SAFETY: a valid local.
    refused(
        unsafe { (ipc.cuDeviceGetUuid)(&mut uuid, count) },
        CUresult::CUDA_ERROR_INVALID_DEVICE,
    );
}
