//! CUDA graphs through the safe layer: capture (across fork/join), replay,
//! update in place, what a capture keeps alive, and the calls refused during
//! a capture with the capture still usable after.

mod support;

use cuda_streams_driver::{
    Capture, DeviceBuffer, Error, GraphArg, Kernel, KernelArg, LaunchConfig, PinnedBuffer, Stream,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use support::{GATE_LIMIT, Gate, XorShift, ctx, kernel, serial};

const N: usize = 4_099;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

/// `y = a * x + y`, captured.
fn saxpy(
    capture: &mut Capture,
    stream: &Stream,
    k: &Kernel,
    a: f32,
    x: &Arc<DeviceBuffer<f32>>,
    y: &Arc<DeviceBuffer<f32>>,
) {
    let args = [
        GraphArg::from(N as u64),
        a.into(),
        GraphArg::read(x),
        GraphArg::write(y),
    ];
    capture.launch(stream, k, cfg(), &args).unwrap();
}

/// `y = a * x + y`, eagerly.
fn saxpy_eager(
    stream: &Stream,
    k: &Kernel,
    a: f32,
    x: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
) {
    let args = [KernelArg::from(N as u64), a.into(), x.into(), y.into()];
    stream.launch(k, cfg(), &args).unwrap();
}

#[test]
fn replayed_results_equal_eager_results() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let mut rng = XorShift::new(16);
    let (x, y) = (rng.f32s(N), rng.f32s(N));

    let dx = DeviceBuffer::from_slice(&stream, &x).unwrap();
    let mut dy = DeviceBuffer::from_slice(&stream, &y).unwrap();
    let mut dz = DeviceBuffer::from_slice(&stream, &x).unwrap();
    for _ in 0..5 {
        saxpy_eager(&stream, &k, 1.5, &dx, &mut dy);
        saxpy_eager(&stream, &k, -0.25, &dy, &mut dz);
    }
    let (eager_y, eager_z) = (dy.to_vec(&stream).unwrap(), dz.to_vec(&stream).unwrap());

    let gx = Arc::new(DeviceBuffer::from_slice(&stream, &x).unwrap());
    let gy = Arc::new(DeviceBuffer::from_slice(&stream, &y).unwrap());
    let gz = Arc::new(DeviceBuffer::from_slice(&stream, &x).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    saxpy(&mut capture, &stream, &k, 1.5, &gx, &gy);
    saxpy(&mut capture, &stream, &k, -0.25, &gy, &gz);
    assert_eq!(capture.node_count(), 2);
    let graph = capture.end().unwrap();
    assert!(!stream.is_capturing());
    assert_eq!(gy.to_vec(&stream).unwrap(), y, "capturing ran nothing");
    let exec = graph.instantiate().unwrap();
    exec.upload(&stream).unwrap();
    for _ in 0..5 {
        exec.launch(&stream).unwrap();
    }
    assert_eq!(gy.to_vec(&stream).unwrap(), eager_y);
    assert_eq!(gz.to_vec(&stream).unwrap(), eager_z);
}

#[test]
fn a_graph_replays_while_another_stream_is_held() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let (stream, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let args = [
        GraphArg::from(N as u64),
        7.0f32.into(),
        GraphArg::write(&out),
    ];
    capture.launch(&stream, &fill, cfg(), &args).unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();

    let mut busy = DeviceBuffer::<f32>::new(&ctx, N).unwrap();
    let gate = Gate::close_within(&other, GATE_LIMIT);
    test_support::fill(&other, &fill, 3.0, &mut busy);
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![7.0; N]);
    if gate.still_held() {
        assert!(!other.query().unwrap(), "the other stream is still held");
    }
    gate.open();
    assert_eq!(busy.to_vec(&other).unwrap(), vec![3.0; N]);
}

