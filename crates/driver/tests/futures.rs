//! Futures woken by the context's reactor: they resolve only after their
//! work (checked by data), a dropped future never fires and leaks no slot,
//! many concurrent waits each complete exactly once, and a failing stream
//! wakes its futures with the error.
//!
//! The executor is hand-written with `std` (the library is runtime-agnostic).
//! Every test takes `serial()`: the context, and so its reactor, is shared
//! by every test of this binary, and the failing-stream test's launch
//! failure is sticky for the whole context until it resets it, as on a GPU.

use cuda_streams_driver::{
    Context, DeviceBuffer, Event, PinnedBuffer, Reactor, ReactorConfig, Stream, WakeMode,
};
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};
use test_support::{Gate, HANG, fill, kernel, serial, spin, spin_kernel};

/// Wakes a parked thread and counts wake-ups.
struct Unpark {
    thread: Thread,
    wakes: AtomicUsize,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn unpark_waker() -> (Arc<Unpark>, Waker) {
    let unpark = Arc::new(Unpark {
        thread: std::thread::current(),
        wakes: AtomicUsize::new(0),
    });
    (Arc::clone(&unpark), Waker::from(unpark))
}

/// Poll `f` on this thread until it is ready, parking in between.
fn block_on<F: Future>(f: F) -> F::Output {
    let (_, waker) = unpark_waker();
    let mut f = pin!(f);
    let deadline = Instant::now() + HANG;
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut TaskContext::from_waker(&waker)) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future hung");
        std::thread::park_timeout(HANG);
    }
}

/// Park (bounded) until `unpark`'s waker was called.
fn wait_for_a_wake(unpark: &Unpark, what: &str) {
    let deadline = Instant::now() + HANG;
    while unpark.wakes.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "{what} was never woken");
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// Poll once.
fn poll_once<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut TaskContext::from_waker(waker))
}

/// Wait (bounded) until the reactor has freed every slot: a cancelled slot
/// is freed by the reactor thread once its write has landed.
fn wait_for_no_slots(reactor: &Reactor) {
    let deadline = Instant::now() + HANG;
    while reactor.stats().slots_in_use != 0 {
        assert!(
            Instant::now() < deadline,
            "slots never freed: {:?}",
            reactor.stats()
        );
        std::thread::yield_now();
    }
}

fn ctx() -> Arc<Context> {
    Context::new(0).expect("a context")
}

#[test]
fn a_copy_future_resolves_only_after_its_work() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_k = spin_kernel(&ctx);
    let fill_k = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 4096).unwrap();
    let mut host = PinnedBuffer::<f32>::new(&ctx, 4096).unwrap();
    for round in 1..=5 {
        let value = round as f32 * 1.5;
        let gate = Gate::close(&stream);
        spin(&stream, &spin_k, Duration::from_millis(2));
        fill(&stream, &fill_k, value, &mut device);
        let mut copied = stream.copy_to_host_future(&mut host, &device).unwrap();
        let (unpark, waker) = unpark_waker();
        if gate.still_held() {
            assert!(poll_once(&mut copied, &waker).is_pending());
        }
        gate.open();
        let host = block_on(copied).unwrap();
        assert!(
            host.as_slice().unwrap().iter().all(|&v| v == value),
            "round {round}: the future resolved before the fill and copy"
        );
        let _ = unpark;
    }
}

#[test]
fn a_completion_sees_everything_enqueued_before_it() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin_k = spin_kernel(&ctx);
    let fill_k = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 1 << 16).unwrap();
    let mut host = PinnedBuffer::<f32>::new(&ctx, 1 << 16).unwrap();
    spin(&stream, &spin_k, Duration::from_millis(5));
    fill(&stream, &fill_k, 7.0, &mut device);
    stream.copy_to_host_async(&mut host, &device).unwrap();
    let copied = stream.record_event().unwrap();
    block_on(stream.completion().unwrap()).unwrap();
    // The stream has passed the copy: an event recorded after it says so.
    // (Not `stream.query()`: the completion's own bookkeeping, queued after
    // the point it watches, may still be running.)
    assert!(copied.query().unwrap());
    assert!(host.as_slice().unwrap().iter().all(|&v| v == 7.0));
}

#[test]
fn an_event_can_be_awaited_and_dropped_meanwhile() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let gate = Gate::close(&stream);
    let event = stream.record_event().unwrap();
    let mut waiting = event.wait_async().unwrap();
    // The future does not borrow the event.
    drop(event);
    let (_, waker) = unpark_waker();
    if gate.still_held() {
        assert!(poll_once(&mut waiting, &waker).is_pending());
    }
    gate.open();
    block_on(waiting).unwrap();
    assert!(stream.query().unwrap());

    // `.await` on `&Event`; a never-recorded event is complete at once.
    let fresh = Event::plain(&ctx).unwrap();
    block_on(async { (&fresh).await }).unwrap();
}

