//! Real control over CUDA streams from Rust: priorities that reach the
//! driver, dependencies and barriers built from events, stream-ordered
//! memory, overlapped pipelines and a GPU-timed profiler.
//!
//! This crate gathers the workspace's crates behind one feature each (all on
//! by default) and adds a [`prelude`]. Nothing links CUDA at build time: the
//! driver is loaded at run time (`libcuda.so.1`), and a built-in software
//! driver runs the same code on CPU threads when no GPU answers, so
//! everything below also runs (and is tested) on a machine without one.
//! `CUDA_STREAMS_DRIVER=cuda|soft|auto` picks the driver (default `auto`).
//!
//! # From a stream to a pipeline
//!
#![cfg_attr(
    all(
        feature = "pool",
        feature = "events",
        feature = "allocator",
        feature = "profiler",
        feature = "pipeline",
        feature = "kernels"
    ),
    doc = "```"
)]
#![cfg_attr(
    not(all(
        feature = "pool",
        feature = "events",
        feature = "allocator",
        feature = "profiler",
        feature = "pipeline",
        feature = "kernels"
    )),
    doc = "```ignore"
)]
//! use cuda_streams::kernels;
//! use cuda_streams::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 1. A context on device 0: the GPU when one answers, else the software driver.
//! let ctx = Context::new(0)?;
//! println!("on the GPU: {}", ctx.is_gpu());
//!
//! // 2. Streams from a pool: created once, handed out without a driver call,
//! //    with priorities read back from the driver.
//! let pool = StreamPool::new(&ctx, 4)?;
//! let producer = pool.get_priority_stream(StreamPriority::High);
//! let consumer = pool.get_priority_stream(StreamPriority::Low);
//! assert!(producer.priority()? <= consumer.priority()?); // lower is more urgent
//!
//! // 3. A kernel on the producer, timed on the GPU by the profiler...
//! let n = 4096;
//! let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
//! let mut data = DeviceBuffer::<f32>::new(&ctx, n)?;
//! let profiler = StreamProfiler::new(&ctx)?;
//! profiler.enable();
//! let coordinator = OperationGraph::new(EventPool::builder(&ctx).plain(8).build()?);
//! let produce = coordinator.register_operation(
//!     OperationType::Kernel, EventPriority::High, &producer, vec![], "fill")?;
//! let consume = coordinator.register_operation(
//!     OperationType::MemoryTransfer, EventPriority::Normal, &consumer, vec![produce], "read back")?;
//! coordinator.begin_operation(produce, &producer)?;
//! let args = [(n as u64).into(), 2.5f32.into(), (&mut data).into()];
//! profiler.time(&producer, "fill", |s| s.launch(&fill, LaunchConfig::for_num_elems(n as u32), &args))??;
//! coordinator.complete_operation(produce)?;
//!
//! // ...and a copy on the consumer that waits for it on the GPU (an event,
//! //    cuStreamWaitEvent), not on the host.
//! coordinator.begin_operation(consume, &consumer)?;
//! let mut host = PinnedBuffer::<f32>::new(&ctx, n)?;
//! consumer.copy_to_host_async(&mut host, &data)?;
//! coordinator.complete_operation(consume)?;
//! assert!(host.as_slice()?.iter().all(|&v| v == 2.5)); // waits for the copy
//! assert_eq!(profiler.get_stream_report(&producer).unwrap().operations["fill"].count, 1);
//!
//! // 4. Scratch memory freed in stream order: the next allocation on the same
//! //    stream reuses the block with no driver call.
//! let allocator = StreamOrderedAllocator::new(&ctx)?;
//! let scratch = allocator.allocate_for_stream(&producer, 1 << 20)?;
//! scratch.memset_u32_async(7)?;
//! drop(scratch);
//! assert_eq!(allocator.stats().live_allocations, 0);
//!
//! // 5. A pipeline: upload, compute and download of three batches in flight,
//! //    overlapped on three streams.
//! let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
//! let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, n)?;
//! let cfg = LaunchConfig::for_num_elems(n as u32);
//! // compute(n, iterations, x, y) reads buffer 0 and writes buffer 1.
//! let stage = pipeline.add_stage(
//!     GpuPipelineStage::builder("compute", compute, cfg).len().u32(3).reads(0).writes(1).build(),
//! );
//! pipeline.set_inputs(vec![0]); // buffer 0 is uploaded, buffer 1 (the output) downloaded
//! pipeline.set_order(vec![stage])?;
//! pipeline.fill_input(0, &vec![1.0; n])?;
//! for _ in 0..10 {
//!     pipeline.execute_iteration()?;
//! }
//! pipeline.drain()?;
//! let expected = kernels::reference::compute_element(3, 1.0);
//! assert!(pipeline.output(1)?.iter().all(|&v| v == expected));
//! println!("{:.0} iterations/s", pipeline.get_stats()?.throughput);
//! # Ok(())
//! # }
//! ```
//!
//! # The crates
//!
//! | module | feature | what it holds |
//! | --- | --- | --- |
//! | [`driver`] | always | the safe layer: [`Context`](driver::Context), [`Stream`](driver::Stream), [`Event`](driver::Event), buffers, modules, launches, driver selection |
//! | `pool` | `pool` | `StreamPool`, strategies, exclusive streams, `MultiStreamCoordinator` |
//! | `engine` | `engine` | `OperationGraph` (every coordinator is a view on it), `Op`, capture and replay (`GraphCapture`, `ReplayGraph`) |
//! | `events` | `events` | `EventPool`, `OperationCoordinator` (the seed's name for `OperationGraph`), `CrossStreamBarrier`, `AsyncEventWaiter` |
//! | `allocator` | `allocator` | `StreamOrderedAllocator` (caching or the driver's pool) |
//! | `profiler` | `profiler` | `StreamProfiler`, reports, Chrome traces |
//! | `pipeline` | `pipeline` | `GpuTripleBuffer`, `AsyncCoordinator`, `PipelineStageManager`, `ManagedGpuContext`, `BatchUploader`, `ProcessLoader` |
//! | `kernels` | `kernels` | the workspace's CUDA kernels and their CPU twins |
//! | `collectives` | `collectives` | NCCL `Communicator`s, collectives on streams, `Group` |
//! | `driver::interop::cudarc` | `cudarc` (off by default) | cudarc streams as ours, cudarc slices in our launches, our buffers in cudarc's calls, events across the two |
//! | `driver::interop::cust` | `cust` (off by default; needs a CUDA toolkit to build) | cust streams as ours, cust buffers in our launches, our buffers as cust slices, waits across the two |
//!
//! Each module is the sub-crate itself (`cuda_streams::pool` is
//! `cuda-streams-stream-pool`), with its own guide in the repository's
//! `docs/` and runnable examples under this crate's `examples/`
//! (`cargo run -p cuda-streams --example stream_pool`).
//!
//! # Features
//!
//! Generated from the comments in this crate's `Cargo.toml`; on docs.rs each
//! feature-gated item carries a badge naming its feature.
//!
#![doc = document_features::document_features!()]
//!
//! The [`prelude`] follows the features: it holds the common types of the
//! modules that are enabled.

