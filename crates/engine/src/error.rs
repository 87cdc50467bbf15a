//! The event-coordination layer's error type.

/// Everything event coordination can fail with.
///
/// Each message names the ids and values involved:
///
/// ```
/// use cuda_streams_engine::{
///     Error, EventPool, EventPriority, OperationGraph, OperationId, OperationType,
/// };
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 1, 0)?));
/// let err = coordinator
///     .register_operation(
///         OperationType::Kernel, EventPriority::Normal, &stream, vec![OperationId(42)], "orphan",
///     )
///     .unwrap_err();
/// assert!(matches!(err, Error::UnknownDependency { dependency: OperationId(42), .. }));
/// assert!(err.to_string().contains("depend on operation 42"), "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the safe driver layer failed.
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// An operation id this coordinator never issued (or whose registration failed).
    #[error("{operation} is unknown to this coordinator ({call})")]
    UnknownOperation {
        /// The id given.
        operation: crate::OperationId,
        /// The call that was given it, e.g. `begin_operation`.
        call: &'static str,
    },
    /// Registering an operation with a dependency this coordinator never issued.
    #[error("{operation} cannot depend on {dependency}: no such operation was registered")]
    UnknownDependency {
        /// The operation being registered (its id is not usable).
        operation: crate::OperationId,
        /// The unknown dependency.
        dependency: crate::OperationId,
    },
    /// A dependency that would close a cycle: each operation waits for the next.
    #[error("dependency would close a cycle: {}", crate::cycle::describe(.cycle, |id| id.to_string()))]
    Cycle {
        /// The operations on the cycle, first and last the same.
        cycle: Vec<crate::OperationId>,
    },
    /// A standing stream dependency that would make a stream wait,
    /// transitively, for itself: each stream waits for the next.
    #[error("dependency would close a cycle: {}", crate::cycle::describe(.path, |id| format!("stream {id}")))]
    StreamCycle {
        /// The stream ids along the cycle, first and last the same.
        path: Vec<u64>,
    },
    /// Work enqueued by an operation built with
    /// [`OperationGraph::op`](crate::OperationGraph::op) failed; the operation
    /// was completed anyway, so nothing waits on it forever.
    #[error("{}", crate::race_hint::failed(.operation, .label, .source))]
    OperationFailed {
        /// The operation.
        operation: crate::OperationId,
        /// Its label.
        label: String,
        /// What its work returned. Another crate's error that `?` carried
        /// out of the work is [`driver::Error::Other`]:
        /// `source.downcast_ref::<E>()` gives it back as its own type.
        #[source]
        source: driver::Error,
    },
    /// A captured operation made to depend on an id its capture never
    /// issued: one of another capture, or one not captured (yet).
    #[error("{operation} cannot depend on {dependency}: {reason}")]
    UnknownCaptureDependency {
        /// The operation being captured (its id is not usable).
        operation: crate::CaptureOpId,
        /// The dependency given.
        dependency: crate::CaptureOpId,
        /// Why it is unknown.
        reason: &'static str,
    },
    /// Work of a captured operation ([`crate::CaptureOpBuilder::run`])
    /// failed; the operation was not captured.
    #[error("{}", crate::race_hint::failed(.operation, .label, .source))]
    CapturedOperationFailed {
        /// The operation.
        operation: crate::CaptureOpId,
        /// Its label.
        label: String,
        /// What its work returned (boxed: the id is wider than an
        /// `OperationId`, and `Error` stays small).
        #[source]
        source: Box<driver::Error>,
    },
    /// An operation made to depend on itself.
    #[error("{operation} cannot depend on itself")]
    SelfDependency {
        /// The operation.
        operation: crate::OperationId,
    },
    /// Beginning an operation whose dependency has not been completed with
    /// `complete_operation` (its completion event is not recorded yet, and a
    /// wait on it would silently not wait).
    #[error(
        "cannot begin {operation}: its dependency {dependency} is {state}, not completed (call complete_operation on it first)"
    )]
    DependencyNotComplete {
        /// The operation being begun.
        operation: crate::OperationId,
        /// The dependency that is not complete.
        dependency: crate::OperationId,
        /// Where the dependency is: `registered` or `begun`.
        state: &'static str,
    },
    /// `begin_operation` on an operation already begun.
    #[error("{operation} was already begun")]
    AlreadyBegun {
        /// The operation.
        operation: crate::OperationId,
    },
    /// `begin_operation` or `complete_operation` on an operation already completed.
    #[error("{operation} was already completed")]
    AlreadyCompleted {
        /// The operation.
        operation: crate::OperationId,
    },
    /// `complete_operation` on an operation that was never begun.
    #[error("cannot complete {operation}: it was never begun (call begin_operation first)")]
    NotBegun {
        /// The operation.
        operation: crate::OperationId,
    },
    /// `begin_operation` with a stream other than the one the operation was registered on.
    #[error("{operation} was registered on stream {registered} but begun on stream {given}")]
    StreamMismatch {
        /// The operation.
        operation: crate::OperationId,
        /// The stream it was registered on.
        registered: u64,
        /// The stream given to `begin_operation`.
        given: u64,
    },
    /// The async waiter's background thread could not be started.
    #[error("starting the async event waiter's thread failed: {0}")]
    Spawn(#[source] std::io::Error),
    /// A barrier over no streams.
    #[error("a cross-stream barrier needs at least one stream, got 0")]
    EmptyBarrier,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of the operation graph inside work that returns a driver `Result`
/// (the closure of an operation graph's operation): a driver failure comes
/// back as itself, anything else as [`driver::Error::Other`], which keeps
/// it whole.
impl From<Error> for driver::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Driver(error) => error,
            other => driver::Error::other(other),
        }
    }
}
