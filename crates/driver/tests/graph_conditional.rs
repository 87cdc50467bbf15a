//! Conditional nodes in captures: a WHILE loop a kernel ends, an IF, and the
//! refusals (a condition of another capture or that already has its node,
//! a host callback in a body, a body ended by hand). The kernel here is a stand-in only the software
//! driver runs; the GPU runs the kernels crate's (see `docs/graphs.md`).

mod support;

use cuda_streams_driver::sys::signature::{Access, Extent, Param, Scalar};
use cuda_streams_driver::{
    DeviceBuffer, Error, GraphArg, KernelDecl, LaunchConfig, Module, ModuleImage, Stream,
};
use std::sync::Arc;
use support::ctx;

static IMAGE: [u8; 12] = *b"conditional\0";

/// `count_up(u32* counter, u32* data, u32 n, u32 limit, handle)` (the body
/// of `frontier.cu`'s WHILE loop): `data[..n] += 1`, the counter goes up by
/// one, the condition is whether it is still below `limit`.
fn count_up(_: &soft_driver::LaunchDims, args: &mut soft_driver::TwinArgs<'_>) {
    let counter = args.slice_mut::<u32>();
    let data = args.slice_mut::<u32>();
    let _n: u32 = args.scalar();
    let limit: u32 = args.scalar();
    let handle: u64 = args.scalar();
    data.iter_mut().for_each(|x| *x += 1);
    counter[0] += 1;
    soft_driver::set_conditional(handle, u32::from(counter[0] < limit));
}

const PARAMS: &[Param] = &[
    Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Elements(1),
    },
    Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Arg(2),
    },
    Param::Scalar(Scalar::U32),
    Param::Scalar(Scalar::U32),
    Param::Condition,
];
static KERNELS: &[KernelDecl] = &[KernelDecl {
    name: "count_up",
    params: PARAMS,
    twin: Some(count_up),
    grid_dependency_sync: false,
}];

/// The context, a stream and `count_down`, or `None` on the GPU.
fn setup() -> Option<(Arc<Stream>, cuda_streams_driver::Kernel)> {
    if cuda_streams_driver::driver().unwrap().is_gpu() {
        eprintln!("skipped on the GPU: the image is a stand-in only the software driver loads");
        return None;
    }
    let ctx = ctx();
    // SAFETY: the twin touches the one counter and the n words declared.
    let image = unsafe { ModuleImage::declared(&IMAGE, KERNELS) };
    let kernel = Module::load(&ctx, image)
        .unwrap()
        .function("count_up")
        .unwrap();
    Some((Stream::new(&ctx).unwrap(), kernel))
}

/// Capture: zero `counter`, then a WHILE node whose body is
/// one `count_up` to `limit`.
fn capture_loop(
    stream: &Arc<Stream>,
    kernel: &cuda_streams_driver::Kernel,
    counter: &Arc<DeviceBuffer<u32>>,
    data: &Arc<DeviceBuffer<u32>>,
    limit: u32,
) -> cuda_streams_driver::Graph {
    let n = data.len() as u32;
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(stream, counter, 0).unwrap();
    let more = capture.condition(stream, 1).unwrap();
    capture
        .while_loop(stream, more, |body| {
            let args = [
                GraphArg::write(counter),
                GraphArg::write(data),
                n.into(),
                limit.into(),
                more.arg(),
            ];
            let origin = Arc::clone(body.origin());
            body.launch(&origin, kernel, LaunchConfig::for_num_elems(n), &args)
        })
        .unwrap();
    capture.end().unwrap()
}

fn zeroed(stream: &Arc<Stream>, n: usize) -> Arc<DeviceBuffer<u32>> {
    let mut data = DeviceBuffer::<u32>::new_async(stream, n).unwrap();
    stream.memset_u8_async(&mut data, 0).unwrap();
    Arc::new(data)
}