#[test]
fn an_update_changes_a_kernel_argument_without_instantiating_again() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let capture_fill = |value: f32, times: usize| {
        let mut capture = stream.begin_capture().unwrap();
        for _ in 0..times {
            let args = [
                GraphArg::from(N as u64),
                value.into(),
                GraphArg::write(&out),
            ];
            capture.launch(&stream, &fill, cfg(), &args).unwrap();
        }
        capture.end().unwrap()
    };
    let mut exec = capture_fill(1.0, 1).instantiate().unwrap();
    let raw = exec.as_raw();
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![1.0; N]);

    exec.update(&capture_fill(2.0, 1)).unwrap();
    assert_eq!(exec.as_raw(), raw, "the same executable graph");
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![2.0; N]);

    let err = exec.update(&capture_fill(3.0, 2)).unwrap_err();
    assert!(matches!(err, Error::GraphUpdate { .. }), "{err:?}");
    assert!(
        err.to_string().contains("cannot be updated in place"),
        "{err}"
    );
    exec.launch(&stream).unwrap();
    assert_eq!(
        out.to_vec(&stream).unwrap(),
        vec![2.0; N],
        "unchanged by the refusal"
    );
}

#[test]
fn illegal_calls_during_capture_get_clear_errors_and_the_capture_still_works() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let (stream, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut eager = DeviceBuffer::<f32>::new(&ctx, N).unwrap();
    let host = PinnedBuffer::<f32>::new(&ctx, N).unwrap();

    let mut capture = stream.begin_capture().unwrap();
    let refused = |result: Result<(), Error>, says: &str| {
        let err = result.unwrap_err();
        assert!(err.to_string().contains(says), "{says}: {err}");
    };
    refused(stream.synchronize(), "Stream::synchronize on stream");
    refused(stream.query().map(drop), "Stream::query");
    refused(ctx.synchronize(), "Context::synchronize is not allowed");
    let args = [
        KernelArg::from(N as u64),
        1.0f32.into(),
        (&mut eager).into(),
    ];
    refused(
        stream.launch(&fill, cfg(), &args),
        "while the stream is being captured",
    );
    refused(
        stream.copy_from_host(&mut eager, &vec![0.0; N]),
        "while the stream is being captured",
    );
    refused(
        stream.copy_from_host_async(&mut eager, &host),
        "while the stream is being captured",
    );
    refused(stream.add_callback(|| {}), "Stream::add_callback");
    refused(stream.begin_capture().map(drop), "Stream::begin_capture");
    refused(
        DeviceBuffer::<f32>::new_async(&stream, 4).map(drop),
        "new_async",
    );
    refused(
        other.wait_stream(&stream),
        "bring it into the capture with Capture::fork",
    );
    refused(stream.wait_stream(&other), "recorded outside the capture");
    let args = [
        GraphArg::from(N as u64),
        5.0f32.into(),
        GraphArg::write(&out),
    ];
    refused(
        capture.launch(&other, &fill, cfg(), &args),
        "does not take part in the capture",
    );
    // Other streams work as usual meanwhile.
    other
        .launch(
            &fill,
            cfg(),
            &[
                KernelArg::from(N as u64),
                1.0f32.into(),
                (&mut eager).into(),
            ],
        )
        .unwrap();
    other.synchronize().unwrap();

    capture.launch(&stream, &fill, cfg(), &args).unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    stream.synchronize().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![5.0; N]);
    assert_eq!(eager.to_vec(&other).unwrap(), vec![1.0; N]);
    refused(capture.end().map(drop), "has already ended");
}

