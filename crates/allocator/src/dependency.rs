//! Events a stream's memory depends on.

use driver::Event;
use driver::PooledEvent;
use std::sync::Arc;

/// An event that a stream's frees must wait for (see
/// [`crate::StreamOrderedAllocator::add_stream_dependency`]): a plain shared
/// [`Event`] or one borrowed from an [`driver::EventPool`].
///
/// ```
/// use cuda_streams_allocator::{StreamDependency, StreamOrderedAllocator};
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let (producer, consumer) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// // `consumer` reads `producer`'s memory up to here: `producer`'s frees must wait.
/// let read_done = StreamDependency::from(consumer.record_event()?);
/// assert!(matches!(read_done, StreamDependency::Event(_)));
/// allocator.add_stream_dependency(&producer, read_done.clone())?;
/// consumer.synchronize()?;
/// assert!(read_done.event().query()?);
/// assert!(allocator.dependencies_satisfied(&producer)?);
/// assert_eq!(allocator.clear_dependencies(&producer), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub enum StreamDependency {
    /// A shared driver event.
    Event(Arc<Event>),
    /// A pooled event; it returns to its pool when the last clone is dropped.
    Pooled(Arc<PooledEvent>),
}

impl StreamDependency {
    /// The event to query or wait for.
    pub fn event(&self) -> &Event {
        match self {
            Self::Event(event) => event,
            Self::Pooled(event) => event,
        }
    }
}

impl From<Arc<Event>> for StreamDependency {
    fn from(event: Arc<Event>) -> Self {
        Self::Event(event)
    }
}

impl From<Event> for StreamDependency {
    fn from(event: Event) -> Self {
        Self::Event(Arc::new(event))
    }
}

impl From<PooledEvent> for StreamDependency {
    fn from(event: PooledEvent) -> Self {
        Self::Pooled(Arc::new(event))
    }
}

impl From<Arc<PooledEvent>> for StreamDependency {
    fn from(event: Arc<PooledEvent>) -> Self {
        Self::Pooled(event)
    }
}

/// What a pending free waits for before its block can be reused.
pub(crate) enum Wait {
    /// Recorded on a stream that used the block (`record_stream`).
    Use(PooledEvent),
    /// A dependency of the home stream that had not completed at the free.
    Dependency(StreamDependency),
}

impl Wait {
    pub(crate) fn event(&self) -> &Event {
        match self {
            Self::Use(event) => event,
            Self::Dependency(dep) => dep.event(),
        }
    }

    /// Whether the event has completed; with `block`, wait for it. A failed
    /// query counts as not complete (the block stays unused: safe).
    pub(crate) fn done(&self, block: bool) -> bool {
        match self.event().query() {
            Ok(true) => true,
            Ok(false) if block => self.event().synchronize().is_ok(),
            _ => false,
        }
    }
}