#[test]
fn a_while_loop_runs_until_its_kernel_clears_the_condition_at_every_launch() {
    let Some((stream, kernel)) = setup() else {
        return;
    };
    let n = 16;
    let counter = Arc::new(DeviceBuffer::<u32>::new_async(&stream, 1).unwrap());
    let data = zeroed(&stream, n);
    let graph = capture_loop(&stream, &kernel, &counter, &data, 5);
    assert_eq!(
        graph.node_count(),
        3,
        "the memset, the node, its body's kernel"
    );
    let exec = graph.instantiate().unwrap();
    drop(graph);
    exec.launch(&stream).unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), vec![5; n], "five turns");
    assert_eq!(counter.to_vec(&stream).unwrap(), [5]);
    // The condition is 1 again at the start of the next launch: without
    // that, the loop would not run and `data` would stay at 5.
    exec.launch(&stream).unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), vec![10; n]);
}

#[test]
fn the_graph_keeps_the_body_buffers_alive() {
    let Some((stream, kernel)) = setup() else {
        return;
    };
    let counter = Arc::new(DeviceBuffer::<u32>::new_async(&stream, 1).unwrap());
    let data = zeroed(&stream, 4);
    let exec = capture_loop(&stream, &kernel, &counter, &data, 3)
        .instantiate()
        .unwrap();
    // Only the body uses `data`: the executable graph keeps it.
    let weak = Arc::downgrade(&data);
    drop(data);
    let data = weak.upgrade().expect("kept by the executable graph");
    exec.launch(&stream).unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), vec![3; 4]);
}

#[test]
fn a_condition_of_another_capture_is_refused_naming_both() {
    let Some((stream, _)) = setup() else {
        return;
    };
    let other = Stream::new(stream.context()).unwrap();
    let mut first = other.begin_capture().unwrap();
    let foreign = first.condition(&other, 0).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let err = capture
        .while_loop(&stream, foreign, |_| Ok(()))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Conditional { .. }), "{err:?}");
    assert!(
        text.contains(&format!("belongs to the graph of capture {}", first.id()))
            && text.contains(&format!("not to that of capture {}", capture.id())),
        "{text}"
    );
    // Refused before anything was captured: the capture goes on.
    capture.end().unwrap();
    first.end().unwrap();
}

#[test]
fn a_host_callback_in_a_body_is_refused_and_voids_the_capture() {
    let Some((stream, _)) = setup() else {
        return;
    };
    let mut capture = stream.begin_capture().unwrap();
    let cond = capture.condition(&stream, 0).unwrap();
    let err = capture
        .if_then(&stream, cond, |body| {
            let origin = Arc::clone(body.origin());
            body.add_callback(&origin, || {})
        })
        .unwrap_err();
    assert!(err.to_string().contains("host callback"), "{err}");
    assert!(matches!(capture.end(), Err(Error::CaptureEnded { .. })));
    assert!(!stream.is_capturing(), "the stream left the capture");
    stream.synchronize().unwrap();
}

#[test]
fn a_body_cannot_be_ended_by_hand() {
    let Some((stream, _)) = setup() else {
        return;
    };
    let mut capture = stream.begin_capture().unwrap();
    let cond = capture.condition(&stream, 0).unwrap();
    let err = capture
        .if_then(&stream, cond, |body| body.end().map(drop))
        .unwrap_err();
    assert!(err.to_string().contains("not with Capture::end"), "{err}");
}

#[test]
fn work_of_another_crate_in_a_body_is_refused() {
    let Some((stream, _)) = setup() else {
        return;
    };
    let mut capture = stream.begin_capture().unwrap();
    let cond = capture.condition(&stream, 0).unwrap();
    let err = capture
        .while_loop(&stream, cond, |body| {
            let origin = Arc::clone(body.origin());
            // SAFETY: the closure enqueues nothing.
            unsafe { body.record_external(&origin, &[], Arc::new(()), || Ok::<_, Error>(())) }
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("NCCL cannot instantiate it"),
        "{err}"
    );
}

#[test]
fn an_update_changes_the_body_arguments_and_refuses_another_body() {
    let Some((stream, kernel)) = setup() else {
        return;
    };
    let counter = Arc::new(DeviceBuffer::<u32>::new_async(&stream, 1).unwrap());
    let data = zeroed(&stream, 4);
    let mut exec = capture_loop(&stream, &kernel, &counter, &data, 2)
        .instantiate()
        .unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), vec![2; 4]);
    // Same shape, another limit (and a new condition): updated in place.
    exec.update(&capture_loop(&stream, &kernel, &counter, &data, 7))
        .unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(
        data.to_vec(&stream).unwrap(),
        vec![9; 4],
        "seven more turns"
    );

    // A body of two kernels is another topology: refused, naming where.
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &counter, 0).unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    capture
        .while_loop(&stream, more, |body| {
            let args = [
                GraphArg::write(&counter),
                GraphArg::write(&data),
                4u32.into(),
                3u32.into(),
                more.arg(),
            ];
            let origin = Arc::clone(body.origin());
            let cfg = LaunchConfig::for_num_elems(4);
            body.launch(&origin, &kernel, cfg, &args)?;
            body.launch(&origin, &kernel, cfg, &args)
        })
        .unwrap();
    let other = capture.end().unwrap();
    let err = exec.update(&other).unwrap_err();
    assert!(matches!(err, Error::GraphUpdate { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("body 0 of node 1"), "{text}");
    // Unchanged: still the seven-turn loop.
    exec.launch(&stream).unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), vec![16; 4]);
}