#[test]
fn work_forked_to_other_streams_is_captured_and_must_be_joined() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let origin = Stream::new(&ctx).unwrap();
    let branches = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let mut rng = XorShift::new(61);
    let x = rng.f32s(N);
    let dx = Arc::new(DeviceBuffer::from_slice(&origin, &x).unwrap());
    let ys = [
        Arc::new(DeviceBuffer::from_slice(&origin, &vec![1.0; N]).unwrap()),
        Arc::new(DeviceBuffer::from_slice(&origin, &vec![2.0; N]).unwrap()),
    ];
    let total = Arc::new(DeviceBuffer::from_slice(&origin, &vec![0.0; N]).unwrap());

    let mut capture = origin.begin_capture().unwrap();
    capture
        .fork(&origin, &[&branches[0], &branches[1]])
        .unwrap();
    assert!(branches.iter().all(|b| b.is_capturing()));
    for (branch, y) in branches.iter().zip(&ys) {
        saxpy(&mut capture, branch, &k, 2.0, &dx, y);
    }
    capture.join(&origin, &[&branches[0]]).unwrap();
    let err = capture.end().unwrap_err();
    assert!(
        matches!(err, Error::CaptureUnjoined { stream, .. } if stream == branches[1].id()),
        "{err:?}"
    );
    // Still open and usable: join the other branch, then sum on the origin.
    capture.join(&origin, &[&branches[1]]).unwrap();
    saxpy(&mut capture, &origin, &k, 1.0, &ys[0], &total);
    saxpy(&mut capture, &origin, &k, 1.0, &ys[1], &total);
    let graph = capture.end().unwrap();
    assert_eq!(graph.node_count(), 4);
    assert!(!origin.is_capturing() && branches.iter().all(|b| !b.is_capturing()));

    let exec = graph.instantiate().unwrap();
    let replay = Stream::new(&ctx).unwrap();
    exec.launch(&replay).unwrap();
    exec.launch(&replay).unwrap();
    let (mut y0, mut y1, mut t) = (vec![1.0f32; N], vec![2.0f32; N], vec![0.0f32; N]);
    for _ in 0..2 {
        for i in 0..N {
            y0[i] = 2.0f32.mul_add(x[i], y0[i]);
            y1[i] = 2.0f32.mul_add(x[i], y1[i]);
            t[i] = 1.0f32.mul_add(y0[i], t[i]);
            t[i] = 1.0f32.mul_add(y1[i], t[i]);
        }
    }
    assert_eq!(ys[0].to_vec(&replay).unwrap(), y0);
    assert_eq!(ys[1].to_vec(&replay).unwrap(), y1);
    assert_eq!(total.to_vec(&replay).unwrap(), t);
}

#[test]
fn a_graph_keeps_its_buffers_and_callbacks_alive_while_an_instance_exists() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let x = Arc::new(DeviceBuffer::from_slice(&stream, &vec![1.0f32; N]).unwrap());
    let y = Arc::new(DeviceBuffer::from_slice(&stream, &vec![0.0f32; N]).unwrap());
    let fired = Arc::new(AtomicUsize::new(0));
    let mut capture = stream.begin_capture().unwrap();
    saxpy(&mut capture, &stream, &k, 3.0, &x, &y);
    let counter = Arc::clone(&fired);
    capture
        .add_callback(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let graph = capture.end().unwrap();
    let exec = graph.instantiate().unwrap();
    // Only the executable graph holds the input now (the soft driver would
    // fault on freed memory; compute-sanitizer checks the GPU).
    let weak_x = Arc::downgrade(&x);
    drop((x, graph));
    assert!(weak_x.upgrade().is_some(), "kept by the executable graph");
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
    }
    assert_eq!(y.to_vec(&stream).unwrap(), vec![9.0; N]);
    assert_eq!(
        fired.load(Ordering::SeqCst),
        3,
        "the callback fires at every replay"
    );
    assert_eq!(stream.metrics().callback_panics, 0);

    drop(exec);
    assert!(
        weak_x.upgrade().is_none(),
        "released with the last instance"
    );
    // The callbacks go once the stream has passed the last replay.
    stream.synchronize().unwrap();
    let released = Stream::new(&ctx).unwrap();
    released.wait_stream(&stream).unwrap();
    released.synchronize().unwrap();
    assert_eq!(Arc::strong_count(&fired), 1, "the callback was released");
}

#[test]
fn a_panicking_graph_callback_is_caught_and_counted_at_every_replay() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    capture
        .add_callback(&stream, || panic!("graph callback"))
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    exec.launch(&stream).unwrap();
    // Both replays' panics, reported once, by the synchronize.
    let err = stream.synchronize().unwrap_err();
    assert!(
        matches!(err, Error::CallbackPanicked { count: 2, .. }),
        "{err:?}"
    );
    stream.check_callback_panics().unwrap();
    assert_eq!(stream.metrics().callback_panics, 2);
}

#[test]
fn a_dropped_capture_leaves_the_stream_usable() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let args = [
        GraphArg::from(N as u64),
        4.0f32.into(),
        GraphArg::write(&out),
    ];
    capture.launch(&stream, &fill, cfg(), &args).unwrap();
    drop((capture, args));
    assert!(!stream.is_capturing());
    stream.synchronize().unwrap();
    let mut eager = DeviceBuffer::<f32>::new(&ctx, N).unwrap();
    test_support::fill(&stream, &fill, 6.0, &mut eager);
    assert_eq!(eager.to_vec(&stream).unwrap(), vec![6.0; N]);
    assert_eq!(
        Arc::strong_count(&out),
        1,
        "the discarded graph let go of the buffer"
    );
}

