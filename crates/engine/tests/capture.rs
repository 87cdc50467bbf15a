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
    let mut capture = graph.capture(&stream).unwrap();
    let err = capture
        .op(&stream)
        .after(&[OperationId(7)])
        .run(|_, _| Ok(()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnknownDependency {
                dependency: OperationId(7),
                ..
            }
        ),
        "{err:?}"
    );
    // The capture is still usable.
    let first = capture.op(&stream).run(|_, _| Ok(())).unwrap();
    assert_eq!(first, OperationId(1));
    let replay = capture.finish().unwrap();
    replay.replay(&stream, 2).unwrap();
    stream.synchronize().unwrap();
}
