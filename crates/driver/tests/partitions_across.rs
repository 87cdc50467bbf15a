//! What waits for a whole context, and what waits for a stream's work,
//! works on a partition's streams as on any other: `Context::synchronize`
//! waits for every partition's work, and a stream's completion, a copy
//! future and an event's future made on a partition's stream resolve only
//! once its work has run (shown with gates, not timing). Every test holds
//! the serial lock: a capture elsewhere in the process would refuse the
//! context-wide calls the others make.

mod support;

use cuda_streams_driver::{
    DeviceBuffer, Kernel, KernelArg, LaunchConfig, PinnedBuffer, Sms, Stream, StreamPriority,
};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use support::{GATE_LIMIT, Gate, HANG, kernel, serial};

/// `fill_f32(n, value, out)` of `fill` on `stream`.
fn fill_with(fill: &Kernel, stream: &Stream, value: f32, out: &mut DeviceBuffer<f32>) {
    let n = out.len();
    let args = [KernelArg::from(n as u64), value.into(), out.into()];
    stream
        .launch(fill, LaunchConfig::for_num_elems(n as u32), &args)
        .expect("fill launches in a partition");
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn waker() -> Waker {
    Waker::from(Arc::new(Unpark(std::thread::current())))
}

/// Whether `future` is still pending when polled once.
fn pending<F: Future + Unpin>(future: &mut F) -> bool {
    let waker = waker();
    std::pin::Pin::new(future)
        .poll(&mut TaskContext::from_waker(&waker))
        .is_pending()
}

/// Poll `future` on this thread until it is ready, parking in between.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = waker();
    let mut future = pin!(future);
    let deadline = Instant::now() + HANG;
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut TaskContext::from_waker(&waker)) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future hung");
        std::thread::park_timeout(HANG);
    }
}

#[test]
fn context_synchronize_waits_for_every_partitions_work() {
    let _serial = serial();
    let ctx = support::ctx();
    let split = ctx.partition(&[Sms(8), Sms(8)]).unwrap();
    let streams: Vec<_> = split
        .partitions
        .iter()
        .map(|partition| partition.stream(StreamPriority::Normal).unwrap())
        .collect();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut outs: Vec<_> = streams
        .iter()
        .map(|stream| DeviceBuffer::<f32>::new_async(stream, 64).unwrap())
        .collect();
    for (partition, stream) in split.partitions.iter().zip(&streams) {
        partition.load(&fill).unwrap();
        stream.synchronize().unwrap();
    }
    // The gates open themselves: nothing here opens them.
    let gates: Vec<_> = streams
        .iter()
        .map(|stream| Gate::close_within(stream, Duration::from_millis(500)))
        .collect();
    for (i, (stream, out)) in streams.iter().zip(&mut outs).enumerate() {
        fill_with(&fill, stream, i as f32 + 1.0, out);
    }
    // Returns once every stream of the device is done: only after each
    // partition's gate opened and its fill ran. Had it not waited for the
    // partitions, it would return at once, with both gates still held.
    ctx.synchronize().unwrap();
    for (i, stream) in streams.iter().enumerate() {
        assert!(
            stream.query().unwrap(),
            "Context::synchronize returned with partition {i}'s work still queued"
        );
    }
    drop(gates);
    for (i, (stream, out)) in streams.iter().zip(&outs).enumerate() {
        assert_eq!(out.to_vec(stream).unwrap(), vec![i as f32 + 1.0; 64]);
    }
}

#[test]
fn futures_on_a_partitions_stream_resolve_only_after_its_work() {
    let _serial = serial();
    let ctx = support::ctx();
    let split = ctx.partition(&[Sms(8)]).unwrap();
    let stream = split.partitions[0].stream(StreamPriority::High).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    split.partitions[0].load(&fill).unwrap();
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 1024).unwrap();
    let mut host = PinnedBuffer::<f32>::new(&ctx, 1024).unwrap();
    for round in 1..=3 {
        let value = round as f32 * 2.5;
        let gate = Gate::close_within(&stream, GATE_LIMIT);
        fill_with(&fill, &stream, value, &mut device);
        let done = stream.record_event().unwrap();
        let mut event_done = done.wait_async().unwrap();
        let mut completion = stream.completion().unwrap();
        let mut copied = stream.copy_to_host_future(&mut host, &device).unwrap();
        if gate.still_held() {
            assert!(
                pending(&mut event_done),
                "round {round}: the event's future"
            );
            assert!(pending(&mut completion), "round {round}: the completion");
            assert!(pending(&mut copied), "round {round}: the copy future");
        }
        gate.open();
        block_on(event_done).unwrap();
        block_on(completion).unwrap();
        let host = block_on(copied).unwrap();
        assert!(
            host.as_slice().unwrap().iter().all(|&v| v == value),
            "round {round}: the copy future resolved before the fill and the copy"
        );
    }
}
