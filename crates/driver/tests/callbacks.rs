//! Host callbacks run when the stream reaches them, in order, and their panics
//! are caught without breaking the stream.

mod support;

use cuda_streams_driver::{Error, PinnedBuffer, Stream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{HANG, XorShift, ctx, kernel, spin};

#[test]
fn a_callback_fires_when_the_stream_gets_there_not_at_synchronize() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    const SPIN: Duration = Duration::from_millis(300);

    let enqueued = Instant::now();
    spin(&stream, &spin_kernel, SPIN);
    let (tx, rx) = mpsc::channel();
    stream
        .add_callback(move || tx.send(Instant::now()).unwrap())
        .unwrap();

    // Nobody synchronizes: the callback must arrive on its own.
    let fired = rx
        .recv_timeout(HANG)
        .expect("the callback fires without synchronize");
    assert!(
        fired.duration_since(enqueued) >= SPIN,
        "the callback ran {:?} after enqueueing, before the {SPIN:?} spin ended",
        fired.duration_since(enqueued)
    );
    // Only now look at the stream.
    stream.synchronize().unwrap();
    assert!(stream.query().unwrap());
    assert_eq!(stream.metrics().callbacks, 1);
}

#[test]
fn callbacks_run_in_stream_order_between_other_work() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut rng = XorShift::new(7);
    let data = rng.u32s(4096);
    let host = PinnedBuffer::from_slice(&ctx, &data).unwrap();
    let mut device = cuda_streams_driver::DeviceBuffer::<u32>::new_async(&stream, 4096).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    for i in 0..50u32 {
        let order = Arc::clone(&order);
        stream
            .add_callback(move || order.lock().unwrap().push(i))
            .unwrap();
        if i == 25 {
            stream.copy_from_host_async(&mut device, &host).unwrap();
        }
    }
    stream.add_callback(move || tx.send(()).unwrap()).unwrap();
    rx.recv_timeout(HANG).expect("the last callback fires");
    assert_eq!(*order.lock().unwrap(), (0..50).collect::<Vec<_>>());
    assert_eq!(device.to_vec(&stream).unwrap(), data);
}

#[test]
fn a_panicking_callback_is_caught_and_the_stream_stays_usable() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    stream
        .add_callback(|| panic!("boom in a callback"))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    stream
        .add_callback(move || tx.send("after").unwrap())
        .unwrap();
    assert_eq!(
        rx.recv_timeout(HANG).unwrap(),
        "after",
        "the stream goes on after a panic"
    );

    let metrics = stream.metrics();
    assert_eq!((metrics.callbacks, metrics.callback_panics), (2, 1));
    match stream.check_callback_panics() {
        Err(Error::CallbackPanicked {
            stream: id,
            count,
            message,
        }) => {
            assert_eq!((id, count), (stream.id(), 1));
            assert!(message.contains("boom in a callback"), "{message}");
        }
        other => panic!("expected CallbackPanicked, got {other:?}"),
    }
    stream
        .check_callback_panics()
        .expect("reported once, then cleared");

    // Still a working stream: a round trip through the device.
    let data = XorShift::new(3).u32s(1000);
    let buffer = cuda_streams_driver::DeviceBuffer::from_slice(&stream, &data).unwrap();
    assert_eq!(buffer.to_vec(&stream).unwrap(), data);
}

#[test]
fn driver_calls_inside_a_callback_are_refused_not_deadlocked() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let inner = Arc::clone(&stream);
    let (tx, rx) = mpsc::channel();
    stream
        .add_callback(move || {
            let query = inner.query();
            let sync = inner.synchronize();
            tx.send((query, sync)).unwrap();
        })
        .unwrap();
    let (query, sync) = rx.recv_timeout(HANG).expect("the callback ran");
    assert!(
        matches!(query, Err(Error::InsideCallback { .. })),
        "{query:?}"
    );
    assert!(
        matches!(sync, Err(Error::InsideCallback { .. })),
        "{sync:?}"
    );
    // Outside the callback the same calls work.
    stream.synchronize().unwrap();
}

