//! Stream capture and graph replay through the driver table.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use sys::{
    CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo, CUresult, CUstreamCaptureMode,
    CUstreamCaptureStatus, Driver,
};

#[test]
fn a_captured_stream_replays_as_a_graph() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let n = 512u32;
    let dev = DeviceMem::new(table, n as usize * 4);
    static REPLAYS: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: an allocation of n words.
    ok(unsafe { (table.cuMemsetD32Async)(dev.ptr, 10, n as usize, stream.raw) });
    stream.sync();

    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointer.
    unsafe {
        ok((table.cuStreamBeginCapture)(
            stream.raw,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        ));
    }
    launch_add_u32(table, function, stream.raw, dev.ptr, n, 5);
    // A graph replays its host function with the same userData each time, so
    // it cannot own boxed state: the counter is a static.
    unsafe extern "C" fn count(data: *mut std::ffi::c_void) {
        // SAFETY: data is &REPLAYS, a static.
        unsafe { &*data.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: count only reads the static it is given.
    ok(unsafe {
        (table.cuLaunchHostFunc)(
            stream.raw,
            Some(count),
            (&REPLAYS as *const AtomicUsize).cast_mut().cast(),
        )
    });
    // SAFETY: as above.
    unsafe { ok((table.cuStreamEndCapture)(stream.raw, &mut graph)) };
    // Captured work did not run.
    stream.sync();
    assert_eq!(REPLAYS.load(Ordering::SeqCst), 0);

    let mut exec = std::ptr::null_mut();
    // SAFETY: a captured graph; valid out-pointer.
    ok(unsafe { (table.cuGraphInstantiate)(&mut exec, graph, 0) });
    for _ in 0..3 {
        // SAFETY: an instantiated graph, a live stream.
        ok(unsafe { (table.cuGraphLaunch)(exec, stream.raw) });
    }
    stream.sync();
    assert_eq!(REPLAYS.load(Ordering::SeqCst), 3);
    let mut out = vec![0u32; n as usize];
    // SAFETY: n words each side; synchronised below.
    unsafe {
        ok((table.cuMemcpyDtoHAsync)(
            out.as_mut_ptr().cast(),
            dev.ptr,
            n as usize * 4,
            stream.raw,
        ));
    }
    stream.sync();
    assert!(
        out.iter().all(|&w| w == 25),
        "three replays of += 5 over 10"
    );
    // SAFETY: destroyed once each.
    unsafe {
        ok((table.cuGraphExecDestroy)(exec));
        ok((table.cuGraphDestroy)(graph));
    }
}

#[test]
fn ending_a_capture_that_never_began_is_an_error() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointer.
    let code = unsafe { (table.cuStreamEndCapture)(stream.raw, &mut graph) };
    expect(code, CUresult::CUDA_ERROR_ILLEGAL_STATE);
}

fn begin(table: &Driver, stream: &Stream) {
    // SAFETY: a live stream.
    ok(unsafe {
        (table.cuStreamBeginCapture)(
            stream.raw,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    });
}

fn end(table: &Driver, stream: &Stream) -> Result<sys::CUgraph, CUresult> {
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointer.
    let code = unsafe { (table.cuStreamEndCapture)(stream.raw, &mut graph) };
    if code == CUresult::CUDA_SUCCESS {
        Ok(graph)
    } else {
        Err(code)
    }
}

fn capture_status(table: &Driver, stream: &Stream) -> CUstreamCaptureStatus {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; valid out-pointer.
    ok(unsafe { (table.cuStreamIsCapturing)(stream.raw, &mut status) });
    status
}

fn instantiate(table: &Driver, graph: sys::CUgraph) -> sys::CUgraphExec {
    let mut exec = std::ptr::null_mut();
    // SAFETY: a captured graph; valid out-pointer.
    ok(unsafe { (table.cuGraphInstantiate)(&mut exec, graph, 0) });
    exec
}

fn read_words(table: &Driver, stream: &Stream, dev: &DeviceMem, n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    // SAFETY: n words each side; synchronised below.
    ok(unsafe { (table.cuMemcpyDtoHAsync)(out.as_mut_ptr().cast(), dev.ptr, n * 4, stream.raw) });
    stream.sync();
    out
}

fn fill(table: &Driver, stream: &Stream, dev: &DeviceMem, n: usize, value: u32) {
    // SAFETY: an allocation of n words.
    ok(unsafe { (table.cuMemsetD32Async)(dev.ptr, value, n, stream.raw) });
    stream.sync();
}

#[test]
fn work_forked_to_another_stream_and_joined_back_is_captured() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let (origin, branch, replay) = (Stream::new(table), Stream::new(table), Stream::new(table));
    let n = 300;
    let (x, y) = (DeviceMem::new(table, n * 4), DeviceMem::new(table, n * 4));
    fill(table, &origin, &x, n, 10);
    fill(table, &origin, &y, n, 10);
    let (forked, joined) = (Event::new(table, 0), Event::new(table, 0));

    begin(table, &origin);
    launch_add_u32(table, function, origin.raw, x.ptr, n as u32, 1);
    forked.record(origin.raw);
    // SAFETY: live handles.
    ok(unsafe { (table.cuStreamWaitEvent)(branch.raw, forked.raw, 0) });
    assert_eq!(
        capture_status(table, &branch),
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "waiting on an event of the capture pulls the stream in"
    );
    launch_add_u32(table, function, branch.raw, y.ptr, n as u32, 2);
    joined.record(branch.raw);
    // SAFETY: live handles.
    ok(unsafe { (table.cuStreamWaitEvent)(origin.raw, joined.raw, 0) });
    launch_add_u32(table, function, origin.raw, x.ptr, n as u32, 3);
    let graph = end(table, &origin).expect("a joined capture ends");
    for stream in [&origin, &branch] {
        assert_eq!(
            capture_status(table, stream),
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        );
    }
    assert_eq!(
        read_words(table, &replay, &y, n),
        vec![10; n],
        "nothing ran"
    );

    let exec = instantiate(table, graph);
    for _ in 0..2 {
        // SAFETY: an instantiated graph, a live stream.
        ok(unsafe { (table.cuGraphLaunch)(exec, replay.raw) });
    }
    assert_eq!(read_words(table, &replay, &x, n), vec![10 + 2 * 4; n]);
    assert_eq!(read_words(table, &replay, &y, n), vec![10 + 2 * 2; n]);
    // SAFETY: destroyed once each.
    unsafe {
        ok((table.cuGraphExecDestroy)(exec));
        ok((table.cuGraphDestroy)(graph));
    }
}