#[test]
fn a_dropped_future_never_fires_and_frees_its_slot() {
    let _serial = serial();
    let ctx = ctx();
    let reactor = ctx.reactor();
    let stream = Stream::new(&ctx).unwrap();
    let before = reactor.stats();
    for _ in 0..50 {
        let gate = Gate::close(&stream);
        let mut completion = stream.completion().unwrap();
        let (unpark, waker) = unpark_waker();
        let first = poll_once(&mut completion, &waker);
        drop(completion);
        gate.open();
        stream.synchronize().unwrap();
        wait_for_no_slots(reactor);
        if first.is_pending() {
            assert_eq!(
                unpark.wakes.load(Ordering::SeqCst),
                0,
                "a dropped future was woken"
            );
        }
    }
    let after = reactor.stats();
    assert_eq!(after.pending, 0);
    assert_eq!(after.slots_in_use, 0);
    // Freed slots are reused: 50 waits in a row never needed a second chunk.
    assert_eq!(after.slot_capacity, before.slot_capacity.max(4096));
    assert!(after.cancelled > before.cancelled);
}

/// A hand-written `join_all`: polls only the futures that were woken.
fn join_all<F: Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    struct Flag {
        index: usize,
        queue: Arc<Mutex<Vec<usize>>>,
        thread: Thread,
    }
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.queue.lock().unwrap().push(self.index);
            self.thread.unpark();
        }
    }
    let queue = Arc::new(Mutex::new((0..futures.len()).collect::<Vec<_>>()));
    let wakers: Vec<Waker> = (0..futures.len())
        .map(|index| {
            Waker::from(Arc::new(Flag {
                index,
                queue: Arc::clone(&queue),
                thread: std::thread::current(),
            }))
        })
        .collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut left = futures.len();
    let deadline = Instant::now() + HANG;
    while left > 0 {
        let woken = std::mem::take(&mut *queue.lock().unwrap());
        for index in woken {
            if outputs[index].is_some() {
                continue; // a wake after completion: nothing to poll
            }
            if let Poll::Ready(out) = poll_once(&mut futures[index], &wakers[index]) {
                outputs[index] = Some(out);
                left -= 1;
            }
        }
        if left > 0 && queue.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "{left} futures hung");
            std::thread::park_timeout(HANG);
        }
    }
    outputs.into_iter().map(Option::unwrap).collect()
}

#[test]
fn ten_thousand_concurrent_waits_each_complete_once() {
    let _serial = serial();
    let ctx = ctx();
    let reactor = ctx.reactor();
    let before = reactor.stats();
    let streams: Vec<_> = (0..8).map(|_| Stream::new(&ctx).unwrap()).collect();
    let mut buffers: Vec<_> = streams
        .iter()
        .map(|s| DeviceBuffer::<u32>::new_async(s, 1024).unwrap())
        .collect();
    let completed = Arc::new(AtomicUsize::new(0));
    let mut futures = Vec::new();
    for i in 0..10_000u32 {
        let s = i as usize % streams.len();
        streams[s].memset_u32_async(&mut buffers[s], i).unwrap();
        let completion = streams[s].completion().unwrap();
        let completed = Arc::clone(&completed);
        futures.push(Box::pin(async move {
            completion.await.unwrap();
            completed.fetch_add(1, Ordering::SeqCst);
            i
        }));
    }
    let outputs = join_all(futures);
    assert_eq!(outputs, (0..10_000).collect::<Vec<_>>());
    assert_eq!(completed.load(Ordering::SeqCst), 10_000);
    let after = reactor.stats();
    assert_eq!(after.completed - before.completed, 10_000);
    assert_eq!(after.pending, 0);
    assert_eq!(after.slots_in_use, 0);
}

#[test]
fn every_wake_mode_wakes() {
    let _serial = serial();
    let ctx = ctx();
    let reactor = ctx.reactor();
    let original = reactor.config();
    let stream = Stream::new(&ctx).unwrap();
    let spin_k = spin_kernel(&ctx);
    for mode in [WakeMode::Spin, WakeMode::HostFn, WakeMode::Adaptive] {
        reactor.set_config(ReactorConfig::default().with_mode(mode));
        for _ in 0..20 {
            spin(&stream, &spin_k, Duration::from_micros(200));
            block_on(stream.completion().unwrap()).unwrap();
        }
    }
    reactor.set_config(original);
    assert_eq!(reactor.stats().pending, 0);
}

