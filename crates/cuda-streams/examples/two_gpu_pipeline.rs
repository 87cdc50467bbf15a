//! A pipeline across two GPUs joined by peer copies: device 0 produces batch
//! `b` (filled with `b + 1`), device 1's P2P stream pulls it
//! (`cuMemcpyPeerAsync`, peer access enabled on demand), and device 1
//! accumulates `2 * batch` into its result. Two slots per device: device 0
//! refills a slot only after device 1 has pulled it (an event of device 1
//! waited on by device 0's stream), and device 1 overwrites a landing slot
//! only after its compute has read it. The host never waits until the end.
//!
//! `cargo run -p cuda-streams --example two_gpu_pipeline`

use cuda_streams::kernels::typed::Elementwise;
use cuda_streams::pool::DevicePools;
use cuda_streams::prelude::*;

const N: usize = 1 << 16;
const BATCHES: usize = 8;

fn main() -> Result<(), cuda_streams::Error> {
    let pools = DevicePools::new(4, AllocationStrategy::RoundRobin)?;
    if pools.len() < 2 {
        println!(
            "two_gpu_pipeline needs two devices; the driver reports {}",
            pools.len()
        );
        return Ok(());
    }
    let (dev0, dev1) = (pools.for_device(0)?, pools.for_device(1)?);
    let produce = dev0.get_stream_for_purpose(StreamPurpose::KernelExecution);
    let consume = dev1.get_stream_for_purpose(StreamPurpose::KernelExecution);
    // Device 1's P2P-transfer stream carries the copies between the devices.
    let p2p = pools.p2p_stream(1)?;
    let (k0, k1) = (
        Elementwise::load(dev0.context())?,
        Elementwise::load(dev1.context())?,
    );
    let mut staged = [
        DeviceBuffer::<f32>::new(dev0.context(), N)?,
        DeviceBuffer::new(dev0.context(), N)?,
    ];
    let mut landed = [
        DeviceBuffer::<f32>::new(dev1.context(), N)?,
        DeviceBuffer::new(dev1.context(), N)?,
    ];
    let mut result = DeviceBuffer::from_slice(&consume, &vec![0.0f32; N])?;
    let mut pulled: [Option<Event>; 2] = [None, None];
    let mut read: [Option<Event>; 2] = [None, None];
    for batch in 0..BATCHES {
        let slot = batch % 2;
        if let Some(done) = &pulled[slot] {
            produce.wait_event(done)?; // device 1 has pulled this slot
        }
        k0.fill_f32(&produce, batch as f32 + 1.0, &mut staged[slot])?;
        p2p.wait_stream(&produce)?; // a wait across the devices
        if let Some(done) = &read[slot] {
            p2p.wait_event(done)?; // device 1's compute has read the landing slot
        }
        p2p.copy_peer_async(&mut landed[slot], &staged[slot])?;
        pulled[slot] = Some(p2p.record_event()?);
        consume.wait_stream(&p2p)?;
        k1.saxpy(&consume, 2.0, &landed[slot], &mut result)?;
        read[slot] = Some(consume.record_event()?);
    }
    let expected: f32 = (1..=BATCHES).map(|b| 2.0 * b as f32).sum();
    let got = result.to_vec(&consume)?;
    assert!(got.iter().all(|&v| v == expected), "device 1's result");
    println!(
        "two_gpu_pipeline: {BATCHES} batches of {N} floats from device 0 to device 1, result {expected} everywhere"
    );
    Ok(())
}
