//! Memory through the driver table: copies, memsets, stream-ordered allocation,
//! pools, pinned and managed memory, and out-of-memory.

mod common;

use common::*;
use sys::{CUdeviceptr, CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUresult};

#[test]
fn copies_round_trip_random_data() {
    let table = table();
    let stream = Stream::new(table);
    for (seed, len) in [
        (1u64, 1usize),
        (2, 255),
        (3, 256),
        (4, 4097),
        (5, (1 << 20) + 3),
    ] {
        let data = random_bytes(seed, len);
        let source = Pinned::new(table, len);
        source.fill(&data);
        let (a, b) = (DeviceMem::new(table, len), DeviceMem::new(table, len));
        let out = Pinned::new(table, len);
        // SAFETY: allocations and buffers of `len` bytes.
        unsafe {
            ok((table.cuMemcpyHtoDAsync)(
                a.ptr,
                source.void(),
                len,
                stream.raw,
            ));
            ok((table.cuMemcpyDtoDAsync)(b.ptr, a.ptr, len, stream.raw));
            ok((table.cuMemsetD8Async)(a.ptr, 0, len, stream.raw));
            ok((table.cuMemcpyDtoHAsync)(
                out.void(),
                b.ptr,
                len,
                stream.raw,
            ));
        }
        stream.sync();
        assert_eq!(
            out.bytes(),
            &data[..],
            "{len} bytes through two device buffers"
        );
    }
}

#[test]
fn pageable_host_memory_copies_too() {
    let table = table();
    let stream = Stream::new(table);
    let data = random_bytes(99, 10_000);
    let mut back = vec![0u8; 10_000];
    let dev = DeviceMem::new(table, 10_000);
    // SAFETY: buffers of 10_000 bytes that outlive the synchronize below.
    unsafe {
        ok((table.cuMemcpyHtoDAsync)(
            dev.ptr,
            data.as_ptr().cast(),
            10_000,
            stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            back.as_mut_ptr().cast(),
            dev.ptr,
            10_000,
            stream.raw,
        ));
    }
    stream.sync();
    assert_eq!(back, data);
}

#[test]
fn peer_copies_within_the_device() {
    let table = table();
    let stream = Stream::new(table);
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { (table.cuCtxGetCurrent)(&mut ctx) });
    let data = random_bytes(12, 3000);
    let (a, b) = (DeviceMem::new(table, 3000), DeviceMem::new(table, 3000));
    let mut back = vec![0u8; 3000];
    // SAFETY: buffers of 3000 bytes, the current context.
    unsafe {
        ok((table.cuMemcpyHtoDAsync)(
            a.ptr,
            data.as_ptr().cast(),
            3000,
            stream.raw,
        ));
        ok((table.cuMemcpyPeerAsync)(
            b.ptr, ctx, a.ptr, ctx, 3000, stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            back.as_mut_ptr().cast(),
            b.ptr,
            3000,
            stream.raw,
        ));
    }
    stream.sync();
    assert_eq!(back, data);
}

