//! The last `Arc<Context>` dropped inside a stream callback: CUDA forbids
//! driver calls there, so the drop makes none, and the primary context is
//! still released, from another thread once the callback has returned.
//!
//! One test in its own binary: it watches the process-wide retain count of
//! the software driver's primary context, which other tests would move.

use cuda_streams_driver::{Context, DriverKind, Stream, in_stream_callback};
use std::sync::{Arc, mpsc};
use std::time::Instant;
use test_support::HANG;

#[test]
fn dropping_the_last_context_in_a_callback_calls_no_driver_from_it() {
    let ctx = Context::new(0).unwrap();
    // Under compute-sanitizer on the GPU, destroying a stream whose host
    // function is still running blocks until it returns (seen on the H200:
    // the stream's drop below waited out the gate), so the premise of the
    // test, that the main thread lets go of every handle while the callback
    // is blocked, does not hold there. The plain GPU run and the software
    // driver test it.
    if ctx.is_gpu() && std::env::var_os("CUDA_STREAMS_SANITIZER").is_some_and(|v| !v.is_empty()) {
        eprintln!(
            "skipped under compute-sanitizer: stream destruction waits for the blocked host function"
        );
        return;
    }
    let soft = ctx.kind() == DriverKind::Soft;
    if soft {
        assert_eq!(soft_driver::primary_context_retains(), 1);
    }
    let stream = Stream::new(&ctx).unwrap();
    // Hold the stream until every other handle is gone.
    let (open, gate) = mpsc::channel::<()>();
    stream
        .add_callback(move || {
            let _ = gate.recv_timeout(HANG);
        })
        .unwrap();
    let last = Arc::clone(&ctx);
    let (tx, rx) = mpsc::channel();
    stream
        .add_callback(move || {
            let context = Arc::downgrade(&last);
            drop(last);
            tx.send((context.strong_count(), in_stream_callback()))
                .unwrap();
        })
        .unwrap();
    drop(stream);
    drop(ctx);
    drop(open);
    assert_eq!(
        rx.recv_timeout(HANG).unwrap(),
        (0, true),
        "the callback dropped the last handle"
    );

    if soft {
        // The release happens on another thread, after the callback returned.
        let start = Instant::now();
        while soft_driver::primary_context_retains() != 0 {
            assert!(
                start.elapsed() < HANG,
                "the primary context was never released"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            soft_driver::refused_in_host_functions(),
            0,
            "a driver call was made from the callback"
        );
    } else {
        eprintln!("on the GPU only the absence of a crash is checked here");
    }
    // The device is usable again afterwards.
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (tx, rx) = mpsc::channel();
    stream.add_callback(move || tx.send(()).unwrap()).unwrap();
    rx.recv_timeout(HANG).unwrap();
    stream.synchronize().unwrap();
}
