//! Completion callbacks run once, when the GPU reaches the completion event:
//! not when `complete_operation` is called.

mod support;

use cuda_streams_event_coord as events;
use events::{EventPriority, OperationCoordinator, OperationId, OperationType};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use support::{Gate, HANG, ctx, kernel, pool, spin, streams};

fn op(c: &OperationCoordinator, stream: &Arc<driver::Stream>) -> OperationId {
    c.register_operation(
        OperationType::Kernel,
        EventPriority::Normal,
        stream,
        vec![],
        "op",
    )
    .unwrap()
}

#[test]
fn a_callback_runs_at_gpu_time_exactly_once() {
    let ctx = ctx();
    let s = streams(&ctx, 1);
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let id = op(&coordinator, &s[0]);
    let ran = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU32::new(0));
    let (r, c) = (Arc::clone(&ran), Arc::clone(&count));
    coordinator
        .add_completion_callback(id, move || {
            r.store(true, Ordering::SeqCst);
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    coordinator.begin_operation(id, &s[0]).unwrap();
    spin(&s[0], &spin_kernel, Duration::from_millis(200));
    coordinator.complete_operation(id).unwrap();
    // Read the flag first, then the stream: if the stream is still busy, the
    // flag was read before the GPU got to the event.
    let ran_early = ran.load(Ordering::SeqCst);
    if !s[0].query().unwrap() {
        assert!(
            !ran_early,
            "the callback ran before the GPU reached the event"
        );
    } else {
        eprintln!("the spin ended before the check; the not-yet assertion is skipped");
    }
    s[0].synchronize().unwrap();
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // Nothing runs it again.
    coordinator.retire_completed();
    s[0].synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn callbacks_added_late_run_once_too() {
    let ctx = ctx();
    let s = streams(&ctx, 1);
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let count = Arc::new(AtomicU32::new(0));
    let bump = || {
        let c = Arc::clone(&count);
        move || {
            c.fetch_add(1, Ordering::SeqCst);
        }
    };

    // Completed and already passed by the GPU: runs before the call returns.
    let done = op(&coordinator, &s[0]);
    coordinator.begin_operation(done, &s[0]).unwrap();
    coordinator.complete_operation(done).unwrap();
    s[0].synchronize().unwrap();
    coordinator.add_completion_callback(done, bump()).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // Completed but the GPU is held: runs once the gate opens.
    let held = op(&coordinator, &s[0]);
    coordinator.begin_operation(held, &s[0]).unwrap();
    let gate = Gate::close(&s[0]);
    coordinator.complete_operation(held).unwrap();
    let (tx, rx) = mpsc::channel();
    let c = Arc::clone(&count);
    coordinator
        .add_completion_callback(held, move || {
            c.fetch_add(1, Ordering::SeqCst);
            tx.send(()).unwrap();
        })
        .unwrap();
    assert!(!s[0].query().unwrap());
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "not before the GPU gets there"
    );
    gate.open();
    rx.recv_timeout(HANG).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);

    // Retired: runs at once.
    s[0].synchronize().unwrap();
    coordinator.retire_completed();
    assert_eq!(coordinator.metrics().in_flight, 0);
    coordinator.add_completion_callback(done, bump()).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[test]
fn several_callbacks_and_a_panicking_one() {
    let ctx = ctx();
    let s = streams(&ctx, 1);
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let id = op(&coordinator, &s[0]);
    let count = Arc::new(AtomicU32::new(0));
    for i in 0..5 {
        let c = Arc::clone(&count);
        coordinator
            .add_completion_callback(id, move || {
                if i == 2 {
                    panic!("callback {i} fails on purpose");
                }
                c.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    coordinator.begin_operation(id, &s[0]).unwrap();
    coordinator.complete_operation(id).unwrap();
    s[0].synchronize().unwrap();
    assert_eq!(
        count.load(Ordering::SeqCst),
        4,
        "the others still ran, once each"
    );
    assert_eq!(coordinator.metrics().callback_panics, 1);
    s[0].check_callback_panics().unwrap();
}
