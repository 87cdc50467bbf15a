//! Streams the engine chooses: an operation's priority picks the class.
//!
//! With [`OperationGraph::op`] the caller names the stream. With
//! [`OperationGraph::op_from`] the caller names a [`StreamSource`] (a stream
//! pool) and the engine takes a stream of the class its
//! [`EventPriority`] maps to: `Critical` and `High` run on the device's
//! high-priority streams, `Normal` on normal ones, `Low` and `Cleanup` on
//! low ones. That is the only place where an operation's priority changes
//! what runs where.

use crate::graph::OperationGraph;
use crate::op::OpBuilder;
use crate::operation::EventPriority;
use driver::{Stream, StreamPriority};
use std::sync::Arc;

/// Hands out streams by priority class; `cuda_streams_stream_pool::StreamPool`
/// is one.
pub trait StreamSource {
    /// A stream of `class` (spread over the source's streams of that class).
    fn stream_for(&self, class: StreamPriority) -> Arc<Stream>;
}

impl EventPriority {
    /// The stream class an operation of this priority runs on when the
    /// engine chooses its stream.
    ///
    /// ```
    /// use cuda_streams_engine::EventPriority;
    /// use cuda_streams_engine::driver::StreamPriority;
    /// assert_eq!(EventPriority::Critical.stream_class(), StreamPriority::High);
    /// assert_eq!(EventPriority::Cleanup.stream_class(), StreamPriority::Low);
    /// ```
    pub const fn stream_class(self) -> StreamPriority {
        match self {
            EventPriority::Critical | EventPriority::High => StreamPriority::High,
            EventPriority::Normal => StreamPriority::Normal,
            EventPriority::Low | EventPriority::Cleanup => StreamPriority::Low,
        }
    }
}

impl OperationGraph {
    /// Describe an operation whose stream the engine takes from `source`
    /// when it runs, by its priority ([`EventPriority::stream_class`]).
    ///
    /// ```
    /// use cuda_streams_engine::{EventPriority, OperationGraph, StreamSource};
    /// use cuda_streams_engine::driver::{Context, Stream, StreamPriority};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_engine::Result<()> {
    /// // Any type can hand out streams; a stream pool is the usual one.
    /// struct TwoClasses { urgent: Arc<Stream>, other: Arc<Stream> }
    /// impl StreamSource for TwoClasses {
    ///     fn stream_for(&self, class: StreamPriority) -> Arc<Stream> {
    ///         match class {
    ///             StreamPriority::High => self.urgent.clone(),
    ///             _ => self.other.clone(),
    ///         }
    ///     }
    /// }
    /// let ctx = Context::new(0)?;
    /// let source = TwoClasses {
    ///     urgent: Stream::new_with_priority(&ctx, StreamPriority::High)?,
    ///     other: Stream::new(&ctx)?,
    /// };
    /// let graph = OperationGraph::for_context(&ctx);
    /// let op = graph.op_from(&source).priority(EventPriority::Critical).run(|_| Ok(()))?;
    /// assert_eq!(graph.metadata(op.id()).unwrap().stream_id, source.urgent.id());
    /// # Ok(())
    /// # }
    /// ```
    pub fn op_from<'g>(&'g self, source: &'g dyn StreamSource) -> OpBuilder<'g> {
        OpBuilder::from_source(self, source)
    }
}
