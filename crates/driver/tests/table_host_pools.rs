//! Memory pools of host memory through the driver tables (`sys::HostPools`
//! and the main table's pool calls): properties refused with a detail, the
//! memory as a copy source and destination, stream-ordered frees, `maxSize`,
//! trimming and destruction. Where a GPU driver's exact answer is its own,
//! the test asserts only a refusal on the GPU and the software driver's code
//! and detail on the software driver.

mod common;

use common::*;
use sys::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUmemPoolProps,
    CUmemoryPool, CUresult, HostPools,
};

fn pools() -> Option<&'static HostPools> {
    match cuda_streams_driver::driver().unwrap().host_pools() {
        Ok(pools) => Some(pools),
        Err(err) if is_gpu() => {
            eprintln!("skipped: {err}");
            None
        }
        Err(err) => panic!("the software driver has host pools: {err}"),
    }
}

fn host_props(max_size: usize) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        maxSize: max_size,
        ..CUmemPoolProps::default()
    }
}

/// A pool of host memory, destroyed on drop.
struct Pool {
    raw: CUmemoryPool,
    pools: &'static HostPools,
}

impl Pool {
    fn new(pools: &'static HostPools, max_size: usize) -> Self {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer and properties.
        ok(unsafe { (pools.cuMemPoolCreate)(&mut raw, &host_props(max_size)) });
        Self { raw, pools }
    }

    fn attribute(&self, attr: CUmemPool_attribute) -> u64 {
        let mut value = 0u64;
        // SAFETY: a live pool; the byte attributes are 8 bytes.
        ok(unsafe {
            (table().cuMemPoolGetAttribute)(self.raw, attr, (&mut value as *mut u64).cast())
        });
        value
    }

