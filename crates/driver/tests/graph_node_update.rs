//! A captured launch's arguments set in an executable graph, node by node
//! (`Capture::launch_updatable`, `GraphExec::set_args`): later replays take
//! them, earlier ones keep theirs, the instance keeps and orders the new
//! buffers, and nodes of another graph or arguments of the wrong kinds are
//! refused with the instance unchanged.

mod support;

use cuda_streams_driver::{
    Context, DeviceBuffer, Error, GraphArg, GraphExec, Kernel, KernelArg, KernelNode, LaunchConfig,
    OrderPolicy, Stream,
};
use std::sync::Arc;
use support::{GATE_LIMIT, Gate, ctx, kernel, serial};

const N: usize = 1_031;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

fn fill_args(value: f32, out: &Arc<DeviceBuffer<f32>>) -> [GraphArg; 3] {
    [GraphArg::from(N as u64), value.into(), GraphArg::write(out)]
}

/// One updatable `fill_f32` of `out` with `value`, instantiated.
fn one_fill(
    stream: &Stream,
    fill: &Kernel,
    value: f32,
    out: &Arc<DeviceBuffer<f32>>,
) -> (GraphExec, KernelNode) {
    let mut capture = stream.begin_capture().unwrap();
    let node = capture
        .launch_updatable(stream, fill, cfg(), &fill_args(value, out))
        .unwrap();
    (capture.end().unwrap().instantiate().unwrap(), node)
}

/// Under the `check` policy until dropped (the previous one put back).
struct CheckPolicy {
    ctx: Arc<Context>,
    before: OrderPolicy,
}

impl CheckPolicy {
    fn on(ctx: &Arc<Context>) -> Self {
        let before = ctx.ordering();
        ctx.set_ordering(OrderPolicy::Check).unwrap();
        Self {
            ctx: Arc::clone(ctx),
            before,
        }
    }
}

impl Drop for CheckPolicy {
    fn drop(&mut self) {
        if let Err(err) = self.ctx.set_ordering(self.before) {
            eprintln!("the policy could not be put back: {err}");
        }
    }
}

/// Two streams of `ctx`, the `fill_f32` kernel and two buffers: what the
/// ordering tests race with each other.
struct Race {
    stream: Arc<Stream>,
    other: Arc<Stream>,
    fill: Kernel,
    buffers: (Arc<DeviceBuffer<f32>>, Arc<DeviceBuffer<f32>>),
}

impl Race {
    fn new(ctx: &Arc<Context>) -> Self {
        let buffer = || Arc::new(DeviceBuffer::<f32>::new(ctx, N).unwrap());
        Self {
            stream: Stream::new(ctx).unwrap(),
            other: Stream::new(ctx).unwrap(),
            fill: kernel(ctx, &kernels::ELEMENTWISE, "fill_f32"),
            buffers: (buffer(), buffer()),
        }
    }
}

/// A read of a buffer on another stream, held behind a gate so that it has
/// certainly not finished until [`HeldReader::open`].
struct HeldReader {
    gate: Gate,
    // Kept until the read has run: dropping the kernel's module would wait
    // for the context, and so for the gate.
    _saxpy: Kernel,
    _sink: DeviceBuffer<f32>,
}

impl HeldReader {
    /// `stream` reads `buffer` (a `saxpy` into a scratch buffer).
    fn start(stream: &Stream, buffer: &DeviceBuffer<f32>) -> Self {
        let ctx = stream.context();
        let saxpy = kernel(ctx, &kernels::ELEMENTWISE, "saxpy");
        let mut sink = DeviceBuffer::<f32>::new(ctx, N).unwrap();
        let gate = Gate::close_within(stream, GATE_LIMIT);
        let args = [
            KernelArg::from(N as u64),
            1.0f32.into(),
            KernelArg::from(buffer),
            KernelArg::from(&mut sink),
        ];
        stream.launch(&saxpy, cfg(), &args).unwrap();
        Self {
            gate,
            _saxpy: saxpy,
            _sink: sink,
        }
    }

