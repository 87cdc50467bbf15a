//! A capture cannot swallow eager work: the check "is this stream capturing?"
//! and the driver call that enqueues are one step against `begin_capture`,
//! whether the capture is begun by a `WorkObserver` in the middle of an
//! enqueue or by another thread sharing the stream.
//!
//! Before the gate, each of these let a capture record work whose resources
//! nothing kept: a one-shot callback freed at every replay (a double free), a
//! kernel whose buffer was freed and reused, and a `copy_to_host` that
//! returned `Err` with its copy still queued into the caller's `Vec`.

mod support;

use cuda_streams_driver::{
    DeviceBuffer, Error, GraphArg, KernelArg, LaunchConfig, Stream, WorkObserver,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::{ctx, kernel, serial};

/// Begins a capture on the stream it observes, in the middle of an enqueue.
#[derive(Default)]
struct CaptureBeginner {
    began: Mutex<Option<Result<cuda_streams_driver::Capture, Error>>>,
}

impl WorkObserver for CaptureBeginner {
    fn before_work(&self, stream: &Stream) {
        *self.began.lock().unwrap() = Some(stream.begin_capture());
    }
}

impl CaptureBeginner {
    /// The observer's attempt must have been refused, naming the stream.
    fn assert_refused(&self, stream: &Stream) {
        match self.began.lock().unwrap().take() {
            Some(Err(Error::CaptureInsideEnqueue { stream: id, .. })) => {
                assert_eq!(id, stream.id());
            }
            Some(Err(other)) => panic!("refused for another reason: {other}"),
            Some(Ok(mut capture)) => {
                let nodes = capture.end().map(|g| g.node_count());
                panic!("the observer began a capture mid-enqueue (graph nodes: {nodes:?})")
            }
            None => panic!("the observer was not called"),
        }
    }
}

#[test]
fn an_observer_cannot_pull_a_callback_into_a_capture() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let beginner = Arc::new(CaptureBeginner::default());
    stream.observe_next_work(beginner.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    stream
        .add_callback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    beginner.assert_refused(&stream);
    stream.synchronize().unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the callback ran eagerly, once"
    );
    // The stream is not left capturing, and captures still work.
    assert!(!stream.is_capturing());
    let mut capture = stream.begin_capture().unwrap();
    assert_eq!(capture.end().unwrap().node_count(), 0);
}

#[test]
fn an_observer_cannot_pull_a_launch_into_a_capture() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut out = DeviceBuffer::<f32>::new_async(&stream, 1024).unwrap();
    let beginner = Arc::new(CaptureBeginner::default());
    stream.observe_next_work(beginner.clone());
    let args = [KernelArg::from(1024u64), 3.5f32.into(), (&mut out).into()];
    stream
        .launch(&fill, LaunchConfig::for_num_elems(1024), &args)
        .unwrap();
    beginner.assert_refused(&stream);
    // The fill ran eagerly: the buffer holds it before being freed.
    assert_eq!(out.to_vec(&stream).unwrap(), vec![3.5f32; 1024]);
}

#[test]
fn an_observer_cannot_pull_a_copy_to_host_into_a_capture() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let data: Vec<u32> = (0..1024).collect();
    let src = DeviceBuffer::from_slice(&stream, &data).unwrap();
    let beginner = Arc::new(CaptureBeginner::default());
    stream.observe_next_work(beginner.clone());
    let mut host = vec![0u32; 1024];
    stream.copy_to_host(&mut host, &src).unwrap();
    beginner.assert_refused(&stream);
    assert_eq!(host, data, "the copy ran before copy_to_host returned");
}

