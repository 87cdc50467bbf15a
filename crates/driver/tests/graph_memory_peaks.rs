//! The peaks of the device's graph memory (`Context::graph_memory_usage`):
//! replays reuse their graph's memory, and graphs sharing it through one
//! stream peak at about the largest one's footprint, where graphs on their
//! own streams keep one footprint each. The figures are the whole device's,
//! so this binary holds one test, which measures one workload at a time.

mod support;

use cuda_streams_driver::{
    Context, DriverKind, Graph, GraphExec, GraphMemoryShare, GraphMemoryUsage, Stream,
};
use std::sync::Arc;
use support::ctx;

const MIB: usize = 1 << 20;
/// Large next to any allocation granularity of the driver's graph memory.
const SIZES: [usize; 3] = [64 * MIB, 32 * MIB, 16 * MIB];

/// A graph whose one memory node holds `bytes`, set by a memset.
fn graph_of(stream: &Stream, bytes: usize) -> Graph {
    let mut capture = stream.begin_capture().unwrap();
    let scratch = capture.graph_buffer::<u8>(stream, bytes).unwrap();
    capture.memset_graph(stream, &scratch, 1).unwrap();
    capture.end().unwrap()
}

/// The most graph memory in use while `run` runs, above what was in use
/// before (everything launched before has finished and been trimmed).
fn peak_of(ctx: &Arc<Context>, run: impl FnOnce()) -> u64 {
    ctx.synchronize().unwrap();
    ctx.trim_graph_memory().unwrap();
    ctx.reset_graph_memory_peaks().unwrap();
    let before: GraphMemoryUsage = ctx.graph_memory_usage().unwrap();
    run();
    ctx.synchronize().unwrap();
    let after = ctx.graph_memory_usage().unwrap();
    eprintln!("before: {before}\nafter:  {after}");
    after.used_high - before.used
}

#[test]
fn replays_reuse_graph_memory_and_shared_graphs_peak_at_the_largest() {
    let ctx = ctx();
    let streams: Vec<Arc<Stream>> = (0..SIZES.len())
        .map(|_| Stream::new(&ctx).unwrap())
        .collect();
    let largest = SIZES[0] as u64;
    let sum: u64 = SIZES.iter().map(|&s| s as u64).sum();

    // One graph: the first replay takes its footprint, the next ten reuse it.
    let exec = graph_of(&streams[0], SIZES[0]).instantiate().unwrap();
    let once = peak_of(&ctx, || exec.launch(&streams[0]).unwrap());
    let again = peak_of(&ctx, || {
        for _ in 0..10 {
            exec.launch(&streams[0]).unwrap();
        }
    });
    drop(exec);
    assert!(
        once >= largest,
        "one replay used {once} bytes, its graph needs {largest}"
    );
    assert!(
        again <= once,
        "ten replays peaked at {again} bytes, one at {once}: the replays grew"
    );

    // Shared: every graph launched on the share's stream, interleaved.
    let share = GraphMemoryShare::new(&streams[0]);
    let shared_execs: Vec<GraphExec> = SIZES
        .iter()
        .map(|&bytes| {
            graph_of(&streams[0], bytes)
                .instantiate_shared(&share)
                .unwrap()
        })
        .collect();
    let shared = peak_of(&ctx, || {
        for _ in 0..3 {
            for exec in &shared_execs {
                exec.launch(share.stream()).unwrap();
            }
        }
    });
    drop(shared_execs);

    // Separate: each graph on a stream of its own.
    let separate_execs: Vec<GraphExec> = SIZES
        .iter()
        .map(|&bytes| graph_of(&streams[0], bytes).instantiate().unwrap())
        .collect();
    let separate = peak_of(&ctx, || {
        for _ in 0..3 {
            for (exec, stream) in separate_execs.iter().zip(&streams) {
                exec.launch(stream).unwrap();
            }
        }
    });
    drop(separate_execs);
    eprintln!(
        "graph memory peak of {} graphs ({largest} bytes the largest, {sum} in all): shared {shared}, separate {separate}",
        SIZES.len()
    );

    assert!(
        shared * 10 <= largest * 11,
        "graphs sharing memory peaked at {shared} bytes, more than the largest ({largest}) + 10%"
    );
    assert!(
        separate >= shared,
        "separate graphs peaked at {separate} bytes, below the shared {shared}"
    );
    if ctx.kind() == DriverKind::Soft {
        // The software driver's rule: each stream keeps its largest footprint.
        assert_eq!(separate, sum, "separate graphs keep one footprint each");
    }
}
