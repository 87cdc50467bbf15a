//! Loops on the device and graph update, against the raw calls of
//! `frontier.cu`'s shapes, measured in the same run.
//!
//! A loop of `TURNS` turns whose body is one `count_while_below` (the counter
//! goes up, the condition says whether it is still below the limit):
//!
//! - ours: `Capture::while_loop`, one `GraphExec::launch` for all the turns;
//! - raw: the same conditional node made with the driver table's calls
//!   (`cuGraphCreate`, `cuGraphConditionalHandleCreate`, `cuGraphAddNode`,
//!   the body captured with `cuStreamBeginCaptureToGraph`), one
//!   `cuGraphLaunch`;
//! - host loop: per turn, launch the kernel, copy the counter back,
//!   synchronize, test.
//!
//! Printed per turn (FIGURE), with RATIO lines: ours against raw (goal: at
//! most 1.1x the raw node's cost) and the host loop against ours (goal: at
//! least 2.5x).
//!
//! Graph update: a chain of `NODES` `fill_u32` kernels captured once; new
//! arguments taken with `GraphExec::update` from a graph captured again,
//! against capturing and instantiating again; and the raw calls alone
//! (`cuGraphExecUpdate` against `cuGraphInstantiate` of the same captured
//! graph).
//!
//! Node update: the same chain captured with `Capture::launch_updatable`;
//! new arguments set with `GraphExec::set_args` on all `NODES` nodes, and
//! on one node, against capturing and instantiating again; and the raw
//! `cuGraphExecKernelNodeSetParams` on every node, as the baseline of
//! `set_args`'s own cost.
//!
//! Device update: the same chain captured with
//! `Capture::launch_device_updatable`; every node's `value` set on the GPU
//! with `GraphExec::set_scalars` (the new values copied up from the host,
//! then one launch of the setting kernel, synchronized), against capturing
//! and instantiating again (goal: at least 100x faster).
//!
//! On the software driver the kernels are CPU twins, so only the host-side
//! figures mean anything there.

use cuda_streams_benches::{compare, figure, kernel, median_duration};
use driver::{
    Capture, Context, DeviceBuffer, DeviceMemory, Graph, GraphArg, GraphExec, Kernel, KernelNode,
    LaunchConfig, NodeScalar, Stream,
};
use std::sync::Arc;
use sys::{
    CU_GRAPH_COND_ASSIGN_DEFAULT, CUDA_CONDITIONAL_NODE_PARAMS, CUgraphConditionalNodeType,
    CUgraphNodeParams, CUgraphNodeType, CUresult, CUstreamCaptureMode,
};

const TURNS: u32 = 1_000;
const NODES: usize = 10_000;
const RUNS: usize = 7;

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "a raw driver call failed");
}

/// Ours: a WHILE node of `TURNS` turns, one launch; the median per turn in ns.
fn ours(stream: &Arc<Stream>, count: &Kernel, counter: &Arc<DeviceBuffer<u32>>) -> f64 {
    let mut capture = stream.begin_capture().expect("a capture");
    capture.memset_u8(stream, counter, 0).expect("a memset");
    let more = capture.condition(stream, 1).expect("a condition");
    capture
        .while_loop(stream, more, |body| {
            let s = Arc::clone(body.origin());
            let args = [GraphArg::write(counter), TURNS.into(), more.arg()];
            body.launch(&s, count, LaunchConfig::for_num_elems(1), &args)
        })
        .expect("the loop");
    let exec = capture
        .end()
        .expect("a graph")
        .instantiate()
        .expect("an exec");
    exec.launch(stream).expect("warm-up");
    stream.synchronize().expect("sync");
    assert_eq!(
        counter.to_vec(stream).expect("read"),
        [TURNS],
        "every turn ran"
    );
    let t = median_duration(RUNS, || {
        exec.launch(stream).expect("a launch");
        stream.synchronize().expect("sync");
    });
    t.as_nanos() as f64 / f64::from(TURNS)
}