/// The kernels crate's `count_while_below` (`++counter`, the condition is
/// whether it is below the limit), on either driver.
fn count_while_below(stream: &Stream) -> cuda_streams_driver::Kernel {
    Module::load(stream.context(), &kernels::SOLVER)
        .unwrap()
        .function("count_while_below")
        .unwrap()
}

/// On either driver: the kernels crate's `count_while_below` in a WHILE
/// node, then two IF nodes, each on a condition of its own (a condition
/// serves one node): one whose condition is 1 runs its body once, one
/// whose condition is 0 does not run it.
#[test]
fn the_kernels_crate_loop_runs_on_either_driver() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let count = count_while_below(&stream);
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let ran = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let skipped = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &counter, 0).unwrap();
    capture.memset_u8(&stream, &ran, 0).unwrap();
    capture.memset_u8(&stream, &skipped, 0).unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    let one = LaunchConfig::for_num_elems(1);
    capture
        .while_loop(&stream, more, |body| {
            let origin = Arc::clone(body.origin());
            let args = [GraphArg::write(&counter), 1000u32.into(), more.arg()];
            body.launch(&origin, &count, one, &args)
        })
        .unwrap();
    for (default, target) in [(1, &ran), (0, &skipped)] {
        let then = capture.condition(&stream, default).unwrap();
        capture
            .if_then(&stream, then, |body| {
                let origin = Arc::clone(body.origin());
                // A limit of 5: were the node a loop, it would run 5 times.
                let args = [GraphArg::write(target), 5u32.into(), then.arg()];
                body.launch(&origin, &count, one, &args)
            })
            .unwrap();
    }
    let exec = capture.end().unwrap().instantiate().unwrap();
    for _ in 0..2 {
        exec.launch(&stream).unwrap();
        assert_eq!(counter.to_vec(&stream).unwrap(), [1000]);
        assert_eq!(ran.to_vec(&stream).unwrap(), [1], "the IF body runs once");
        assert_eq!(skipped.to_vec(&stream).unwrap(), [0], "condition 0: no run");
    }
}

/// CUDA refuses to instantiate a graph where one condition serves two
/// conditional nodes: the capture refuses the second node, after the
/// first or within its body, naming the condition.
#[test]
fn a_condition_serves_one_conditional_node() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let count = count_while_below(&stream);
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let one = LaunchConfig::for_num_elems(1);

    // A second node after the first: refused before anything is
    // captured, so the capture goes on and its graph runs.
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &counter, 0).unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    capture
        .while_loop(&stream, more, |body| {
            let origin = Arc::clone(body.origin());
            let args = [GraphArg::write(&counter), 3u32.into(), more.arg()];
            body.launch(&origin, &count, one, &args)
        })
        .unwrap();
    let err = capture.if_then(&stream, more, |_| Ok(())).unwrap_err();
    assert!(matches!(err, Error::Conditional { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "condition {:#x} already has its conditional node",
            more.raw()
        )),
        "{text}"
    );
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(counter.to_vec(&stream).unwrap(), [3]);

    // A node in the body of the node the condition serves: refused too.
    let mut capture = stream.begin_capture().unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    let err = capture
        .while_loop(&stream, more, |body| {
            let origin = Arc::clone(body.origin());
            body.if_then(&origin, more, |_| Ok(()))
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("condition {:#x} already has", more.raw())),
        "{err}"
    );
}
