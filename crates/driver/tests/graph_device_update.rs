//! Device nodes' scalars set on the GPU (`Capture::launch_device_updatable`,
//! `DeviceNode::scalar`, `GraphExec::scalar_table`, `GraphExec::set_scalars`):
//! replays after a set take its values, values computed on the GPU work the
//! same, the instance's drop waits for a set in flight, CUDA's rules are
//! kept (one instance, no whole-graph update), and every refusal names what
//! it refuses.

mod support;

use cuda_streams_driver::{
    Context, DeviceBuffer, DeviceNode, Error, GraphArg, GraphExec, Kernel, KernelArg, LaunchConfig,
    OrderPolicy, Stream,
};
use std::sync::Arc;
use support::{GATE_LIMIT, Gate, ctx, kernel, serial};

const N: usize = 257;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

/// `fill_u32(N, value, out)` for each of `outs`, captured as device nodes
/// (value `k` for the k-th), and the instance.
fn fills(
    stream: &Stream,
    fill: &Kernel,
    outs: &[Arc<DeviceBuffer<u32>>],
) -> (GraphExec, Vec<DeviceNode>) {
    let mut capture = stream.begin_capture().unwrap();
    let nodes = outs
        .iter()
        .enumerate()
        .map(|(k, out)| {
            let args = [
                GraphArg::from(N as u64),
                (k as u32).into(),
                GraphArg::write(out),
            ];
            capture
                .launch_device_updatable(stream, fill, cfg(), &args)
                .unwrap()
        })
        .collect();
    (capture.end().unwrap().instantiate().unwrap(), nodes)
}

fn buffers(ctx: &Arc<Context>, count: usize) -> Vec<Arc<DeviceBuffer<u32>>> {
    (0..count)
        .map(|_| Arc::new(DeviceBuffer::<u32>::new(ctx, N).unwrap()))
        .collect()
}

fn contents(stream: &Arc<Stream>, outs: &[Arc<DeviceBuffer<u32>>]) -> Vec<Vec<u32>> {
    outs.iter().map(|out| out.to_vec(stream).unwrap()).collect()
}

#[test]
fn replays_after_a_set_take_the_values_set_on_the_gpu() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 3);
    let (exec, nodes) = fills(&stream, &fill, &outs);
    exec.launch(&stream).unwrap();
    assert_eq!(
        contents(&stream, &outs),
        [vec![0; N], vec![1; N], vec![2; N]]
    );

    let scalars: Vec<_> = nodes.iter().map(|n| n.scalar::<u32>(1).unwrap()).collect();
    assert_eq!(
        scalars[2].offset(),
        8,
        "fill_u32's value sits after the u64 count"
    );
    let table = exec.scalar_table(&stream, &scalars).unwrap();
    assert_eq!(table.len(), 3);
    for round in [[10, 20, 30], [7, 8, 9]] {
        let values = DeviceBuffer::from_slice(&stream, &round).unwrap();
        exec.set_scalars(&stream, &table, &values).unwrap();
        exec.launch(&stream).unwrap();
        let want: Vec<Vec<u32>> = round.iter().map(|&v| vec![v; N]).collect();
        assert_eq!(contents(&stream, &outs), want);
    }
    // A table of some of the nodes leaves the others as they were.
    let first = exec
        .scalar_table(&stream, std::slice::from_ref(&scalars[0]))
        .unwrap();
    let values = DeviceBuffer::from_slice(&stream, &[41u32, 99]).unwrap();
    exec.set_scalars(&stream, &first, &values).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(
        contents(&stream, &outs),
        [vec![41; N], vec![8; N], vec![9; N]]
    );
}

#[test]
fn values_written_by_earlier_work_on_the_stream_are_the_ones_set() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 2);
    let (exec, nodes) = fills(&stream, &fill, &outs);
    let scalars: Vec<_> = nodes.iter().map(|n| n.scalar::<u32>(1).unwrap()).collect();
    let table = exec.scalar_table(&stream, &scalars).unwrap();
    // The GPU decides the new values: a kernel writes them, in stream
    // order before the set.
    let mut values = DeviceBuffer::<u32>::new(&ctx, 2).unwrap();
    let args = [KernelArg::from(2u64), 123u32.into(), (&mut values).into()];
    stream
        .launch(&fill, LaunchConfig::for_num_elems(2), &args)
        .unwrap();
    exec.set_scalars(&stream, &table, &values).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(contents(&stream, &outs), [vec![123; N], vec![123; N]]);
}

