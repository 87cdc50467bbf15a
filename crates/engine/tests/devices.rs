//! Edges across devices: an operation on device 1's stream after one on
//! device 0's waits for it on the GPU, and each records its completion event
//! on its own device. Skips, saying why, with fewer than two devices.

use cuda_streams_engine::OperationGraph;
use cuda_streams_engine::driver::{Context, DeviceBuffer, Stream};
use test_support::Gate;

#[test]
fn an_operation_on_another_device_waits_for_its_dependency() {
    let count = Context::device_count().unwrap();
    if count < 2 {
        eprintln!("skipped: needs two devices, the driver reports {count}");
        return;
    }
    let (gpu0, gpu1) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let (s0, s1) = (Stream::new(&gpu0).unwrap(), Stream::new(&gpu1).unwrap());
    let graph = OperationGraph::for_context(&gpu0);
    let mut produced = DeviceBuffer::<u32>::new(&gpu0, 4096).unwrap();
    let mut pulled = DeviceBuffer::<u32>::new(&gpu1, 4096).unwrap();
    let gate = Gate::close(&s0);
    let produce = graph
        .op(&s0)
        .label("produce on device 0")
        .run(|s| s.memset_u32_async(&mut produced, 42))
        .unwrap();
    let pull = graph
        .op(&s1)
        .after(&[produce.id()])
        .label("pull onto device 1")
        .run(|s| s.copy_peer_async(&mut pulled, &produced))
        .unwrap();
    if gate.still_held() {
        assert!(
            !pull.is_done().unwrap(),
            "device 1 ran ahead of its dependency"
        );
    }
    gate.open();
    pull.wait().unwrap();
    assert_eq!(pulled.to_vec(&s1).unwrap(), vec![42; 4096]);
    assert!(produce.is_done().unwrap());
}
