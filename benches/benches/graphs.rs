//! CUDA graphs against eager launches through the operation graph.
//!
//! A DAG of 10,000 small kernels on 4 streams: kernel `k` runs on stream
//! `k % 4` after kernel `k - 3`, which is on another stream, so every
//! operation has a cross-stream edge (one wait and one record eagerly, an
//! edge of the CUDA graph when captured). Each kernel fills its stream's
//! 256-element buffer.
//!
//! - eager: the 10,000 operations through `OperationGraph::op`, then a
//!   synchronize of the 4 streams (wall time, host enqueueing included);
//! - replayed: the same DAG captured once with `OperationGraph::capture`,
//!   one `ReplayGraph::replay`, then the same synchronize.
//!
//! Printed: the ratio of the wall times (goal on the H200: at least 4x), and
//! what each costs the host: the whole replay call (one `cuGraphLaunch` for
//! the 10,000 nodes, with our bookkeeping) against enqueueing the same DAG
//! eagerly (the 10,000 `op` calls, without the synchronize), as a ratio of
//! the two measured in the same run. Neither is divided by the nodes: a
//! single call spread over 10,000 nodes reads near zero whatever it costs.
//!
//! The pipeline's launch-bound case: 300 steps of upload, `compute` (one
//! iteration) and download of 4,096 floats, eagerly through
//! `PipelineStageManager` (three slots, three streams), against the same
//! manager's step captured with `capture_graph` (one graph per slot) and
//! replayed 300 times, each replay on its slot's lane (goal: at least 2x).
//!
//! On the software driver the kernels are CPU twins, so only the host-side
//! figures mean anything there.

use cuda_streams_benches::{
    compare, criterion_summary, figure, kernel, median_duration, run_criterion,
};
use driver::{Context, DeviceBuffer, GraphArg, Kernel, KernelArg, LaunchConfig, Stream};
use engine::{CaptureOpId, OperationGraph, OperationId};
use pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager};
use std::sync::Arc;
use std::time::Instant;

const NODES: usize = 10_000;
const STREAMS: usize = 4;
/// Kernel `k` depends on kernel `k - STRIDE` (on another stream).
const STRIDE: usize = 3;
const LEN: usize = 256;
const RUNS: usize = 11;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(LEN as u32)
}

fn eager(
    graph: &OperationGraph,
    streams: &[Arc<Stream>],
    fill: &Kernel,
    buffers: &mut [DeviceBuffer<u32>],
) {
    let mut ids: Vec<OperationId> = Vec::with_capacity(NODES);
    for k in 0..NODES {
        let lane = k % STREAMS;
        let after: &[OperationId] = if k >= STRIDE {
            &ids[k - STRIDE..=k - STRIDE]
        } else {
            &[]
        };
        let out = &mut buffers[lane];
        let op = graph
            .op(&streams[lane])
            .after(after)
            .run(|s| {
                let args = [KernelArg::from(LEN as u64), (k as u32).into(), out.into()];
                s.launch(fill, cfg(), &args)
            })
            .expect("an eager operation");
        ids.push(op.id());
    }
}

/// The median of `samples` (not empty).
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn synchronize(streams: &[Arc<Stream>]) {
    for stream in streams {
        stream.synchronize().expect("synchronize");
    }
}

const PIPELINE_ELEMENTS: usize = 4_096;
const PIPELINE_STEPS: usize = 300;

/// The pipeline's launch-bound case, eager and as replayed graphs.
fn pipeline_case(ctx: &Arc<Context>) {
    let compute = kernel(ctx, &kernels::COMPUTE, "compute");
    let cfg = LaunchConfig::for_num_elems(PIPELINE_ELEMENTS as u32);
    let data: Vec<f32> = (0..PIPELINE_ELEMENTS)
        .map(|i| (i % 1000) as f32 * 0.001)
        .collect();

    let coordinator = AsyncCoordinator::new(ctx).expect("a coordinator");
    let mut manager =
        PipelineStageManager::new(coordinator, PIPELINE_ELEMENTS).expect("a pipeline");
    let stage = manager.add_stage(GpuPipelineStage::compute(
        "compute",
        compute.clone(),
        cfg,
        1,
        0,
        1,
    ));
    manager.set_inputs(vec![0]);
    manager.set_order(vec![stage]).expect("an order");
    manager.fill_input(0, &data).expect("input");
    for _ in 0..3 {
        manager.execute_iteration().expect("a step");
    }
    manager.drain().expect("drain");
    let eager_time = median_duration(RUNS, || {
        for _ in 0..PIPELINE_STEPS {
            manager.execute_iteration().expect("a step");
        }
        manager.drain().expect("drain");
    });

    // The same step, captured: one graph per slot, replayed on the slot's lane.
    let mut graph = manager.capture_graph().expect("the step is captured");
    for _ in 0..3 {
        graph.execute_iteration().expect("a replay");
    }
    graph.synchronize().expect("synchronize");
    let replay_time = median_duration(RUNS, || {
        for _ in 0..PIPELINE_STEPS {
            graph.execute_iteration().expect("a replay");
        }
        graph.synchronize().expect("synchronize");
    });

    let stream = Stream::new(ctx).expect("a stream");
    let mut expected = DeviceBuffer::<f32>::new(ctx, PIPELINE_ELEMENTS).expect("a buffer");
    let input = DeviceBuffer::from_slice(&stream, &data).expect("a buffer");
    let args = [
        KernelArg::from(PIPELINE_ELEMENTS as u64),
        1u32.into(),
        (&input).into(),
        (&mut expected).into(),
    ];
    stream.launch(&compute, cfg, &args).expect("a launch");
    let expected = expected.to_vec(&stream).expect("read");
    assert_eq!(
        graph.output(1).expect("read"),
        &expected[..],
        "a replayed step's output"
    );
    compare(
        "graphs: pipeline launch-bound (300 steps of 4,096 floats) replayed vs PipelineStageManager",
        replay_time.as_nanos() as f64,
        eager_time.as_nanos() as f64,
    );
}