#[test]
fn dropping_the_instance_waits_for_a_set_in_flight() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 1);
    let (exec, nodes) = fills(&stream, &fill, &outs);
    let table = exec
        .scalar_table(&stream, &[nodes[0].scalar::<u32>(1).unwrap()])
        .unwrap();
    let values = DeviceBuffer::from_slice(&stream, &[5u32]).unwrap();
    let gate = Gate::close_within(&stream, GATE_LIMIT);
    exec.set_scalars(&stream, &table, &values).unwrap();
    let held = gate.still_held();
    // The set writes into the instance's parameters: the drop must not
    // destroy them before it has run, behind the gate.
    drop(exec);
    if held {
        assert!(
            !gate.still_held(),
            "the drop returned while the set was still held behind the gate"
        );
    }
    gate.open();
    // Had the instance gone first, the set would have failed on the stream.
    stream.synchronize().unwrap();
}

#[test]
fn a_set_and_a_replay_on_unordered_streams_are_a_race_under_check() {
    let _serial = serial();
    let ctx = ctx();
    let before = ctx.ordering();
    ctx.set_ordering(OrderPolicy::Check).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 1);
    let (exec, nodes) = fills(&stream, &fill, &outs);
    let table = exec
        .scalar_table(&stream, &[nodes[0].scalar::<u32>(1).unwrap()])
        .unwrap();
    let values = DeviceBuffer::from_slice(&stream, &[5u32]).unwrap();
    stream.synchronize().unwrap();
    exec.launch(&other).unwrap();
    let err = exec.set_scalars(&stream, &table, &values).unwrap_err();
    assert!(matches!(err, Error::UnorderedAccess(_)), "{err}");
    // Ordered, it is no race.
    stream.wait_stream(&other).unwrap();
    exec.set_scalars(&stream, &table, &values).unwrap();
    stream.synchronize().unwrap();
    ctx.set_ordering(before).unwrap();
}

#[test]
fn scalars_that_bound_memory_or_are_not_of_the_type_are_refused() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 1);
    let (_exec, nodes) = fills(&stream, &fill, &outs);
    let node = &nodes[0];
    let says = |err: Error, what: &str| {
        let text = err.to_string();
        assert!(matches!(err, Error::NodeUpdate { .. }), "{text}");
        assert!(text.contains(what) && text.contains("fill_u32"), "{text}");
    };
    says(
        node.scalar::<u64>(0).unwrap_err(),
        "counts the elements of pointer parameter 2",
    );
    says(node.scalar::<i32>(1).unwrap_err(), "not i32");
    says(node.scalar::<u64>(2).unwrap_err(), "parameter 2");
    says(node.scalar::<u32>(3).unwrap_err(), "takes 3 parameters");
}

#[test]
fn cudas_rules_one_instance_and_no_whole_graph_update() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, N).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let args = [GraphArg::from(N as u64), 1u32.into(), GraphArg::write(&out)];
    capture
        .launch_device_updatable(&stream, &fill, cfg(), &args)
        .unwrap();
    let graph = capture.end().unwrap();
    let mut exec = graph.instantiate().unwrap();
    let err = graph.instantiate().unwrap_err();
    assert!(
        matches!(err, Error::NodeUpdate { .. }) && err.to_string().contains("once"),
        "{err}"
    );
    let err = exec.update(&graph).unwrap_err();
    assert!(err.to_string().contains("GraphExec::update"), "{err}");
    // A plain graph does not update it either, nor it a plain instance.
    let mut capture = stream.begin_capture().unwrap();
    capture.launch(&stream, &fill, cfg(), &args).unwrap();
    let plain = capture.end().unwrap();
    assert!(exec.update(&plain).is_err());
    let mut plain_exec = plain.instantiate().unwrap();
    assert!(plain_exec.update(&graph).is_err());
    // The instance still works.
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![1; N]);
}

