//! Memory that knows capture: graph buffers allocated and freed by their
//! graph at every replay (memory nodes), their data through many replays,
//! graphs sharing graph memory through one stream, and every refusal with
//! its error. The peaks of the device's graph memory are measured in
//! `graph_memory_peaks.rs`, alone in its binary.

mod support;

use cuda_streams_driver::{
    DeviceBuffer, Error, Graph, GraphArg, GraphMemoryShare, Kernel, LaunchConfig, Stream,
};
use kernels::ELEMENTWISE;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use support::{HANG, ctx, kernel};

const N: usize = 1_000;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

/// A graph that computes `acc += 2 * a + input` through two graph buffers:
/// `first = a` (a fill), `second = input` (a copy in), `second += 2 * first`
/// (saxpy), `acc += second` (saxpy). Each replay starts from fresh scratch,
/// so `acc` after `k` replays is `k * (2a + input)` only if every replay
/// filled and read its scratch in order.
fn accumulate_graph(
    stream: &Stream,
    fill: &Kernel,
    saxpy: &Kernel,
    a: f32,
    input: &Arc<DeviceBuffer<f32>>,
    acc: &Arc<DeviceBuffer<f32>>,
) -> Graph {
    let mut capture = stream.begin_capture().unwrap();
    let first = capture.graph_buffer::<f32>(stream, N).unwrap();
    let second = capture.graph_buffer::<f32>(stream, N).unwrap();
    let n = GraphArg::from(N as u64);
    let fill_args = [n.clone(), a.into(), GraphArg::graph(&first, true)];
    capture.launch(stream, fill, cfg(), &fill_args).unwrap();
    capture.copy_to_graph(stream, &second, input).unwrap();
    let scale = [
        n.clone(),
        2.0f32.into(),
        GraphArg::graph(&first, false),
        GraphArg::graph(&second, true),
    ];
    capture.launch(stream, saxpy, cfg(), &scale).unwrap();
    let add = [
        n,
        1.0f32.into(),
        GraphArg::graph(&second, false),
        GraphArg::write(acc),
    ];
    capture.launch(stream, saxpy, cfg(), &add).unwrap();
    capture.end().unwrap()
}

fn input(ctx: &Arc<cuda_streams_driver::Context>, stream: &Stream) -> Arc<DeviceBuffer<f32>> {
    let data: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut buffer = DeviceBuffer::new(ctx, N).unwrap();
    stream.copy_from_host(&mut buffer, &data).unwrap();
    Arc::new(buffer)
}

#[test]
fn a_graph_buffer_holds_its_data_through_every_replay() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &ELEMENTWISE, "fill_f32");
    let saxpy = kernel(&ctx, &ELEMENTWISE, "saxpy");
    let input = input(&ctx, &stream);
    let mut acc = DeviceBuffer::<f32>::new(&ctx, N).unwrap();
    stream.copy_from_host(&mut acc, &vec![0.0; N]).unwrap();
    let acc = Arc::new(acc);
    let graph = accumulate_graph(&stream, &fill, &saxpy, 3.0, &input, &acc);
    // Two allocation nodes, four work nodes, two free nodes.
    assert_eq!(graph.node_count(), 8);
    assert_eq!(graph.graph_memory_bytes(), 2 * N * 4);
    let exec = graph.instantiate().unwrap();
    assert_eq!(exec.graph_memory_bytes(), 2 * N * 4);
    let replays = 7;
    for _ in 0..replays {
        exec.launch(&stream).unwrap();
    }
    let got = acc.to_vec(&stream).unwrap();
    let want: Vec<f32> = (0..N)
        .map(|i| (0..replays).fold(0.0f32, |acc, _| acc + (2.0f32 * 3.0 + i as f32)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn graphs_sharing_memory_keep_their_own_results() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &ELEMENTWISE, "fill_f32");
    let saxpy = kernel(&ctx, &ELEMENTWISE, "saxpy");
    let input = input(&ctx, &stream);
    let share = GraphMemoryShare::new(&stream);
    let mut accs = Vec::new();
    let mut execs = Vec::new();
    for a in [1.0f32, 10.0, 100.0] {
        let mut acc = DeviceBuffer::<f32>::new(&ctx, N).unwrap();
        stream.copy_from_host(&mut acc, &vec![0.0; N]).unwrap();
        let acc = Arc::new(acc);
        let graph = accumulate_graph(&stream, &fill, &saxpy, a, &input, &acc);
        execs.push(graph.instantiate_shared(&share).unwrap());
        accs.push(acc);
    }
    // Interleaved: each replay finds its scratch freshly filled, whatever
    // the graph before it left in the shared memory.
    for _ in 0..4 {
        for exec in &execs {
            exec.launch(share.stream()).unwrap();
        }
    }
    for (acc, a) in accs.iter().zip([1.0f32, 10.0, 100.0]) {
        let got = acc.to_vec(&stream).unwrap();
        let want: Vec<f32> = (0..N)
            .map(|i| (0..4).fold(0.0f32, |acc, _| acc + (2.0 * a + i as f32)))
            .collect();
        assert_eq!(got, want, "the graph with a = {a}");
    }
}

