//! An operation graph captured into a CUDA graph replays to the results of
//! running it eagerly; its completion callbacks fire at every replay.

use cuda_streams_engine::driver::{
    Capture, DeviceBuffer, GraphArg, Kernel, KernelArg, LaunchConfig, Stream,
};
use cuda_streams_engine::{Error, OperationGraph, OperationId};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use test_support::{XorShift, ctx, kernel, serial};

const N: usize = 3_001;
const ROUNDS: usize = 4;

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

/// `y = a * x + y`, captured.
fn saxpy(
    k: &Kernel,
    a: f32,
    x: &Arc<DeviceBuffer<f32>>,
    y: &Arc<DeviceBuffer<f32>>,
) -> impl FnOnce(&mut Capture, &Stream) -> cuda_streams_engine::driver::Result<()> {
    let args = [
        GraphArg::from(N as u64),
        a.into(),
        GraphArg::read(x),
        GraphArg::write(y),
    ];
    move |c, s| c.launch(s, k, cfg(), &args)
}

#[test]
fn a_captured_dag_replays_to_the_eager_results() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let streams: Vec<_> = (0..3).map(|_| Stream::new(&ctx).unwrap()).collect();
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let graph = OperationGraph::for_context(&ctx);
    let mut rng = XorShift::new(3);
    let x = rng.f32s(N);
    let ys: Vec<Vec<f32>> = (0..3).map(|_| rng.f32s(N)).collect();

    // Eagerly, through the builder.
    let s = &streams;
    let dx = DeviceBuffer::from_slice(&s[0], &x).unwrap();
    let mut dy: Vec<_> = ys
        .iter()
        .map(|y| DeviceBuffer::from_slice(&s[0], y).unwrap())
        .collect();
    s[0].synchronize().unwrap();
    for _ in 0..ROUNDS {
        let [y0, y1, y2] = &mut dy[..] else {
            unreachable!()
        };
        let launch = |st: &Stream, a: f32, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>| {
            st.launch(
                &k,
                cfg(),
                &[KernelArg::from(N as u64), a.into(), x.into(), y.into()],
            )
        };
        let a = graph.op(&s[0]).run(|st| launch(st, 1.0, &dx, y0)).unwrap();
        let b = graph
            .op(&s[1])
            .after(&[a.id()])
            .run(|st| launch(st, 2.0, y0, y1))
            .unwrap();
        let c = graph
            .op(&s[2])
            .after(&[a.id()])
            .run(|st| launch(st, 3.0, y0, y2))
            .unwrap();
        let d = graph
            .op(&s[0])
            .after(&[b.id(), c.id()])
            .run(|st| launch(st, 1.0, y1, y2))
            .unwrap();
        d.wait().unwrap();
    }
    let eager: Vec<Vec<f32>> = dy.iter().map(|y| y.to_vec(&s[0]).unwrap()).collect();

    // Captured once, replayed.
    let gx = Arc::new(DeviceBuffer::from_slice(&s[0], &x).unwrap());
    let gy: Vec<_> = ys
        .iter()
        .map(|y| Arc::new(DeviceBuffer::from_slice(&s[0], y).unwrap()))
        .collect();
    s[0].synchronize().unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&fired);
    let mut capture = graph.capture(&s[0]).unwrap();
    let a = capture
        .op(&s[0])
        .label("a")
        .run(saxpy(&k, 1.0, &gx, &gy[0]))
        .unwrap();
    let b = capture
        .op(&s[1])
        .after(&[a])
        .run(saxpy(&k, 2.0, &gy[0], &gy[1]))
        .unwrap();
    let c = capture
        .op(&s[2])
        .after(&[a])
        .run(saxpy(&k, 3.0, &gy[0], &gy[2]))
        .unwrap();
    capture
        .op(&s[0])
        .after(&[b, c])
        .on_complete(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .run(saxpy(&k, 1.0, &gy[1], &gy[2]))
        .unwrap();
    let replay = capture.finish().unwrap();
    assert_eq!((replay.operation_count(), replay.node_count()), (4, 5));
    assert!(streams.iter().all(|s| !s.is_capturing()));
    assert_eq!(
        fired.load(Ordering::SeqCst),
        0,
        "nothing ran while capturing"
    );

    // Half the replays on one stream, half on another, ordered after it.
    let other = Stream::new(&ctx).unwrap();
    replay.replay(&s[0], ROUNDS / 2).unwrap();
    other.wait_stream(&s[0]).unwrap();
    replay.replay(&other, ROUNDS - ROUNDS / 2).unwrap();
    let replayed: Vec<Vec<f32>> = gy.iter().map(|y| y.to_vec(&other).unwrap()).collect();
    assert_eq!(replayed, eager);
    assert_eq!(
        fired.load(Ordering::SeqCst),
        ROUNDS,
        "the callback fires at every replay"
    );
}