    fn open(self) {
        self.gate.open();
    }
}

#[test]
fn later_replays_take_the_new_arguments_and_earlier_ones_keep_theirs() {
    // Captures are process-wide state in the software driver.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let (first, second) = (
        Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap()),
        Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap()),
    );
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &first);
    assert_eq!(node.position(), 0);
    assert_eq!(node.kernel().name(), "fill_f32");

    // The first replay waits behind the gate while the node changes.
    let gate = Gate::close_within(&stream, GATE_LIMIT);
    exec.launch(&stream).unwrap();
    let before = Arc::strong_count(&second);
    exec.set_args(&node, &fill_args(2.0, &second)).unwrap();
    assert!(
        Arc::strong_count(&second) > before,
        "the instance keeps the new buffer"
    );
    exec.launch(&stream).unwrap();
    gate.open();
    assert_eq!(
        first.to_vec(&stream).unwrap(),
        vec![1.0; N],
        "the old arguments"
    );
    assert_eq!(
        second.to_vec(&stream).unwrap(),
        vec![2.0; N],
        "the new ones"
    );

    // Set again: the buffer set before is let go.
    exec.set_args(&node, &fill_args(3.0, &first)).unwrap();
    assert_eq!(Arc::strong_count(&second), before);
    exec.launch(&stream).unwrap();
    assert_eq!(first.to_vec(&stream).unwrap(), vec![3.0; N]);
}

#[test]
fn a_new_grid_comes_with_new_arguments() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::from_slice(&stream, &[0.0; N]).unwrap());
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &out);
    // Half the elements, on a grid of one block of 64 threads.
    let half = N / 2;
    let args = [
        GraphArg::from(half as u64),
        5.0f32.into(),
        GraphArg::write(&out),
    ];
    exec.set_launch(&node, LaunchConfig::for_num_elems(half as u32), &args)
        .unwrap();
    exec.launch(&stream).unwrap();
    let got = out.to_vec(&stream).unwrap();
    assert_eq!(&got[..half], vec![5.0; half]);
    assert_eq!(&got[half..], vec![0.0; N - half], "beyond the new size");
}

#[test]
fn a_node_of_another_graph_or_wrong_arguments_are_refused_and_change_nothing() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &out);
    let (_other_exec, other_node) = one_fill(&stream, &fill, 9.0, &out);

    let err = exec
        .set_args(&other_node, &fill_args(4.0, &out))
        .unwrap_err();
    assert!(matches!(err, Error::NodeUpdate { .. }), "{err:?}");
    assert!(
        err.to_string().contains("kernel node 0 (`fill_f32`)"),
        "names the node: {err}"
    );

    // Wrong count, then a scalar where a buffer belongs.
    let err = exec
        .set_args(&node, &[GraphArg::from(N as u64), 4.0f32.into()])
        .unwrap_err();
    assert!(err.to_string().contains("fill_f32"), "{err}");
    let err = exec
        .set_args(
            &node,
            &[GraphArg::from(N as u64), 4.0f32.into(), 7u64.into()],
        )
        .unwrap_err();
    assert!(err.to_string().contains("fill_f32"), "{err}");

    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![1.0; N], "unchanged");
}

#[test]
fn an_update_from_a_graph_replaces_what_was_set_and_the_nodes_stay_usable() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let (out, other) = (
        Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap()),
        Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap()),
    );
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &out);
    let held = Arc::strong_count(&other);
    exec.set_args(&node, &fill_args(5.0, &other)).unwrap();
    assert!(Arc::strong_count(&other) > held);

    let mut capture = stream.begin_capture().unwrap();
    capture
        .launch(&stream, &fill, cfg(), &fill_args(3.0, &out))
        .unwrap();
    exec.update(&capture.end().unwrap()).unwrap();
    assert_eq!(
        Arc::strong_count(&other),
        held,
        "the update let go of what set_args kept"
    );
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![3.0; N]);

    // The node of the graph it was instantiated from still names it.
    exec.set_args(&node, &fill_args(6.0, &out)).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![6.0; N]);
}

