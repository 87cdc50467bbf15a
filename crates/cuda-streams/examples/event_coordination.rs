//! Event coordination: a small DAG of real work across three streams (two
//! uploads, a kernel on each, a join that adds the results), ordered only by
//! the coordinator's events; then a cross-stream barrier and the async waiter.
//!
//! `cargo run -p cuda-streams --example event_coordination`

use cuda_streams::events::OperationCoordinator; // the seed's name for OperationGraph
use cuda_streams::kernels;
use cuda_streams::prelude::*;
use std::sync::{Arc, mpsc};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let streams: Vec<Arc<Stream>> = (0..3)
        .map(|_| Stream::new(&ctx))
        .collect::<Result<_, _>>()?;
    let (s0, s1, s2) = (&streams[0], &streams[1], &streams[2]);
    let events = EventPool::builder(&ctx).plain(16).build()?;
    let coordinator = OperationCoordinator::new(Arc::clone(&events));

    let elementwise = Module::load(&ctx, &kernels::ELEMENTWISE)?;
    let saxpy = elementwise.function("saxpy")?;
    let scale_add = elementwise.function("scale_add")?;
    let n = 1 << 16;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let xs: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    let ys: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.5).collect();
    let (mut x, mut y, mut out) = (
        DeviceBuffer::<f32>::new(&ctx, n)?,
        DeviceBuffer::<f32>::new(&ctx, n)?,
        DeviceBuffer::<f32>::new(&ctx, n)?,
    );
    let (host_x, host_y) = (
        PinnedBuffer::from_slice(&ctx, &xs)?,
        PinnedBuffer::from_slice(&ctx, &ys)?,
    );

    // The plan: upload x on s0, upload y on s1; y += 2x on s1 (needs both
    // uploads); out = 1.5 * x + 0.5 * y on s2 (needs the saxpy).
    let op = |ty, stream: &Arc<Stream>, deps, name: &str| {
        coordinator.register_operation(ty, EventPriority::Normal, stream, deps, name)
    };
    let up_x = op(OperationType::MemoryTransfer, s0, vec![], "upload x")?;
    let up_y = op(OperationType::MemoryTransfer, s1, vec![], "upload y")?;
    let axpy = op(OperationType::Kernel, s1, vec![up_x, up_y], "y += 2x")?;
    let join = op(
        OperationType::Kernel,
        s2,
        vec![axpy, up_x],
        "out = 1.5x + 0.5y",
    )?;
    println!("ready first: {:?}", coordinator.ready_operations());
    assert!(coordinator.detect_deadlocks().is_empty());

    let (tx, rx) = mpsc::channel();
    coordinator.add_completion_callback(join, move || tx.send("join done").unwrap())?;

    coordinator.begin_operation(up_x, s0)?;
    s0.copy_from_host_async(&mut x, &host_x)?;
    coordinator.complete_operation(up_x)?;
    coordinator.begin_operation(up_y, s1)?;
    s1.copy_from_host_async(&mut y, &host_y)?;
    coordinator.complete_operation(up_y)?;
    coordinator.begin_operation(axpy, s1)?; // s1 waits for s0's upload on the GPU
    s1.launch(
        &saxpy,
        cfg,
        &[
            (n as u64).into(),
            2.0f32.into(),
            (&x).into(),
            (&mut y).into(),
        ],
    )?;
    coordinator.complete_operation(axpy)?;
    coordinator.begin_operation(join, s2)?; // s2 waits for s1's kernel
    let args = [
        (n as u64).into(),
        1.5f32.into(),
        (&x).into(),
        0.5f32.into(),
        (&y).into(),
        (&mut out).into(),
    ];
    s2.launch(&scale_add, cfg, &args)?;
    coordinator.complete_operation(join)?;
    println!("callback: {}", rx.recv()?); // fired when the GPU got there

    let result = out.to_vec(s2)?;
    let mut expected = ys.clone();
    kernels::reference::saxpy(2.0, &xs, &mut expected);
    let mut joined = vec![0.0; n];
    kernels::reference::scale_add(1.5, &xs, 0.5, &expected, &mut joined);
    assert_eq!(
        result, joined,
        "the DAG's result must match the CPU reference"
    );
    let m = coordinator.metrics();
    println!(
        "{} operations, {} completed, result of {n} elements verified",
        m.total_operations, m.completed_operations
    );

    // Every stream reaches the barrier before the host goes on.
    let barrier = CrossStreamBarrier::new(streams.clone(), Arc::clone(&events))?;
    println!("barrier over 3 streams took {:?}", barrier.synchronize()?);

    // Callbacks when events complete, on the waiter's own thread.
    let waiter = AsyncEventWaiter::new();
    let (tx, rx) = mpsc::channel();
    for (i, stream) in streams.iter().enumerate() {
        let tx = tx.clone();
        waiter.wait_async(stream.record_event()?, move || tx.send(i).unwrap());
    }
    let mut fired: Vec<usize> = (0..3).map(|_| rx.recv()).collect::<Result<_, _>>()?;
    fired.sort();
    assert_eq!(fired, [0, 1, 2]);
    println!("async waiter fired for streams {fired:?}");
    Ok(())
}
