//! The one enqueue protocol, seen from its cases: this crate's own work
//! (memsets, host callbacks, graph launches and uploads) and work enqueued
//! by another library (`Stream::enqueue_external`) and raw calls that use
//! no buffer of ours (the result layer's stream-ordered allocations, frees
//! and copies, a future's wake-up). Each case is refused
//! on a capturing stream under its own name, counted as what it is, and
//! shown to the stream's observers only when it is work of this crate that
//! runs; a refused enqueue leaves nothing on the stream.

mod support;

use cuda_streams_driver::sys::CUresult;
use cuda_streams_driver::{
    BufferUse, Context, DeviceBuffer, DeviceMemory, Error, GraphExec, Stream, WorkObserver, result,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use support::{ctx, serial};

/// An executable graph of one memset on `buf`, captured on a stream of its
/// own.
fn memset_graph(ctx: &Arc<Context>, buf: &Arc<DeviceBuffer<u32>>) -> GraphExec {
    let stream = Stream::new(ctx).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, buf, 7).unwrap();
    capture.end().unwrap().instantiate().unwrap()
}

/// External work with no buffers that enqueues nothing.
fn nothing(stream: &Stream) -> cuda_streams_driver::Result<()> {
    stream.enqueue_external(&[], || Ok::<(), Error>(()))
}

#[test]
fn every_case_is_refused_on_a_capturing_stream_under_its_own_name() {
    // Captures are process-wide state in the software driver.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buf = Arc::new(DeviceBuffer::<u32>::new(&ctx, 16).unwrap());
    let mut plain = DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
    let exec = memset_graph(&ctx, &buf);
    let capture = stream.begin_capture().unwrap();
    let refusals = [
        (
            "memset",
            stream.memset_u32_async(&mut plain, 1).unwrap_err(),
        ),
        ("callback", stream.add_callback(|| {}).unwrap_err()),
        ("graph launch", exec.launch(&stream).unwrap_err()),
        ("graph upload", exec.upload(&stream).unwrap_err()),
        ("external work", nothing(&stream).unwrap_err()),
    ];
    drop(capture);
    let names = [
        "enqueueing work (use the Capture's methods)",
        "Stream::add_callback",
        "GraphExec::launch",
        "GraphExec::upload",
        "external work",
    ];
    for ((case, err), name) in refusals.into_iter().zip(names) {
        assert!(
            matches!(err, Error::StreamCapturing { operation, .. } if operation == name),
            "{case}: {err}"
        );
    }
}

#[test]
fn each_case_is_counted_as_what_it_is() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buf = Arc::new(DeviceBuffer::<u32>::new(&ctx, 16).unwrap());
    let exec = memset_graph(&ctx, &buf);
    let counts = |s: &Stream| {
        let m = s.metrics();
        (m.callbacks, m.graph_launches, m.graph_nodes)
    };

    stream.add_callback(|| {}).unwrap();
    assert_eq!(counts(&stream), (1, 0, 0), "a callback");
    exec.upload(&stream).unwrap();
    assert_eq!(counts(&stream), (1, 0, 0), "an upload runs no work");
    exec.launch(&stream).unwrap();
    assert_eq!(counts(&stream), (1, 1, 1), "a launch of a one-node graph");
    let before = stream.metrics();
    nothing(&stream).unwrap();
    let after = stream.metrics();
    assert_eq!(
        (
            after.operations_count,
            after.memory_transfers,
            after.kernel_launches
        ),
        (
            before.operations_count,
            before.memory_transfers,
            before.kernel_launches
        ),
        "external work is the other library's to count"
    );
    stream.synchronize().unwrap();
    assert_eq!(buf.to_vec(&stream).unwrap(), [0x0707_0707; 16]);
}

/// Counts the work items it was told of.
struct Told(AtomicU32);

impl WorkObserver for Told {
    fn before_work(&self, _stream: &Stream) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn observers_are_told_of_this_crates_work_that_runs() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let buf = Arc::new(DeviceBuffer::<u32>::new(&ctx, 16).unwrap());
    let exec = memset_graph(&ctx, &buf);
    let told = Arc::new(Told(AtomicU32::new(0)));
    stream.observe_next_work(told.clone());

    nothing(&stream).unwrap();
    exec.upload(&stream).unwrap();
    assert_eq!(
        told.0.load(Ordering::Relaxed),
        0,
        "external work and uploads are not told"
    );
    exec.launch(&stream).unwrap();
    assert_eq!(told.0.load(Ordering::Relaxed), 1, "a graph launch is");

