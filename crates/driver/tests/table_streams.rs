//! Streams through the driver table: order, concurrency, query, priorities,
//! destruction with pending work, the null stream, and context binding.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use sys::{CUresult, CUstream_flags};

#[test]
fn work_on_one_stream_runs_in_submission_order() {
    let table = table();
    let stream = Stream::new(table);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let dev = DeviceMem::new(table, 4096);
    let out = Pinned::new(table, 4096);
    // Interleave host functions with memsets and copies: each copy must see
    // exactly the memset enqueued just before it.
    for i in 0..200u32 {
        let log = Arc::clone(&seen);
        host_fn(table, stream.raw, move || log.lock().unwrap().push(i));
        if i % 50 == 0 {
            let value = (i / 50 + 1) as u8;
            // SAFETY: live allocation and pinned buffer of 4096 bytes.
            unsafe {
                ok((table.cuMemsetD8Async)(dev.ptr, value, 4096, stream.raw));
                ok((table.cuMemcpyDtoHAsync)(
                    out.void(),
                    dev.ptr,
                    4096,
                    stream.raw,
                ));
            }
            let out_ptr = out.ptr as usize;
            let seen_copy = Arc::clone(&seen);
            host_fn(table, stream.raw, move || {
                // SAFETY: the copy before this host function has completed
                // (stream order), and nothing else touches the buffer now.
                let bytes = unsafe { std::slice::from_raw_parts(out_ptr as *const u8, 4096) };
                assert!(bytes.iter().all(|&b| b == value));
                seen_copy.lock().unwrap().push(10_000 + value as u32);
            });
        }
    }
    stream.sync();
    let seen = seen.lock().unwrap();
    let mut expected = Vec::new();
    for i in 0..200u32 {
        expected.push(i);
        if i % 50 == 0 {
            expected.push(10_000 + i / 50 + 1);
        }
    }
    assert_eq!(*seen, expected);
}

#[test]
fn a_blocked_stream_does_not_block_another() {
    if skip_under_sanitizer(
        "on the H200 under memcheck, a host function blocking one stream held \
         another stream's memset and copy until it returned",
    ) {
        return;
    }
    let table = table();
    let (slow, fast) = (Stream::new(table), Stream::new(table));
    // The slow stream's host function holds its stream until we open the gate.
    let mut gate = Gate::block(table, slow.raw);
    let dev = DeviceMem::new(table, 1 << 16);
    let out = Pinned::new(table, 1 << 16);
    let done = Event::new(table, 0);
    // SAFETY: live allocation and pinned buffer of the same size.
    unsafe {
        ok((table.cuMemsetD32Async)(
            dev.ptr,
            0xC0FFEE,
            (1 << 16) / 4,
            fast.raw,
        ));
        ok((table.cuMemcpyDtoHAsync)(
            out.void(),
            dev.ptr,
            1 << 16,
            fast.raw,
        ));
    }
    done.record(fast.raw);
    // Wait for the fast stream on another thread, so that a driver that
    // serialised streams fails here instead of hanging.
    let (tx, rx) = mpsc::channel();
    let event = done.raw as usize;
    std::thread::spawn(move || {
        let table = common::table();
        // SAFETY: the event outlives the wait (the test waits on rx first).
        let code = unsafe { (table.cuEventSynchronize)(event as sys::CUevent) };
        let _ = tx.send(code);
    });
    let code = rx
        .recv_timeout(HANG)
        .expect("the fast stream finished while the slow one was blocked");
    ok(code);
    expect(slow.query(), CUresult::CUDA_ERROR_NOT_READY);
    let words: Vec<u32> = out
        .bytes()
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert!(words.iter().all(|&w| w == 0xC0FFEE));
    gate.open();
    slow.sync();
}

#[test]
fn query_is_not_ready_while_work_is_pending_then_success() {
    let table = table();
    let stream = Stream::new(table);
    ok(stream.query());
    let mut gate = Gate::block(table, stream.raw);
    static RAN: AtomicUsize = AtomicUsize::new(0);
    host_fn(table, stream.raw, bump(&RAN));
    expect(stream.query(), CUresult::CUDA_ERROR_NOT_READY);
    assert_eq!(RAN.load(Ordering::SeqCst), 0);
    gate.open();
    stream.sync();
    ok(stream.query());
    assert_eq!(RAN.load(Ordering::SeqCst), 1);
}