#[test]
fn launches_of_one_instance_on_two_streams_never_overlap() {
    // Both launches use the same addresses: the second must wait for the
    // first, as CUDA orders every launch of an executable graph after the
    // previous ones.
    static INSIDE: Mutex<(usize, bool)> = Mutex::new((0, false));
    static CHANGED: Condvar = Condvar::new();
    let ctx = ctx();
    let (first, second) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut capture = first.begin_capture().unwrap();
    let scratch = capture.graph_buffer::<u8>(&first, 64).unwrap();
    capture.memset_graph(&first, &scratch, 1).unwrap();
    // Holds the replay inside the graph until the test lets it go.
    capture
        .add_callback(&first, || {
            let mut inside = INSIDE.lock().unwrap();
            inside.0 += 1;
            CHANGED.notify_all();
            while !inside.1 {
                inside = CHANGED.wait(inside).unwrap();
            }
        })
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&first).unwrap();
    // The second launch from a thread of its own: a GPU driver may hold
    // `cuGraphLaunch` on the host until the first replay is done, and the
    // first replay waits for this thread below.
    let entered = std::thread::scope(|scope| {
        let launcher = scope.spawn(|| exec.launch(&second));
        let inside = INSIDE.lock().unwrap();
        let (inside, _) = CHANGED
            .wait_timeout_while(inside, HANG, |inside| inside.0 == 0)
            .unwrap();
        // The second launch must not enter while the first is inside: a
        // bounded wait for what must not happen (it would come at once if
        // it could).
        let (mut inside, _) = CHANGED
            .wait_timeout_while(inside, Duration::from_millis(200), |inside| inside.0 == 1)
            .unwrap();
        let entered = inside.0;
        // Let go first, so that a failure fails instead of hanging the
        // streams.
        inside.1 = true;
        CHANGED.notify_all();
        drop(inside);
        launcher.join().unwrap().unwrap();
        entered
    });
    assert_eq!(entered, 1, "the second launch ran inside the first");
    second.synchronize().unwrap();
    assert_eq!(INSIDE.lock().unwrap().0, 2);
}

#[test]
fn a_shared_graph_is_refused_on_another_stream() {
    let ctx = ctx();
    let (stream, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let scratch = capture.graph_buffer::<u32>(&stream, 16).unwrap();
    capture.memset_graph(&stream, &scratch, 1).unwrap();
    let exec = capture
        .end()
        .unwrap()
        .instantiate_shared(&GraphMemoryShare::new(&stream))
        .unwrap();
    assert_eq!(exec.held_to().map(|s| s.id()), Some(stream.id()));
    let err = exec.launch(&other).unwrap_err();
    assert!(matches!(err, Error::GraphMemory { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("held to stream {}", stream.id()))
            && message.contains(&format!("not on stream {}", other.id())),
        "{message}"
    );
    assert!(exec.upload(&other).is_err(), "uploads are held too");
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn a_graph_buffer_is_refused_by_another_capture() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &ELEMENTWISE, "fill_f32");
    let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, N).unwrap());
    let mut first = stream.begin_capture().unwrap();
    let scratch = first.graph_buffer::<f32>(&stream, N).unwrap();
    first.memset_graph(&stream, &scratch, 0).unwrap();
    let first_id = first.id();
    let _graph = first.end().unwrap();

    let mut second = stream.begin_capture().unwrap();
    let args = [
        GraphArg::from(N as u64),
        1.0f32.into(),
        GraphArg::graph(&scratch, true),
    ];
    let refusals = [
        second.launch(&stream, &fill, cfg(), &args).unwrap_err(),
        second.memset_graph(&stream, &scratch, 1).unwrap_err(),
        second.copy_from_graph(&stream, &out, &scratch).unwrap_err(),
        second.copy_to_graph(&stream, &scratch, &out).unwrap_err(),
    ];
    for err in refusals {
        assert!(matches!(err, Error::GraphMemory { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("belongs to the graph of capture {first_id}"))
                && message.contains(&format!("not to capture {}'s", second.id())),
            "{message}"
        );
    }
    assert_eq!(second.node_count(), 0, "nothing was recorded");
    // The capture is still usable.
    second.memset_u8(&stream, &out, 0).unwrap();
    second.end().unwrap();
}