/// Raw: the same node with the table's calls; the median per turn in ns.
fn raw(
    ctx: &Arc<Context>,
    stream: &Arc<Stream>,
    count: &Kernel,
    counter: &Arc<DeviceBuffer<u32>>,
) -> f64 {
    let d = ctx.driver();
    let (mut graph, mut handle, mut node, mut exec) = (
        std::ptr::null_mut(),
        0u64,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let side = Stream::new(ctx).expect("a stream");
    // SAFETY: live handles of the current context, valid out-pointers and
    // parameter blocks; the kernel's arguments match its signature.
    unsafe {
        ok((d.cuGraphCreate)(&mut graph, 0));
        ok((d.cuGraphConditionalHandleCreate)(
            &mut handle,
            graph,
            ctx.as_raw(),
            1,
            CU_GRAPH_COND_ASSIGN_DEFAULT,
        ));
        let mut params = CUgraphNodeParams {
            type_: CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL,
            ..Default::default()
        };
        params.__bindgen_anon_1.conditional = CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            size: 1,
            phGraph_out: std::ptr::null_mut(),
            ctx: ctx.as_raw(),
        };
        ok((d.cuGraphAddNode)(
            &mut node,
            graph,
            std::ptr::null(),
            std::ptr::null(),
            0,
            &mut params,
        ));
        let body = *params.__bindgen_anon_1.conditional.phGraph_out;
        ok((d.cuStreamBeginCaptureToGraph)(
            side.as_raw(),
            body,
            std::ptr::null(),
            std::ptr::null(),
            0,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        ));
        let (mut ptr, mut limit, mut h) = (counter.device_ptr(), TURNS, handle);
        let mut args = [
            (&raw mut ptr).cast::<std::ffi::c_void>(),
            (&raw mut limit).cast(),
            (&raw mut h).cast(),
        ];
        ok((d.cuLaunchKernel)(
            count.as_raw(),
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            side.as_raw(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        let mut ended = std::ptr::null_mut();
        ok((d.cuStreamEndCapture)(side.as_raw(), &mut ended));
        ok((d.cuGraphInstantiate)(&mut exec, graph, 0));
    }
    let launch = || {
        // SAFETY: a live executable graph and stream; the counter outlives
        // the launches (synchronized before it is dropped).
        unsafe {
            ok((d.cuMemsetD32Async)(
                counter.device_ptr(),
                0,
                1,
                stream.as_raw(),
            ));
            ok((d.cuGraphLaunch)(exec, stream.as_raw()));
            ok((d.cuStreamSynchronize)(stream.as_raw()));
        }
    };
    launch();
    assert_eq!(
        counter.to_vec(stream).expect("read"),
        [TURNS],
        "every turn ran"
    );
    let t = median_duration(RUNS, launch);
    // SAFETY: destroyed once; nothing runs any more.
    unsafe {
        ok((d.cuGraphExecDestroy)(exec));
        ok((d.cuGraphDestroy)(graph));
    }
    t.as_nanos() as f64 / f64::from(TURNS)
}

/// The host loop: launch, copy the flag back, synchronize, test; ns per
/// turn. The kernel is `fill_u32` of the counter with the turn's number (a
/// kernel that sets a condition needs a graph around it).
fn host_loop(stream: &Arc<Stream>, fill: &Kernel, counter: &Arc<DeviceBuffer<u32>>) -> f64 {
    let d = stream.context().driver();
    let turns = TURNS / 10;
    let t = median_duration(RUNS, || {
        let mut host = [0u32; 1];
        let mut turn = 0u32;
        loop {
            turn += 1;
            let (mut n, mut value, mut ptr) = (1u64, turn, counter.device_ptr());
            let mut args = [
                (&raw mut n).cast::<std::ffi::c_void>(),
                (&raw mut value).cast(),
                (&raw mut ptr).cast(),
            ];
            // SAFETY: a live stream and buffer; `fill_u32(n, value, out)`
            // gets its three arguments; `host` is read after the sync.
            unsafe {
                ok((d.cuLaunchKernel)(
                    fill.as_raw(),
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream.as_raw(),
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                ));
                ok((d.cuMemcpyDtoHAsync)(
                    host.as_mut_ptr().cast(),
                    counter.device_ptr(),
                    4,
                    stream.as_raw(),
                ));
                ok((d.cuStreamSynchronize)(stream.as_raw()));
            }
            if host[0] >= turns {
                break;
            }
        }
    });
    t.as_nanos() as f64 / f64::from(turns)
}

/// A chain of `NODES` fills with `value`.
fn chain(stream: &Arc<Stream>, fill: &Kernel, out: &Arc<DeviceBuffer<u32>>, value: u32) -> Graph {
    let mut capture = stream.begin_capture().expect("a capture");
    let n = out.len();
    for k in 0..NODES {
        let args = [
            GraphArg::from(n as u64),
            (value + k as u32).into(),
            GraphArg::write(out),
        ];
        capture
            .launch(stream, fill, LaunchConfig::for_num_elems(n as u32), &args)
            .expect("a launch");
    }
    capture.end().expect("a graph")
}

fn update_case(stream: &Arc<Stream>, fill: &Kernel) {
    let out = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 256).expect("a buffer"));
    let mut exec = chain(stream, fill, &out, 0).instantiate().expect("an exec");
    let mut value = 1;
    let ours = median_duration(RUNS, || {
        let graph = chain(stream, fill, &out, value);
        exec.update(&graph).expect("an update");
        value += 1;
    });
    let again = median_duration(RUNS, || {
        let graph = chain(stream, fill, &out, value);
        drop(graph.instantiate().expect("an exec"));
        value += 1;
    });
    compare(
        "conditional/update_vs_recapture_instantiate",
        ours.as_nanos() as f64,
        again.as_nanos() as f64,
    );
    // The raw calls alone, on one captured graph.
    let graph = chain(stream, fill, &out, 7);
    let d = stream.context().driver();
    let raw_update = median_duration(RUNS, || {
        let mut info = sys::CUgraphExecUpdateResultInfo::default();
        // SAFETY: live handles of one context; a graph of the same shape.
        ok(unsafe { (d.cuGraphExecUpdate)(exec.as_raw(), graph.as_raw(), &mut info) });
    });
    let raw_instantiate = median_duration(RUNS, || {
        let mut other = std::ptr::null_mut();
        // SAFETY: a live graph; the instance is destroyed at once.
        unsafe {
            ok((d.cuGraphInstantiate)(&mut other, graph.as_raw(), 0));
            ok((d.cuGraphExecDestroy)(other));
        }
    });
    compare(
        "conditional/raw_exec_update_vs_instantiate",
        raw_update.as_nanos() as f64,
        raw_instantiate.as_nanos() as f64,
    );
    figure(
        "conditional/capture_chain_of_10000",
        (ours.as_secs_f64() - raw_update.as_secs_f64()) * 1e3,
        "ms (capture + our bookkeeping)",
    );
}

/// The chain of `chain`, each launch captured with `launch` (updatable on
/// the host or on the device), instantiated; the nodes `launch` handed back.
fn chain_of_nodes<N>(
    stream: &Arc<Stream>,
    out: &Arc<DeviceBuffer<u32>>,
    mut launch: impl FnMut(&mut Capture, LaunchConfig, &[GraphArg]) -> N,
) -> (GraphExec, Vec<N>) {
    let mut capture = stream.begin_capture().expect("a capture");
    let n = out.len();
    let config = LaunchConfig::for_num_elems(n as u32);
    let nodes = (0..NODES)
        .map(|k| {
            let args = [
                GraphArg::from(n as u64),
                (k as u32).into(),
                GraphArg::write(out),
            ];
            launch(&mut capture, config, &args)
        })
        .collect();
    let exec = capture
        .end()
        .expect("a graph")
        .instantiate()
        .expect("an exec");
    (exec, nodes)
}

/// The chain of `chain`, captured with updatable launches.
fn updatable_chain(
    stream: &Arc<Stream>,
    fill: &Kernel,
    out: &Arc<DeviceBuffer<u32>>,
) -> (GraphExec, Vec<KernelNode>) {
    chain_of_nodes(stream, out, |capture, config, args| {
        capture
            .launch_updatable(stream, fill, config, args)
            .expect("a launch")
    })
}

fn node_update_case(stream: &Arc<Stream>, fill: &Kernel) {
    let out = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 256).expect("a buffer"));
    let (mut exec, nodes) = updatable_chain(stream, fill, &out);
    let n = out.len() as u64;
    let mut value = 1u32;
    let all = median_duration(RUNS, || {
        for node in &nodes {
            let args = [GraphArg::from(n), value.into(), GraphArg::write(&out)];
            exec.set_args(node, &args).expect("set");
        }
        value += 1;
    });
    let last_all = value - 1;
    let one = median_duration(RUNS, || {
        let args = [GraphArg::from(n), value.into(), GraphArg::write(&out)];
        exec.set_args(&nodes[NODES / 2], &args).expect("set");
        value += 1;
    });
    // What a replay gives: the last node's value.
    exec.launch(stream).expect("a replay");
    let last = out.to_vec(stream).expect("a download")[0];
    assert_eq!(last, last_all, "the last node's latest value");
    let again = median_duration(RUNS, || {
        let graph = chain(stream, fill, &out, value);
        drop(graph.instantiate().expect("an exec"));
    });
    compare(
        "conditional/set_args_all_nodes_vs_recapture_instantiate",
        all.as_nanos() as f64,
        again.as_nanos() as f64,
    );
    compare(
        "conditional/set_args_one_node_vs_recapture_instantiate",
        one.as_nanos() as f64,
        again.as_nanos() as f64,
    );
    // The raw call on every node, with the node's own function.
    let d = stream.context().driver();
    let raw_all = median_duration(RUNS, || {
        let ptr = out.device_ptr();
        for node in &nodes {
            let (mut n_arg, mut v_arg, mut p_arg) = (n, value, ptr);
            let mut params = [
                (&raw mut n_arg).cast::<std::ffi::c_void>(),
                (&raw mut v_arg).cast(),
                (&raw mut p_arg).cast(),
            ];
            let config = node.config();
            let raw_params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: fill.as_raw(),
                gridDimX: config.grid_dim.0,
                gridDimY: config.grid_dim.1,
                gridDimZ: config.grid_dim.2,
                blockDimX: config.block_dim.0,
                blockDimY: config.block_dim.1,
                blockDimZ: config.block_dim.2,
                sharedMemBytes: config.shared_mem_bytes,
                kernelParams: params.as_mut_ptr(),
                ..Default::default()
            };
            // SAFETY: a live instance of the graph holding the node; the
            // arguments are the kernel's (u64, u32, pointer), alive for the
            // call; `out` outlives every replay (synchronized below).
            ok(unsafe {
                (d.cuGraphExecKernelNodeSetParams)(exec.as_raw(), node.as_raw(), &raw_params)
            });
        }
        value += 1;
    });
    compare(
        "conditional/set_args_all_nodes_vs_raw_set_params",
        all.as_nanos() as f64,
        raw_all.as_nanos() as f64,
    );
    exec.launch(stream).expect("a replay");
    stream.synchronize().expect("synchronized");
}

