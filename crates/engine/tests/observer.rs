//! An operation observer sees every builder operation's work, with its
//! label, kind and dependencies, on the operation's stream; work it forgets
//! to run still runs.

use cuda_streams_engine::driver::{DeviceBuffer, PinnedBuffer, Stream};
use cuda_streams_engine::{
    ObservedOperation, OperationGraph, OperationId, OperationObserver, OperationType,
};
use std::sync::{Arc, Mutex};
use test_support::ctx;

/// What an observer saw of one operation.
#[derive(Debug, PartialEq)]
struct Seen {
    label: String,
    kind: OperationType,
    stream: u64,
    dependencies: Vec<OperationId>,
}

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
    /// Forget to run the work (a faulty observer).
    forget: bool,
}

impl OperationObserver for Recorder {
    fn around_work(&self, operation: &ObservedOperation<'_>, work: &mut dyn FnMut()) {
        self.seen.lock().unwrap().push(Seen {
            label: operation.label().to_string(),
            kind: operation.kind(),
            stream: operation.stream().id(),
            dependencies: operation.dependencies().to_vec(),
        });
        if !self.forget {
            work();
        }
    }
}

#[test]
fn the_observer_sees_each_operation_once_with_its_description() {
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let branches = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
    let graph = OperationGraph::for_context(&ctx);
    let recorder = Arc::new(Recorder::default());
    graph.observe(recorder.clone());
    let first = graph.op(&a).label("first").run(|_| Ok(())).unwrap();
    let copy = graph
        .op(&b)
        .after(&[first.id()])
        .kind(OperationType::MemoryTransfer)
        .label("copy")
        .run(|_| Ok(()))
        .unwrap();
    let refs: Vec<&Stream> = branches.iter().map(|s| &**s).collect();
    let fan = graph
        .op(&a)
        .label("fan")
        .fork_join(&refs, |_, _| Ok(()))
        .unwrap();
    let parallel = graph
        .parallel(&branches)
        .label("each")
        .run(|_| Ok::<(), std::io::Error>(()));
    assert!(parallel.is_ok());
    fan.wait().unwrap();
    copy.wait().unwrap();
    parallel.wait().unwrap();

    let seen = recorder.seen.lock().unwrap();
    assert_eq!(
        seen[..3],
        [
            Seen {
                label: "first".into(),
                kind: OperationType::Kernel,
                stream: a.id(),
                dependencies: vec![]
            },
            Seen {
                label: "copy".into(),
                kind: OperationType::MemoryTransfer,
                stream: b.id(),
                dependencies: vec![first.id()],
            },
            // A fork/join is one operation, on its own stream.
            Seen {
                label: "fan".into(),
                kind: OperationType::Kernel,
                stream: a.id(),
                dependencies: vec![]
            },
        ]
    );
    // One per parallel branch, each on its branch's stream.
    let mut each: Vec<u64> = seen[3..].iter().map(|s| s.stream).collect();
    each.sort_unstable();
    let mut expected: Vec<u64> = branches.iter().map(|s| s.id()).collect();
    expected.sort_unstable();
    assert_eq!(each, expected);
    assert!(seen[3..].iter().all(|s| s.label == "each"));
}

#[test]
fn work_the_observer_forgets_still_runs() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    graph.observe(Arc::new(Recorder {
        forget: true,
        ..Default::default()
    }));
    let mut data = DeviceBuffer::<u32>::new(&ctx, 16).unwrap();
    let mut host = PinnedBuffer::<u32>::new(&ctx, 16).unwrap();
    let fill = graph
        .op(&stream)
        .label("fill")
        .run(|s| s.memset_u32_async(&mut data, 5))
        .unwrap();
    let read = graph
        .op(&stream)
        .after(&[fill.id()])
        .run(|s| s.copy_to_host_async(&mut host, &data))
        .unwrap();
    read.wait().unwrap();
    assert!(host.as_slice().unwrap().iter().all(|&v| v == 5));
    // And a failure of forgotten work is still the operation's.
    let mut small = DeviceBuffer::<u32>::new(&ctx, 4).unwrap();
    let err = graph
        .op(&stream)
        .label("too long")
        .run(|s| s.copy_from_host(&mut small, &[1u32; 8]));
    assert!(err.is_err());
}
