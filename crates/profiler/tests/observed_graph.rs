//! A profiler observing an operation graph times every operation under its
//! graph label, and under no other name.

use cuda_streams_profiler::StreamProfiler;
use cuda_streams_profiler::driver::Stream;
use cuda_streams_profiler::engine::OperationGraph;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use test_support::{ctx, spin, spin_kernel};

const SPIN: Duration = Duration::from_millis(2);

fn names(profiler: &StreamProfiler, stream: &Stream) -> BTreeSet<String> {
    let report = profiler.get_stream_report(stream).expect("profiled");
    report.operations.keys().cloned().collect()
}

#[test]
fn every_operation_is_timed_under_its_label() {
    let ctx = ctx();
    let kernel = spin_kernel(&ctx);
    let streams = [
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    ];
    let profiler = Arc::new(StreamProfiler::new(&ctx).unwrap());
    profiler.enable();
    let graph = OperationGraph::for_context(&ctx);
    assert!(graph.observe(profiler.clone()).is_none());

    // Three pool-like streams joined through the graph: two producers and a
    // consumer after both, then an unlabelled operation.
    let a = graph.op(&streams[0]).label("produce a").run(|s| {
        spin(s, &kernel, SPIN);
        Ok(())
    });
    let b = graph.op(&streams[1]).label("produce b").run(|s| {
        spin(s, &kernel, SPIN);
        Ok(())
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    let join = graph
        .op(&streams[2])
        .after(&[a.id(), b.id()])
        .label("consume")
        .run(|s| {
            spin(s, &kernel, SPIN);
            Ok(())
        })
        .unwrap();
    let bare = graph
        .op(&streams[2])
        .after(&[join.id()])
        .run(|_| Ok(()))
        .unwrap();
    bare.wait().unwrap();

    assert_eq!(
        names(&profiler, &streams[0]),
        BTreeSet::from(["produce a".to_string()])
    );
    assert_eq!(
        names(&profiler, &streams[1]),
        BTreeSet::from(["produce b".to_string()])
    );
    assert_eq!(
        names(&profiler, &streams[2]),
        BTreeSet::from(["consume".to_string(), "Kernel".to_string()]),
        "an unlabelled operation is named by its kind"
    );
    // The scope holds the operation's own work: the 2 ms kernel, not an
    // empty mark beside it.
    let consume = profiler.get_stream_report(&streams[2]).unwrap().operations["consume"];
    assert_eq!(consume.count, 1);
    assert!(consume.total >= SPIN, "{consume}");
    assert_eq!(profiler.error_count(), 0);
}

#[test]
fn stop_observing_stops_the_timing() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let profiler = Arc::new(StreamProfiler::new(&ctx).unwrap());
    profiler.enable();
    let graph = OperationGraph::for_context(&ctx);
    graph.observe(profiler.clone());
    graph
        .op(&stream)
        .label("seen")
        .run(|_| Ok(()))
        .unwrap()
        .wait()
        .unwrap();
    let observer = graph.stop_observing().expect("the profiler was observing");
    assert!(Arc::ptr_eq(
        &observer,
        &(profiler.clone() as Arc<dyn cuda_streams_profiler::engine::OperationObserver>)
    ));
    graph
        .op(&stream)
        .label("unseen")
        .run(|_| Ok(()))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        names(&profiler, &stream),
        BTreeSet::from(["seen".to_string()])
    );
}
