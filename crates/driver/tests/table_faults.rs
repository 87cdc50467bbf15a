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

/// Reset the faults even when an assertion fails, so the next test starts clean.
struct ResetOnDrop;
impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        faults::reset();
    }
}

#[test]
fn a_failed_launch_is_sticky_for_the_whole_context_until_cleared() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let _device = device_wide();
    let _reset = ResetOnDrop;
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
    // As on a GPU, the whole context fails: another stream, which never
    // touched the failed work, and the calls that make new things.
    expect(bystander.query(), CUresult::CUDA_ERROR_LAUNCH_FAILED);
    // SAFETY: live allocation and stream.
    expect(
        unsafe { (table.cuMemsetD8Async)(dev.ptr, 0, 64, bystander.raw) },
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    let (mut ptr, mut raw_stream, mut raw_event) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers.
    unsafe {
        expect(
            (table.cuMemAlloc)(&mut ptr, 64),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
        expect(
            (table.cuStreamCreateWithPriority)(&mut raw_stream, 0, 0),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
        expect(
            (table.cuEventCreate)(&mut raw_event, 0),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
    }
    let (code, detail) = faults::stream_fault(stream.raw).unwrap().unwrap();
    assert_eq!(code, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    assert!(detail.contains("injected"), "{detail}");
    // The bystander has no error of its own: it fails because its context does.
    assert!(faults::stream_fault(bystander.raw).unwrap().is_none());

    faults::clear(stream.raw).unwrap();
    stream.sync();
    bystander.sync();
    // SAFETY: no arguments.
    ok(unsafe { (table.cuCtxSynchronize)() });
    launch_add_u32(table, function, stream.raw, dev.ptr, 16, 1);
    stream.sync();
}

/// Device memory read back through a fresh stream.
fn read_u32(table: &'static sys::Driver, dev: &DeviceMem) -> Vec<u32> {
    let mut out = vec![0u32; dev.len / 4];
    let stream = Stream::new(table);
    // SAFETY: `out` holds `dev.len` bytes and outlives the copy (synchronized).
    ok(unsafe { (table.cuMemcpyDtoHAsync)(out.as_mut_ptr().cast(), dev.ptr, dev.len, stream.raw) });
    stream.sync();
    out
}

#[test]
fn work_waiting_on_a_failed_launch_does_not_run_and_fails() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let (_module, function) = load_add_u32(table);
    let (producer, consumer) = (Stream::new(table), Stream::new(table));
    let (data, result) = (DeviceMem::new(table, 64), DeviceMem::new(table, 64));
    // SAFETY: live allocations and stream.
    unsafe {
        ok((table.cuMemsetD32Async)(data.ptr, 1, 16, consumer.raw));
        ok((table.cuMemsetD32Async)(result.ptr, 1, 16, consumer.raw));
    }
    consumer.sync();
    // The failing launch is still queued behind the gate when the consumer's
    // work is enqueued: every call below succeeds, as on a GPU.
    let mut gate = Gate::block(table, producer.raw);
    faults::fail_next_launch(producer.raw).unwrap();
    launch_add_u32(table, function, producer.raw, data.ptr, 16, 41);
    let produced = Event::new(table, 0);
    produced.record(producer.raw);
    // SAFETY: live stream and event; a copy between live allocations.
    unsafe {
        ok((table.cuStreamWaitEvent)(consumer.raw, produced.raw, 0));
        ok((table.cuMemcpyDtoDAsync)(
            result.ptr,
            data.ptr,
            64,
            consumer.raw,
        ));
    }
    launch_add_u32(table, function, consumer.raw, result.ptr, 16, 100);
    gate.open();
    // SAFETY: live streams and event.
    unsafe {
        expect(
            (table.cuStreamSynchronize)(consumer.raw),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
        expect(
            (table.cuStreamSynchronize)(producer.raw),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
        expect(
            (table.cuEventSynchronize)(produced.raw),
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        );
    }
    expect(consumer.query(), CUresult::CUDA_ERROR_LAUNCH_FAILED);
    faults::reset();
    // Nothing after the wait ran: the result still holds what it held.
    assert_eq!(read_u32(table, &result), [1; 16]);
}

#[test]
fn a_failure_crosses_devices_through_a_wait() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    ok(unsafe { (table.cuDeviceGetCount)(&mut count) });
    if count < 2 {
        eprintln!("skipped: one software device (CUDA_STREAMS_SOFT_DEVICES < 2)");
        return;
    }
    let (_module, function) = load_add_u32(table);
    let producer = Stream::new(table);
    let data = DeviceMem::new(table, 64);
    let mut gate = Gate::block(table, producer.raw);
    faults::fail_next_launch(producer.raw).unwrap();
    launch_add_u32(table, function, producer.raw, data.ptr, 16, 1);
    let produced = Event::new(table, 0);
    produced.record(producer.raw);
    // Device 1's primary context current on this thread until the end.
    let on_second = OnDevice::one(table);
    let consumer = Stream::new(table);
    let bystander = Stream::new(table);
    let copy = DeviceMem::new(table, 64);
    // SAFETY: live streams, event and allocations.
    unsafe {
        ok((table.cuStreamWaitEvent)(consumer.raw, produced.raw, 0));
        ok((table.cuMemcpyDtoDAsync)(
            copy.ptr,
            data.ptr,
            64,
            consumer.raw,
        ));
    }
    gate.open();
    // SAFETY: a live stream.
    expect(
        unsafe { (table.cuStreamSynchronize)(consumer.raw) },
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
    );
    let detail = soft_driver::last_error_detail().unwrap();
    assert!(
        detail.contains("waited for stream") && detail.contains("add_u32"),
        "{detail}"
    );
    // Device 1's context is not poisoned (the failed work was device 0's):
    // its other streams go on.
    bystander.sync();
    drop((consumer, bystander, copy, on_second));
}

/// Device 1's primary context, current on this thread while it lives; then
/// device 0's again.
struct OnDevice {
    table: &'static sys::Driver,
    previous: sys::CUcontext,
    device: sys::CUdevice,
}

impl OnDevice {
    fn one(table: &'static sys::Driver) -> Self {
        let (mut previous, mut device, mut ctx) = (std::ptr::null_mut(), 0, std::ptr::null_mut());
        // SAFETY: valid out-pointers; the caller checked that device 1 exists.
        unsafe {
            ok((table.cuCtxGetCurrent)(&mut previous));
            ok((table.cuDeviceGet)(&mut device, 1));
            ok((table.cuDevicePrimaryCtxRetain)(&mut ctx, device));
            ok((table.cuCtxSetCurrent)(ctx));
        }
        Self {
            table,
            previous,
            device,
        }
    }
}

impl Drop for OnDevice {
    fn drop(&mut self) {
        // SAFETY: the context that was current before, and the retain above.
        unsafe {
            (self.table.cuCtxSetCurrent)(self.previous);
            (self.table.cuDevicePrimaryCtxRelease)(self.device);
        }
    }
}

#[test]
fn an_invalid_launch_configuration_is_not_sticky() {
    if skip_on_gpu("fault injection is a software-driver feature") {
        return;
    }
    let _serial = serial();
    let _reset = ResetOnDrop;
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let dev = DeviceMem::new(table, 64);
    let (mut data, mut n, mut value) = (dev.ptr, 16u32, 1u32);
    let mut params = [
        (&mut data as *mut sys::CUdeviceptr).cast::<std::ffi::c_void>(),
        (&mut n as *mut u32).cast(),
        (&mut value as *mut u32).cast(),
    ];
    // 2048 threads per block: refused at the call, as a GPU refuses it.
    // SAFETY: params points at three live arguments matching the kernel.
    let code = unsafe {
        (table.cuLaunchKernel)(
            function,
            1,
            1,
            1,
            2048,
            1,
            1,
            0,
            stream.raw,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    assert_ne!(code, CUresult::CUDA_SUCCESS);
    // Not sticky: the stream, the context and the next launch are fine.
    ok(stream.query());
    // SAFETY: no arguments.
    ok(unsafe { (table.cuCtxSynchronize)() });
    launch_add_u32(table, function, stream.raw, dev.ptr, 16, 1);
    stream.sync();
    assert_eq!(read_u32(table, &dev)[0], 1);
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
