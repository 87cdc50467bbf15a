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