#[test]
fn a_callback_captures_are_dropped_after_it_runs() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(Arc::clone(&dropped));
    let (tx, rx) = mpsc::channel();
    stream
        .add_callback(move || {
            let _guard = guard;
            tx.send(()).unwrap();
        })
        .unwrap();
    rx.recv_timeout(HANG).unwrap();
    stream.synchronize().unwrap();
    assert!(dropped.load(Ordering::SeqCst));
}

#[test]
fn a_callback_panic_fails_the_next_synchronize_once() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    stream
        .add_callback(|| panic!("boom at step {}", 7))
        .unwrap();
    match stream.synchronize() {
        Err(Error::CallbackPanicked {
            stream: id,
            count,
            message,
        }) => {
            assert_eq!((id, count), (stream.id(), 1));
            assert_eq!(message, "boom at step 7");
        }
        other => panic!("expected CallbackPanicked from synchronize, got {other:?}"),
    }
    let shown = stream
        .add_callback(|| panic!("again"))
        .and_then(|()| stream.synchronize())
        .unwrap_err()
        .to_string();
    assert!(
        shown.contains(&format!("stream {}", stream.id())) && shown.contains("again"),
        "the error names the stream and the message: {shown}"
    );
    // Reported once: the stream is usable again, and nothing is left to check.
    stream.synchronize().expect("reported once");
    stream.check_callback_panics().expect("already reported");
    assert_eq!(stream.metrics().callback_panics, 2);
    let data = XorShift::new(5).u32s(256);
    let buffer = cuda_streams_driver::DeviceBuffer::from_slice(&stream, &data).unwrap();
    assert_eq!(buffer.to_vec(&stream).unwrap(), data);
}

#[test]
fn a_completion_reports_the_panics_of_the_callbacks_before_it() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let before = stream.completion().unwrap();
    stream.add_callback(|| panic!("in the middle")).unwrap();
    let (tx, rx) = mpsc::channel();
    stream.add_callback(move || tx.send(()).unwrap()).unwrap();
    let after = stream.completion().unwrap();
    let mut host = PinnedBuffer::<u32>::new(&ctx, 64).unwrap();
    let device = cuda_streams_driver::DeviceBuffer::<u32>::zeroed_async(&stream, 64).unwrap();
    // The callback after the panicking one ran: the panic is on record.
    rx.recv_timeout(HANG).expect("the callbacks ran");
    // Polled after the panic, but its point came before the callback.
    block_on(before).expect("the panic came after this point");
    match block_on(after) {
        Err(Error::CallbackPanicked {
            stream: id,
            message,
            ..
        }) => {
            assert_eq!(id, stream.id());
            assert_eq!(message, "in the middle");
        }
        other => panic!("expected CallbackPanicked from the future, got {other:?}"),
    }
    // Reported by the future: not again by a copy future or a synchronize.
    block_on(stream.copy_to_host_future(&mut host, &device).unwrap()).unwrap();
    stream.synchronize().unwrap();
    // A copy future reports a panic too.
    stream.add_callback(|| panic!("before the copy")).unwrap();
    let copied = block_on(stream.copy_to_host_future(&mut host, &device).unwrap());
    assert!(
        matches!(&copied, Err(Error::CallbackPanicked { message, .. }) if message == "before the copy"),
        "{copied:?}"
    );
}

#[test]
fn events_do_not_report_callback_panics_the_stream_does() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    stream.add_callback(|| panic!("not the event's")).unwrap();
    let event = stream.record_event().unwrap();
    event
        .synchronize()
        .expect("the GPU work before the event went well");
    assert!(event.query().unwrap());
    // Still unreported: the stream's synchronize says so.
    assert!(matches!(
        stream.synchronize(),
        Err(Error::CallbackPanicked { count: 1, .. })
    ));
}

/// Poll `f` to completion on this thread, parking between polls.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut f = std::pin::pin!(f);
    let deadline = Instant::now() + HANG;
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future hung");
        std::thread::park_timeout(HANG);
    }
}
