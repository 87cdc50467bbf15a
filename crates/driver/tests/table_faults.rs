//! Software-only behaviour: fault injection, the capacity, and handles that a
//! GPU would not survive (destroyed or foreign handles are undefined behaviour
//! on NVIDIA's driver, so they are only exercised here).
//!
//! Every test takes `serial()`: sticky context errors, the capacity and pending
//! allocation failures are process-wide.

mod common;

use common::*;
use soft_driver::faults;
use std::time::Duration;
use sys::CUresult;

#[test]
fn a_failed_launch_is_sticky_until_cleared() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let _device = device_wide();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let (stream, bystander) = (Stream::new(table), Stream::new(table));
    let dev = DeviceMem::new(table, 64);
    faults::fail_next_launch(stream.raw).unwrap();
    // The launch call succeeds: kernel errors are asynchronous.
    launch_add_u32(table, function, stream.raw, dev.ptr, 16, 1);
    // SAFETY: a live stream.
    expect(
        unsafe { (table.cuStreamSynchronize)(stream.raw) },
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    assert!(
        soft_driver::last_error_detail()
            .unwrap()
            .contains("add_u32")
    );
    expect(stream.query(), CUresult::CUDA_ERROR_LAUNCH_FAILED);
    // SAFETY: live allocation and stream.
    expect(
        unsafe { (table.cuMemsetD8Async)(dev.ptr, 0, 64, stream.raw) },
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    // SAFETY: no arguments.
    expect(
        unsafe { (table.cuCtxSynchronize)() },
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    // Other streams keep working (a GPU would fail the whole context).
    // SAFETY: live allocation and stream.
    ok(unsafe { (table.cuMemsetD8Async)(dev.ptr, 0, 64, bystander.raw) });
    bystander.sync();
    let (code, detail) = faults::stream_fault(stream.raw).unwrap().unwrap();
    assert_eq!(code, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    assert!(detail.contains("injected"), "{detail}");

    faults::clear(stream.raw).unwrap();
    stream.sync();
    // SAFETY: no arguments.
    ok(unsafe { (table.cuCtxSynchronize)() });
    launch_add_u32(table, function, stream.raw, dev.ptr, 16, 1);
    stream.sync();
}

#[test]
fn a_panicking_twin_is_a_launch_failure_naming_it() {
    if skip_on_gpu("the kernel runs on the GPU, not as a twin") {
        return;
    }
    let _serial = serial();
    static IMAGE: [u8; 6] = *b"panic\0";
    unsafe fn boom(_: &soft_driver::LaunchDims, _: *mut *mut std::ffi::c_void) {
        panic!("twin exploded");
    }
    // SAFETY: boom() takes no arguments and touches no memory (it panics).
    unsafe {
        soft_driver::register_image(
            &IMAGE,
            &[soft_driver::TwinSpec {
                name: "boom",
                params: &[],
                run: boom,
            }],
        )
    }
    .unwrap();
    let table = table();
    let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
    let stream = Stream::new(table);
    // SAFETY: valid out-pointers, a registered image; a kernel without arguments.
    unsafe {
        ok((table.cuModuleLoadData)(&mut module, IMAGE.as_ptr().cast()));
        ok((table.cuModuleGetFunction)(
            &mut function,
            module,
            c"boom".as_ptr(),
        ));
        ok((table.cuLaunchKernel)(
            function,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream.raw,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ));
        expect(
            (table.cuStreamSynchronize)(stream.raw),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
    }
    let detail = soft_driver::last_error_detail().unwrap();
    assert!(
        detail.contains("boom") && detail.contains("twin exploded"),
        "{detail}"
    );
    faults::reset();
    stream.sync();
}

#[test]
fn injected_allocation_failures_run_out_then_allocation_works() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    faults::fail_next_allocations(2);
    let mut ptr = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        expect(
            (table.cuMemAlloc)(&mut ptr, 256),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        );
        expect(
            (table.cuMemAllocAsync)(&mut ptr, 256, stream.raw),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        );
    }
    assert_eq!(faults::pending_allocation_failures(), 0);
    let _works = DeviceMem::new(table, 256);
}

#[test]
fn a_delayed_worker_widens_the_race_window() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let event = Event::new(table, 0);
    faults::delay_next_operation(stream.raw, Duration::from_millis(300)).unwrap();
    event.record(stream.raw);
    // The marker cannot have been passed yet: the worker sleeps first.
    expect(event.query(), CUresult::CUDA_ERROR_NOT_READY);
    event.sync();
    ok(event.query());
}

#[test]
fn a_stream_ordered_use_after_free_is_an_illegal_address() {
    if skip_on_gpu("a use-after-free is undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let mut out = vec![0u8; 1024];
    let mut ptr = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { (table.cuMemAlloc)(&mut ptr, 1024) });
    let mut gate = Gate::block(table, stream.raw);
    // SAFETY: valid at enqueue time; freed (wrongly) before the copy runs.
    unsafe {
        ok((table.cuMemcpyDtoHAsync)(
            out.as_mut_ptr().cast(),
            ptr,
            1024,
            stream.raw,
        ));
        ok((table.cuMemFree)(ptr));
    }
    gate.open();
    expect(
        stream.query_after_sync(table),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    );
    assert!(
        soft_driver::last_error_detail()
            .unwrap()
            .contains("not inside any live allocation")
    );
    faults::reset();
}

trait SyncCode {
    fn query_after_sync(&self, table: &sys::Driver) -> CUresult;
}

impl SyncCode for Stream {
    fn query_after_sync(&self, table: &sys::Driver) -> CUresult {
        // SAFETY: a live stream.
        unsafe { (table.cuStreamSynchronize)(self.raw) }
    }
}

#[test]
fn copies_out_of_bounds_of_an_allocation_are_invalid() {
    if skip_on_gpu("bounds checks of device pointers are the software driver's") {
        return;
    }
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let dev = DeviceMem::new(table, 1000);
    let host = vec![0u8; 4096];
    // SAFETY: the driver refuses these before touching anything.
    unsafe {
        expect(
            (table.cuMemcpyHtoDAsync)(dev.ptr, host.as_ptr().cast(), 1001, stream.raw),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        expect(
            (table.cuMemcpyDtoHAsync)(
                host.as_ptr().cast_mut().cast(),
                dev.ptr + 500,
                600,
                stream.raw,
            ),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        expect(
            (table.cuMemsetD8Async)(0x1000, 0, 16, stream.raw),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
    }
    assert!(soft_driver::last_error_detail().unwrap().contains("0x1000"));
    ok(stream.query());
}

#[test]
fn destroyed_and_foreign_handles_are_invalid_not_undefined() {
    if skip_on_gpu("destroyed and foreign handles are undefined behaviour on a GPU") {
        return;
    }
    let _serial = serial();
    let table = table();
    let mut stream = std::ptr::null_mut();
    let mut event = std::ptr::null_mut();
    let mut local = [0u64; 8];
    let foreign = local.as_mut_ptr().cast::<std::ffi::c_void>();
    let (module, function) = load_add_u32(table);
    // SAFETY: the software driver resolves handles through registries, never
    // dereferencing them; that is what this test proves.
    unsafe {
        ok((table.cuStreamCreateWithPriority)(&mut stream, 0, 0));
        ok((table.cuEventCreate)(&mut event, 0));
        ok((table.cuStreamDestroy)(stream));
        ok((table.cuEventDestroy)(event));
        ok((table.cuModuleUnload)(module));
        let invalid = CUresult::CUDA_ERROR_INVALID_HANDLE;
        expect((table.cuStreamQuery)(stream), invalid);
        expect((table.cuStreamSynchronize)(stream), invalid);
        expect((table.cuStreamDestroy)(stream), invalid);
        expect((table.cuEventQuery)(event), invalid);
        expect((table.cuEventDestroy)(event), invalid);
        expect((table.cuEventRecord)(event, std::ptr::null_mut()), invalid);
        expect((table.cuStreamQuery)(foreign.cast()), invalid);
        expect((table.cuEventSynchronize)(foreign.cast()), invalid);
        // A stream handle is not an event and vice versa.
        let live = Stream::new(table);
        expect((table.cuEventQuery)(live.raw.cast()), invalid);
        expect((table.cuModuleUnload)(module), invalid);
        let mut f = std::ptr::null_mut();
        expect(
            (table.cuModuleGetFunction)(&mut f, module, c"add_u32".as_ptr()),
            invalid,
        );
        let mut arg = 0u64;
        let mut params = [(&mut arg as *mut u64).cast::<std::ffi::c_void>(); 3];
        expect(
            (table.cuLaunchKernel)(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                live.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            invalid,
        );
        expect((table.cuGraphLaunch)(foreign.cast(), live.raw), invalid);
        expect((table.cuMemPoolTrimTo)(foreign.cast(), 0), invalid);
    }
}

#[test]
fn out_of_memory_at_capacity_and_recovery_after_frees() {
    if skip_on_gpu("the capacity is the software device's setting") {
        return;
    }
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let before = soft_driver::capacity();
    let chunk = 1 << 20;
    soft_driver::set_capacity(soft_driver::memory_in_use() + 4 * chunk);
    let result = std::panic::catch_unwind(|| {
        let mut held: Vec<DeviceMem> = (0..3).map(|_| DeviceMem::new(table, chunk)).collect();
        let mut async_ptr = 0;
        // SAFETY: valid out-pointers.
        unsafe {
            ok((table.cuMemAllocAsync)(&mut async_ptr, chunk, stream.raw));
            let mut ptr = 0;
            expect(
                (table.cuMemAlloc)(&mut ptr, 256),
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            );
            let detail = soft_driver::last_error_detail().unwrap();
            assert!(detail.contains("capacity"), "{detail}");
            expect(
                (table.cuMemAllocAsync)(&mut ptr, 256, stream.raw),
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            );
            let (mut free, mut total) = (1usize, 0usize);
            ok((table.cuMemGetInfo)(&mut free, &mut total));
            assert_eq!(free, 0);
            // Pinned host memory is not device memory.
            let pinned = Pinned::new(table, chunk);
            drop(pinned);
            // Recovery: a stream-ordered free releases at the synchronize ...
            ok((table.cuMemFreeAsync)(async_ptr, stream.raw));
            stream.sync();
            ok((table.cuMemAllocAsync)(&mut ptr, chunk, stream.raw));
            ok((table.cuMemFreeAsync)(ptr, stream.raw));
            stream.sync();
        }
        // ... and a plain free at once.
        held.pop();
        held.push(DeviceMem::new(table, chunk));
    });
    soft_driver::set_capacity(before);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
