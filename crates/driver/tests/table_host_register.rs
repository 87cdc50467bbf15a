//! `cuMemHostRegister` / `cuMemHostUnregister` through the driver table: a
//! registration round trip with a copy from the registered memory, and the
//! refusals a GPU driver makes (memory from `cuMemHostAlloc`, a page already
//! registered, unknown flags, unregistering what was never registered).
//!
//! Every test takes `serial()`: registrations may not share a page, and two
//! tests' buffers might.

mod common;

use common::*;
use sys::CUresult;

#[test]
fn registered_memory_is_a_copy_source_until_unregistered() {
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let dev = DeviceMem::new(table, 8192);
    let mut data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
    let mut back = vec![0u8; 8192];
    let host = data.as_mut_ptr().cast();
    // SAFETY: `data` is live and unmoved until unregistered below; the copies
    // are synchronised before either buffer is touched again.
    unsafe {
        ok((table.cuMemHostRegister)(host, data.len(), 0));
        ok((table.cuMemcpyHtoDAsync)(
            dev.ptr,
            host,
            data.len(),
            stream.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            back.as_mut_ptr().cast(),
            dev.ptr,
            back.len(),
            stream.raw,
        ));
        stream.sync();
        ok((table.cuMemHostUnregister)(host));
    }
    assert_eq!(back, data);
}

#[test]
fn the_driver_refuses_what_a_gpu_driver_refuses() {
    let _serial = serial();
    let table = table();
    let pinned = Pinned::new(table, 4096);
    let mut data = vec![0u8; 3 * 4096];
    let host = data.as_mut_ptr();
    // SAFETY: every pointer is live for the sizes given; nothing is copied.
    unsafe {
        // Memory from cuMemHostAlloc is page-locked already; a GPU driver
        // (an H100, CUDA 13.0) answers INVALID_VALUE, not ALREADY_REGISTERED.
        expect(
            (table.cuMemHostRegister)(pinned.void(), 4096, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        // Unregistering what was never registered (CUDA documents this code).
        expect(
            (table.cuMemHostUnregister)(host.cast()),
            CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        );
        ok((table.cuMemHostRegister)(host.cast(), 4096, 0));
        // A registration overlapping another's bytes (CUDA documents this
        // code for memory registered already; not yet seen on a GPU here).
        expect(
            (table.cuMemHostRegister)(host.add(100).cast(), 4096, 0),
            CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        );
        ok((table.cuMemHostUnregister)(host.cast()));
        // Unregistered: the same memory registers again, once.
        ok((table.cuMemHostRegister)(host.cast(), 4096, 0));
        ok((table.cuMemHostUnregister)(host.cast()));
        expect(
            (table.cuMemHostUnregister)(host.cast()),
            CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        );
    }
    if skip_on_gpu("flag and size checks name the value in the software driver's detail") {
        return;
    }
    // SAFETY: as above.
    unsafe {
        expect(
            (table.cuMemHostRegister)(host.cast(), 4096, 0x40),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        assert!(soft_driver::last_error_detail().unwrap().contains("0x40"));
        expect(
            (table.cuMemHostRegister)(host.cast(), 0, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        assert!(
            soft_driver::last_error_detail()
                .unwrap()
                .contains("0 bytes")
        );
    }
}