/// The default mode learns how long waits on a stream take and parks
/// through most of the next one. A wait far longer than those it learned
/// must still wake its task once, after its work, through the back-off.
#[test]
fn a_wait_longer_than_the_learned_ones_still_wakes_once() {
    let _serial = serial();
    let ctx = ctx();
    let reactor = ctx.reactor();
    let original = reactor.config();
    reactor.set_config(ReactorConfig::default());
    assert!(reactor.config().predict, "prediction is on by default");
    let stream = Stream::new(&ctx).unwrap();
    let spin_k = spin_kernel(&ctx);
    let fill_k = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 4096).unwrap();
    let mut host = PinnedBuffer::<f32>::new(&ctx, 4096).unwrap();
    // Teach it: short waits on this stream.
    for _ in 0..8 {
        spin(&stream, &spin_k, Duration::from_micros(50));
        block_on(stream.completion().unwrap()).unwrap();
    }
    // Then one held far past that window by a gate.
    let gate = Gate::close(&stream);
    fill(&stream, &fill_k, 3.5, &mut device);
    let mut copied = stream.copy_to_host_future(&mut host, &device).unwrap();
    let (unpark, waker) = unpark_waker();
    if gate.still_held() {
        assert!(poll_once(&mut copied, &waker).is_pending());
    }
    // Let the window pass (the reactor sees the wait is late) before the
    // work may finish; the gate, not this pause, orders the data.
    let until = Instant::now() + Duration::from_millis(5);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    gate.open();
    wait_for_a_wake(&unpark, "the late wait");
    let host = match poll_once(&mut copied, &waker) {
        Poll::Ready(done) => done.unwrap(),
        Poll::Pending => panic!("woken but not ready"),
    };
    assert!(host.as_slice().unwrap().iter().all(|&v| v == 3.5));
    assert_eq!(unpark.wakes.load(Ordering::SeqCst), 1, "woken exactly once");
    reactor.set_config(original);
}

/// A wait pending for long must not wake the reactor every `max_park`:
/// once it has been pending a while its parks grow towards `long_park`.
/// Counted, not timed: over a span the gate holds, the reactor's parks
/// must be at least 4 times fewer than the span holds `max_park`s (what
/// the short back-off alone takes). The span is measured, not asserted.
#[test]
fn a_long_wait_wakes_the_reactor_rarely() {
    let _serial = serial();
    let ctx = ctx();
    let reactor = ctx.reactor();
    let original = reactor.config();
    let config = ReactorConfig::default();
    reactor.set_config(config);
    let stream = Stream::new(&ctx).unwrap();
    let gate = Gate::close(&stream);
    let mut done = stream.completion().unwrap();
    let (unpark, waker) = unpark_waker();
    assert!(poll_once(&mut done, &waker).is_pending() || !gate.still_held());
    let (before, from) = (reactor.stats().parks, Instant::now());
    // The span to count over; the gate, not this pause, holds the wait.
    std::thread::sleep(Duration::from_millis(500));
    let (parks, span) = (reactor.stats().parks - before, from.elapsed());
    let held = gate.still_held();
    gate.open();
    wait_for_a_wake(&unpark, "the long wait");
    assert!(
        poll_once(&mut done, &waker).is_ready(),
        "woken but not ready"
    );
    assert_eq!(unpark.wakes.load(Ordering::SeqCst), 1, "woken exactly once");
    reactor.set_config(original);
    let short_parks = (span.as_nanos() / config.max_park.as_nanos()) as u64;
    assert!(
        parks > 0,
        "the reactor never parked while the wait was pending"
    );
    if held {
        assert!(
            parks * 4 < short_parks,
            "{parks} reactor parks in {span:?} of one pending wait: \
             {short_parks} max_parks of {:?} fit in that span",
            config.max_park
        );
    }
}

#[test]
fn a_failing_stream_wakes_its_futures_with_the_error() {
    if ctx().is_gpu() {
        eprintln!("skipped on the GPU: fault injection is a software-driver feature");
        return;
    }
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill_k = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 256).unwrap();
    let gate = Gate::close(&stream);
    soft_driver::faults::fail_next_launch(stream.as_raw()).unwrap();
    fill(&stream, &fill_k, 1.0, &mut device);
    let first = stream.completion().unwrap();
    let (_, waker) = unpark_waker();
    let mut second = stream.completion().unwrap();
    assert!(poll_once(&mut second, &waker).is_pending() || !gate.still_held());
    gate.open();
    for future in [first, second] {
        let err = block_on(future).unwrap_err();
        assert!(
            err.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"),
            "expected the launch failure, got {err}"
        );
    }
    // The error came from the stream: a new wait cannot even be enqueued.
    assert!(stream.completion().is_err());
    soft_driver::faults::clear(stream.as_raw()).unwrap();
    block_on(stream.completion().unwrap()).unwrap();
    wait_for_no_slots(ctx.reactor());
}
