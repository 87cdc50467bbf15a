//! Deadlock detection over dependency edges and same-stream order edges.

mod support;

use cuda_streams_event_coord as events;
use events::{Error, EventPriority, OperationCoordinator, OperationId, OperationType};
use std::sync::Arc;
use support::{ctx, pool, streams};

fn reg(
    c: &OperationCoordinator,
    stream: &Arc<driver::Stream>,
    deps: Vec<OperationId>,
    name: &str,
) -> OperationId {
    c.register_operation(
        OperationType::Kernel,
        EventPriority::Normal,
        stream,
        deps,
        name,
    )
    .unwrap()
}

/// The example: A queued on stream 1 waits for B on stream 2, B sits
/// on stream 2 behind C, C waits for D, D is queued on stream 1 behind A.
#[test]
fn the_cycle_through_stream_order_is_found() {
    let ctx = ctx();
    let s = streams(&ctx, 2);
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let a = reg(&coordinator, &s[0], vec![], "A");
    let d = reg(&coordinator, &s[0], vec![], "D"); // behind A on stream 1
    let c = reg(&coordinator, &s[1], vec![d], "C"); // waits for D
    let b = reg(&coordinator, &s[1], vec![], "B"); // behind C on stream 2
    assert!(coordinator.detect_deadlocks().is_empty(), "no cycle yet");
    coordinator.add_dependency(a, b).unwrap(); // A waits for B
    let cycles = coordinator.detect_deadlocks();
    assert_eq!(cycles, vec![vec![a, d, c, b]]);
    assert_eq!(coordinator.metrics().deadlock_detections, 1);
    // Begin refuses A (B is not complete), so the plan cannot run as queued.
    assert!(matches!(
        coordinator.begin_operation(a, &s[0]),
        Err(Error::DependencyNotComplete { .. })
    ));
    // Running B first (out of its queue position) breaks the cycle.
    coordinator.begin_operation(b, &s[1]).unwrap();
    coordinator.complete_operation(b).unwrap();
    assert!(coordinator.detect_deadlocks().is_empty());
    assert_eq!(coordinator.metrics().deadlock_detections, 1);
}

#[test]
fn a_plan_cycle_is_refused_when_added_and_stream_order_cycles_are_found() {
    let ctx = ctx();
    let s = streams(&ctx, 4);
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let bystander = reg(&coordinator, &s[0], vec![], "ok");
    // A cycle through stream order on streams 0 and 1, as above.
    let a = reg(&coordinator, &s[0], vec![], "A");
    let d = reg(&coordinator, &s[0], vec![], "D");
    let c = reg(&coordinator, &s[1], vec![d], "C");
    let b = reg(&coordinator, &s[1], vec![], "B");
    coordinator.add_dependency(a, b).unwrap();
    // A plan cycle (dependencies alone): refused at once, naming it, and the
    // plan is unchanged.
    let x1 = reg(&coordinator, &s[2], vec![], "x1");
    let y1 = reg(&coordinator, &s[3], vec![x1], "y1");
    let y2 = reg(&coordinator, &s[3], vec![y1], "y2");
    let err = coordinator.add_dependency(x1, y2).unwrap_err();
    assert!(
        matches!(&err, Error::Cycle { cycle } if *cycle == [x1, y2, y1, x1]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("dependency would close a cycle: {x1} -> {y2} -> {y1} -> {x1}")
    );
    assert!(coordinator.metadata(x1).unwrap().dependencies.is_empty());
    let _after = reg(&coordinator, &s[3], vec![bystander], "after");
    // Only the stream-order cycle is left to find.
    assert_eq!(coordinator.detect_deadlocks(), vec![vec![a, d, c, b]]);
    assert_eq!(coordinator.metrics().deadlock_detections, 1);
}

#[test]
fn a_running_pipeline_has_no_cycles() {
    let ctx = ctx();
    let s = streams(&ctx, 3);
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let mut ids = Vec::new();
    for i in 0..30 {
        let deps = ids.last().copied().into_iter().collect();
        let id = reg(&coordinator, &s[i % 3], deps, "step");
        ids.push(id);
    }
    for (i, &id) in ids.iter().enumerate().take(10) {
        coordinator.begin_operation(id, &s[i % 3]).unwrap();
        coordinator.complete_operation(id).unwrap();
    }
    assert!(coordinator.detect_deadlocks().is_empty());
    assert_eq!(coordinator.metrics().deadlock_detections, 0);
}

#[test]
fn add_dependency_checks_its_arguments() {
    let ctx = ctx();
    let s = streams(&ctx, 1);
    let coordinator = OperationCoordinator::new(pool(&ctx));
    let a = reg(&coordinator, &s[0], vec![], "A");
    let b = reg(&coordinator, &s[0], vec![], "B");
    assert!(matches!(
        coordinator.add_dependency(a, a),
        Err(Error::SelfDependency { .. })
    ));
    assert!(matches!(
        coordinator.add_dependency(a, OperationId(999)),
        Err(Error::UnknownDependency { .. })
    ));
    coordinator.begin_operation(a, &s[0]).unwrap();
    assert!(matches!(
        coordinator.add_dependency(a, b),
        Err(Error::AlreadyBegun { .. })
    ));
    coordinator.add_dependency(b, a).unwrap();
    coordinator.add_dependency(b, a).unwrap();
    assert_eq!(coordinator.metadata(b).unwrap().dependencies, vec![a]);
}