#[test]
fn tables_and_values_of_the_wrong_instance_or_count_are_refused() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 2);
    let (exec, nodes) = fills(&stream, &fill, &outs);
    let (other, other_nodes) = fills(&stream, &fill, &outs);
    let scalars: Vec<_> = nodes.iter().map(|n| n.scalar::<u32>(1).unwrap()).collect();
    let table = exec.scalar_table(&stream, &scalars).unwrap();

    let err = exec.scalar_table::<u32>(&stream, &[]).unwrap_err();
    assert!(err.to_string().contains("at least one"), "{err}");
    let foreign = other_nodes[1].scalar::<u32>(1).unwrap();
    let err = exec.scalar_table(&stream, &[foreign]).unwrap_err();
    assert!(
        err.to_string().contains("device node 1 (`fill_u32`)"),
        "{err}"
    );

    let one = DeviceBuffer::from_slice(&stream, &[3u32]).unwrap();
    let err = exec.set_scalars(&stream, &table, &one).unwrap_err();
    assert!(
        err.to_string().contains("1 values for a scalar table of 2"),
        "{err}"
    );
    let two = DeviceBuffer::from_slice(&stream, &[3u32, 4]).unwrap();
    let err = other.set_scalars(&stream, &table, &two).unwrap_err();
    assert!(err.to_string().contains("belongs to the instance"), "{err}");

    // A plain instance has no device nodes.
    let mut capture = stream.begin_capture().unwrap();
    let args = [
        GraphArg::from(N as u64),
        1u32.into(),
        GraphArg::write(&outs[0]),
    ];
    capture.launch(&stream, &fill, cfg(), &args).unwrap();
    let plain = capture.end().unwrap().instantiate().unwrap();
    assert!(plain.set_scalars(&stream, &table, &two).is_err());

    // Nothing was set by the refusals.
    exec.launch(&stream).unwrap();
    assert_eq!(contents(&stream, &outs), [vec![0; N], vec![1; N]]);
}

#[test]
fn a_conditional_body_refuses_device_nodes() {
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, N).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let flag = capture.condition(&stream, 0).unwrap();
    let mut refused = None;
    capture
        .if_then(&stream, flag, |body| {
            let origin = Arc::clone(body.origin());
            let args = [GraphArg::from(N as u64), 1u32.into(), GraphArg::write(&out)];
            refused = Some(
                body.launch_device_updatable(&origin, &fill, cfg(), &args)
                    .unwrap_err(),
            );
            Ok(())
        })
        .unwrap();
    let err = refused.unwrap();
    assert!(
        err.to_string().contains("body of a conditional node"),
        "{err}"
    );
}

#[test]
fn an_instance_is_uploaded_once_before_its_first_set() {
    let _serial = serial();
    let ctx = ctx();
    if ctx.is_gpu() {
        // A GPU's uploads are not counted; there, a set before the first
        // upload would be lost, which the tests above would see.
        return;
    }
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let outs = buffers(&ctx, 1);
    let (exec, nodes) = fills(&stream, &fill, &outs);
    let uploads = || soft_driver::graph_uploads(exec.as_raw()).unwrap();
    assert_eq!(uploads(), 0);
    let scalar = nodes[0].scalar::<u32>(1).unwrap();
    let table = exec
        .scalar_table(&stream, std::slice::from_ref(&scalar))
        .unwrap();
    assert_eq!(uploads(), 1, "uploaded before any set");
    let values = DeviceBuffer::from_slice(&stream, &[6u32]).unwrap();
    exec.set_scalars(&stream, &table, &values).unwrap();
    // A second table must not upload again: on a GPU that could copy the
    // captured values back over the set.
    let _again = exec.scalar_table(&stream, &[scalar]).unwrap();
    assert_eq!(uploads(), 1, "uploaded once");
    exec.launch(&stream).unwrap();
    assert_eq!(contents(&stream, &outs), [vec![6; N]]);
}
