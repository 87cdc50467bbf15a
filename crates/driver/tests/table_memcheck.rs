//! The software driver checks what memcheck checks: every pointer a kernel
//! twin, a copy or a memset receives must be live, usable in stream order and
//! long enough, or the work fails with `CUDA_ERROR_ILLEGAL_ADDRESS`, touches
//! nothing, and poisons the whole context (as on a GPU) until reset.
//!
//! Its own test binary: a poisoned context would fail every other test of the
//! process. Each test takes `serial()` and resets the faults when done.

mod common;

use common::*;
use soft_driver::faults;
use std::ffi::c_void;
use sys::{CUdeviceptr, CUresult};

/// Copy `len` bytes of device memory back to the host.
fn read(table: &'static sys::Driver, ptr: CUdeviceptr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let stream = Stream::new(table);
    // SAFETY: `out` holds `len` bytes and outlives the copy (synchronized);
    // `ptr` is a live allocation of at least `len`.
    ok(unsafe { (table.cuMemcpyDtoHAsync)(out.as_mut_ptr().cast(), ptr, len, stream.raw) });
    stream.sync();
    out
}

fn write(table: &'static sys::Driver, ptr: CUdeviceptr, data: &[u8]) {
    let stream = Stream::new(table);
    // SAFETY: `data` is readable until the copy is synchronized; `ptr` holds
    // at least `data.len()` bytes.
    ok(unsafe { (table.cuMemcpyHtoDAsync)(ptr, data.as_ptr().cast(), data.len(), stream.raw) });
    stream.sync();
}

fn sync(stream: &Stream) -> CUresult {
    // SAFETY: a live stream.
    unsafe { (table().cuStreamSynchronize)(stream.raw) }
}

/// Reset the faults even when an assertion fails, so the next test starts clean.
struct ResetOnDrop;
impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        faults::reset();
    }
}

