//! What the coordinator knows about one operation: its id, kind, priority and
//! metadata.

use std::fmt;
use std::time::Instant;

/// An operation's id within one [`crate::OperationCoordinator`]: issued in
/// registration order, from 1, never reused.
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
/// are [`OperationId`] rather than bare `u64`).
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
    /// When it was registered.
    pub creation_time: Instant,
    /// The operations it waits for.
    pub dependencies: Vec<OperationId>,
    /// Free text for debugging and profiling.
    pub description: String,
}

/// Where an operation is in its life.
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