#[test]
fn a_captured_operation_depends_only_on_operations_of_its_capture() {
    // Captures are process-wide state in the software driver: a call that
    // is illegal during any capture invalidates every open one.
    let _serial = serial();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let mut earlier = graph.capture(&stream).unwrap();
    let elsewhere = earlier.op(&stream).run(|_, _| Ok(())).unwrap();
    earlier.finish().unwrap();
    // An eager operation with the same number exists: a captured id cannot
    // name it (another type), and another capture's id is refused.
    let eager = graph.op(&stream).run(|_| Ok(())).unwrap();
    assert_eq!(eager.id(), OperationId(elsewhere.index()));
    let mut capture = graph.capture(&stream).unwrap();
    let err = capture
        .op(&stream)
        .after(&[elsewhere])
        .run(|_, _| Ok(()))
        .unwrap_err();
    assert!(
        matches!(err, Error::UnknownCaptureDependency { dependency, .. } if dependency == elsewhere),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "cannot depend on captured operation 1 of capture {}: it belongs to another capture",
            elsewhere.capture()
        )),
        "{message}"
    );
    // The capture is still usable, and its own ids are its own.
    let first = capture.op(&stream).run(|_, _| Ok(())).unwrap();
    assert_eq!(first.index(), 1);
    assert_ne!(first.capture(), elsewhere.capture());
    capture
        .op(&stream)
        .after(&[first])
        .run(|_, _| Ok(()))
        .unwrap();
    let replay = capture.finish().unwrap();
    replay.replay(&stream, 2).unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn a_replay_takes_new_arguments_from_a_capture_of_the_same_shape_only() {
    let _serial = serial();
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let k = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let x = Arc::new(DeviceBuffer::from_slice(&a, &vec![1.0f32; N]).unwrap());
    let y = Arc::new(DeviceBuffer::from_slice(&a, &vec![0.0f32; N]).unwrap());
    let z = Arc::new(DeviceBuffer::from_slice(&a, &vec![0.0f32; N]).unwrap());
    let graph = OperationGraph::for_context(&ctx);
    // y += s x on a, then z += y on b: two streams, one edge.
    let step = |scale: f32| {
        let mut capture = graph.capture(&a).unwrap();
        let first = capture.op(&a).run(saxpy(&k, scale, &x, &y)).unwrap();
        capture
            .op(&b)
            .after(&[first])
            .run(saxpy(&k, 1.0, &y, &z))
            .unwrap();
        capture
    };
    let mut replay = step(1.0).finish().unwrap();
    replay.replay(&a, 1).unwrap();
    assert_eq!(z.to_vec(&a).unwrap(), vec![1.0; N]); // y = 1, z = 1
    replay.update(step(3.0)).unwrap();
    assert_eq!(replay.operation_count(), 2);
    replay.replay(&a, 1).unwrap();
    assert_eq!(z.to_vec(&a).unwrap(), vec![5.0; N]); // y = 4, z = 5
    // Another shape (one operation) is refused, and the replay keeps the
    // arguments it had.
    let mut other = graph.capture(&a).unwrap();
    other.op(&a).run(saxpy(&k, 100.0, &x, &y)).unwrap();
    let err = replay.update(other).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Driver(cuda_streams_engine::driver::Error::GraphUpdate { .. })
        ),
        "{err:?}"
    );
    replay.replay(&a, 1).unwrap();
    assert_eq!(z.to_vec(&a).unwrap(), vec![12.0; N]); // y = 7, z = 12
    assert_eq!(replay.operation_count(), 2);
}