#![forbid(unsafe_code)]
// Every doc test here (the README's example, the guides' examples) is code a
// user pastes: it must compile without a warning.
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
pub mod prelude;

pub use error::{Error, Result};

/// The stream-ordered allocator (`cuda-streams-allocator`).
#[cfg(feature = "allocator")]
#[cfg_attr(docsrs, doc(cfg(feature = "allocator")))]
pub use allocator;
/// NCCL communicators and collectives (`cuda-streams-collectives`).
#[cfg(feature = "collectives")]
#[cfg_attr(docsrs, doc(cfg(feature = "collectives")))]
pub use collectives;
/// The safe driver layer (always present): contexts, streams, events,
/// buffers, modules, kernel launches and driver selection.
pub use driver;
/// The operation graph every coordinator is a view on
/// (`cuda-streams-engine`): [`OperationGraph`](engine::OperationGraph), its
/// builder, capture into CUDA graphs ([`GraphCapture`](engine::GraphCapture),
/// [`ReplayGraph`](engine::ReplayGraph)) and its [`Error`](engine::Error)
/// ([`Error::Engine`]).
#[cfg(feature = "engine")]
#[cfg_attr(docsrs, doc(cfg(feature = "engine")))]
pub use engine;
/// Event coordination (`cuda-streams-event-coord`).
#[cfg(feature = "events")]
#[cfg_attr(docsrs, doc(cfg(feature = "events")))]
pub use events;
/// The kernels and their CPU twins (`cuda-streams-kernels`).
#[cfg(feature = "kernels")]
#[cfg_attr(docsrs, doc(cfg(feature = "kernels")))]
pub use kernels;

/// The README's example, compiled and run as a doc test, with warnings
/// denied: a user who pastes it sees none.
#[cfg(all(
    doctest,
    feature = "pool",
    feature = "events",
    feature = "allocator",
    feature = "profiler",
    feature = "pipeline",
    feature = "kernels"
))]
#[doc(test(attr(deny(warnings))))]
#[doc = include_str!("../../../README.md")]
pub struct Readme;

/// The examples of `docs/engine.md`, written with the facade's paths, run
/// as doc tests.
#[cfg(all(doctest, feature = "engine"))]
#[doc = include_str!("../../../docs/engine.md")]
pub struct EngineGuide;

/// The examples of `docs/graphs.md`, written with the facade's paths, run
/// as doc tests.
#[cfg(all(doctest, feature = "engine", feature = "kernels"))]
#[doc = include_str!("../../../docs/graphs.md")]
pub struct GraphsGuide;

/// The examples of `docs/partitions.md` (SM partitions and the QoS pool),
/// run as doc tests.
#[cfg(all(doctest, feature = "pool", feature = "kernels"))]
#[doc = include_str!("../../../docs/partitions.md")]
pub struct PartitionsGuide;

/// The examples of `docs/async.md` (futures), run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/async.md")]
pub struct AsyncGuide;

/// The examples of `docs/kernels.md` (your own kernels), run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/kernels.md")]
pub struct KernelsGuide;
/// The async pipeline (`cuda-streams-pipeline`).
#[cfg(feature = "pipeline")]
#[cfg_attr(docsrs, doc(cfg(feature = "pipeline")))]
pub use pipeline;
/// The stream pool (`cuda-streams-stream-pool`).
#[cfg(feature = "pool")]
#[cfg_attr(docsrs, doc(cfg(feature = "pool")))]
pub use pool;
/// The profiler (`cuda-streams-profiler`).
#[cfg(feature = "profiler")]
#[cfg_attr(docsrs, doc(cfg(feature = "profiler")))]
pub use profiler;