#[test]
fn a_graph_buffer_of_the_graph_is_used_in_a_conditional_body_but_none_is_allocated_there() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let out = Arc::new(DeviceBuffer::<u8>::new(&ctx, 64).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let scratch = capture.graph_buffer::<u8>(&stream, 64).unwrap();
    capture.memset_graph(&stream, &scratch, 9).unwrap();
    let condition = match capture.condition(&stream, 1) {
        Ok(condition) => condition,
        Err(err @ Error::Conditional { .. }) => {
            eprintln!("skipped: {err}");
            return;
        }
        Err(err) => panic!("{err}"),
    };
    let top = capture.id();
    capture
        .if_then(&stream, condition, |body| {
            let origin = Arc::clone(body.origin());
            body.copy_from_graph(&origin, &out, &scratch)?;
            let err = body.graph_buffer::<u8>(&origin, 8).unwrap_err();
            assert!(matches!(err, Error::GraphMemory { .. }), "{err:?}");
            assert!(
                err.to_string()
                    .contains(&format!("allocate in the top-level capture {top}")),
                "{err}"
            );
            Ok(())
        })
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![9; 64]);
}

#[test]
fn a_graph_with_memory_nodes_has_one_instance_and_no_update() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let capture_memset = |value: u8| {
        let mut capture = stream.begin_capture().unwrap();
        let scratch = capture.graph_buffer::<u8>(&stream, 256).unwrap();
        capture.memset_graph(&stream, &scratch, value).unwrap();
        capture.end().unwrap()
    };
    let graph = capture_memset(1);
    let mut exec = graph.instantiate().unwrap();
    let err = graph.instantiate().unwrap_err();
    assert!(matches!(err, Error::GraphMemory { .. }), "{err:?}");
    assert!(err.to_string().contains("one executable instance"), "{err}");
    let err = exec.update(&capture_memset(2)).unwrap_err();
    assert!(matches!(err, Error::GraphMemory { .. }), "{err:?}");
    assert!(
        err.to_string().contains("cannot be updated in place"),
        "{err}"
    );
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    drop(exec);
    // The first instance is gone: a new one may be made.
    graph.instantiate().unwrap().launch(&stream).unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn a_zero_length_graph_buffer_is_refused() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let err = capture.graph_buffer::<f32>(&stream, 0).unwrap_err();
    assert!(matches!(err, Error::ZeroSize { len: 0, .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("a GraphBuffer of 0 element(s) would be empty"),
        "{err}"
    );
    let err = capture
        .graph_buffer::<f32>(&Stream::new(&ctx).unwrap(), 4)
        .unwrap_err();
    assert!(matches!(err, Error::CaptureIsolation { .. }), "{err:?}");
    assert_eq!(capture.node_count(), 0);
}

#[test]
fn eager_allocations_on_a_capturing_stream_stay_refused() {
    // A DeviceBuffer is readable by eager work: allocated as a memory node
    // it would name memory that exists only during replays.
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let err = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap_err();
    assert!(matches!(err, Error::StreamCapturing { .. }), "{err:?}");
    assert!(
        err.to_string().contains("enqueue through the Capture"),
        "{err}"
    );
    capture.graph_buffer::<f32>(&stream, 4).unwrap();
}
