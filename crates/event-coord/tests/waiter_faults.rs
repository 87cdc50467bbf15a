//! The waiter never passes failed work off as finished: a wait whose
//! event's stream failed reaches `wait_async_result`'s callback as `Err`.

use cuda_streams_event_coord::{AsyncEventWaiter, WaitError};
use std::sync::mpsc;
use test_support::{FaultReset, Gate, HANG, ctx, fail_next_launch, kernel, serial};

#[test]
fn a_wait_behind_a_failed_launch_reports_the_failure() {
    let _serial = serial();
    let _reset = FaultReset;
    let ctx = ctx();
    let stream = cuda_streams_event_coord::driver::Stream::new(&ctx).unwrap();
    if !fail_next_launch(&stream) {
        return;
    }
    // The failing launch is still queued behind the gate when the wait starts.
    let gate = Gate::close(&stream);
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let mut out = cuda_streams_event_coord::driver::DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
    let args = [
        cuda_streams_event_coord::driver::KernelArg::from(16u64),
        1u32.into(),
        (&mut out).into(),
    ];
    stream
        .launch(
            &fill,
            cuda_streams_event_coord::driver::LaunchConfig::for_num_elems(16),
            &args,
        )
        .unwrap();
    let waiter = AsyncEventWaiter::new();
    let (tx, rx) = mpsc::channel();
    let (seed_tx, seed_rx) = mpsc::channel();
    waiter.wait_async_result(stream.record_event().unwrap(), move |outcome| {
        tx.send(outcome).unwrap()
    });
    // The seed-shaped wait still fires (nobody waits forever) ...
    waiter.wait_async(stream.record_event().unwrap(), move || {
        seed_tx.send(()).unwrap()
    });
    gate.open();
    match rx.recv_timeout(HANG).unwrap() {
        Err(WaitError::Failed(err)) => {
            assert!(err.to_string().contains("LAUNCH_FAILED"), "{err}")
        }
        other => panic!("a failed launch was reported as {other:?}"),
    }
    seed_rx.recv_timeout(HANG).unwrap();
    // ... and the failure is counted.
    assert!(waiter.metrics().query_errors >= 2);
}

#[test]
fn a_wait_on_finished_work_reports_success() {
    let _serial = serial();
    let ctx = ctx();
    let stream = cuda_streams_event_coord::driver::Stream::new(&ctx).unwrap();
    let waiter = AsyncEventWaiter::new();
    let (tx, rx) = mpsc::channel();
    waiter.wait_async_result(stream.record_event().unwrap(), move |outcome| {
        tx.send(outcome.is_ok()).unwrap()
    });
    assert!(rx.recv_timeout(HANG).unwrap());
}
