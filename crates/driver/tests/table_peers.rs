//! Two devices through the driver table: a primary context and memory each,
//! peer access, peer copies both ways, and a stream of one device waiting on
//! an event of the other. Skips (saying why) with fewer than two devices.

mod common;

use common::*;
use sys::{CUcontext, CUresult, Driver};

/// The primary context of each of the first two devices (retained), or
/// `None` (printed why) when there are fewer than two.
struct Two {
    table: &'static Driver,
    ctx: [CUcontext; 2],
}

impl Two {
    fn new() -> Option<Self> {
        let table = table();
        let mut count = 0;
        // SAFETY: valid out-pointer.
        ok(unsafe { (table.cuDeviceGetCount)(&mut count) });
        if count < 2 {
            eprintln!("skipped: needs two devices, the driver reports {count}");
            return None;
        }
        let mut ctx = [std::ptr::null_mut(); 2];
        for (dev, slot) in ctx.iter_mut().enumerate() {
            // SAFETY: valid out-pointer, an existing ordinal.
            ok(unsafe { (table.cuDevicePrimaryCtxRetain)(slot, dev as i32) });
        }
        Some(Self { table, ctx })
    }

    /// Make device `dev`'s context current on this thread.
    fn on(&self, dev: usize) {
        // SAFETY: a retained primary context.
        ok(unsafe { (self.table.cuCtxSetCurrent)(self.ctx[dev]) });
    }
}

impl Drop for Two {
    fn drop(&mut self) {
        // Leave the thread as `common::bind` left it: device 0 current.
        self.on(0);
        for dev in 0..2 {
            // SAFETY: releases the retain taken in `new`.
            ok(unsafe { (self.table.cuDevicePrimaryCtxRelease)(dev) });
        }
    }
}

#[test]
fn each_device_has_its_own_primary_context_and_memory() {
    let Some(two) = Two::new() else { return };
    assert_ne!(two.ctx[0], two.ctx[1], "one primary context per device");
    let table = two.table;
    for dev in 0..2 {
        two.on(dev);
        let mut current = std::ptr::null_mut();
        let (mut free, mut total, mut device_total) = (0, 0, 0);
        // SAFETY: valid out-pointers.
        unsafe {
            ok((table.cuCtxGetCurrent)(&mut current));
            ok((table.cuMemGetInfo)(&mut free, &mut total));
            ok((table.cuDeviceTotalMem)(&mut device_total, dev as i32));
        }
        assert_eq!(current, two.ctx[dev]);
        assert_eq!(total, device_total, "cuMemGetInfo answers for device {dev}");
        assert!(free <= total);
    }
    if !is_gpu() {
        // An allocation counts against its own device only.
        two.on(1);
        let before = [
            soft_driver::device_memory_in_use(0),
            soft_driver::device_memory_in_use(1),
        ];
        let mem = DeviceMem::new(table, 1 << 20);
        assert_eq!(soft_driver::device_memory_in_use(0), before[0]);
        assert!(soft_driver::device_memory_in_use(1) >= before[1] + (1 << 20));
        drop(mem);
    }
}

#[test]
fn peer_access_is_enabled_once_and_disabled_once() {
    // Peer access is process-wide state: one test at a time changes it.
    let _serial = serial();
    let Some(two) = Two::new() else { return };
    let table = two.table;
    let (mut can, mut self_peer) = (0, 1);
    // SAFETY: valid out-pointers, existing devices.
    unsafe {
        ok((table.cuDeviceCanAccessPeer)(&mut can, 0, 1));
        ok((table.cuDeviceCanAccessPeer)(&mut self_peer, 0, 0));
    }
    assert_eq!(self_peer, 0, "a device is not its own peer");
    if can == 0 {
        eprintln!("skipped: devices 0 and 1 cannot be peers");
        return;
    }
    two.on(1);
    // SAFETY: a live peer context, flags 0.
    unsafe {
        // Another test of this binary may have left it on: start from off.
        let _ = (table.cuCtxDisablePeerAccess)(two.ctx[0]);
        ok((table.cuCtxEnablePeerAccess)(two.ctx[0], 0));
        expect(
            (table.cuCtxEnablePeerAccess)(two.ctx[0], 0),
            CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        );
        ok((table.cuCtxDisablePeerAccess)(two.ctx[0]));
        expect(
            (table.cuCtxDisablePeerAccess)(two.ctx[0]),
            CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        );
        let own = (table.cuCtxEnablePeerAccess)(two.ctx[1], 0);
        assert_ne!(own, CUresult::CUDA_SUCCESS, "a context is not its own peer");
    }
}

