//! Dependencies, barriers, parallel execution and completion callbacks,
//! proved with data and GPU timing.

mod support;

use cuda_streams_stream_pool::driver::{DeviceBuffer, Error as DriverError, OrderPolicy};
use cuda_streams_stream_pool::{Error, MultiStreamCoordinator, StreamPool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use support::{HANG, XorShift, ctx, fill, kernel, saxpy, spin, spin_kernel};

const N: usize = 4099;
/// Long enough that, without ordering, the reader would run first.
const SLOW: Duration = Duration::from_millis(300);

#[test]
fn a_barrier_orders_work_proved_with_data() {
    let ctx = ctx();
    let (spinner, filler, saxpy_k) = (
        spin_kernel(&ctx),
        kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32"),
        kernel(&ctx, &kernels::ELEMENTWISE, "saxpy"),
    );
    let pool = StreamPool::new(&ctx, 3).unwrap();
    let coordinator = pool.coordinator();
    let [a, b, c] = [0, 1, 2].map(|i| Arc::clone(&coordinator.streams()[i]));
    let mut rng = XorShift::new(0xBA77);
    let (value, scale) = (rng.next_f32(), rng.next_f32());
    let y0 = rng.f32s(N);

    // x lives on b, so only the barrier (not the buffer's own tracking, which
    // orders uses after the home stream) can order b's read after a's write.
    let mut x = DeviceBuffer::<f32>::zeroed_async(&b, N).unwrap();
    let mut y = DeviceBuffer::from_slice(&b, &y0).unwrap();
    b.synchronize().unwrap();

    // a: a slow kernel, then the write.
    spin(&a, &spinner, SLOW);
    fill(&a, &filler, value, &mut x);
    coordinator.create_barrier().unwrap();
    // b: a kernel after the barrier reads what a wrote.
    saxpy(&b, &saxpy_k, scale, &x, &mut y);
    let got = y.to_vec(&b).unwrap();
    let expected: Vec<f32> = y0.iter().map(|&y| scale.mul_add(value, y)).collect();
    assert_eq!(got, expected, "b's kernel saw a's fill");
    // c was held back too.
    assert_eq!(x.to_vec(&c).unwrap(), vec![value; N]);

    // The control: without the barrier, b reads before a writes.
    spin(&a, &spinner, SLOW);
    fill(&a, &filler, value + 1.0, &mut x);
    let early = x.to_vec(&b);
    if a.context().ordering() == OrderPolicy::Off {
        assert_eq!(
            early.unwrap(),
            vec![value; N],
            "no barrier: b did not wait for a"
        );
    } else {
        // The stream-order tracker refuses the race before it happens.
        let err = early.unwrap_err();
        assert!(matches!(err, DriverError::UnorderedAccess(_)), "{err}");
    }
    a.synchronize().unwrap();
}

#[test]
fn a_dependency_orders_work_and_chains_apply_transitively() {
    let ctx = ctx();
    let (spinner, filler) = (
        spin_kernel(&ctx),
        kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32"),
    );
    let pool = StreamPool::new(&ctx, 3).unwrap();
    let mut coordinator = pool.coordinator();
    let [a, b, c] = [0, 1, 2].map(|i| Arc::clone(&coordinator.streams()[i]));
    let mut x = DeviceBuffer::<f32>::zeroed_async(&c, N).unwrap();
    c.synchronize().unwrap();

    spin(&a, &spinner, SLOW);
    fill(&a, &filler, 3.5, &mut x);
    coordinator.add_dependency(&c, &a).unwrap();
    assert_eq!(x.to_vec(&c).unwrap(), vec![3.5; N], "c waited for a");
    coordinator.remove_dependency(&c, &a);

    // Declared chain c -> b -> a, applied in one call for new work.
    coordinator.add_dependency(&b, &a).unwrap();
    coordinator.add_dependency(&c, &b).unwrap();
    spin(&a, &spinner, SLOW);
    fill(&a, &filler, 7.25, &mut x);
    coordinator.apply_dependencies().unwrap();
    assert_eq!(
        x.to_vec(&c).unwrap(),
        vec![7.25; N],
        "c waited for a through b"
    );
}

#[test]
fn a_dependency_that_closes_a_cycle_is_rejected_and_named() {
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 4).unwrap();
    let mut coordinator = pool.coordinator();
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| Arc::clone(&coordinator.streams()[i]));
    coordinator.add_dependency(&b, &a).unwrap();
    coordinator.add_dependency(&c, &b).unwrap();
    coordinator.add_dependency(&d, &a).unwrap();
    let err = coordinator.add_dependency(&a, &c).unwrap_err();
    let (ai, bi, ci) = (a.id(), b.id(), c.id());
    assert!(
        matches!(&err, Error::Cycle { path } if *path == [ai, ci, bi, ai]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "dependency would close a cycle: stream {ai} -> stream {ci} -> stream {bi} -> stream {ai}"
        )
    );
    let err = coordinator.add_dependency(&b, &b).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("dependency would close a cycle: stream {bi} -> stream {bi}")
    );
    // Rejected edges change nothing: the three accepted ones, exactly.
    // (`has_cycles()` would be false here by construction: the check refused
    // both edges before they could close anything.)
    let mut kept = coordinator.dependencies();
    kept.sort_unstable();
    let mut accepted = vec![(bi, ai), (ci, bi), (d.id(), ai)];
    accepted.sort_unstable();
    assert_eq!(kept, accepted);
    // A diamond is not a cycle.
    coordinator.add_dependency(&c, &d).unwrap();
    let outsider = pool.acquire_exclusive().unwrap();
    let err = coordinator.add_dependency(&outsider, &a).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "stream {} is not one of this coordinator's streams",
            outsider.id()
        )
    );
}

