//! Graph memory nodes: the peak of the device's graph memory and the replay
//! time of `GRAPHS` graphs, each allocating `SIZES[i]` bytes of scratch
//! (`Capture::graph_buffer`) that a memset fills, shared through one stream
//! (`GraphMemoryShare`) against separate (one stream each), and the same
//! graphs made with the raw calls (`cuMemAllocAsync` / `cuMemFreeAsync`
//! while capturing) and launched on one stream, in the same run.
//!
//! Printed: each peak (FIGURE, MiB, above what was in use before), the
//! shared peak against the largest graph's footprint (goal: at most +10%),
//! and RATIO lines for the replay time of one round of all the graphs,
//! ours shared against raw.
//!
//! On the software driver the peaks follow its model (docs/testing.md) and
//! the memsets run on CPU threads: only the GPU's figures mean anything.

use cuda_streams_benches::{compare, figure, median_duration};
use driver::{Context, Graph, GraphExec, GraphMemoryShare, Stream};
use std::sync::Arc;
use sys::{CUresult, CUstreamCaptureMode};

const MIB: usize = 1 << 20;
const SIZES: [usize; 4] = [64 * MIB, 48 * MIB, 32 * MIB, 16 * MIB];
const ROUNDS: usize = 5;
const RUNS: usize = 7;

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "a raw driver call failed");
}

fn graph_of(stream: &Stream, bytes: usize) -> Graph {
    let mut capture = stream.begin_capture().expect("a capture");
    let scratch = capture
        .graph_buffer::<u8>(stream, bytes)
        .expect("a graph buffer");
    capture.memset_graph(stream, &scratch, 1).expect("a memset");
    capture.end().expect("a graph")
}

/// The graph memory in use at most while `run` runs, above what was in use
/// before, in bytes.
fn peak_of(ctx: &Arc<Context>, run: impl FnOnce()) -> u64 {
    ctx.synchronize().expect("sync");
    ctx.trim_graph_memory().expect("trim");
    ctx.reset_graph_memory_peaks().expect("reset");
    let before = ctx.graph_memory_usage().expect("usage");
    run();
    ctx.synchronize().expect("sync");
    ctx.graph_memory_usage().expect("usage").used_high - before.used
}

/// One round: every graph once, each on its stream; then wait.
fn round(execs: &[GraphExec], streams: &[&Arc<Stream>]) {
    for (exec, stream) in execs.iter().zip(streams) {
        exec.launch(stream).expect("a launch");
    }
    for stream in streams {
        stream.synchronize().expect("sync");
    }
}

/// The raw graphs: capture, allocate, memset, free, instantiate.
fn raw_execs(ctx: &Arc<Context>, stream: &Stream) -> Vec<sys::CUgraphExec> {
    let d = ctx.driver();
    SIZES
        .iter()
        .map(|&bytes| {
            let (mut graph, mut exec, mut ptr) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
            // SAFETY: a live stream of the current context; valid
            // out-pointers; the memset stays inside the allocation, between
            // it and its free.
            unsafe {
                ok((d.cuStreamBeginCapture)(
                    stream.as_raw(),
                    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                ));
                ok((d.cuMemAllocAsync)(&mut ptr, bytes, stream.as_raw()));
                ok((d.cuMemsetD8Async)(ptr, 1, bytes, stream.as_raw()));
                ok((d.cuMemFreeAsync)(ptr, stream.as_raw()));
                ok((d.cuStreamEndCapture)(stream.as_raw(), &mut graph));
                ok((d.cuGraphInstantiate)(&mut exec, graph, 0));
                ok((d.cuGraphDestroy)(graph));
            }
            exec
        })
        .collect()
}

fn main() {
    let ctx = Context::new(0).expect("a context");
    let streams: Vec<Arc<Stream>> = SIZES
        .iter()
        .map(|_| Stream::new(&ctx).expect("a stream"))
        .collect();
    let one = vec![&streams[0]; SIZES.len()];
    let each: Vec<&Arc<Stream>> = streams.iter().collect();
    let largest = SIZES[0] as f64;
    let mib = |bytes: u64| bytes as f64 / MIB as f64;

    let share = GraphMemoryShare::new(&streams[0]);
    let shared: Vec<GraphExec> = SIZES
        .iter()
        .map(|&b| {
            graph_of(&streams[0], b)
                .instantiate_shared(&share)
                .expect("an exec")
        })
        .collect();
    round(&shared, &one);
    let shared_peak = peak_of(&ctx, || (0..ROUNDS).for_each(|_| round(&shared, &one)));
    let shared_ns = median_duration(RUNS, || round(&shared, &one)).as_nanos() as f64;
    drop(shared);

    let separate: Vec<GraphExec> = SIZES
        .iter()
        .map(|&b| graph_of(&streams[0], b).instantiate().expect("an exec"))
        .collect();
    round(&separate, &each);
    let separate_peak = peak_of(&ctx, || (0..ROUNDS).for_each(|_| round(&separate, &each)));
    let separate_ns = median_duration(RUNS, || round(&separate, &each)).as_nanos() as f64;
    drop(separate);

    let raw = raw_execs(&ctx, &streams[0]);
    let d = ctx.driver();
    let raw_round = || {
        for &exec in &raw {
            // SAFETY: a live executable graph and stream.
            ok(unsafe { (d.cuGraphLaunch)(exec, streams[0].as_raw()) });
        }
        streams[0].synchronize().expect("sync");
    };
    raw_round();
    let raw_peak = peak_of(&ctx, || (0..ROUNDS).for_each(|_| raw_round()));
    let raw_ns = median_duration(RUNS, raw_round).as_nanos() as f64;
    for exec in raw {
        // SAFETY: destroyed once; nothing runs any more.
        ok(unsafe { (d.cuGraphExecDestroy)(exec) });
    }

    figure(
        "graph_memory/largest_footprint",
        largest / MIB as f64,
        "MiB",
    );
    figure("graph_memory/peak_shared", mib(shared_peak), "MiB");
    figure("graph_memory/peak_separate", mib(separate_peak), "MiB");
    figure("graph_memory/peak_raw_one_stream", mib(raw_peak), "MiB");
    figure(
        "graph_memory/peak_shared_over_largest",
        shared_peak as f64 / largest,
        "x (goal: at most 1.10)",
    );
    figure("graph_memory/round_shared", shared_ns / 1e3, "us/round");
    figure("graph_memory/round_separate", separate_ns / 1e3, "us/round");
    figure("graph_memory/round_raw", raw_ns / 1e3, "us/round");
    compare("graph_memory/round_shared_vs_raw", shared_ns, raw_ns);
    compare("graph_memory/round_separate_vs_raw", separate_ns, raw_ns);
}