#[test]
fn peer_copies_move_data_both_ways_without_peer_access() {
    let Some(two) = Two::new() else { return };
    let table = two.table;
    let len = (1 << 20) + 3;
    let data = [random_bytes(21, len), random_bytes(22, len)];
    two.on(0);
    let (mem0, stream0, pinned0) = (
        DeviceMem::new(table, len),
        Stream::new(table),
        Pinned::new(table, len),
    );
    two.on(1);
    let (mem1, stream1, pinned1) = (
        DeviceMem::new(table, len),
        Stream::new(table),
        Pinned::new(table, len),
    );
    pinned0.fill(&data[0]);
    pinned1.fill(&data[1]);
    // SAFETY: every buffer holds `len` bytes; each stream's context is current
    // when it is used.
    unsafe {
        two.on(0);
        ok((table.cuMemcpyHtoDAsync)(
            mem0.ptr,
            pinned0.void(),
            len,
            stream0.raw,
        ));
        two.on(1);
        ok((table.cuMemcpyHtoDAsync)(
            mem1.ptr,
            pinned1.void(),
            len,
            stream1.raw,
        ));
    }
    stream0.sync();
    stream1.sync();
    // Swap through scratch buffers: 0 -> 1 on device 1's stream, 1 -> 0 on
    // device 0's.
    two.on(1);
    let into1 = DeviceMem::new(table, len);
    two.on(0);
    let into0 = DeviceMem::new(table, len);
    // SAFETY: as above; each pointer is memory of the context named with it.
    unsafe {
        two.on(1);
        ok((table.cuMemcpyPeerAsync)(
            into1.ptr,
            two.ctx[1],
            mem0.ptr,
            two.ctx[0],
            len,
            stream1.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            pinned1.void(),
            into1.ptr,
            len,
            stream1.raw,
        ));
        two.on(0);
        ok((table.cuMemcpyPeerAsync)(
            into0.ptr,
            two.ctx[0],
            mem1.ptr,
            two.ctx[1],
            len,
            stream0.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            pinned0.void(),
            into0.ptr,
            len,
            stream0.raw,
        ));
    }
    stream0.sync();
    stream1.sync();
    assert!(
        pinned1.bytes() == data[0],
        "device 0's data reached device 1"
    );
    assert!(
        pinned0.bytes() == data[1],
        "device 1's data reached device 0"
    );
    drop((into0, mem0, stream0));
    two.on(1);
    drop((into1, mem1, stream1));
}

#[test]
fn a_stream_waits_for_an_event_recorded_on_another_device() {
    let Some(two) = Two::new() else { return };
    let table = two.table;
    two.on(0);
    let producer = Stream::new(table);
    let done = Event::new(table, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING.0);
    let mut gate = Gate::block(table, producer.raw);
    done.record(producer.raw);
    two.on(1);
    let consumer = Stream::new(table);
    let other = Event::new(table, 0);
    // SAFETY: live handles; the event belongs to device 0, the stream to 1.
    unsafe {
        ok((table.cuStreamWaitEvent)(consumer.raw, done.raw, 0));
        // An event is recorded only on its own device's streams.
        expect(
            (table.cuEventRecord)(done.raw, consumer.raw),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
    }
    other.record(consumer.raw);
    // Held by device 0's gate, across the devices.
    expect(consumer.query(), CUresult::CUDA_ERROR_NOT_READY);
    expect(other.query(), CUresult::CUDA_ERROR_NOT_READY);
    gate.open();
    other.sync();
    ok(consumer.query());
    ok(done.query());
    drop((other, consumer));
    two.on(0);
    drop((done, producer));
}

#[test]
fn a_memset_of_another_devices_memory_needs_peer_access() {
    if skip_on_gpu("checks the software driver's refusal at the call") {
        return;
    }
    let _serial = serial();
    let Some(two) = Two::new() else { return };
    let table = two.table;
    two.on(0);
    let mem0 = DeviceMem::new(table, 4096);
    two.on(1);
    let stream1 = Stream::new(table);
    // SAFETY: a live 4096-byte allocation; the stream of the current context.
    unsafe {
        let _ = (table.cuCtxDisablePeerAccess)(two.ctx[0]);
        expect(
            (table.cuMemsetD8Async)(mem0.ptr, 1, 4096, stream1.raw),
            CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        let why = soft_driver::last_error_detail().unwrap();
        assert!(
            why.contains("device 0") && why.contains("device 1"),
            "{why}"
        );
        ok((table.cuCtxEnablePeerAccess)(two.ctx[0], 0));
        ok((table.cuMemsetD8Async)(mem0.ptr, 1, 4096, stream1.raw));
        stream1.sync();
        ok((table.cuCtxDisablePeerAccess)(two.ctx[0]));
    }
    drop(stream1);
    two.on(0);
    drop(mem0);
}