/// The chain of `chain`, captured with device-updatable launches: the
/// instance and each node's `value` scalar.
fn device_chain(
    stream: &Arc<Stream>,
    fill: &Kernel,
    out: &Arc<DeviceBuffer<u32>>,
) -> (GraphExec, Vec<NodeScalar<u32>>) {
    chain_of_nodes(stream, out, |capture, config, args| {
        let node = capture
            .launch_device_updatable(stream, fill, config, args)
            .expect("a launch");
        node.scalar::<u32>(1).expect("fill_u32's value")
    })
}

fn device_update_case(stream: &Arc<Stream>, fill: &Kernel) {
    let out = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 256).expect("a buffer"));
    let (exec, scalars) = device_chain(stream, fill, &out);
    let table = exec.scalar_table(stream, &scalars).expect("a table");
    let mut values = DeviceBuffer::<u32>::new(stream.context(), NODES).expect("values");
    let mut base = 1_000u32;
    let mut host: Vec<u32> = vec![0; NODES];
    let ours = median_duration(RUNS, || {
        base += 100_000;
        for (k, value) in host.iter_mut().enumerate() {
            *value = base + k as u32;
        }
        stream
            .copy_from_host(&mut values, &host)
            .expect("values up");
        exec.set_scalars(stream, &table, &values).expect("a set");
        stream.synchronize().expect("synchronized");
    });
    // What a replay gives: the last node's new value.
    exec.launch(stream).expect("a replay");
    let last = out.to_vec(stream).expect("a download")[0];
    assert_eq!(
        last,
        base + NODES as u32 - 1,
        "the last node's value, set on the GPU"
    );
    let again = median_duration(RUNS, || {
        let graph = chain(stream, fill, &out, base);
        drop(graph.instantiate().expect("an exec"));
    });
    figure(
        "conditional/set_scalars_on_device_all_nodes",
        ours.as_secs_f64() * 1e6,
        "us (values up + one setting launch, synchronized)",
    );
    compare(
        "conditional/set_scalars_on_device_vs_recapture_instantiate",
        ours.as_nanos() as f64,
        again.as_nanos() as f64,
    );
}

fn main() {
    let ctx = Context::new(0).expect("a context");
    let stream = Stream::new(&ctx).expect("a stream");
    let count = kernel(&ctx, &kernels::SOLVER, "count_while_below");
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).expect("a counter"));
    let ours_ns = ours(&stream, &count, &counter);
    let raw_ns = raw(&ctx, &stream, &count, &counter);
    let host_ns = host_loop(&stream, &fill, &counter);
    figure("conditional/while_ours", ours_ns / 1e3, "us/iteration");
    figure("conditional/while_raw_node", raw_ns / 1e3, "us/iteration");
    figure("conditional/host_loop", host_ns / 1e3, "us/iteration");
    compare("conditional/while_ours_vs_raw_node", ours_ns, raw_ns);
    compare("conditional/while_ours_vs_host_loop", ours_ns, host_ns);
    update_case(&stream, &fill);
    node_update_case(&stream, &fill);
    device_update_case(&stream, &fill);
}
