//! One allocator per device: memory lands on the stream's device, each
//! device's cache stays its own, and a stream of another device is refused
//! with both contexts named. Needs two devices (the software driver has two
//! by default); with fewer it says why it skips.

use cuda_streams_allocator::driver::{Context, Stream};
use cuda_streams_allocator::{DeviceAllocators, Error};

#[test]
fn each_device_allocates_its_own_memory_for_its_streams() {
    let contexts = Context::all().unwrap();
    if contexts.len() < 2 {
        println!(
            "skipped: needs two devices, the driver reports {}",
            contexts.len()
        );
        return;
    }
    let allocators = DeviceAllocators::new().unwrap();
    assert_eq!(allocators.len(), contexts.len());
    let streams: Vec<_> = contexts[..2]
        .iter()
        .map(|c| Stream::new(c).unwrap())
        .collect();
    let mut blocks = Vec::new();
    for (device, stream) in streams.iter().enumerate() {
        let bytes = (device + 1) << 20;
        let block = allocators.allocate_for_stream(stream, bytes).unwrap();
        // The data round-trips on the block's own device.
        let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + device) as u8).collect();
        block.copy_from_host(&data).unwrap();
        let mut back = vec![0u8; bytes];
        block.copy_to_host(&mut back).unwrap();
        assert_eq!(back, data, "device {device}");
        blocks.push(block);
    }
    for device in 0..2 {
        let stats = allocators.for_device(device as i32).unwrap().stats();
        assert_eq!(stats.allocated_bytes, (device + 1) << 20, "device {device}");
    }
    // Device 0's allocator refuses device 1's stream, naming both contexts.
    let err = allocators
        .for_device(0)
        .unwrap()
        .allocate_for_stream(&streams[1], 4096)
        .unwrap_err();
    match &err {
        Error::ContextMismatch {
            expected, found, ..
        } => {
            assert_eq!((*expected, *found), (contexts[0].id(), contexts[1].id()));
        }
        other => panic!("expected ContextMismatch, got {other}"),
    }
    // An unknown device is an error naming it; everything above still works.
    let err = allocators.for_device(contexts.len() as i32).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("device {}", contexts.len())),
        "{err}"
    );
    drop(blocks);
    assert!(allocators.allocate_for_stream(&streams[0], 1 << 20).is_ok());
}
