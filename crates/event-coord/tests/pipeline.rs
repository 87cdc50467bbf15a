//! The spec's "parallel pipeline with synchronization", with real copies and
//! kernels, verified against the CPU reference.
//!
//! N preparation transfers on a memory stream (held back by a spin first, so
//! the copies land late), compute operations on several streams that depend
//! on all of them, and a final reduction depending on all computes. Only the
//! coordinator's waits order the streams: without them the computes would
//! read buffers the copies have not filled yet.

mod support;

use cuda_streams_event_coord as events;
use driver::{DeviceBuffer, KernelArg, LaunchConfig, PinnedBuffer, Stream};
use events::{EventPool, EventPriority, OperationCoordinator, OperationId, OperationType};
use kernels::reference;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use support::{XorShift, ctx, kernel, spin, streams};

const N_PREP: usize = 4;
const N_COMPUTE: usize = 3;
const LEN: usize = 4099;

#[test]
fn parallel_pipeline_with_synchronization() {
    let ctx = ctx();
    let memory_stream = Stream::new(&ctx).unwrap();
    let compute_streams = streams(&ctx, N_COMPUTE);
    let reduction_stream = Stream::new(&ctx).unwrap();
    let saxpy = kernel(&ctx, &kernels::ELEMENTWISE, "saxpy");
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let checksum = kernel(&ctx, &kernels::REDUCE, "checksum");
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let cfg = LaunchConfig::for_num_elems(LEN as u32);
    let n = LEN as u64;

    let event_pool = Arc::new(EventPool::new(&ctx, 16, 0).unwrap());
    let coordinator = OperationCoordinator::new(event_pool);
    let mut rng = XorShift::new(0xE7E27);
    let host: Vec<Vec<f32>> = (0..N_PREP).map(|_| rng.f32s(LEN)).collect();
    let scales: Vec<f32> = (0..N_COMPUTE).map(|_| rng.next_f32()).collect();

    // Data preparation phase.
    let prep_ops: Vec<OperationId> = (0..N_PREP)
        .map(|i| {
            coordinator.register_operation(
                OperationType::MemoryTransfer,
                EventPriority::High,
                &memory_stream,
                vec![],
                format!("Prepare data {i}"),
            )
        })
        .collect::<Result<_, _>>()
        .unwrap();
    // Parallel computation phase: each depends on every preparation.
    let compute_ops: Vec<OperationId> = compute_streams
        .iter()
        .enumerate()
        .map(|(i, stream)| {
            coordinator.register_operation(
                OperationType::Kernel,
                EventPriority::Normal,
                stream,
                prep_ops.clone(),
                format!("Compute {i}"),
            )
        })
        .collect::<Result<_, _>>()
        .unwrap();
    // Final reduction.
    let reduction = coordinator
        .register_operation(
            OperationType::AllReduce,
            EventPriority::Critical,
            &reduction_stream,
            compute_ops.clone(),
            "Final reduction".to_string(),
        )
        .unwrap();
    assert_eq!(
        coordinator.ready_operations(),
        prep_ops,
        "only the preparations are ready"
    );
    let finished = Arc::new(AtomicU32::new(0));
    let f = Arc::clone(&finished);
    coordinator
        .add_completion_callback(reduction, move || {
            f.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();

    // Allocate first, then hold the memory stream, so the copies land late.
    let pinned: Vec<PinnedBuffer<f32>> = host
        .iter()
        .map(|h| PinnedBuffer::from_slice(&ctx, h).unwrap())
        .collect();
    let mut inputs: Vec<DeviceBuffer<f32>> = (0..N_PREP)
        .map(|_| DeviceBuffer::new_async(&memory_stream, LEN).unwrap())
        .collect();
    spin(&memory_stream, &spin_kernel, Duration::from_millis(50));
    for ((&id, input), pinned) in prep_ops.iter().zip(&mut inputs).zip(&pinned) {
        coordinator.begin_operation(id, &memory_stream).unwrap();
        memory_stream.copy_from_host_async(input, pinned).unwrap();
        coordinator.complete_operation(id).unwrap();
    }

    let mut outputs: Vec<DeviceBuffer<f32>> = Vec::new();
    for ((&id, stream), &a) in compute_ops.iter().zip(&compute_streams).zip(&scales) {
        coordinator.begin_operation(id, stream).unwrap();
        let mut out = DeviceBuffer::<f32>::new_async(stream, LEN).unwrap();
        stream
            .launch(&fill, cfg, &[n.into(), 0f32.into(), (&mut out).into()])
            .unwrap();
        for input in &inputs {
            let args = [
                KernelArg::from(n),
                a.into(),
                input.into(),
                (&mut out).into(),
            ];
            stream.launch(&saxpy, cfg, &args).unwrap();
        }
        coordinator.complete_operation(id).unwrap();
        outputs.push(out);
    }

    coordinator
        .begin_operation(reduction, &reduction_stream)
        .unwrap();
    let mut total = DeviceBuffer::<f32>::new_async(&reduction_stream, LEN).unwrap();
    reduction_stream
        .launch(&fill, cfg, &[n.into(), 0f32.into(), (&mut total).into()])
        .unwrap();
    for out in &outputs {
        let args = [
            KernelArg::from(n),
            1f32.into(),
            out.into(),
            (&mut total).into(),
        ];
        reduction_stream.launch(&saxpy, cfg, &args).unwrap();
    }
    let mut sum = DeviceBuffer::<u64>::zeroed_async(&reduction_stream, 1).unwrap();
    // checksum reads the f32 bits as u32: a reinterpretation the checked
    // launch refuses (its signature says `const u32*`), so unchecked here.
    // SAFETY: `total` holds `n` 4-byte values (any bits are a valid u32) and
    // `sum` one u64, as checksum(n, data, out) touches; both stay allocated
    // until the kernel has run (tracked as kernel arguments).
    unsafe {
        reduction_stream.launch_unchecked(
            &checksum,
            cfg,
            &[n.into(), (&total).into(), (&mut sum).into()],
        )
    }
    .unwrap();
    coordinator.complete_operation(reduction).unwrap();

    // The CPU reference, in the same order of operations.
    let mut expected_outputs = Vec::new();
    for &a in &scales {
        let mut out = vec![0f32; LEN];
        for h in &host {
            reference::saxpy(a, h, &mut out);
        }
        expected_outputs.push(out);
    }
    let mut expected_total = vec![0f32; LEN];
    for out in &expected_outputs {
        reference::saxpy(1.0, out, &mut expected_total);
    }
    let bits: Vec<u32> = expected_total.iter().map(|v| v.to_bits()).collect();

    let got_total = total.to_vec(&reduction_stream).unwrap();
    assert_eq!(
        got_total.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        bits,
        "the reduction saw every compute, which saw every copy"
    );
    assert_eq!(
        sum.to_vec(&reduction_stream).unwrap(),
        vec![reference::checksum(&bits)]
    );
    reduction_stream.synchronize().unwrap();
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    let m = coordinator.metrics();
    assert_eq!((m.total_operations, m.completed_operations), (8, 8));
    assert!(coordinator.detect_deadlocks().is_empty());
}
