//! A CUDA graph replay under a scope is one timed operation of the stream,
//! and the stream's report counts the replays and their nodes.

use cuda_streams_profiler::StreamProfiler;
use cuda_streams_profiler::driver::{GraphArg, LaunchConfig, Stream};
use std::time::Duration;
use test_support::{ctx, spin_kernel};

const SPIN: Duration = Duration::from_millis(2);
const NODES: usize = 3;

#[test]
fn a_replay_is_one_scope_carrying_its_node_count() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let spin = spin_kernel(&ctx);
    let mut capture = stream.begin_capture().unwrap();
    for _ in 0..NODES {
        let ns = SPIN.as_nanos() as u64;
        capture
            .launch(
                &stream,
                &spin,
                LaunchConfig::for_num_elems(1),
                &[GraphArg::from(ns)],
            )
            .unwrap();
    }
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.upload(&stream).unwrap();
    stream.synchronize().unwrap();

    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    for _ in 0..2 {
        profiler
            .time(&stream, "replay", |s| exec.launch(s))
            .unwrap()
            .unwrap();
    }
    stream.synchronize().unwrap();
    let report = profiler.get_stream_report(&stream).unwrap();
    assert_eq!(report.graph_launches, 2, "{report:?}");
    assert_eq!(report.graph_nodes, 2 * NODES as u64, "{report:?}");
    let replay = report.operations["replay"];
    assert_eq!(replay.count, 2);
    // Each replay runs three 2 ms spins back to back: the scope holds all
    // of it (on the software driver the spins sleep as long).
    assert!(replay.min >= SPIN * NODES as u32 * 9 / 10, "{replay:?}");
    assert!(
        report.to_string().contains("2 CUDA graph replays, 6 nodes"),
        "{report}"
    );
}
