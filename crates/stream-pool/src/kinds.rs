//! The vocabulary the pool hands streams out by: strategies, workload types
//! and stream purposes, and how they map to the engine's operation types.
//!
//! How the kinds of work map to one another (`From` below) is tabled in
//! `docs/stream-pool.md`, "The kinds of work".

use driver::StreamPriority;
/// The engine's operation types, which the pool's kinds map to.
pub use engine::OperationType;
use std::fmt;

/// How [`crate::StreamPool::get_stream`] picks a stream, and how the other
/// getters pick within the streams they may use.
///
/// | strategy | `get_stream()` | within a workload's or class's streams |
/// | --- | --- | --- |
/// | `RoundRobin` | every shared stream in turn | in turn |
/// | `LoadBalanced` | the stream with the least live work (see below) | the same, among those streams |
/// | `Priority` | an idle stream of the most urgent class that has one; all busy: the High class in turn | in turn |
/// | `Workload` | `get_stream_for_workload(WorkloadType::Mixed)` | in turn |
///
/// *Live work* is asked of the driver, not counted on the host: the candidates
/// are queried (`cuStreamQuery`) from a rotating start and the first idle one
/// wins; when all are busy, the one with the fewest operations enqueued since
/// a query last found it idle wins. Looking enqueues nothing on the
/// candidates (no probe events). So a stream busy with one long kernel is
/// avoided even though it was handed out only once.
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{AllocationStrategy, StreamPool};
/// use std::collections::HashSet;
/// use std::sync::{Arc, mpsc};
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let pool = StreamPool::new(&ctx, 4)?;
/// assert_eq!(pool.strategy(), AllocationStrategy::RoundRobin); // the default
/// let ids: HashSet<u64> = (0..4).map(|_| pool.get_stream().id()).collect();
/// assert_eq!(ids.len(), 4); // each stream in turn
///
/// pool.set_strategy(AllocationStrategy::LoadBalanced);
/// let busy = Arc::clone(pool.streams().next().unwrap());
/// let (open, gate) = mpsc::channel::<()>();
/// busy.add_callback(move || {
///     let _ = gate.recv(); // holds `busy` until `open` is dropped
/// })?;
/// assert!((0..8).all(|_| pool.get_stream().id() != busy.id()));
/// drop(open);
/// busy.synchronize()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AllocationStrategy {
    /// Hand the streams out in turn: one atomic increment, no driver call.
    #[default]
    RoundRobin,
    /// Prefer idle streams, then the least live work (driver queries).
    LoadBalanced,
    /// Prefer the most urgent priority class that has an idle stream.
    Priority,
    /// Route by workload type: `get_stream()` serves [`WorkloadType::Mixed`].
    Workload,
}

impl AllocationStrategy {
    /// Every strategy.
    pub const ALL: [Self; 4] = [
        Self::RoundRobin,
        Self::LoadBalanced,
        Self::Priority,
        Self::Workload,
    ];

    pub(crate) fn to_u8(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_u8(value: u8) -> Self {
        Self::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or_default()
    }
}

/// What kind of work a stream is wanted for. Each type is served by a
/// contiguous run of the pool's streams (ordered most urgent first), which
/// [`crate::StreamPool::optimize_configuration`] may resize from measured load.
///
/// Default assignment: `Compute` the High class, `Memory` the first half of
/// the Normal class, `Mixed` its second half, `Coordination` the Low class
/// (an empty class borrows its nearest neighbour's streams).
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{AllocationStrategy, StreamPool, WorkloadType};
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let pool = StreamPool::new_with_strategy(&ctx, 8, AllocationStrategy::Workload)?;
/// for workload in WorkloadType::ALL {
///     let stream = pool.get_stream_for_workload(workload);
///     assert_eq!(pool.class_of(&stream), Some(workload.default_class()));
/// }
/// // Memory and Mixed split the Normal class between them.
/// let ids = |workload| pool.workload_streams(workload).iter().map(|s| s.id()).collect::<Vec<_>>();
/// let memory = ids(WorkloadType::Memory);
/// assert!(ids(WorkloadType::Mixed).iter().all(|id| !memory.contains(id)));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadType {
    /// Computation-heavy kernels (matrix products, convolutions).
    Compute,
    /// Memory-bound work: large transfers and copies.
    Memory,
    /// Balanced compute and memory (general network layers).
    Mixed,
    /// Synchronisation work: barriers, event waits, bookkeeping.
    Coordination,
}

impl WorkloadType {
    /// Every workload type, in the order their streams are laid out (most urgent first).
    pub const ALL: [Self; 4] = [Self::Compute, Self::Memory, Self::Mixed, Self::Coordination];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The priority class whose streams serve this type by default.
    pub fn default_class(self) -> StreamPriority {
        match self {
            Self::Compute => StreamPriority::High,
            Self::Memory | Self::Mixed => StreamPriority::Normal,
            Self::Coordination => StreamPriority::Low,
        }
    }
}

