//! IF-ELSE and SWITCH nodes (`Capture::if_else`, `Capture::switch`): the
//! body the condition picks runs, once, at every launch, and none when a
//! SWITCH's condition is past its last case. The conditions here keep their
//! default (no kernel sets them), so the same tests run on a GPU.

mod support;

use cuda_streams_driver::{
    Capture, DeviceBuffer, Error, GraphArg, Kernel, LaunchConfig, Module, Stream,
};
use std::sync::Arc;
use support::ctx;

/// `fill_u32` of one word of `out` with `value`, captured into `body`.
fn fill(
    body: &mut Capture,
    kernel: &Kernel,
    out: &Arc<DeviceBuffer<u32>>,
    value: u32,
) -> cuda_streams_driver::Result<()> {
    let origin = Arc::clone(body.origin());
    let args = [1u64.into(), value.into(), GraphArg::write(out)];
    body.launch(&origin, kernel, LaunchConfig::for_num_elems(1), &args)
}

fn setup() -> (Arc<Stream>, Kernel) {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let kernel = Module::load(&ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .function("fill_u32")
        .unwrap();
    (stream, kernel)
}

/// `out`, set to `value` and read after a launch of the graph.
fn launched(
    stream: &Arc<Stream>,
    graph: cuda_streams_driver::Graph,
    out: &Arc<DeviceBuffer<u32>>,
) -> u32 {
    let exec = graph.instantiate().unwrap();
    exec.launch(stream).unwrap();
    let first = out.to_vec(stream).unwrap()[0];
    // Again: the condition takes its default at every launch.
    exec.launch(stream).unwrap();
    assert_eq!(out.to_vec(stream).unwrap()[0], first);
    first
}

#[test]
fn an_if_else_node_runs_then_when_the_condition_holds_and_otherwise_when_not() {
    let (stream, kernel) = setup();
    for (default, expected) in [(0, 2), (1, 1), (7, 1)] {
        let out = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 1).unwrap());
        let mut capture = stream.begin_capture().unwrap();
        capture.memset_u8(&stream, &out, 0).unwrap();
        let cond = capture.condition(&stream, default).unwrap();
        capture
            .if_else(
                &stream,
                cond,
                |body| fill(body, &kernel, &out, 1),
                |body| fill(body, &kernel, &out, 2),
            )
            .unwrap();
        let graph = capture.end().unwrap();
        assert_eq!(
            launched(&stream, graph, &out),
            expected,
            "condition {default}"
        );
    }
}

#[test]
fn a_switch_node_runs_the_case_its_condition_names_and_none_past_the_last() {
    let (stream, kernel) = setup();
    const CASES: u32 = 4;
    for default in [0, 1, 3, CASES, 100] {
        let out = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 1).unwrap());
        let mut capture = stream.begin_capture().unwrap();
        capture.memset_u8(&stream, &out, 0).unwrap();
        let cond = capture.condition(&stream, default).unwrap();
        let mut captured = Vec::new();
        capture
            .switch(&stream, cond, CASES, |case, body| {
                captured.push(case);
                fill(body, &kernel, &out, 10 + case)
            })
            .unwrap();
        assert_eq!(captured, [0, 1, 2, 3], "each case captured once, in order");
        let graph = capture.end().unwrap();
        let expected = if default < CASES { 10 + default } else { 0 };
        assert_eq!(
            launched(&stream, graph, &out),
            expected,
            "condition {default}"
        );
    }
}

#[test]
fn a_switch_of_no_cases_is_refused_and_a_failed_body_voids_the_capture() {
    let (stream, kernel) = setup();
    let out = Arc::new(DeviceBuffer::<u32>::new(stream.context(), 1).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let cond = capture.condition(&stream, 0).unwrap();
    let err = capture.switch(&stream, cond, 0, |_, _| Ok(())).unwrap_err();
    assert!(matches!(err, Error::Conditional { .. }), "{err:?}");
    assert!(err.to_string().contains("at least one case"), "{err}");
    // The condition is still free: a refused node took nothing.
    let err = capture
        .if_else(
            &stream,
            cond,
            |body| fill(body, &kernel, &out, 1),
            |body| {
                let origin = Arc::clone(body.origin());
                body.add_callback(&origin, || {})
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("host callback"), "{err}");
    assert!(matches!(capture.end(), Err(Error::CaptureEnded { .. })));
    assert!(!stream.is_capturing(), "the stream left the capture");
    stream.synchronize().unwrap();
}