#[test]
fn a_kernel_writing_past_its_buffer_fails_touches_nothing_and_poisons_the_context() {
    if skip_on_gpu("an out-of-bounds write is undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let (_module, add) = load_add_u32(table);
    let (stream, bystander) = (Stream::new(table), Stream::new(table));
    let before = DeviceMem::new(table, 64);
    let buffer = DeviceMem::new(table, 64); // 16 u32
    let after = DeviceMem::new(table, 64);
    for (mem, byte) in [(&before, 0xB0u8), (&buffer, 0x11), (&after, 0xA0)] {
        write(table, mem.ptr, &[byte; 64]);
    }
    launch_add_u32(table, add, stream.raw, buffer.ptr, 17, 1); // one u32 too many
    expect(sync(&stream), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    let detail = soft_driver::last_error_detail().unwrap();
    assert!(
        detail.contains("add_u32")
            && detail.contains("17 element(s) of u32 at")
            && detail.contains("In bytes: [")
            && detail.contains("runs past the end of the 64-byte allocation"),
        "{detail}"
    );
    // Sticky for the context: another stream and the context say so too.
    expect(bystander.query(), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    // SAFETY: no arguments.
    expect(
        unsafe { (table.cuCtxSynchronize)() },
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    );
    faults::reset();
    // Nothing was touched: not the buffer, not its neighbours.
    assert_eq!(read(table, before.ptr, 64), [0xB0; 64]);
    assert_eq!(read(table, buffer.ptr, 64), [0x11; 64]);
    assert_eq!(read(table, after.ptr, 64), [0xA0; 64]);
    // After the reset the same launch, in bounds, works.
    launch_add_u32(table, add, stream.raw, buffer.ptr, 16, 1);
    ok(sync(&stream));
    assert_eq!(
        read(table, buffer.ptr, 64),
        0x1111_1112u32.to_le_bytes().repeat(16)
    );
}

#[test]
fn freed_and_host_pointers_are_illegal_addresses() {
    if skip_on_gpu("these accesses are undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let (_module, add) = load_add_u32(table);
    let stream = Stream::new(table);
    let freed = DeviceMem::new(table, 64).ptr; // dropped: freed at once
    launch_add_u32(table, add, stream.raw, freed, 4, 1);
    expect(sync(&stream), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(
        soft_driver::last_error_detail()
            .unwrap()
            .contains("not inside any live allocation")
    );
    faults::reset();
    let mut host = [7u32; 4];
    let host_ptr = host.as_mut_ptr() as CUdeviceptr;
    launch_add_u32(table, add, stream.raw, host_ptr, 4, 1);
    expect(sync(&stream), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    faults::reset();
    assert_eq!(host, [7; 4], "plain host memory was not written");
    // A count of zero touches nothing: a null pointer is fine.
    launch_add_u32(table, add, stream.raw, 0, 0, 1);
    ok(sync(&stream));
}

#[test]
fn a_read_only_pointer_shorter_than_its_extent_is_refused_too() {
    if skip_on_gpu("an out-of-bounds read is undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let stream = Stream::new(table);
    // saxpy(u64 n, f32 a, const f32* x, f32* y): x shorter than n.
    let mut saxpy = std::ptr::null_mut();
    // The software driver's module of the kernels crate's declarations (the
    // safe twin of saxpy, behind the driver's pointer checks).
    let module = soft_driver::module_from_declarations().unwrap();
    let decl = kernels::ELEMENTWISE.twin("saxpy").unwrap();
    soft_driver::define_kernel(module, decl.name, decl.params, decl.twin.unwrap()).unwrap();
    // SAFETY: valid out-pointers; a live module.
    unsafe {
        ok((table.cuModuleGetFunction)(
            &mut saxpy,
            module,
            c"saxpy".as_ptr(),
        ));
    }
    let (x, y) = (DeviceMem::new(table, 8 * 4), DeviceMem::new(table, 16 * 4));
    write(table, y.ptr, &[0u8; 64]);
    let (mut n, mut a, mut xp, mut yp) = (16u64, 2.0f32, x.ptr, y.ptr);
    let mut params: [*mut c_void; 4] = [
        (&raw mut n).cast(),
        (&raw mut a).cast(),
        (&raw mut xp).cast(),
        (&raw mut yp).cast(),
    ];
    // SAFETY: four arguments of the kernel's sizes; the pointers are what is tested.
    ok(unsafe {
        (table.cuLaunchKernel)(
            saxpy,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            stream.raw,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    });
    expect(sync(&stream), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(
        soft_driver::last_error_detail()
            .unwrap()
            .contains("parameter 2")
    );
    faults::reset();
    assert_eq!(read(table, y.ptr, 64), [0u8; 64], "y was not written");
    // SAFETY: loaded above, unloaded once.
    ok(unsafe { (table.cuModuleUnload)(module) });
}

#[test]
fn stream_ordered_memory_is_usable_only_in_stream_order() {
    if skip_on_gpu("using memory before its stream allocated it is undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let (home, other) = (Stream::new(table), Stream::new(table));
    let mut gate = Gate::block(table, home.raw);
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: valid out-pointer and stream.
    ok(unsafe { (table.cuMemAllocAsync)(&mut ptr, 256, home.raw) });
    // `other` does not wait for `home`, which has not reached the allocation.
    // SAFETY: 256 bytes at a (not yet usable) stream-ordered allocation.
    ok(unsafe { (table.cuMemsetD8Async)(ptr, 1, 256, other.raw) });
    expect(sync(&other), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(
        soft_driver::last_error_detail()
            .unwrap()
            .contains("has not reached yet")
    );
    gate.open();
    faults::reset();
    // Ordered through an event recorded after the allocation: fine.
    let mut gate = Gate::block(table, home.raw);
    let mut second: CUdeviceptr = 0;
    // SAFETY: valid out-pointer and stream.
    ok(unsafe { (table.cuMemAllocAsync)(&mut second, 256, home.raw) });
    let allocated = Event::new(table, 0);
    allocated.record(home.raw);
    // SAFETY: live stream and event; then a memset of the 256 bytes.
    unsafe {
        ok((table.cuStreamWaitEvent)(other.raw, allocated.raw, 0));
        ok((table.cuMemsetD8Async)(second, 2, 256, other.raw));
    }
    gate.open();
    ok(sync(&other));
    assert_eq!(read(table, second, 256), [2u8; 256]);
    // SAFETY: both allocations are freed once, in stream order on `home`.
    unsafe {
        ok((table.cuMemFreeAsync)(ptr, home.raw));
        ok((table.cuMemFreeAsync)(second, home.raw));
    }
    home.sync();
}

#[test]
fn graph_memory_outside_its_replay_fails_like_freed_memory() {
    if skip_on_gpu("touching graph memory outside its graph is undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let stream = Stream::new(table);
    let mut ptr: CUdeviceptr = 0;
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: a live stream; valid out-pointers; the memset stays inside the
    // 256 bytes allocated, between the allocation and its free.
    unsafe {
        ok((table.cuStreamBeginCapture)(
            stream.raw,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        ));
        ok((table.cuMemAllocAsync)(&mut ptr, 256, stream.raw));
        ok((table.cuMemsetD8Async)(ptr, 7, 256, stream.raw));
        ok((table.cuMemFreeAsync)(ptr, stream.raw));
        ok((table.cuStreamEndCapture)(stream.raw, &mut graph));
        ok((table.cuGraphInstantiate)(&mut exec, graph, 0));
        for _ in 0..3 {
            ok((table.cuGraphLaunch)(exec, stream.raw));
        }
    }
    expect(sync(&stream), CUresult::CUDA_SUCCESS);
    // Not a free of ours: the graph's free node frees it.
    // SAFETY: a graph allocation, which cuMemFree refuses.
    expect(
        unsafe { (table.cuMemFree)(ptr) },
        CUresult::CUDA_ERROR_INVALID_VALUE,
    );
    // Between replays nothing is mapped there.
    // SAFETY: the address is checked by the driver, which refuses the work.
    ok(unsafe { (table.cuMemsetD8Async)(ptr, 1, 256, stream.raw) });
    expect(sync(&stream), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    let detail = soft_driver::last_error_detail().unwrap();
    assert!(
        detail.contains("graph memory") && detail.contains("mapped only while a launch"),
        "{detail}"
    );
    // SAFETY: handles made above, destroyed once.
    unsafe {
        (table.cuGraphExecDestroy)(exec);
        (table.cuGraphDestroy)(graph);
    }
}