    fn used(&self) -> u64 {
        self.attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    fn reserved(&self) -> u64 {
        self.attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    fn allocate(&self, bytes: usize, stream: &Stream) -> Result<CUdeviceptr, CUresult> {
        let mut ptr = 0;
        // SAFETY: valid out-pointer; a live pool and stream.
        match unsafe { (table().cuMemAllocFromPoolAsync)(&mut ptr, bytes, self.raw, stream.raw) } {
            CUresult::CUDA_SUCCESS => Ok(ptr),
            code => Err(code),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: a live pool, destroyed once.
        unsafe { (self.pools.cuMemPoolDestroy)(self.raw) };
    }
}

/// `code` is a refusal: on the software driver `wanted`, with a detail
/// containing `says`; on a GPU any failure.
#[track_caller]
fn refused(code: CUresult, wanted: CUresult, says: &str) {
    if is_gpu() {
        assert_ne!(code, CUresult::CUDA_SUCCESS, "a GPU driver accepted it");
        return;
    }
    expect(code, wanted);
    let detail = soft_driver::last_error_detail().expect("a detail");
    assert!(detail.contains(says), "{detail}");
}

#[test]
fn properties_that_make_no_pool_of_host_memory_are_refused_naming_the_value() {
    let Some(pools) = pools() else {
        return;
    };
    table();
    let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
    let create = |props: CUmemPoolProps| {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer and properties.
        let code = unsafe { (pools.cuMemPoolCreate)(&mut raw, &props) };
        if code == CUresult::CUDA_SUCCESS {
            // SAFETY: just created.
            unsafe { (pools.cuMemPoolDestroy)(raw) };
        }
        code
    };
    let mut props = host_props(0);
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED;
    // CUDA 13 makes a managed-memory pool of this (seen on driver 580);
    // the software driver models pinned host pools only and refuses it.
    if !is_gpu() {
        refused(create(props), invalid, "allocType 2");
    }
    let mut props = host_props(0);
    props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    refused(create(props), invalid, "location type 4");
    let mut props = host_props(0);
    props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA;
    props.location.id = 77;
    refused(create(props), invalid, "NUMA node 77");
    let mut props = host_props(0);
    props.handleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    refused(create(props), invalid, "handleTypes 0x1");
    let mut props = host_props(0);
    props.reserved[3] = 1;
    refused(create(props), invalid, "reserved bytes");
    // SAFETY: null pointers, which the driver must refuse.
    let code = unsafe { (pools.cuMemPoolCreate)(std::ptr::null_mut(), &host_props(0)) };
    refused(code, invalid, "null pointer");
    // A host location with id ignored, and NUMA node 0, are pools.
    let mut props = host_props(0);
    props.location.id = 12345;
    ok(create(props));
}

#[test]
fn pool_memory_is_host_memory_that_copies_read_and_write() {
    let Some(pools) = pools() else {
        return;
    };
    let table = table();
    let stream = Stream::new(table);
    let pool = Pool::new(pools, 0);
    let len = 10_000;
    let data = random_bytes(7, len);
    let (up, down) = (
        pool.allocate(len, &stream).unwrap(),
        pool.allocate(len, &stream).unwrap(),
    );
    let device = DeviceMem::new(table, len);
    stream.sync();
    // SAFETY: `len` bytes of host memory the stream has allocated and no
    // operation uses yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), up as *mut u8, len) };
    // SAFETY: allocations of `len` bytes, live until the frees below.
    unsafe {
        ok((table.cuMemcpyHtoDAsync)(
            device.ptr,
            up as *const _,
            len,
            stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            down as *mut _,
            device.ptr,
            len,
            stream.raw,
        ));
    }
    stream.sync();
    // SAFETY: `len` bytes the copy above wrote, which nothing uses now.
    let back = unsafe { std::slice::from_raw_parts(down as *const u8, len) };
    assert_eq!(back, &data[..]);
    // SAFETY: from the pool, freed once, unused after.
    unsafe {
        ok((table.cuMemFreeAsync)(up, stream.raw));
        ok((table.cuMemFreeAsync)(down, stream.raw));
    }
    stream.sync();
    assert_eq!(pool.used(), 0);
}

#[test]
fn a_free_gives_the_memory_back_only_when_its_stream_reaches_it() {
    let Some(pools) = pools() else {
        return;
    };
    let table = table();
    let (held, other) = (Stream::new(table), Stream::new(table));
    let pool = Pool::new(pools, 0);
    // Otherwise a GPU driver may serve `other` from the freed memory by
    // making it wait for `held`, which the gate holds.
    let mut off = 0i32;
    // SAFETY: a live pool; the reuse attributes are ints.
    ok(unsafe {
        (table.cuMemPoolSetAttribute)(
            pool.raw,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
            (&mut off as *mut i32).cast(),
        )
    });
    let len = 1 << 16;
    let first = pool.allocate(len, &held).unwrap();
    held.sync();
    let mut gate = Gate::block(table, held.raw);
    // SAFETY: from the pool, freed once; nothing uses it after.
    ok(unsafe { (table.cuMemFreeAsync)(first, held.raw) });
    // The free waits behind the gate: the memory is still the allocation's,
    // so another stream's request gets other memory.
    let second = pool.allocate(len, &other).unwrap();
    other.sync();
    assert_ne!(
        second, first,
        "handed out before its stream reached the free"
    );
    // The software driver counts the memory as used until the stream
    // reaches the free. A GPU's pool stops counting it when the free is
    // enqueued (driver 580: 64 KiB used here, the second allocation's),
    // though it still hands the memory to no other stream.
    if !is_gpu() {
        assert!(pool.used() >= 2 * len as u64, "used {}", pool.used());
    }
    gate.open();
    held.sync();
    assert!(pool.used() < 2 * len as u64, "used {}", pool.used());
    // SAFETY: from the pool, freed once.
    ok(unsafe { (table.cuMemFreeAsync)(second, other.raw) });
    other.sync();
}

#[test]
fn max_size_caps_the_pool_and_trim_gives_memory_back() {
    let Some(pools) = pools() else {
        return;
    };
    if skip_on_gpu("a GPU's pool reserves in its own granularity") {
        return;
    }
    let table = table();
    let stream = Stream::new(table);
    let pool = Pool::new(pools, 8192);
    let (a, b) = (
        pool.allocate(4096, &stream).unwrap(),
        pool.allocate(4096, &stream).unwrap(),
    );
    refused(
        pool.allocate(1, &stream).unwrap_err(),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        "maxSize: 8192 of 8192 bytes in use",
    );
    // A threshold keeps freed memory across synchronisations.
    let mut keep = u64::MAX;
    // SAFETY: a live pool; the threshold is 8 bytes.
    ok(unsafe {
        (table.cuMemPoolSetAttribute)(
            pool.raw,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
    });
    // SAFETY: from the pool, freed once, unused.
    unsafe {
        ok((table.cuMemFreeAsync)(a, stream.raw));
        ok((table.cuMemFreeAsync)(b, stream.raw));
    }
    stream.sync();
    assert_eq!((pool.used(), pool.reserved()), (0, 8192));
    // SAFETY: a live pool.
    ok(unsafe { (table.cuMemPoolTrimTo)(pool.raw, 4096) });
    assert_eq!(pool.reserved(), 4096);
    // SAFETY: a live pool.
    ok(unsafe { (table.cuMemPoolTrimTo)(pool.raw, 0) });
    assert_eq!(pool.reserved(), 0);
    assert_eq!(
        pool.attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
        8192
    );
}

#[test]
fn the_default_release_threshold_gives_freed_memory_back_at_a_synchronisation() {
    let Some(pools) = pools() else {
        return;
    };
    if skip_on_gpu("when a GPU's pool releases memory is its own") {
        return;
    }
    let table = table();
    let stream = Stream::new(table);
    let pool = Pool::new(pools, 0);
    let ptr = pool.allocate(4096, &stream).unwrap();
    // SAFETY: from the pool, freed once, unused.
    ok(unsafe { (table.cuMemFreeAsync)(ptr, stream.raw) });
    stream.sync();
    assert_eq!(pool.reserved(), 0);
}

#[test]
fn a_destroyed_pool_takes_no_requests_but_its_memory_lives_until_freed() {
    let Some(pools) = pools() else {
        return;
    };
    let table = table();
    let stream = Stream::new(table);
    let raw = Pool::new(pools, 0);
    let ptr = raw.allocate(4096, &stream).unwrap();
    stream.sync();
    let handle = raw.raw;
    std::mem::forget(raw);
    // SAFETY: a live pool, destroyed once (forgotten above).
    ok(unsafe { (pools.cuMemPoolDestroy)(handle) });
    // SAFETY: the memory stays until freed, as CUDA keeps it.
    unsafe { (ptr as *mut u8).write_bytes(3, 4096) };
    let mut again = 0;
    // SAFETY: valid out-pointer; a destroyed pool, which must be refused.
    let code = unsafe { (table.cuMemAllocFromPoolAsync)(&mut again, 64, handle, stream.raw) };
    assert_ne!(code, CUresult::CUDA_SUCCESS);
    // SAFETY: from the pool, freed once, unused after.
    ok(unsafe { (table.cuMemFreeAsync)(ptr, stream.raw) });
    stream.sync();
    if !is_gpu() {
        // SAFETY: destroyed already: refused, not undefined.
        let code = unsafe { (pools.cuMemPoolDestroy)(handle) };
        refused(
            code,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "not a live memory pool",
        );
        let mut default = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        ok(unsafe { (table.cuDeviceGetDefaultMemPool)(&mut default, 0) });
        // SAFETY: a default pool, which must be refused.
        let code = unsafe { (pools.cuMemPoolDestroy)(default) };
        refused(code, CUresult::CUDA_ERROR_INVALID_VALUE, "default pool");
    }
}

#[test]
fn access_is_granted_to_devices_and_bad_descriptors_are_refused() {
    let Some(pools) = pools() else {
        return;
    };
    table();
    let pool = Pool::new(pools, 0);
    let mut desc = CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: a live pool; one descriptor.
    ok(unsafe { (pools.cuMemPoolSetAccess)(pool.raw, &desc, 1) });
    if is_gpu() {
        return;
    }
    desc.flags = CUmemAccess_flags(2);
    // SAFETY: as above.
    let code = unsafe { (pools.cuMemPoolSetAccess)(pool.raw, &desc, 1) };
    refused(code, CUresult::CUDA_ERROR_INVALID_VALUE, "access flags 2");
    desc.flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    desc.location.id = 99;
    // SAFETY: as above.
    let code = unsafe { (pools.cuMemPoolSetAccess)(pool.raw, &desc, 1) };
    refused(code, CUresult::CUDA_ERROR_INVALID_DEVICE, "device 99");
}