/// A fixed role for a stream, as a pipeline stage uses it
/// ([`crate::StreamPool::get_stream_for_purpose`]). A purpose always gets the
/// same stream, so work of one purpose stays in order; different purposes get
/// different streams while the pool has at least five.
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{StreamPool, StreamPurpose};
/// use std::collections::HashSet;
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let pool = StreamPool::new(&ctx, 8)?;
/// let kernels = pool.get_stream_for_purpose(StreamPurpose::KernelExecution);
/// assert_eq!(kernels.id(), pool.get_stream_for_purpose(StreamPurpose::KernelExecution).id());
/// let mut ids = HashSet::new();
/// for purpose in StreamPurpose::ALL {
///     let stream = pool.get_stream_for_purpose(purpose);
///     assert_eq!(pool.class_of(&stream), Some(purpose.preferred_class()));
///     ids.insert(stream.id());
/// }
/// assert_eq!(ids.len(), StreamPurpose::ALL.len()); // one stream each
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamPurpose {
    /// Host-to-device uploads: the pipeline's upload stream. The seed named
    /// it for the configuration its demo uploaded; any upload uses it.
    ConfigUpload,
    /// The main compute kernels: the pipeline's compute stream.
    KernelExecution,
    /// Device-to-host downloads: the pipeline's download stream. The seed
    /// named it for the telemetry its demo downloaded; any download uses it.
    TelemetryDownload,
    /// Peer-to-peer copies between GPUs.
    P2PTransfer,
    /// Auxiliary kernels beside the main ones.
    AuxCompute,
}

impl StreamPurpose {
    /// Every purpose.
    pub const ALL: [Self; 5] = [
        Self::ConfigUpload,
        Self::KernelExecution,
        Self::TelemetryDownload,
        Self::P2PTransfer,
        Self::AuxCompute,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The priority class this purpose prefers: kernels High, transfers
    /// Normal, peer copies and auxiliary kernels Low.
    pub fn preferred_class(self) -> StreamPriority {
        match self {
            Self::KernelExecution => StreamPriority::High,
            Self::ConfigUpload | Self::TelemetryDownload => StreamPriority::Normal,
            Self::P2PTransfer | Self::AuxCompute => StreamPriority::Low,
        }
    }
}

impl fmt::Display for StreamPurpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ConfigUpload => "config upload",
            Self::KernelExecution => "kernel execution",
            Self::TelemetryDownload => "telemetry download",
            Self::P2PTransfer => "P2P transfer",
            Self::AuxCompute => "aux compute",
        })
    }
}

impl From<StreamPurpose> for OperationType {
    /// What the work of a stream with this role is: copies or kernels.
    fn from(purpose: StreamPurpose) -> Self {
        match purpose {
            StreamPurpose::ConfigUpload
            | StreamPurpose::TelemetryDownload
            | StreamPurpose::P2PTransfer => Self::MemoryTransfer,
            StreamPurpose::KernelExecution | StreamPurpose::AuxCompute => Self::Kernel,
        }
    }
}

impl From<OperationType> for WorkloadType {
    /// The class of streams an operation of this type belongs on.
    fn from(operation: OperationType) -> Self {
        match operation {
            OperationType::Kernel => Self::Compute,
            OperationType::MemoryTransfer => Self::Memory,
            OperationType::Reduction | OperationType::Broadcast | OperationType::AllReduce => {
                Self::Mixed
            }
            OperationType::Synchronization | OperationType::Barrier => Self::Coordination,
        }
    }
}

impl From<StreamPurpose> for WorkloadType {
    /// Through the purpose's [`OperationType`].
    fn from(purpose: StreamPurpose) -> Self {
        OperationType::from(purpose).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_purpose_maps_to_the_workload_of_its_operation_type() {
        for purpose in StreamPurpose::ALL {
            let workload = WorkloadType::from(OperationType::from(purpose));
            assert_eq!(WorkloadType::from(purpose), workload);
            // A transfer role never lands on the compute class, nor a kernel
            // role on the memory class.
            let kernel = matches!(
                purpose,
                StreamPurpose::KernelExecution | StreamPurpose::AuxCompute
            );
            assert_eq!(workload == WorkloadType::Compute, kernel, "{purpose}");
            assert_eq!(workload == WorkloadType::Memory, !kernel, "{purpose}");
        }
        for operation in OperationType::ALL {
            let workload = WorkloadType::from(operation);
            assert_eq!(
                workload == WorkloadType::Coordination,
                matches!(
                    operation,
                    OperationType::Synchronization | OperationType::Barrier
                ),
                "{operation:?}"
            );
        }
    }

    #[test]
    fn strategy_round_trips_through_u8() {
        for strategy in AllocationStrategy::ALL {
            assert_eq!(AllocationStrategy::from_u8(strategy.to_u8()), strategy);
        }
    }
}
