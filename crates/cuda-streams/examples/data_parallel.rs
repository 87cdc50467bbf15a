//! Data parallelism over two GPUs: each device computes its gradients, the
//! gradients are all-reduced (NCCL on GPUs, the software NCCL otherwise) on a
//! communication stream per device while the compute streams go on with the
//! next, independent step, then every device applies the summed gradients.
//! The collectives are operations of one operation graph, so the update
//! waits for them like for any other operation. Every element is checked.
//!
//! `cargo run -p cuda-streams --example data_parallel` (the software driver
//! has two devices by default; `CUDA_STREAMS_SOFT_DEVICES=N` changes that).

use cuda_streams::collectives::{Communicator, Group, ReduceOp};
use cuda_streams::kernels::typed::Elementwise;
use cuda_streams::prelude::*;
use std::sync::Arc;

const N: usize = 1 << 16;
const STEPS: usize = 3;
const RATE: f32 = 0.1;

/// One device's share: its streams, kernels and buffers.
struct Replica {
    compute: Arc<Stream>,
    comms: Arc<Stream>,
    kernels: Elementwise,
    inputs: DeviceBuffer<f32>,
    weights: DeviceBuffer<f32>,
    grads: DeviceBuffer<f32>,
    /// The "next step" computed while the all-reduce runs.
    lookahead: DeviceBuffer<f32>,
}

/// What rank `rank`'s inputs hold at element `i`.
fn input(rank: usize, i: usize) -> f32 {
    (i % 97) as f32 * (rank as f32 + 1.0)
}

fn main() -> Result<(), cuda_streams::Error> {
    let contexts = Context::all()?;
    if contexts.len() < 2 {
        println!(
            "data_parallel needs two devices; the driver reports {}",
            contexts.len()
        );
        return Ok(());
    }
    let contexts = &contexts[..2];
    let ranks = Communicator::all_devices(contexts)?;
    // One graph for both devices: its operations may sit on either.
    let graph = OperationGraph::for_context(&contexts[0]);
    let mut replicas = contexts
        .iter()
        .enumerate()
        .map(|(rank, ctx)| {
            let compute = Stream::new(ctx)?;
            let host: Vec<f32> = (0..N).map(|i| input(rank, i)).collect();
            Ok(Replica {
                comms: Stream::new(ctx)?,
                kernels: Elementwise::load(ctx)?,
                inputs: DeviceBuffer::from_slice(&compute, &host)?,
                weights: DeviceBuffer::from_slice(&compute, &vec![1.0f32; N])?,
                grads: DeviceBuffer::new_async(&compute, N)?,
                lookahead: DeviceBuffer::new_async(&compute, N)?,
                compute,
            })
        })
        .collect::<Result<Vec<_>, cuda_streams::Error>>()?;

    for step in 0..STEPS {
        // Each device's gradients (0.5 * its inputs, to keep the reference
        // simple), on its communication stream after its compute so far.
        let mut computed = Vec::new();
        for r in &mut replicas {
            let (k, inputs) = (&r.kernels, &r.inputs);
            let grads = &mut r.grads;
            computed.push(
                graph
                    .op(&r.comms)
                    .label("gradients")
                    .run(|s| {
                        s.wait_stream(&r.compute)?;
                        k.scale_add(s, 0.5, inputs, 0.0, inputs, grads)
                    })?
                    .id(),
            );
        }
        // The all-reduce on the communication streams...
        let mut group = Group::new();
        for (rank, r) in ranks.iter().zip(&mut replicas) {
            group.all_reduce_in_place(rank, &r.comms, &mut r.grads, ReduceOp::Sum)?;
        }
        let reduced = group.end_in(&graph, &computed, "all-reduce gradients")?;
        // ... while compute goes on with work that does not need it.
        for r in &mut replicas {
            let factor = step as f32 + 2.0;
            r.kernels.scale_add(
                &r.compute,
                factor,
                &r.inputs,
                0.0,
                &r.inputs,
                &mut r.lookahead,
            )?;
        }
        // The update needs the summed gradients: it runs after the collective.
        for r in &mut replicas {
            let (k, grads) = (&r.kernels, &r.grads);
            let mut updated = DeviceBuffer::<f32>::new_async(&r.compute, N)?;
            let weights = &r.weights;
            // Nothing waits on the update's handle: the next step's work is
            // ordered after it by the compute stream itself.
            let _update = graph
                .op(&r.compute)
                .after(&reduced)
                .label("apply gradients")
                .run(|s| k.scale_add(s, 1.0, weights, -RATE, grads, &mut updated))?;
            r.weights = updated;
        }
        // Check this step on the host.
        let summed: Vec<f32> = (0..N)
            .map(|i| 0.5 * input(0, i) + 0.5 * input(1, i))
            .collect();
        for (rank, r) in replicas.iter().enumerate() {
            assert_eq!(
                r.grads.to_vec(&r.compute)?,
                summed,
                "rank {rank}, step {step}: gradients"
            );
            let lookahead = r.lookahead.to_vec(&r.compute)?;
            let factor = step as f32 + 2.0;
            assert!(
                lookahead
                    .iter()
                    .enumerate()
                    .all(|(i, &v)| v == factor * input(rank, i)),
                "rank {rank}, step {step}: the overlapped compute"
            );
        }
    }
    // Every replica applied the same summed gradients STEPS times.
    let mut expected = vec![1.0f32; N];
    for _ in 0..STEPS {
        for (i, w) in expected.iter_mut().enumerate() {
            let g = 0.5 * input(0, i) + 0.5 * input(1, i);
            *w = 1.0f32.mul_add(*w, -RATE * g);
        }
    }
    for (rank, r) in replicas.iter().enumerate() {
        assert_eq!(
            r.weights.to_vec(&r.compute)?,
            expected,
            "rank {rank}: weights"
        );
    }
    println!(
        "data_parallel: {STEPS} steps over {} devices, {N} weights each, every result checked",
        ranks.len()
    );
    Ok(())
}
