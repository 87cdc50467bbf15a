//! CUDA graphs: a DAG of kernels on three streams captured once through the
//! operation graph, replayed ten times, every element of every buffer checked
//! against a CPU reference, and the completion callback counted per replay.
//!
//! `cargo run -p cuda-streams --example graph_replay`

use cuda_streams::driver::{Capture, GraphArg};
use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const N: usize = 10_000;
const REPLAYS: usize = 10;

type Work = Box<dyn FnOnce(&mut Capture, &Stream) -> cuda_streams::driver::Result<()>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let streams: Vec<Arc<Stream>> = (0..3)
        .map(|_| Stream::new(&ctx))
        .collect::<Result<_, _>>()?;
    let (s0, s1, s2) = (&streams[0], &streams[1], &streams[2]);
    let elementwise = Module::load(&ctx, &kernels::ELEMENTWISE)?;
    let (saxpy, scale_add) = (
        elementwise.function("saxpy")?,
        elementwise.function("scale_add")?,
    );
    let cfg = LaunchConfig::for_num_elems(N as u32);

    let x_host: Vec<f32> = (0..N).map(|i| (i % 101) as f32 * 0.25).collect();
    let upload = |values: &[f32]| DeviceBuffer::from_slice(s0, values).map(Arc::new);
    let x = upload(&x_host)?;
    let ys = [upload(&[1.0; N])?, upload(&[2.0; N])?, upload(&[3.0; N])?];
    let out = upload(&[0.0; N])?;

    // y0 += x on s0; y1 += 0.5 y0 on s1 and y2 += 2 y0 on s2, both after it;
    // out = y1 + 3 y2 on s0 after both branches, with a completion callback.
    let saxpy_op = |a: f32, x: &Arc<DeviceBuffer<f32>>, y: &Arc<DeviceBuffer<f32>>| -> Work {
        let args = [
            GraphArg::from(N as u64),
            a.into(),
            GraphArg::read(x),
            GraphArg::write(y),
        ];
        let saxpy = saxpy.clone();
        Box::new(move |c, s| c.launch(s, &saxpy, cfg, &args))
    };
    let graph = OperationGraph::for_context(&ctx);
    let replays_done = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&replays_done);
    let mut capture = graph.capture(s0)?;
    let root = capture
        .op(s0)
        .label("y0 += x")
        .run(saxpy_op(1.0, &x, &ys[0]))?;
    let left = capture
        .op(s1)
        .after(&[root])
        .label("y1 += 0.5 y0")
        .run(saxpy_op(0.5, &ys[0], &ys[1]))?;
    let right = capture
        .op(s2)
        .after(&[root])
        .label("y2 += 2 y0")
        .run(saxpy_op(2.0, &ys[0], &ys[2]))?;
    let combine_args = [
        GraphArg::from(N as u64),
        1.0f32.into(),
        GraphArg::read(&ys[1]),
        3.0f32.into(),
        GraphArg::read(&ys[2]),
        GraphArg::write(&out),
    ];
    capture
        .op(s0)
        .after(&[left, right])
        .label("out = y1 + 3 y2")
        .on_complete(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .run(|c, s| c.launch(s, &scale_add, cfg, &combine_args))?;
    let replay = capture.finish()?;
    println!(
        "captured {} operations as a graph of {} nodes on 3 streams",
        replay.operation_count(),
        replay.node_count()
    );

    replay.replay(s0, REPLAYS)?;
    s0.synchronize()?;

    // The same DAG on the CPU, ten times.
    let (mut y0, mut y1, mut y2, mut expected) = (
        vec![1.0f32; N],
        vec![2.0f32; N],
        vec![3.0f32; N],
        vec![0.0f32; N],
    );
    for _ in 0..REPLAYS {
        reference::saxpy(1.0, &x_host, &mut y0);
        reference::saxpy(0.5, &y0, &mut y1);
        reference::saxpy(2.0, &y0, &mut y2);
        for i in 0..N {
            expected[i] = reference::scale_add_element(1.0, y1[i], 3.0, y2[i]);
        }
    }
    let checks = [
        (&ys[0], &y0, "y0"),
        (&ys[1], &y1, "y1"),
        (&ys[2], &y2, "y2"),
        (&out, &expected, "out"),
    ];
    for (device, host, name) in checks {
        let got = device.to_vec(s0)?;
        if let Some(i) = (0..N).find(|&i| got[i] != host[i]) {
            return Err(format!(
                "{name}[{i}] is {} after {REPLAYS} replays, expected {}",
                got[i], host[i]
            )
            .into());
        }
    }
    let fired = replays_done.load(Ordering::SeqCst);
    if fired != REPLAYS {
        return Err(
            format!("the completion callback fired {fired} times, expected {REPLAYS}").into(),
        );
    }
    println!(
        "{REPLAYS} replays: all {} results match the CPU; the callback fired {fired} times",
        4 * N
    );
    Ok(())
}
