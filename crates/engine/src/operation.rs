//! What the coordinator knows about one operation: its id, kind, priority and
//! metadata.

use std::fmt;
use std::time::Instant;

/// An operation's id within one [`crate::OperationGraph`]: issued in
/// registration order, from 1, never reused.
///
/// ```
/// use cuda_streams_engine::{
///     EventPool, EventPriority, OperationGraph, OperationId, OperationType,
/// };
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 2, 0)?));
/// let (kind, priority) = (OperationType::Kernel, EventPriority::Normal);
/// let first = coordinator.register_operation(kind, priority, &stream, vec![], "first")?;
/// let second = coordinator.register_operation(kind, priority, &stream, vec![first], "second")?;
/// assert_eq!(first, OperationId(1));
/// assert!(first < second);
/// assert_eq!(second.get(), 2);
/// assert_eq!(u64::from(second), 2);
/// assert_eq!(second.to_string(), "operation 2");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OperationId(pub u64);

impl OperationId {
    /// The number inside.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "operation {}", self.0)
    }
}

impl From<OperationId> for u64 {
    fn from(id: OperationId) -> u64 {
        id.0
    }
}

/// What kind of GPU work an operation is.
///
/// ```
/// use cuda_streams_engine::{EventPool, EventPriority, OperationGraph, OperationType};
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 1, 0)?));
/// let upload = coordinator.register_operation(
///     OperationType::MemoryTransfer, EventPriority::High, &stream, vec![], "upload",
/// )?;
/// let metadata = coordinator.metadata(upload).expect("not retired yet");
/// assert_eq!(metadata.operation_type, OperationType::MemoryTransfer);
/// assert_eq!(OperationType::ALL.len(), 7);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationType {
    /// A compute kernel.
    Kernel,
    /// A host↔device or device↔device copy.
    MemoryTransfer,
    /// An explicit synchronization point.
    Synchronization,
    /// A collective reduction.
    Reduction,
    /// Distributing data.
    Broadcast,
    /// A distributed reduction.
    AllReduce,
    /// A global synchronization barrier.
    Barrier,
}

impl OperationType {
    /// Every variant, in declaration order.
    pub const ALL: [OperationType; 7] = [
        OperationType::Kernel,
        OperationType::MemoryTransfer,
        OperationType::Synchronization,
        OperationType::Reduction,
        OperationType::Broadcast,
        OperationType::AllReduce,
        OperationType::Barrier,
    ];
}

/// How urgent an operation is. The derived order puts `Critical` first:
/// `Critical < High < Normal < Low < Cleanup`, so sorting ascending lists the
/// most urgent first.
///
/// ```
/// use cuda_streams_engine::{EventPool, EventPriority, OperationGraph, OperationType};
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let mut priorities = vec![EventPriority::Low, EventPriority::Critical, EventPriority::Normal];
/// priorities.sort();
/// assert_eq!(priorities, [EventPriority::Critical, EventPriority::Normal, EventPriority::Low]);
///
/// // The coordinator's ready list puts the most urgent first.
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 2, 0)?));
/// let register = |priority| {
///     coordinator.register_operation(OperationType::Kernel, priority, &stream, vec![], "")
/// };
/// let tidy = register(EventPriority::Cleanup)?;
/// let urgent = register(EventPriority::Critical)?;
/// assert_eq!(coordinator.ready_operations(), [urgent, tidy]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventPriority {
    /// Must run immediately.
    Critical,
    /// High priority (compute-intensive work).
    High,
    /// Standard work.
    Normal,
    /// Background work.
    Low,
    /// Maintenance and cleanup.
    Cleanup,
}

impl EventPriority {
    /// Every variant, most urgent first.
    pub const ALL: [EventPriority; 5] = [
        EventPriority::Critical,
        EventPriority::High,
        EventPriority::Normal,
        EventPriority::Low,
        EventPriority::Cleanup,
    ];
}

/// What the coordinator records about each operation (the spec's fields; ids
/// are [`OperationId`] rather than bare `u64`), from
/// [`OperationGraph::metadata`](crate::OperationGraph::metadata).
///
/// ```
/// use cuda_streams_engine::{EventPool, EventPriority, OperationGraph, OperationType};
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 2, 0)?));
/// let (kind, priority) = (OperationType::Kernel, EventPriority::High);
/// let load = coordinator.register_operation(kind, priority, &stream, vec![], "load")?;
/// let scale = coordinator.register_operation(kind, priority, &stream, vec![load], "scale")?;
/// let metadata = coordinator.metadata(scale).expect("not retired yet");
/// assert_eq!(metadata.operation_id, scale);
/// assert_eq!(metadata.priority, EventPriority::High);
/// assert_eq!(metadata.stream_id, stream.id());
/// assert_eq!(metadata.dependencies, [load]);
/// assert_eq!(metadata.description, "scale");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct EventMetadata {
    /// What kind of work it is.
    pub operation_type: OperationType,
    /// How urgent it is.
    pub priority: EventPriority,
    /// [`driver::Stream::id`] of the stream it was registered on.
    pub stream_id: u64,
    /// Its id.
    pub operation_id: OperationId,
    /// When it was registered (for a builder operation, when `run` began).
    /// Where the CPU's time stamp counter is invariant, the graph keeps the
    /// counter and converts it here, to within a few hundred ns.
    pub creation_time: Instant,
    /// The operations it waits for.
    pub dependencies: Vec<OperationId>,
    /// Free text for debugging and profiling.
    pub description: String,
}

/// Where an operation is in its life, from
/// [`OperationGraph::state`](crate::OperationGraph::state).
///
/// ```
/// use cuda_streams_engine::{
///     EventPool, EventPriority, OperationGraph, OperationId, OperationState, OperationType,
/// };
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 1, 0)?));
/// let op = coordinator.register_operation(
///     OperationType::Kernel, EventPriority::Normal, &stream, vec![], "kernel",
/// )?;
/// assert_eq!(coordinator.state(op), Some(OperationState::Registered));
/// coordinator.begin_operation(op, &stream)?;
/// assert_eq!(coordinator.state(op), Some(OperationState::Begun));
/// coordinator.complete_operation(op)?;
/// assert_eq!(coordinator.state(op), Some(OperationState::Completed));
/// stream.synchronize()?; // the GPU is past the completion event
/// coordinator.retire_completed();
/// assert_eq!(coordinator.state(op), Some(OperationState::Retired));
/// assert_eq!(coordinator.state(OperationId(99)), None); // never issued
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationState {
    /// Registered; `begin_operation` not called yet.
    Registered,
    /// `begin_operation` called; `complete_operation` not yet.
    Begun,
    /// `complete_operation` recorded its completion event; the GPU may not
    /// have reached it yet.
    Completed,
    /// The GPU has passed the completion event and the coordinator has
    /// dropped the operation (its metadata is gone).
    Retired,
}
