//! Data parallelism over two devices: each computes its gradients, they are
//! all-reduced on a communication stream per device while the compute
//! stream goes on with the next, independent step, then every device applies
//! the summed gradients. Every result is checked against the host.

use cuda_streams_collectives::driver::{
    Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Stream,
};
use cuda_streams_collectives::{Communicator, Group, ReduceOp};
use std::sync::Arc;

const N: usize = 1 << 16;

/// `out = a * x + b * y`.
fn scale_add(
    s: &Stream,
    k: &Kernel,
    a: f32,
    x: &DeviceBuffer<f32>,
    b: f32,
    y: &DeviceBuffer<f32>,
    out: &mut DeviceBuffer<f32>,
) {
    let args = [
        KernelArg::from(N as u64),
        a.into(),
        x.into(),
        b.into(),
        y.into(),
        out.into(),
    ];
    s.launch(k, LaunchConfig::for_num_elems(N as u32), &args)
        .unwrap();
}

struct Device {
    compute: Arc<Stream>,
    comms: Arc<Stream>,
    scale_add: Kernel,
    weights: DeviceBuffer<f32>,
    inputs: DeviceBuffer<f32>,
    grads: DeviceBuffer<f32>,
    next: DeviceBuffer<f32>,
}

#[test]
fn gradients_are_all_reduced_while_the_next_step_computes() {
    let contexts = Context::all().unwrap();
    if contexts.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            contexts.len()
        );
        return;
    }
    let contexts = &contexts[..2];
    let ranks = Communicator::all_devices(contexts).unwrap();
    let mut devices: Vec<Device> = contexts
        .iter()
        .enumerate()
        .map(|(r, ctx)| {
            let compute = Stream::new(ctx).unwrap();
            let inputs: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * (r as f32 + 1.0)).collect();
            Device {
                comms: Stream::new(ctx).unwrap(),
                scale_add: test_support::kernel(ctx, &kernels::ELEMENTWISE, "scale_add"),
                weights: DeviceBuffer::from_slice(&compute, &vec![1.0; N]).unwrap(),
                inputs: DeviceBuffer::from_slice(&compute, &inputs).unwrap(),
                grads: DeviceBuffer::new_async(&compute, N).unwrap(),
                next: DeviceBuffer::new_async(&compute, N).unwrap(),
                compute,
            }
        })
        .collect();
    // Step 1: gradients = 0.5 * inputs, on each compute stream.
    for d in &mut devices {
        scale_add(
            &d.compute,
            &d.scale_add,
            0.5,
            &d.inputs,
            0.0,
            &d.inputs,
            &mut d.grads,
        );
        d.comms.wait_stream(&d.compute).unwrap();
    }
    // The all-reduce runs on the communication streams...
    let mut group = Group::new();
    for (rank, d) in ranks.iter().zip(&mut devices) {
        group
            .all_reduce_in_place(rank, &d.comms, &mut d.grads, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    // ... while compute goes on: next = 3 * inputs (independent of grads).
    for d in &mut devices {
        scale_add(
            &d.compute,
            &d.scale_add,
            3.0,
            &d.inputs,
            0.0,
            &d.inputs,
            &mut d.next,
        );
    }
    // Step 2 needs the summed gradients: weights = weights - 0.1 * grads.
    for d in &mut devices {
        d.compute.wait_stream(&d.comms).unwrap();
        let mut updated = DeviceBuffer::<f32>::new_async(&d.compute, N).unwrap();
        scale_add(
            &d.compute,
            &d.scale_add,
            1.0,
            &d.weights,
            -0.1,
            &d.grads,
            &mut updated,
        );
        d.weights = updated;
    }
    let summed: Vec<f32> = (0..N)
        .map(|i| 0.5 * (i % 97) as f32 * 1.0 + 0.5 * (i % 97) as f32 * 2.0)
        .collect();
    for (r, d) in devices.iter().enumerate() {
        let grads = d.grads.to_vec(&d.compute).unwrap();
        assert_eq!(grads, summed, "rank {r}'s summed gradients");
        let weights = d.weights.to_vec(&d.compute).unwrap();
        let expected: Vec<f32> = summed
            .iter()
            .map(|g| 1.0f32.mul_add(1.0, -0.1 * g))
            .collect();
        assert_eq!(weights, expected, "rank {r}'s weights");
        let next = d.next.to_vec(&d.compute).unwrap();
        let expected: Vec<f32> = (0..N)
            .map(|i| 3.0 * (i % 97) as f32 * (r as f32 + 1.0))
            .collect();
        assert_eq!(next, expected, "rank {r}'s next step");
    }
}