#[test]
fn launches_order_the_buffers_set_on_a_node() {
    let _serial = serial();
    let ctx = Context::new(0).unwrap();
    let _check = CheckPolicy::on(&ctx);
    let Race {
        stream,
        other,
        fill,
        buffers: (out, shared),
    } = Race::new(&ctx);
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &out);
    exec.set_args(&node, &fill_args(2.0, &shared)).unwrap();

    // Another stream still reads `shared`: a replay writing it is a race.
    let reader = HeldReader::start(&other, &shared);
    let err = exec.launch(&stream).unwrap_err();
    assert!(matches!(err, Error::UnorderedAccess(_)), "{err:?}");
    reader.open();
    // Ordered, it runs.
    stream.wait_event(&other.mark().unwrap()).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(shared.to_vec(&stream).unwrap(), vec![2.0; N]);
}

#[test]
fn a_launch_in_a_conditional_body_cannot_be_updatable() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let cond = capture.condition(&stream, 1).unwrap();
    let err = capture
        .if_then(&stream, cond, |body| {
            let origin = Arc::clone(body.origin());
            body.launch_updatable(&origin, &fill, cfg(), &fill_args(1.0, &out))
                .map(drop)
        })
        .unwrap_err();
    assert!(matches!(err, Error::NodeUpdate { .. }), "{err:?}");
    assert!(
        err.to_string().contains("body of a conditional node"),
        "{err}"
    );
    drop(capture);
    stream.synchronize().unwrap();
}

#[test]
fn a_condition_of_another_graph_is_refused_as_a_new_argument() {
    let _serial = serial();
    let ctx = ctx();
    let (stream, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let count = kernel(&ctx, &kernels::SOLVER, "count_while_below");
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let one = LaunchConfig::for_num_elems(1);
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &counter, 0).unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    let args = |limit: u32, cond: cuda_streams_driver::Condition| {
        [GraphArg::write(&counter), limit.into(), cond.arg()]
    };
    // A first turn at the top level, then the loop: `limit` turns in all.
    let first = capture
        .launch_updatable(&stream, &count, one, &args(10, more))
        .unwrap();
    capture
        .while_loop(&stream, more, |body| {
            let origin = Arc::clone(body.origin());
            body.launch(&origin, &count, one, &args(10, more))
        })
        .unwrap();
    let mut exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(counter.to_vec(&stream).unwrap(), [10]);

    let mut foreign_capture = other.begin_capture().unwrap();
    let foreign = foreign_capture.condition(&other, 0).unwrap();
    let err = exec.set_args(&first, &args(10, foreign)).unwrap_err();
    assert!(matches!(err, Error::Conditional { .. }), "{err:?}");
    assert!(err.to_string().contains("count_while_below"), "{err}");
    drop(foreign_capture);

    // Its own condition with a new limit is fine: the first turn counts to
    // 1 and, with a limit of 1, says "stop" before the loop's first turn.
    exec.set_args(&first, &args(1, more)).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(counter.to_vec(&stream).unwrap(), [1], "the body never ran");
}

#[test]
fn a_buffer_the_graph_reads_and_a_node_now_writes_is_counted_once_per_node() {
    // `shared` is read by both captured nodes; one node is set to write it,
    // the other to read it and then to read something else. Each node's
    // share of what the instance keeps is its own.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let saxpy = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let buffer = |v: f32| Arc::new(DeviceBuffer::<f32>::from_slice(&stream, &[v; N]).unwrap());
    let (shared, other, out_x, out_y) = (buffer(1.0), buffer(10.0), buffer(0.0), buffer(0.0));
    let args = |a: f32, x: &Arc<DeviceBuffer<f32>>, y: &Arc<DeviceBuffer<f32>>| {
        [
            GraphArg::from(N as u64),
            a.into(),
            GraphArg::read(x),
            GraphArg::write(y),
        ]
    };
    let mut capture = stream.begin_capture().unwrap();
    let x = capture
        .launch_updatable(&stream, &saxpy, cfg(), &args(1.0, &shared, &out_x))
        .unwrap();
    let y = capture
        .launch_updatable(&stream, &saxpy, cfg(), &args(1.0, &shared, &out_y))
        .unwrap();
    let mut exec = capture.end().unwrap().instantiate().unwrap();

    exec.set_args(&x, &args(2.0, &other, &shared)).unwrap(); // shared += 2 * 10
    exec.set_args(&y, &args(1.0, &shared, &out_y)).unwrap(); // out_y += shared
    exec.set_args(&y, &args(1.0, &other, &out_y)).unwrap(); // out_y += 10
    exec.launch(&stream).unwrap();
    assert_eq!(shared.to_vec(&stream).unwrap(), vec![21.0; N]);
    assert_eq!(out_y.to_vec(&stream).unwrap(), vec![10.0; N]);
    let kept = Arc::strong_count(&shared);
    exec.set_args(&x, &args(1.0, &other, &out_x)).unwrap();
    assert!(
        Arc::strong_count(&shared) < kept,
        "no node was set to it any more: only the graph keeps it"
    );
}

