//! One pool per device: each pool's streams run on its device, and the
//! P2PTransfer stream of a device carries peer copies into it, in order after
//! the producer on the other device.

mod support;

use cuda_streams_stream_pool::driver::{Context, DeviceBuffer};
use cuda_streams_stream_pool::{AllocationStrategy, DevicePools, Error, StreamPurpose};
use test_support::{Gate, XorShift};

#[test]
fn every_device_gets_a_pool_of_its_own_streams() {
    let pools = DevicePools::new(5, AllocationStrategy::RoundRobin).unwrap();
    assert_eq!(pools.len() as i32, Context::device_count().unwrap());
    for (ordinal, pool) in pools.iter().enumerate() {
        assert_eq!(pool.context().ordinal(), ordinal as i32);
        assert!(
            pool.streams()
                .all(|s| s.context().ordinal() == ordinal as i32)
        );
        let p2p = pools.p2p_stream(ordinal as i32).unwrap();
        assert_eq!(p2p.context().ordinal(), ordinal as i32);
        assert_eq!(
            p2p.id(),
            pool.get_stream_for_purpose(StreamPurpose::P2PTransfer).id()
        );
    }
    let count = pools.len();
    match pools.for_device(count as i32) {
        Err(err @ Error::UnknownDevice { .. }) => {
            assert!(
                err.to_string().contains(&format!("device {count}")),
                "{err}"
            )
        }
        other => panic!("expected UnknownDevice, got {other:?}"),
    }
    assert!(matches!(
        pools.for_device(-1),
        Err(Error::UnknownDevice { ordinal: -1, .. })
    ));
}

#[test]
fn the_p2p_stream_pulls_data_after_the_producer_on_another_device() {
    let pools = DevicePools::new(5, AllocationStrategy::RoundRobin).unwrap();
    if pools.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            pools.len()
        );
        return;
    }
    let producer = pools
        .for_device(0)
        .unwrap()
        .get_stream_for_purpose(StreamPurpose::KernelExecution);
    let p2p = pools.p2p_stream(1).unwrap();
    let data = XorShift::new(3).u32s(50_000);
    let mut src = DeviceBuffer::<u32>::new_async(&producer, data.len()).unwrap();
    let gate = Gate::close(&producer);
    // The producer's write of `src` waits behind the gate, and so must the
    // copy into device 1.
    let staged = DeviceBuffer::from_slice(&pools.p2p_stream(0).unwrap(), &data).unwrap();
    producer.wait_stream(&pools.p2p_stream(0).unwrap()).unwrap();
    producer
        .copy_device_to_device_async(&mut src, &staged)
        .unwrap();
    let mut dst = DeviceBuffer::<u32>::new_async(&p2p, data.len()).unwrap();
    p2p.wait_stream(&producer).unwrap();
    p2p.copy_peer_async(&mut dst, &src).unwrap();
    let copied = p2p.record_event().unwrap();
    if gate.still_held() {
        assert!(
            !copied.query().unwrap(),
            "the peer copy ran ahead of its producer"
        );
    }
    gate.open();
    assert_eq!(dst.to_vec(&p2p).unwrap(), data);
}

/// A two-stage pipeline across two devices joined by peer copies: device 0
/// fills batch `b` with `b + 1`, device 1's P2P stream pulls it, device 1
/// accumulates `2 * batch` into its result. Two slots per device, so device 0
/// refills a slot only once device 1 has pulled it (an event of device 1
/// waited on device 0), and device 1 reuses a landing slot only after its
/// compute has read it.
#[test]
fn a_pipeline_across_two_devices_joined_by_peer_copies() {
    use kernels::typed::Elementwise;
    let pools = DevicePools::new(5, AllocationStrategy::RoundRobin).unwrap();
    if pools.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            pools.len()
        );
        return;
    }
    const N: usize = 1 << 14;
    const BATCHES: usize = 6;
    let (dev0, dev1) = (pools.for_device(0).unwrap(), pools.for_device(1).unwrap());
    let produce = dev0.get_stream_for_purpose(StreamPurpose::KernelExecution);
    let consume = dev1.get_stream_for_purpose(StreamPurpose::KernelExecution);
    let p2p = pools.p2p_stream(1).unwrap();
    let (k0, k1) = (
        Elementwise::load(dev0.context()).unwrap(),
        Elementwise::load(dev1.context()).unwrap(),
    );
    let mut staged = [0, 1].map(|_| DeviceBuffer::<f32>::new(dev0.context(), N).unwrap());
    let mut landed = [0, 1].map(|_| DeviceBuffer::<f32>::new(dev1.context(), N).unwrap());
    let mut result = DeviceBuffer::from_slice(&consume, &vec![0.0f32; N]).unwrap();
    let mut pulled: [Option<_>; 2] = [None, None];
    let mut read: [Option<_>; 2] = [None, None];
    for batch in 0..BATCHES {
        let slot = batch % 2;
        if let Some(done) = &pulled[slot] {
            produce.wait_event(done).unwrap(); // device 1 has pulled this slot
        }
        k0.fill_f32(&produce, batch as f32 + 1.0, &mut staged[slot])
            .unwrap();
        p2p.wait_stream(&produce).unwrap();
        if let Some(done) = &read[slot] {
            p2p.wait_event(done).unwrap(); // device 1's compute has read it
        }
        p2p.copy_peer_async(&mut landed[slot], &staged[slot])
            .unwrap();
        pulled[slot] = Some(p2p.record_event().unwrap());
        consume.wait_stream(&p2p).unwrap();
        k1.saxpy(&consume, 2.0, &landed[slot], &mut result).unwrap();
        read[slot] = Some(consume.record_event().unwrap());
    }
    let expected: f32 = (1..=BATCHES).map(|b| 2.0 * b as f32).sum();
    assert_eq!(result.to_vec(&consume).unwrap(), vec![expected; N]);
}