#[test]
fn completion_callbacks_fire_at_gpu_time_exactly_once() {
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new(&ctx, 2).unwrap();
    let coordinator = pool.coordinator();
    let stream = Arc::clone(&coordinator.streams()[0]);
    let fired = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    spin(&stream, &spinner, SLOW);
    let counter = Arc::clone(&fired);
    coordinator
        .add_completion_callback(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
            tx.send(Instant::now()).unwrap();
        })
        .unwrap();
    assert_eq!(coordinator.pending_callbacks(&stream).unwrap(), 1);
    assert!(rx.try_recv().is_err(), "not before the GPU gets there");
    // Nobody synchronizes: the callback fires when the stream reaches it.
    let at = rx.recv_timeout(HANG).expect("the callback fired");
    assert!(
        at - start >= SLOW / 2,
        "fired after {:?}, before the spin ended",
        at - start
    );
    stream.synchronize().unwrap();
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(coordinator.pending_callbacks(&stream).unwrap(), 0);

    // A panicking callback is settled too, and later ones still fire once each.
    coordinator
        .add_completion_callback(&stream, || panic!("boom"))
        .unwrap();
    for _ in 0..3 {
        let counter = Arc::clone(&fired);
        coordinator
            .add_completion_callback(&stream, move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    // The panic is the stream's: its synchronize reports it, once.
    assert!(stream.synchronize().is_err());
    assert_eq!(fired.load(Ordering::SeqCst), 4);
    assert_eq!(coordinator.pending_callbacks(&stream).unwrap(), 0);
    assert_eq!(stream.metrics().callback_panics, 1);
    stream.check_callback_panics().unwrap();
}

#[test]
fn execute_parallel_runs_at_once_and_collects_every_error() {
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 5).unwrap();
    let coordinator = pool.coordinator();
    let n = coordinator.streams().len();
    // Every call waits until all have started: only a truly parallel run gets through.
    let arrived = (Mutex::new(0usize), Condvar::new());
    let result = coordinator.execute_parallel(|stream| {
        let (count, all_here) = &arrived;
        let mut count = count.lock().unwrap();
        *count += 1;
        all_here.notify_all();
        let (count, timeout) = all_here
            .wait_timeout_while(count, HANG, |c| *c < n)
            .unwrap();
        drop(count);
        if timeout.timed_out() {
            return Err(Error::other("the calls did not run at the same time"));
        }
        stream.record_kernel_launch();
        let position = coordinator
            .streams()
            .iter()
            .position(|s| s.id() == stream.id())
            .unwrap();
        match position {
            1 => Err(Error::other(format!("bad input on {}", stream.id()))),
            3 => panic!("stream {} exploded", stream.id()),
            4 => Err(Error::EmptyPool),
            _ => Ok(()),
        }
    });
    let Err(Error::Parallel { failures, total }) = result else {
        panic!("expected every failure, got {result:?}");
    };
    assert_eq!(total, 5);
    let streams = coordinator.streams();
    let failed: Vec<u64> = failures.iter().map(|f| f.stream).collect();
    assert_eq!(failed, [streams[1].id(), streams[3].id(), streams[4].id()]);
    assert_eq!(
        failures[0].error.to_string(),
        format!("bad input on {}", streams[1].id())
    );
    assert!(failures[1].error.to_string().contains("exploded"));
    assert!(matches!(failures[2].error, Error::EmptyPool));
    assert_eq!(pool.metrics().kernel_launches, 5, "all five ran");

    assert!(coordinator.execute_parallel(|_| Ok(())).is_ok());
    let empty = MultiStreamCoordinator::new([]);
    assert!(empty.execute_parallel(|_| Err(Error::EmptyPool)).is_ok());
}