#[test]
fn a_captured_upload_compute_download_step_replays_through_pinned_memory() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let (up, compute, down) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let mut rng = XorShift::new(8);
    let x = rng.f32s(N);
    let host_in = Arc::new(PinnedBuffer::from_slice(&ctx, &x).unwrap());
    let host_out = Arc::new(PinnedBuffer::<f32>::new(&ctx, N).unwrap());
    let dev_in = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let dev_out = Arc::new(DeviceBuffer::from_slice(&up, &vec![1.0; N]).unwrap());

    let mut capture = up.begin_capture().unwrap();
    capture.fork(&up, &[&compute, &down]).unwrap();
    capture.copy_from_host(&up, &dev_in, &host_in).unwrap();
    capture.join(&compute, &[&up]).unwrap();
    saxpy(&mut capture, &compute, &k, 2.0, &dev_in, &dev_out);
    capture.join(&down, &[&compute]).unwrap();
    // SAFETY: no slice of `host_out` is borrowed while a replay is launched.
    unsafe { capture.copy_to_host_unchecked(&down, &host_out, &dev_out) }.unwrap();
    capture.join(&up, &[&compute, &down]).unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();

    let mut expected = vec![1.0f32; N];
    for round in 1..=3 {
        exec.launch(&up).unwrap();
        kernels::reference::saxpy(2.0, &x, &mut expected);
        // Host access waits for the replay that writes the buffer.
        assert_eq!(host_out.as_slice().unwrap(), &expected[..], "round {round}");
    }
}

#[test]
fn graph_private_memory_is_not_reused_while_the_graph_lives() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let x = Arc::new(DeviceBuffer::from_slice(&stream, &vec![1.0f32; N]).unwrap());
    let out = Arc::new(DeviceBuffer::from_slice(&stream, &vec![0.0f32; N]).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    // An intermediate only the graph uses: zeroed, y = 2x into it, out += y.
    let scratch = capture.alloc::<f32>(N).unwrap();
    capture.memset_u8(&stream, &scratch, 0).unwrap();
    saxpy(&mut capture, &stream, &k, 2.0, &x, &scratch);
    saxpy(&mut capture, &stream, &k, 1.0, &scratch, &out);
    let graph = capture.end().unwrap();
    let exec = graph.instantiate().unwrap();
    let (address, weak) = (scratch.as_device_ptr(), Arc::downgrade(&scratch));
    drop((scratch, graph));

    for round in 1..=3u32 {
        // Memory of the same size, from both kinds of allocation, never
        // lands on the graph's.
        let others: Vec<DeviceBuffer<f32>> = (0..8)
            .flat_map(|_| {
                [
                    DeviceBuffer::new(&ctx, N).unwrap(),
                    DeviceBuffer::new_async(&stream, N).unwrap(),
                ]
            })
            .collect();
        assert!(
            others.iter().all(|b| b.as_device_ptr() != address),
            "round {round}"
        );
        drop(others);
        exec.launch(&stream).unwrap();
        assert_eq!(out.to_vec(&stream).unwrap(), vec![2.0 * round as f32; N]);
    }
    assert!(weak.upgrade().is_some(), "kept while an instance lives");
    drop(exec);
    assert!(weak.upgrade().is_none(), "freed with the last instance");
}