#[test]
fn priorities_are_clamped_and_reported_with_flags() {
    let table = table();
    let (mut least, mut greatest) = (99, 99);
    // SAFETY: valid out-pointers.
    ok(unsafe { (table.cuCtxGetStreamPriorityRange)(&mut least, &mut greatest) });
    assert_eq!((least, greatest), (0, -5), "the H200's range");
    for (asked, got) in [(-100, greatest), (-3, -3), (0, 0), (7, least)] {
        let stream = Stream::with(table, CUstream_flags::CU_STREAM_NON_BLOCKING.0, asked);
        let (mut priority, mut flags) = (42, 42);
        // SAFETY: valid out-pointers, live stream.
        unsafe {
            ok((table.cuStreamGetPriority)(stream.raw, &mut priority));
            ok((table.cuStreamGetFlags)(stream.raw, &mut flags));
        }
        assert_eq!(priority, got, "priority {asked} is clamped to {got}");
        assert_eq!(flags & 1, CUstream_flags::CU_STREAM_NON_BLOCKING.0);
    }
    let stream = Stream::new(table);
    let mut flags = 42;
    // SAFETY: valid out-pointer, live stream.
    ok(unsafe { (table.cuStreamGetFlags)(stream.raw, &mut flags) });
    assert_eq!(flags & 1, 0);
}

#[test]
fn destroying_a_stream_with_pending_work_returns_at_once_and_the_work_finishes() {
    let table = table();
    let stream = Stream::new(table);
    let raw = stream.raw;
    std::mem::forget(stream); // destroyed by hand below
    let mut gate = Gate::block(table, raw);
    let (tx, rx) = mpsc::channel();
    let dev = DeviceMem::new(table, 1024);
    let out = Pinned::new(table, 1024);
    // SAFETY: live allocation and pinned buffer.
    unsafe {
        ok((table.cuMemsetD8Async)(dev.ptr, 0x5A, 1024, raw));
        ok((table.cuMemcpyDtoHAsync)(out.void(), dev.ptr, 1024, raw));
    }
    host_fn(table, raw, move || tx.send(()).unwrap());
    // The gate is still closed: destroy must not wait for the work.
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { (table.cuStreamDestroy)(raw) });
    gate.open();
    rx.recv_timeout(HANG)
        .expect("work queued before cuStreamDestroy still ran");
    assert!(out.bytes().iter().all(|&b| b == 0x5A));
}

#[test]
fn the_null_stream_is_a_stream() {
    let table = table();
    let null: sys::CUstream = std::ptr::null_mut();
    let dev = DeviceMem::new(table, 512);
    let data = random_bytes(7, 512);
    let out = Pinned::new(table, 512);
    static RAN: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: live allocation and buffers of 512 bytes; the null stream.
    unsafe {
        ok((table.cuMemcpyHtoDAsync)(
            dev.ptr,
            data.as_ptr().cast(),
            512,
            null,
        ));
        ok((table.cuMemcpyDtoHAsync)(out.void(), dev.ptr, 512, null));
    }
    host_fn(table, null, bump(&RAN));
    // SAFETY: the null stream.
    ok(unsafe { (table.cuStreamSynchronize)(null) });
    assert_eq!(out.bytes(), &data[..]);
    assert_eq!(RAN.load(Ordering::SeqCst), 1);
}

#[test]
fn context_synchronize_waits_for_every_stream() {
    let _device = device_wide();
    let table = table();
    static DONE: AtomicUsize = AtomicUsize::new(0);
    let streams: Vec<Stream> = (0..4).map(|_| Stream::new(table)).collect();
    for stream in &streams {
        // A slow operation, so that a context synchronize that did not wait
        // would see it unfinished.
        host_fn(table, stream.raw, || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            DONE.fetch_add(1, Ordering::SeqCst);
        });
    }
    // SAFETY: no arguments.
    ok(unsafe { (table.cuCtxSynchronize)() });
    assert_eq!(DONE.load(Ordering::SeqCst), 4);
    for stream in &streams {
        ok(stream.query());
    }
}

#[test]
fn a_thread_without_a_current_context_is_refused() {
    let table = cuda_streams_driver::driver().unwrap().table;
    let _ = common::table(); // the context exists (retained) ...
    std::thread::spawn(move || {
        // ... but this new thread never made it current.
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let code = unsafe { (table.cuStreamCreateWithPriority)(&mut stream, 0, 0) };
        expect(code, CUresult::CUDA_ERROR_INVALID_CONTEXT);
        let mut ptr = 0;
        // SAFETY: valid out-pointer.
        let code = unsafe { (table.cuMemAlloc)(&mut ptr, 256) };
        expect(code, CUresult::CUDA_ERROR_INVALID_CONTEXT);
        let mut current = 1 as sys::CUcontext;
        // SAFETY: valid out-pointer.
        ok(unsafe { (table.cuCtxGetCurrent)(&mut current) });
        assert!(current.is_null());
    })
    .join()
    .unwrap();
}

#[test]
fn null_handles_are_invalid() {
    let table = table();
    // SAFETY: null handles are checked by both drivers.
    unsafe {
        expect(
            (table.cuEventQuery)(std::ptr::null_mut()),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
        expect(
            (table.cuEventSynchronize)(std::ptr::null_mut()),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
        expect(
            (table.cuEventRecord)(std::ptr::null_mut(), std::ptr::null_mut()),
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
    }
}