#[test]
fn memsets_write_bytes_and_words() {
    let table = table();
    let stream = Stream::new(table);
    let dev = DeviceMem::new(table, 1024);
    let out = Pinned::new(table, 1024);
    // SAFETY: a 1024-byte allocation and buffer.
    unsafe {
        ok((table.cuMemsetD32Async)(
            dev.ptr,
            0xDEAD_BEEF,
            256,
            stream.raw,
        ));
        ok((table.cuMemsetD8Async)(dev.ptr + 4, 0x11, 4, stream.raw));
        ok((table.cuMemcpyDtoHAsync)(
            out.void(),
            dev.ptr,
            1024,
            stream.raw,
        ));
        expect(
            (table.cuMemsetD32Async)(dev.ptr + 2, 0, 4, stream.raw),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
    }
    stream.sync();
    let words: Vec<u32> = out
        .bytes()
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(words[0], 0xDEAD_BEEF);
    assert_eq!(words[1], 0x1111_1111);
    assert!(words[2..].iter().all(|&w| w == 0xDEAD_BEEF));
}

#[test]
fn async_allocation_and_free_follow_stream_order() {
    let table = table();
    let stream = Stream::new(table);
    let len = 1 << 16;
    let data = random_bytes(31, len);
    let source = Pinned::new(table, len);
    source.fill(&data);
    let out = Pinned::new(table, len);
    let mut gate = Gate::block(table, stream.raw);
    let mut ptr: CUdeviceptr = 0;
    // The allocation returns at once even though the stream is blocked; the
    // free is queued behind the copies that use the memory.
    // SAFETY: valid out-pointer; buffers of `len` bytes.
    unsafe {
        ok((table.cuMemAllocAsync)(&mut ptr, len, stream.raw));
        assert_ne!(ptr, 0);
        assert_eq!(ptr % 256, 0, "256-byte aligned");
        ok((table.cuMemcpyHtoDAsync)(
            ptr,
            source.void(),
            len,
            stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(out.void(), ptr, len, stream.raw));
        ok((table.cuMemFreeAsync)(ptr, stream.raw));
    }
    expect(stream.query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    stream.sync();
    assert_eq!(out.bytes(), &data[..]);
}

#[test]
fn the_default_pool_reports_its_usage_and_takes_attributes() {
    let table = table();
    let stream = Stream::new(table);
    let mut pool = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { (table.cuDeviceGetDefaultMemPool)(&mut pool, 0) });
    let get = |attr: CUmemPool_attribute| {
        let mut value = 0u64;
        // SAFETY: these attributes are 64-bit.
        ok(unsafe { (table.cuMemPoolGetAttribute)(pool, attr, (&mut value as *mut u64).cast()) });
        value
    };
    let len = 3 << 20;
    let mut ptr = 0;
    // SAFETY: valid out-pointer, the default pool.
    ok(unsafe { (table.cuMemAllocFromPoolAsync)(&mut ptr, len, pool, stream.raw) });
    let used = get(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    let reserved = get(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    assert!(used >= len as u64, "used {used} counts our {len} bytes");
    assert!(reserved >= used, "reserved {reserved} >= used {used}");
    assert!(get(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= used);
    let mut threshold = 1u64 << 30;
    // SAFETY: a 64-bit attribute.
    ok(unsafe {
        (table.cuMemPoolSetAttribute)(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    });
    assert_eq!(
        get(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
        1 << 30
    );
    // SAFETY: our allocation, freed once.
    ok(unsafe { (table.cuMemFreeAsync)(ptr, stream.raw) });
    stream.sync();
    // SAFETY: the default pool.
    ok(unsafe { (table.cuMemPoolTrimTo)(pool, 0) });
    let mut zero = 0u64;
    // SAFETY: a 64-bit attribute; restores CUDA's default threshold.
    ok(unsafe {
        (table.cuMemPoolSetAttribute)(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut zero as *mut u64).cast(),
        )
    });
}

#[test]
fn pinned_and_managed_memory_are_host_accessible() {
    let table = table();
    let stream = Stream::new(table);
    let len = 8192;
    let mut managed: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; CU_MEM_ATTACH_GLOBAL.
    ok(unsafe { (table.cuMemAllocManaged)(&mut managed, len, 1) });
    let data = random_bytes(77, len);
    // SAFETY: managed memory is host-accessible; no stream uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), managed as *mut u8, len) };
    let device = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    };
    let host = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
        id: 0,
    };
    let copy = DeviceMem::new(table, len);
    let out = Pinned::new(table, len);
    // SAFETY: managed and device allocations of `len` bytes.
    unsafe {
        ok((table.cuMemPrefetchAsync)(
            managed, len, device, 0, stream.raw,
        ));
        ok((table.cuMemcpyDtoDAsync)(
            copy.ptr, managed, len, stream.raw,
        ));
        ok((table.cuMemsetD8Async)(managed, 0x42, 16, stream.raw));
        ok((table.cuMemPrefetchAsync)(
            managed, len, host, 0, stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            out.void(),
            copy.ptr,
            len,
            stream.raw,
        ));
    }
    stream.sync();
    assert_eq!(out.bytes(), &data[..]);
    // SAFETY: synchronised; managed memory is host-accessible.
    let managed_bytes = unsafe { std::slice::from_raw_parts(managed as *const u8, len) };
    assert!(managed_bytes[..16].iter().all(|&b| b == 0x42));
    assert_eq!(&managed_bytes[16..], &data[16..]);
    // SAFETY: freed once.
    ok(unsafe { (table.cuMemFree)(managed) });
}

#[test]
fn memory_info_is_consistent() {
    let table = table();
    let (mut free, mut total, mut device_total) = (0usize, 0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe {
        ok((table.cuMemGetInfo)(&mut free, &mut total));
        ok((table.cuDeviceTotalMem)(&mut device_total, 0));
    }
    assert!(free <= total && total > 0);
    assert_eq!(total, device_total);
}

#[test]
fn allocations_past_the_device_are_out_of_memory_and_the_device_recovers() {
    // On the H200 an async allocation that runs out of memory first waits for
    // the device's pending work.
    let _device = device_wide();
    let table = table();
    let mut total = 0usize;
    // SAFETY: valid out-pointer.
    ok(unsafe { (table.cuDeviceTotalMem)(&mut total, 0) });
    let mut ptr = 0;
    // SAFETY: valid out-pointer.
    let code = unsafe { (table.cuMemAlloc)(&mut ptr, total + (1 << 30)) };
    expect(code, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    let stream = Stream::new(table);
    // SAFETY: valid out-pointer.
    let code = unsafe { (table.cuMemAllocAsync)(&mut ptr, total + (1 << 30), stream.raw) };
    expect(code, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    let after = DeviceMem::new(table, 1 << 20);
    assert_ne!(after.ptr, 0);
}

#[test]
fn zero_byte_allocations_are_invalid() {
    let table = table();
    let mut ptr = 0;
    // SAFETY: valid out-pointer.
    expect(
        unsafe { (table.cuMemAlloc)(&mut ptr, 0) },
        CUresult::CUDA_ERROR_INVALID_VALUE,
    );
}

#[test]
fn a_large_allocation_is_lazily_zeroed() {
    let table = table();
    // 1 GiB: cheap on both drivers because nothing touches it.
    let big = DeviceMem::new(table, 1 << 30);
    let stream = Stream::new(table);
    let mut tail = [0xFFu8; 64];
    // SAFETY: 64 bytes at the end of the allocation.
    unsafe {
        ok((table.cuMemsetD8Async)(
            big.ptr + (1 << 30) - 64,
            0,
            64,
            stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            tail.as_mut_ptr().cast(),
            big.ptr + (1 << 30) - 64,
            64,
            stream.raw,
        ));
    }
    stream.sync();
    assert_eq!(tail, [0u8; 64]);
}