#[test]
fn a_graphs_own_host_buffers_are_reached_only_when_no_replay_can_touch_them() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let dev_in = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let dev_out = Arc::new(DeviceBuffer::from_slice(&stream, &vec![0.0f32; N]).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let input = capture
        .upload_owned(
            &stream,
            &dev_in,
            PinnedBuffer::from_slice(&ctx, &vec![1.0f32; N]).unwrap(),
        )
        .unwrap();
    saxpy(&mut capture, &stream, &k, 1.0, &dev_in, &dev_out);
    let output = capture
        .download_owned(&stream, PinnedBuffer::new(&ctx, N).unwrap(), &dev_out)
        .unwrap();
    let graph = capture.end().unwrap();
    let (mut exec, other) = (graph.instantiate().unwrap(), graph.instantiate().unwrap());
    drop(graph);
    let err = exec.host(&output).unwrap_err();
    assert!(matches!(err, Error::GraphHostAccess { .. }), "{err:?}");
    assert!(err.to_string().contains("another instance"), "{err}");
    drop(other);

    let mut expected = 0.0;
    for value in [1.0f32, 2.5, -4.0] {
        exec.host(&input).unwrap().fill(value);
        exec.launch(&stream).unwrap();
        expected += value;
        assert_eq!(exec.host(&output).unwrap(), &vec![expected; N][..]);
    }

    // A slot of another capture is refused, naming both.
    let mut capture = stream.begin_capture().unwrap();
    let foreign = capture
        .download_owned(
            &stream,
            PinnedBuffer::<f32>::new(&ctx, N).unwrap(),
            &dev_out,
        )
        .unwrap();
    drop(capture.end().unwrap());
    let err = exec.host(&foreign).unwrap_err();
    assert!(err.to_string().contains("belongs to capture"), "{err}");
}

#[test]
fn capture_memory_filled_from_outside_the_graph_is_read_by_every_replay() {
    let _serial = serial();
    let ctx = ctx();
    let (origin, branch) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let x: Vec<f32> = XorShift::new(7)
        .u32s(N)
        .iter()
        .map(|&v| (v % 100) as f32)
        .collect();
    let y = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let copy = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut capture = origin.begin_capture().unwrap();
    let weights = capture.alloc_from(&x).unwrap();
    let empty: &[f32] = &[];
    let err = capture.alloc_from(empty).unwrap_err();
    assert!(matches!(err, Error::ZeroSize { len: 0, .. }), "{err}");
    assert_eq!(capture.node_count(), 0, "filling is no node of the graph");
    capture.memset_u8(&origin, &y, 0).unwrap();
    capture.fork(&origin, &[&branch]).unwrap();
    // Read on the origin and, at the same time, on a forked branch.
    saxpy(&mut capture, &origin, &k, 2.0, &weights, &y);
    capture.copy(&branch, &copy, &weights).unwrap();
    capture.join(&origin, &[&branch]).unwrap();
    let graph = capture.end().unwrap();
    drop(weights);
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        exec.launch(&origin).unwrap();
    }
    let twice: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
    assert_eq!(
        y.to_vec(&origin).unwrap(),
        twice,
        "zeroed, then y += 2x, per replay"
    );
    assert_eq!(copy.to_vec(&origin).unwrap(), x);
}

#[test]
fn a_replay_reads_and_writes_only_the_ranges_it_was_given() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let source: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let x = Arc::new(DeviceBuffer::from_slice(&stream, &source).unwrap());
    let y = Arc::new(DeviceBuffer::from_slice(&stream, &[1.0f32; 16]).unwrap());
    let four = LaunchConfig::for_num_elems(4);
    let mut capture = stream.begin_capture().unwrap();
    // y[4..8] = 7; then y[8..12] += 2 * x[12..16].
    let args = [
        GraphArg::from(4u64),
        7.0f32.into(),
        GraphArg::write_range(&y, 4..8).unwrap(),
    ];
    capture.launch(&stream, &fill, four, &args).unwrap();
    let args = [
        GraphArg::from(4u64),
        2.0f32.into(),
        GraphArg::read_range(&x, 12..).unwrap(),
        GraphArg::write_range(&y, 8..12).unwrap(),
    ];
    capture.launch(&stream, &k, four, &args).unwrap();
    // A range that does not fit is refused with the capture still usable.
    let err = GraphArg::write_range(&y, 14..18).expect_err("refused");
    assert!(err.to_string().contains("slice 14..18"), "{err}");
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    let mut expected = vec![1.0f32; 16];
    expected[4..8].fill(7.0);
    for i in 8..12 {
        expected[i] = 1.0 + 2.0 * source[i + 4];
    }
    assert_eq!(y.to_vec(&stream).unwrap(), expected);
    // A second replay adds again, only there.
    exec.launch(&stream).unwrap();
    for i in 8..12 {
        expected[i] += 2.0 * source[i + 4];
    }
    assert_eq!(y.to_vec(&stream).unwrap(), expected);
    assert_eq!(x.to_vec(&stream).unwrap(), source);
}