    stream.observe_next_work(told.clone());
    stream.add_callback(|| {}).unwrap();
    assert_eq!(told.0.load(Ordering::Relaxed), 2, "a callback is");
    stream.synchronize().unwrap();
}

#[test]
fn a_refused_enqueue_leaves_no_wait_on_the_stream() {
    // Its allocations and synchronizing calls would invalidate a capture
    // open in another test.
    let _serial = serial();
    let last = Context::device_count().unwrap() - 1;
    if last == 0 {
        eprintln!("skipped: one device, so no buffer of another context to refuse");
        return;
    }
    let (ctx, other_ctx) = (ctx(), Context::new(last).unwrap());
    let (home, stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    // Used on `stream` for the first time, it would make `stream` wait for
    // its allocation on `home`.
    let mut dst = DeviceBuffer::<u32>::new_async(&home, 4).unwrap();
    let foreign = DeviceBuffer::<u32>::new(&other_ctx, 4).unwrap();
    let before = stream.operation_count();

    let err = stream
        .copy_device_to_device_async(&mut dst, &foreign)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceMismatch { .. } | Error::ContextMismatch { .. }
        ),
        "{err}"
    );
    let uses = [BufferUse::write(&mut dst), BufferUse::read(&foreign)];
    let err = stream
        .enqueue_external(&uses, || -> Result<(), Error> {
            panic!("refused work must not run")
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceMismatch { .. } | Error::ContextMismatch { .. }
        ),
        "{err}"
    );
    assert_eq!(
        stream.operation_count(),
        before,
        "nothing enqueued on the stream for refused work"
    );

    // The same buffer accepted: the wait for its allocation, then the work.
    let ptr = dst.device_ptr();
    let uses = [BufferUse::write(&mut dst)];
    stream
        .enqueue_external(&uses, || {
            // SAFETY: 16 bytes of `stream`'s context, alive until the memset
            // has run (tracked).
            let code = unsafe { (ctx.driver().cuMemsetD32Async)(ptr, 3, 4, stream.as_raw()) };
            assert_eq!(code, CUresult::CUDA_SUCCESS);
            Ok::<(), Error>(())
        })
        .unwrap();
    assert!(stream.operation_count() > before);
    assert_eq!(dst.to_vec(&stream).unwrap(), [3; 4]);
}

#[test]
fn raw_calls_are_refused_on_a_capturing_stream_and_neither_counted_nor_told() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let (a, b) = (
        result::mem_alloc_async(&stream, 64).unwrap(),
        result::mem_alloc_async(&stream, 64).unwrap(),
    );
    let capture = stream.begin_capture().unwrap();
    let refusals = [
        (
            "result::mem_alloc_async",
            result::mem_alloc_async(&stream, 64).unwrap_err(),
        ),
        (
            "result::memcpy_dtod_async",
            // SAFETY: both ranges are 64 bytes of live memory of the
            // stream's context, freed only after the stream synchronizes.
            unsafe { result::memcpy_dtod_async(&stream, a, b, 64) }.unwrap_err(),
        ),
        (
            "result::mem_free_async",
            // SAFETY: from `mem_alloc_async` on this stream, unused; refused
            // here, so freed once below.
            unsafe { result::mem_free_async(&stream, a) }.unwrap_err(),
        ),
        (
            "DeviceBuffer::new_async",
            DeviceBuffer::<u32>::new_async(&stream, 4).unwrap_err(),
        ),
        (
            "Stream::completion",
            stream.completion().map(drop).unwrap_err(),
        ),
    ];
    drop(capture);
    for (name, err) in refusals {
        assert!(
            matches!(&err, Error::StreamCapturing { operation, .. } if *operation == name),
            "{name}: {err}"
        );
    }

    let told = Arc::new(Told(AtomicU32::new(0)));
    stream.observe_next_work(told.clone());
    let before = stream.metrics();
    // SAFETY: as above, outside the capture now.
    unsafe { result::memcpy_dtod_async(&stream, a, b, 64) }.unwrap();
    // SAFETY: from `mem_alloc_async` on this stream, last used by the copy
    // above (stream order), freed once.
    unsafe {
        result::mem_free_async(&stream, a).unwrap();
        result::mem_free_async(&stream, b).unwrap();
    }
    let after = stream.metrics();
    assert_eq!(
        (after.operations_count, after.memory_transfers),
        (before.operations_count, before.memory_transfers),
        "raw work is its caller's to count"
    );
    assert_eq!(told.0.load(Ordering::Relaxed), 0, "raw work is not told");
    stream.synchronize().unwrap();
}
