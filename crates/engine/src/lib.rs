//! One operation graph over CUDA streams.
//!
//! Every coordinator of this workspace is a view on [`OperationGraph`]: the
//! seed's `OperationCoordinator` (event coordination) is this type under its
//! seed name, and the stream and pipeline coordinators use its
//! [`OperationId`], its [`cycle`] check and the driver layer's stream
//! ordering. What the graph does:
//!
//! - Nodes are operations on streams (kernels, copies, memsets, host
//!   functions, barriers; [`OperationType`] says which), edges are
//!   dependencies. An edge to another stream is one `cuStreamWaitEvent` on
//!   the dependency's completion event, taken from the context's event pool;
//!   an edge on the same stream costs nothing.
//! - An edge that would close a cycle is refused when it is added, naming the
//!   cycle ([`Error::Cycle`]). Deadlocks that only appear with stream order
//!   (A before B on one stream, B's dependency after A's on another) are found
//!   by [`OperationGraph::detect_deadlocks`].
//! - Stream-level nodes for the stream coordinator
//!   (`cuda_streams_stream_pool::MultiStreamCoordinator`, a view on this
//!   graph): standing stream dependencies
//!   ([`OperationGraph::add_stream_dependency`], cycles refused the same
//!   way, [`Error::StreamCycle`]), a barrier ([`OperationGraph::barrier`])
//!   and host code run on several streams at once, one CPU thread and one
//!   operation each ([`OperationGraph::parallel`]). Each gives operation ids
//!   that later operations depend on.
//! - Completion is seen at GPU time: completion callbacks run from a host
//!   function after the operation's work, and finished operations retire by
//!   querying their events.
//! - Captured once, replayed many times: [`OperationGraph::capture`] takes
//!   the same builder, records the operations into a CUDA graph (dependencies
//!   become its edges, completion callbacks its host nodes) and
//!   [`ReplayGraph::replay`] launches it for a fraction of the launch cost.
//! - Two ways in: the seed-shaped calls (`register_operation`,
//!   `begin_operation`, `complete_operation`) and the builder,
//!   [`OperationGraph::op`], whose operations complete themselves.
//!
//! ```
//! use cuda_streams_engine::OperationGraph;
//! use cuda_streams_engine::driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::new(0)?;
//! let (copies, compute) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
//! let graph = OperationGraph::for_context(&ctx);
//! let mut data = DeviceBuffer::<u32>::new(&ctx, 1024)?;
//! let mut host = PinnedBuffer::<u32>::new(&ctx, 1024)?;
//! let fill = graph.op(&copies).label("fill").run(|s| s.memset_u32_async(&mut data, 9))?;
//! let read = graph.op(&compute).after(&[fill.id()]).label("read")
//!     .run(|s| s.copy_to_host_async(&mut host, &data))?;
//! read.wait()?;
//! assert!(host.as_slice()?.iter().all(|&v| v == 9));
//! # Ok(())
//! # }
//! ```

// The examples of `docs/engine.md` and `docs/graphs.md` use the facade's
// paths (`cuda_streams::engine`), so the facade runs them as doc tests.

mod barrier;
mod capture;
pub mod cycle;
mod error;
mod graph;
mod observe;
mod observer;
mod op;
mod operation;
mod parallel;
mod race_hint;
mod source;
mod standing_waits;
mod streams;

pub use barrier::Barrier;
pub use capture::{CaptureOpBuilder, CaptureOpId, GraphCapture, ReplayGraph};
pub use error::{Error, Result};
pub use graph::{CoordinatorMetrics, OperationGraph};
pub use observer::{ObservedOperation, OperationObserver};
pub use op::{Op, OpBuilder};
pub use operation::{EventMetadata, EventPriority, OperationId, OperationState, OperationType};
pub use parallel::{Branch, BranchError, ParallelBuilder, ParallelRun};
pub use source::StreamSource;

/// The safe driver layer the graph runs on, so examples can name it through
/// this crate.
pub use driver;
/// The event pool completion events come from (the driver layer's).
pub use driver::{EventPool, PooledEvent};
