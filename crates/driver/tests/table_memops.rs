//! Stream memory operations through the driver table: `cuStreamWriteValue32`
//! writes in stream order into mapped pinned memory (whose device pointer
//! `cuMemHostGetDevicePointer` gives), and the software driver's checks.
//!
//! Every test takes `serial()`: the faulted-stream test's launch failure is
//! sticky for the whole context until it resets it, as on a GPU.

mod common;

use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use sys::{CU_MEMHOSTALLOC_DEVICEMAP, CUdeviceptr, CUresult};

/// Mapped pinned memory: host pointer and device pointer.
struct Mapped {
    host: *mut u8,
    device: CUdeviceptr,
    table: &'static sys::Driver,
}

impl Mapped {
    fn new(table: &'static sys::Driver, len: usize) -> Self {
        let mut host = std::ptr::null_mut();
        let mut device = 0;
        // SAFETY: out-pointers are valid locals; `host` is a live pinned
        // allocation when cuMemHostGetDevicePointer runs.
        unsafe {
            ok((table.cuMemHostAlloc)(
                &mut host,
                len,
                CU_MEMHOSTALLOC_DEVICEMAP,
            ));
            ok((table.cuMemHostGetDevicePointer)(&mut device, host, 0));
        }
        Self {
            host: host.cast(),
            device,
            table,
        }
    }

    fn flag(&self, index: usize) -> &AtomicU32 {
        // SAFETY: inside the allocation (tests use small indices), 4-byte
        // aligned, and only ever written atomically (by the driver's flag
        // writes, which are stores the GPU makes, or by us through this).
        unsafe { AtomicU32::from_ptr(self.host.cast::<u32>().add(index)) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: a live pinned allocation, freed once, after the tests synchronised.
        unsafe { (self.table.cuMemFreeHost)(self.host.cast()) };
    }
}

#[test]
fn write_value_lands_in_stream_order() {
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let flags = Mapped::new(table, 4096);
    let mut gate = Gate::block(table, stream.raw);
    // SAFETY: a live stream; the address is inside the mapped allocation.
    unsafe {
        ok((table.cuStreamWriteValue32)(
            stream.raw,
            flags.device + 8,
            7,
            0,
        ));
    }
    let done = Event::new(table, 0);
    done.record(stream.raw);
    // The stream is held by the gate: the write has not happened.
    assert_eq!(flags.flag(2).load(Ordering::Acquire), 0);
    expect(done.query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    done.sync();
    assert_eq!(flags.flag(2).load(Ordering::Acquire), 7);
    assert_eq!(
        flags.flag(1).load(Ordering::Acquire),
        0,
        "only the flag is written"
    );
}

#[test]
fn a_flag_written_after_a_copy_shows_the_copy() {
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let flags = Mapped::new(table, 256);
    let dev = DeviceMem::new(table, 1 << 16);
    let out = Pinned::new(table, 1 << 16);
    for round in 1..=20u32 {
        // SAFETY: live allocations of the sizes given; the flag is inside `flags`.
        unsafe {
            ok((table.cuMemsetD8Async)(
                dev.ptr,
                round as u8,
                1 << 16,
                stream.raw,
            ));
            ok((table.cuMemcpyDtoHAsync)(
                out.void(),
                dev.ptr,
                1 << 16,
                stream.raw,
            ));
            ok((table.cuStreamWriteValue32)(
                stream.raw,
                flags.device,
                round,
                0,
            ));
        }
        // Seeing the flag means the copy before it is complete.
        let deadline = std::time::Instant::now() + HANG;
        while flags.flag(0).load(Ordering::Acquire) != round {
            assert!(
                std::time::Instant::now() < deadline,
                "flag {round} never written"
            );
            std::hint::spin_loop();
        }
        assert!(
            out.bytes().iter().all(|&b| b == round as u8),
            "round {round}"
        );
    }
    stream.sync();
}

#[test]
fn device_memory_can_be_written_too() {
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let dev = DeviceMem::new(table, 64);
    let out = Pinned::new(table, 64);
    // SAFETY: live allocations; 4-byte aligned addresses inside them.
    unsafe {
        ok((table.cuMemsetD8Async)(dev.ptr, 0, 64, stream.raw));
        ok((table.cuStreamWriteValue32)(
            stream.raw,
            dev.ptr + 4,
            0xDEAD_BEEF,
            0,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            out.void(),
            dev.ptr,
            64,
            stream.raw,
        ));
    }
    stream.sync();
    assert_eq!(&out.bytes()[4..8], &0xDEAD_BEEFu32.to_ne_bytes());
}

#[test]
fn bad_arguments_are_refused() {
    if skip_on_gpu("the GPU does not check these addresses (undefined behaviour there)") {
        return;
    }
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let flags = Mapped::new(table, 64);
    let dev = DeviceMem::new(table, 64);
    let mut out = 0;
    // SAFETY: invalid arguments are checked and refused by the software driver.
    unsafe {
        // Misaligned.
        expect(
            (table.cuStreamWriteValue32)(stream.raw, flags.device + 2, 1, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        assert!(
            soft_driver::last_error_detail()
                .unwrap()
                .contains("aligned")
        );
        // Past the end of the allocation.
        expect(
            (table.cuStreamWriteValue32)(stream.raw, flags.device + 64, 1, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        // Unknown flags.
        expect(
            (table.cuStreamWriteValue32)(stream.raw, flags.device, 1, 0x10),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        assert!(soft_driver::last_error_detail().unwrap().contains("0x10"));
        // Device memory has no mapped host pointer.
        expect(
            (table.cuMemHostGetDevicePointer)(&mut out, dev.ptr as *mut _, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        assert!(
            soft_driver::last_error_detail()
                .unwrap()
                .contains("not pinned")
        );
        // Flags must be 0.
        expect(
            (table.cuMemHostGetDevicePointer)(&mut out, flags.host.cast(), 1),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
    }
    // The device pointer of mapped pinned memory is its host address.
    assert_eq!(flags.device, flags.host as CUdeviceptr);
    stream.sync();
}

#[test]
fn a_faulted_stream_writes_no_flag() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let _device = device_wide();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let flags = Mapped::new(table, 64);
    let dev = DeviceMem::new(table, 64);
    // Hold the stream until the write is enqueued: a launch that already
    // failed would make the enqueue itself return the sticky error.
    let (open, held) = std::sync::mpsc::channel::<()>();
    host_fn(table, stream.raw, move || {
        let _ = held.recv_timeout(HANG);
    });
    soft_driver::faults::fail_next_launch(stream.raw).unwrap();
    launch_add_u32(table, function, stream.raw, dev.ptr, 16, 1);
    // SAFETY: a live stream; the flag is inside the mapped allocation.
    ok(unsafe { (table.cuStreamWriteValue32)(stream.raw, flags.device, 1, 0) });
    let _ = open.send(());
    // SAFETY: a live stream.
    expect(
        unsafe { (table.cuStreamSynchronize)(stream.raw) },
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    assert_eq!(flags.flag(0).load(Ordering::Acquire), 0);
    soft_driver::faults::clear(stream.raw).unwrap();
}
