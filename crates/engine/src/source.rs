//! Streams the engine chooses: an operation's priority picks the class.
//!
//! With [`OperationGraph::op`](crate::OperationGraph::op) the caller names
//! the stream. With
//! [`OperationGraph::op_from`](crate::OperationGraph::op_from) (in `op.rs`,
//! beside the builder it returns) the caller names a [`StreamSource`] (a
//! stream pool) and the engine takes a stream of the class its
//! [`EventPriority`] maps to: `Critical` and `High` run on the device's
//! high-priority streams, `Normal` on normal ones, `Low` and `Cleanup` on
//! low ones. That is the only place where an operation's priority changes
//! what runs where.

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
