//! The profiler on SM partitions' streams: a scope on each partition's
//! stream is timed at the length of its work and counted in that stream's
//! report, as on any stream.

mod support;

use cuda_streams_profiler::StreamProfiler;
use driver::{Sms, StreamPriority};
use std::time::Duration;
use support::{ctx, kernel, spin};

#[test]
fn scopes_on_partitions_streams_are_timed_at_their_work() {
    let ctx = ctx();
    let spin_kernel = kernel(&ctx, &kernels::TIMING, "spin");
    let split = ctx.partition(&[Sms(8), Sms(8)]).unwrap();
    let streams: Vec<_> = split
        .partitions
        .iter()
        .map(|partition| {
            partition.load(&spin_kernel).unwrap();
            partition.stream(StreamPriority::Normal).unwrap()
        })
        .collect();
    let profiler = StreamProfiler::new(&ctx).unwrap();
    profiler.enable();
    // Different lengths, so that a report given the other stream's scope
    // shows.
    let lengths = [20u64, 60].map(Duration::from_millis);
    for (stream, length) in streams.iter().zip(lengths) {
        let _scope = profiler.scope(stream, format!("spin {length:?}")).unwrap();
        spin(stream, &spin_kernel, length);
    }
    for (stream, length) in streams.iter().zip(lengths) {
        let report = profiler.get_stream_report(stream).unwrap();
        assert_eq!(report.operation_count, 1, "{report}");
        assert_eq!(report.kernel_launches, 1, "{report}");
        let stats = report.operations[&format!("spin {length:?}")];
        // The kernel runs at least as long as asked; loose above on the
        // software driver, a sleeping thread on a loaded machine.
        assert!(
            stats.total >= length / 2 && stats.total <= length * 4 + Duration::from_millis(50),
            "a {length:?} spin on a partition's stream was timed at {:?}",
            stats.total
        );
    }
}