#[test]
fn a_fork_left_unjoined_fails_the_end_of_the_capture() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let (origin, branch) = (Stream::new(table), Stream::new(table));
    let dev = DeviceMem::new(table, 64 * 4);
    let forked = Event::new(table, 0);
    begin(table, &origin);
    forked.record(origin.raw);
    // SAFETY: live handles.
    ok(unsafe { (table.cuStreamWaitEvent)(branch.raw, forked.raw, 0) });
    launch_add_u32(table, function, branch.raw, dev.ptr, 64, 1);
    expect(
        end(table, &origin).unwrap_err(),
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
    );
    // Both streams left the capture and work as before.
    for stream in [&origin, &branch] {
        assert_eq!(
            capture_status(table, stream),
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        );
        stream.sync();
    }
}

#[test]
fn a_synchronize_during_capture_fails_and_invalidates_it() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let stream = Stream::new(table);
    begin(table, &stream);
    // SAFETY: a live stream.
    let code = unsafe { (table.cuStreamSynchronize)(stream.raw) };
    expect(code, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        capture_status(table, &stream),
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    expect(
        end(table, &stream).unwrap_err(),
        CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    );
    stream.sync();
    assert_eq!(stream.query(), CUresult::CUDA_SUCCESS);
}

#[test]
fn waiting_on_an_event_from_outside_the_capture_is_an_isolation_error() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let (stream, other) = (Stream::new(table), Stream::new(table));
    let outside = Event::new(table, 0);
    outside.record(other.raw);
    begin(table, &stream);
    // SAFETY: live handles.
    let code = unsafe { (table.cuStreamWaitEvent)(stream.raw, outside.raw, 0) };
    expect(code, CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    expect(
        end(table, &stream).unwrap_err(),
        CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    );
}

#[test]
fn an_executable_graph_is_updated_in_place_when_only_parameters_change() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let table = table();
    let (_module, function) = load_add_u32(table);
    let stream = Stream::new(table);
    let n = 128;
    let dev = DeviceMem::new(table, n * 4);
    fill(table, &stream, &dev, n, 0);
    let capture_add = |value: u32, launches: usize| {
        begin(table, &stream);
        for _ in 0..launches {
            launch_add_u32(table, function, stream.raw, dev.ptr, n as u32, value);
        }
        end(table, &stream).expect("capture ends")
    };
    let first = capture_add(5, 1);
    let exec = instantiate(table, first);
    // SAFETY: an instantiated graph, a live stream.
    ok(unsafe { (table.cuGraphUpload)(exec, stream.raw) });
    // SAFETY: as above.
    ok(unsafe { (table.cuGraphLaunch)(exec, stream.raw) });
    assert_eq!(read_words(table, &stream, &dev, n), vec![5; n]);

    let second = capture_add(7, 1);
    let mut info = CUgraphExecUpdateResultInfo::default();
    // SAFETY: live graph handles; valid out-pointer.
    ok(unsafe { (table.cuGraphExecUpdate)(exec, second, &mut info) });
    assert_eq!(
        info.result,
        CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS
    );
    // SAFETY: as above.
    ok(unsafe { (table.cuGraphLaunch)(exec, stream.raw) });
    assert_eq!(
        read_words(table, &stream, &dev, n),
        vec![12; n],
        "the new argument"
    );

    let other_shape = capture_add(1, 2);
    // SAFETY: live graph handles; valid out-pointer.
    let code = unsafe { (table.cuGraphExecUpdate)(exec, other_shape, &mut info) };
    expect(code, CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    assert_ne!(
        info.result,
        CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS
    );
    // SAFETY: as above.
    ok(unsafe { (table.cuGraphLaunch)(exec, stream.raw) });
    assert_eq!(
        read_words(table, &stream, &dev, n),
        vec![19; n],
        "unchanged by the refusal"
    );
    // SAFETY: destroyed once each.
    unsafe {
        ok((table.cuGraphExecDestroy)(exec));
        for graph in [first, second, other_shape] {
            ok((table.cuGraphDestroy)(graph));
        }
    }
}