/// Another thread begins and ends captures on a stream while this one
/// enqueues callbacks, copies to the host and graph launches on it. Every
/// enqueue either runs eagerly or is refused before reaching the driver, so
/// every capture ends empty and every accepted callback runs exactly once.
#[test]
fn captures_begun_by_another_thread_never_swallow_eager_work() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let out = Arc::new(DeviceBuffer::<u32>::new_async(&stream, 256).unwrap());
    let exec = {
        let mut capture = stream.begin_capture().unwrap();
        let args = [GraphArg::from(256u64), 9u32.into(), GraphArg::write(&out)];
        capture
            .launch(&stream, &fill, LaunchConfig::for_num_elems(256), &args)
            .unwrap();
        capture.end().unwrap().instantiate().unwrap()
    };
    let data: Vec<u32> = (0..256).map(|i| i * 7).collect();
    let src = DeviceBuffer::from_slice(&stream, &data).unwrap();

    // The enqueuing thread announces each round and the capturing thread
    // begins one capture per round at once, so the two race every round.
    let round_started = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let runs = Arc::new(AtomicUsize::new(0));
    let (mut accepted, mut refused, mut captures) = (0usize, 0usize, 0usize);
    std::thread::scope(|scope| {
        let capturer = scope.spawn(|| {
            let (mut captures, mut seen) = (0, 0);
            while !done.load(Ordering::Acquire) {
                let now = round_started.load(Ordering::Acquire);
                if now == seen {
                    std::thread::yield_now();
                    continue;
                }
                seen = now;
                match stream.begin_capture() {
                    Ok(mut capture) => {
                        let graph = capture.end().unwrap();
                        assert_eq!(graph.node_count(), 0, "a capture swallowed eager work");
                        captures += 1;
                    }
                    Err(err) => panic!("begin_capture: {err}"),
                }
            }
            captures
        });
        for round in 0..3_000usize {
            round_started.store(round + 1, Ordering::Release);
            let counted = Arc::clone(&runs);
            let outcomes = [
                stream
                    .add_callback(move || {
                        counted.fetch_add(1, Ordering::SeqCst);
                    })
                    .map(|()| 1),
                {
                    let mut host = vec![u32::MAX; 256];
                    let copied = stream.copy_to_host(&mut host, &src);
                    if copied.is_ok() {
                        assert_eq!(host, data, "round {round}");
                    }
                    copied.map(|()| 0)
                },
                exec.launch(&stream).map(|()| 0),
            ];
            for outcome in outcomes {
                match outcome {
                    Ok(callbacks) => accepted += callbacks,
                    Err(Error::StreamCapturing { .. }) => refused += 1,
                    Err(other) => panic!("round {round}: {other}"),
                }
            }
        }
        done.store(true, Ordering::Release);
        captures = capturer.join().unwrap();
    });
    stream.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), accepted);
    assert!(captures > 0, "the capturing thread never ran");
    println!("{accepted} callbacks accepted, {refused} enqueues refused, {captures} captures");
    assert_eq!(out.to_vec(&stream).unwrap(), vec![9u32; 256]);
}

#[test]
fn an_observer_cannot_pull_a_graph_launch_into_a_capture() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let out = Arc::new(DeviceBuffer::<u32>::new_async(&stream, 64).unwrap());
    let exec = {
        let mut capture = stream.begin_capture().unwrap();
        let args = [GraphArg::from(64u64), 5u32.into(), GraphArg::write(&out)];
        capture
            .launch(&stream, &fill, LaunchConfig::for_num_elems(64), &args)
            .unwrap();
        capture.end().unwrap().instantiate().unwrap()
    };
    let beginner = Arc::new(CaptureBeginner::default());
    stream.observe_next_work(beginner.clone());
    exec.launch(&stream).unwrap();
    beginner.assert_refused(&stream);
    assert_eq!(
        out.to_vec(&stream).unwrap(),
        vec![5u32; 64],
        "the replay ran eagerly"
    );
}

/// Lets another thread begin a capture in the middle of an enqueue: it
/// tells the capturer to go, then returns only once the capturer waits at
/// the stream's gate (a probe of the gate is refused while a capture is
/// beginning; none can have begun, since the enqueue holds the gate).
struct CapturerWaiting {
    go: Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

impl WorkObserver for CapturerWaiting {
    fn before_work(&self, stream: &Stream) {
        if let Some(go) = self.go.lock().unwrap().take() {
            go.send(()).unwrap();
        }
        let deadline = std::time::Instant::now() + support::HANG;
        while stream.enqueue_gate("probe").is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "the capturer never reached the gate"
            );
            std::thread::yield_now();
        }
    }
}

/// Poll `future` on this thread until it is ready, parking in between.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut future = std::pin::pin!(future);
    let deadline = std::time::Instant::now() + support::HANG;
    loop {
        let mut cx = std::task::Context::from_waker(&waker);
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(std::time::Instant::now() < deadline, "a future hung");
        std::thread::park_timeout(support::HANG);
    }
}

/// A copy future's copy and the completion that watches it are one
/// enqueue: a capture that begins on another thread while the copy is
/// being enqueued waits for both, rather than refusing the completion with
/// the copy already queued into the caller's buffer.
#[test]
fn a_capture_beginning_during_a_copy_future_waits_for_its_completion() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let data: Vec<u32> = (0..1024).collect();
    let src = DeviceBuffer::from_slice(&stream, &data).unwrap();
    let mut host = cuda_streams_driver::PinnedBuffer::<u32>::new(&ctx, 1024).unwrap();
    let (go, ready) = std::sync::mpsc::channel();
    stream.observe_next_work(Arc::new(CapturerWaiting {
        go: Mutex::new(Some(go)),
    }));
    std::thread::scope(|scope| {
        let stream = &stream;
        let capturer = scope.spawn(move || {
            ready.recv().unwrap();
            let capture = stream
                .begin_capture()
                .expect("the capture begins after the copy");
            drop(capture);
        });
        let future = stream
            .copy_to_host_future(&mut host, &src)
            .expect("the completion is part of the copy's enqueue");
        capturer.join().unwrap();
        let host = block_on(future).expect("the copy completes");
        assert_eq!(host.as_slice().unwrap(), &data[..]);
    });
}
