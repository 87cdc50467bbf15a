//! The engine chooses streams from a pool by an operation's priority:
//! `Critical`/`High` on the device's greatest priority, `Low`/`Cleanup` on
//! its least, and the work really runs there (checked by data).

use cuda_streams_stream_pool::StreamPool;
use cuda_streams_stream_pool::driver::{DeviceBuffer, StreamPriority};
use cuda_streams_stream_pool::engine::{EventPriority, OperationGraph};
use test_support::ctx;

#[test]
fn an_operations_priority_picks_the_stream_class() {
    let ctx = ctx();
    let range = ctx.priority_range();
    let pool = StreamPool::new(&ctx, 6).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let mut data = DeviceBuffer::<u32>::new(&ctx, 256).unwrap();
    let mut previous = None;
    for (value, priority) in [
        EventPriority::Critical,
        EventPriority::High,
        EventPriority::Normal,
        EventPriority::Low,
        EventPriority::Cleanup,
    ]
    .into_iter()
    .enumerate()
    {
        let op = graph
            .op_from(&pool)
            .priority(priority)
            .after(previous.as_slice())
            .label("fill")
            .run(|s| s.memset_u32_async(&mut data, value as u32))
            .unwrap();
        let stream_id = graph.metadata(op.id()).unwrap().stream_id;
        let stream = pool
            .streams()
            .find(|s| s.id() == stream_id)
            .expect("the engine took one of the pool's streams");
        let class = priority.stream_class();
        assert_eq!(pool.class_of(stream), Some(class), "{priority:?}");
        assert_eq!(
            stream.priority().unwrap(),
            range.value(class),
            "{priority:?}"
        );
        op.wait().unwrap();
        let mut host = vec![0u32; 256];
        stream.copy_to_host(&mut host, &data).unwrap();
        assert!(host.iter().all(|&v| v == value as u32), "{priority:?}");
        previous = Some(op.id());
    }
    assert_eq!(EventPriority::Critical.stream_class(), StreamPriority::High);
}
