//! One error across the operation graph: inside an operation's closure, `?`
//! works on the calls of every crate behind the facade, and a failure comes
//! back out of `run` whole, with its source chain.
#![cfg(all(feature = "engine", feature = "allocator", feature = "profiler"))]

use cuda_streams::allocator::{self, StreamOrderedAllocator};
use cuda_streams::driver::{self, Context, PinnedBuffer, Stream};
use cuda_streams::engine::{self, OperationGraph};
use cuda_streams::profiler::StreamProfiler;
use std::error::Error as _;

/// `?` on an allocator call, a profiler call and a driver call in one
/// closure, ending in a plain `Ok(())`: no annotation, no `map_err`.
#[test]
fn question_mark_works_on_every_crate_inside_an_operation() -> cuda_streams::Result<()> {
    let ctx = Context::new(0)?;
    let stream = Stream::new(&ctx)?;
    let alloc = StreamOrderedAllocator::new(&ctx)?;
    let profiler = StreamProfiler::new(&ctx)?;
    profiler.enable();
    let graph = OperationGraph::for_context(&ctx);
    let mut host = PinnedBuffer::<u32>::new(&ctx, 256)?;
    let op = graph.op(&stream).label("fill and read").run(|s| {
        let mut block = alloc.allocate_for_stream(s, 1024)?; // the allocator's error
        let mut view = block.as_device_mut::<u32>()?;
        profiler.time(s, "fill", |s| s.memset_u32_async(&mut view, 7))??; // the profiler's
        s.copy_to_host_async(&mut host, &view)?; // the driver's
        Ok(())
    })?;
    op.wait()?;
    assert!(host.as_slice()?.iter().all(|&v| v == 7));
    let report = profiler.get_stream_report(&stream).expect("profiled");
    assert_eq!(report.operations["fill"].count, 1);
    Ok(())
}

/// The allocator's error comes out of `run`, and out of the facade's error
/// after `?`, with every link of its chain: the operation (named by its
/// label), the carrier, the allocator's own error.
#[test]
fn a_failure_keeps_its_source_chain() {
    fn run(
        graph: &OperationGraph,
        stream: &Stream,
        alloc: &StreamOrderedAllocator,
    ) -> cuda_streams::Result<()> {
        let op = graph.op(stream).label("too big").run(|s| {
            let _never = alloc.allocate_for_stream(s, usize::MAX)?;
            Ok(())
        })?;
        Ok(op.wait()?)
    }
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let alloc = StreamOrderedAllocator::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let err = run(&graph, &stream, &alloc).unwrap_err();

    let cuda_streams::Error::Engine(engine::Error::OperationFailed { label, source, .. }) = &err
    else {
        panic!("not the operation's failure: {err:?}");
    };
    assert_eq!(label, "too big");
    let too_large = source
        .downcast_ref::<allocator::Error>()
        .expect("the allocator's error, carried whole");
    assert!(
        matches!(
            too_large,
            allocator::Error::TooLarge {
                requested: usize::MAX,
                ..
            }
        ),
        "{too_large:?}"
    );
    assert!(err.to_string().contains("\"too big\""), "{err}");
    assert!(err.to_string().contains(&too_large.to_string()), "{err}");

    // Walking `source()` from the facade's error reaches the allocator's.
    let mut chain = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(link) = next {
        chain.push(link);
        next = link.source();
    }
    assert!(
        chain
            .iter()
            .any(|link| link.downcast_ref::<allocator::Error>().is_some()),
        "the chain lost the allocator's error: {chain:?}"
    );
}

/// A driver failure inside another crate's error comes back as the driver's
/// own error, not wrapped twice, so code matching driver errors still sees it.
#[test]
fn a_wrapped_driver_failure_stays_a_driver_error() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let from_allocator = allocator::Error::Driver(driver::Error::EmptyImage);
    let err = graph
        .op(&stream)
        .run(|_| Err(from_allocator.into()))
        .unwrap_err();
    let engine::Error::OperationFailed { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(matches!(source, driver::Error::EmptyImage), "{source:?}");
    assert!(err.source().is_some());
}