/// Ping-pong: a node moved off the buffer it was captured with no longer
/// orders that buffer, so another stream may use it meanwhile; moved back,
/// it does again.
#[test]
fn a_buffer_a_node_was_moved_off_is_free_for_other_streams() {
    let _serial = serial();
    let ctx = Context::new(0).unwrap();
    let _check = CheckPolicy::on(&ctx);
    let Race {
        stream,
        other,
        fill,
        buffers: (ping, pong),
    } = Race::new(&ctx);
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &ping);
    exec.set_args(&node, &fill_args(2.0, &pong)).unwrap();

    let reader = HeldReader::start(&other, &ping);
    exec.launch(&stream)
        .expect("the replay writes pong only: no race with ping's reader");
    exec.set_args(&node, &fill_args(3.0, &ping)).unwrap();
    let err = exec.launch(&stream).unwrap_err();
    assert!(matches!(err, Error::UnorderedAccess(_)), "{err:?}");
    reader.open();
    stream.wait_event(&other.mark().unwrap()).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(ping.to_vec(&stream).unwrap(), vec![3.0; N]);
    assert_eq!(pong.to_vec(&stream).unwrap(), vec![2.0; N]);
}

/// After an update from another graph, the instance's buffers are that
/// graph's, which a node of the first graph cannot be matched against: a
/// node set then leaves every one of them ordered.
#[test]
fn after_an_update_setting_a_node_orders_the_graphs_buffers_still() {
    let _serial = serial();
    let ctx = Context::new(0).unwrap();
    let _check = CheckPolicy::on(&ctx);
    let Race {
        stream,
        other,
        fill,
        buffers: (ping, pong),
    } = Race::new(&ctx);
    let (mut exec, node) = one_fill(&stream, &fill, 1.0, &ping);
    let mut capture = stream.begin_capture().unwrap();
    capture
        .launch(&stream, &fill, cfg(), &fill_args(4.0, &ping))
        .unwrap();
    exec.update(&capture.end().unwrap()).unwrap();
    exec.set_args(&node, &fill_args(2.0, &pong)).unwrap();

    let reader = HeldReader::start(&other, &ping);
    let err = exec.launch(&stream).unwrap_err();
    assert!(matches!(err, Error::UnorderedAccess(_)), "{err:?}");
    reader.open();
    other.synchronize().unwrap();
}

/// A declared kernel's typed `launch_updatable`: the scalars typed, the
/// buffers lent as graph arguments, the node set like any other.
#[test]
fn a_declared_kernel_captures_an_updatable_launch() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill: kernels::FillF32 = cuda_streams_driver::Module::load(&ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .kernel()
        .expect("the image declares fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let node = fill
        .launch_updatable(
            &mut capture,
            &stream,
            cfg(),
            N as u64,
            1.5,
            GraphArg::write(&out),
        )
        .unwrap();
    assert_eq!(node.kernel().name(), "fill_f32");
    let mut exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![1.5; N]);
    exec.set_args(&node, &fill_args(2.5, &out)).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![2.5; N]);
}