fn main() {
    run_criterion(&[]);
    let ctx = Context::new(0).expect("a context");
    let streams: Vec<Arc<Stream>> = (0..STREAMS)
        .map(|_| Stream::new(&ctx).expect("a stream"))
        .collect();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let graph = OperationGraph::for_context(&ctx);

    // Eager, through the engine.
    let mut buffers: Vec<DeviceBuffer<u32>> = (0..STREAMS)
        .map(|_| DeviceBuffer::new(&ctx, LEN).expect("a buffer"))
        .collect();
    let mut enqueue_ns = Vec::with_capacity(RUNS);
    let eager_time = median_duration(RUNS, || {
        let start = Instant::now();
        eager(&graph, &streams, &fill, &mut buffers);
        enqueue_ns.push(start.elapsed().as_nanos() as f64);
        synchronize(&streams);
    });
    let enqueue_ns = median(enqueue_ns);

    // Captured once, replayed.
    let shared: Vec<Arc<DeviceBuffer<u32>>> = (0..STREAMS)
        .map(|_| Arc::new(DeviceBuffer::new(&ctx, LEN).expect("a buffer")))
        .collect();
    let capture_start = Instant::now();
    let mut capture = graph.capture(&streams[0]).expect("a capture");
    let mut ids: Vec<CaptureOpId> = Vec::with_capacity(NODES);
    for k in 0..NODES {
        let lane = k % STREAMS;
        let after: &[CaptureOpId] = if k >= STRIDE {
            &ids[k - STRIDE..=k - STRIDE]
        } else {
            &[]
        };
        let args = [
            GraphArg::from(LEN as u64),
            (k as u32).into(),
            GraphArg::write(&shared[lane]),
        ];
        let id = capture
            .op(&streams[lane])
            .after(after)
            .run(|c, s| c.launch(s, &fill, cfg(), &args))
            .expect("a captured operation");
        ids.push(id);
    }
    let mut replay = capture.finish().expect("the capture ends");
    let capture_time = capture_start.elapsed();
    replay.exec().upload(&streams[0]).expect("upload");
    synchronize(&streams);

    let mut launch_ns = Vec::with_capacity(RUNS);
    let replay_time = median_duration(RUNS, || {
        let start = Instant::now();
        replay.replay(&streams[0], 1).expect("a replay");
        launch_ns.push(start.elapsed().as_nanos() as f64);
        synchronize(&streams);
    });
    let launch_ns = median(launch_ns);

    // Both ran the same DAG: every buffer holds the value of its lane's last kernel.
    for (lane, (eager, replayed)) in buffers.iter().zip(&shared).enumerate() {
        let last = (0..NODES)
            .rev()
            .find(|k| k % STREAMS == lane)
            .expect("a kernel") as u32;
        assert_eq!(eager.to_vec(&streams[0]).expect("read"), vec![last; LEN]);
        assert_eq!(replayed.to_vec(&streams[0]).expect("read"), vec![last; LEN]);
    }

    compare(
        "graphs: 10,000-kernel DAG on 4 streams replayed vs eager through the engine",
        replay_time.as_nanos() as f64,
        eager_time.as_nanos() as f64,
    );
    compare(
        "graphs: host time to launch the 10,000-kernel DAG, one replay vs eager enqueueing through the engine",
        launch_ns,
        enqueue_ns,
    );
    figure(
        "graphs: host time of one replay's launch (the whole DAG)",
        launch_ns / 1e3,
        "us",
    );
    figure(
        "graphs: eager enqueueing through the engine, host time per kernel",
        enqueue_ns / NODES as f64 / 1e3,
        "us",
    );
    figure(
        "graphs: eager through the engine, per kernel (wall)",
        eager_time.as_nanos() as f64 / NODES as f64 / 1e3,
        "us",
    );
    figure(
        "graphs: capturing and instantiating the DAG once",
        capture_time.as_secs_f64() * 1e3,
        "ms",
    );
    pipeline_case(&ctx);
    criterion_summary();
}
