//! Stream capture and graph replay through the driver table.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use sys::{CUresult, CUstreamCaptureMode};

#[test]
fn a_captured_stream_replays_as_a_graph() {
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
    let table = table();
    let stream = Stream::new(table);
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointer.
    let code = unsafe { (table.cuStreamEndCapture)(stream.raw, &mut graph) };
    expect(code, CUresult::CUDA_ERROR_ILLEGAL_STATE);
}
