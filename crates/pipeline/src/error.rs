//! The pipeline crate's error type.

use crate::ids::{BufferId, StageId};
use crate::slot_state::SlotState;

/// Everything the pipeline can fail with.
///
/// Messages name the value at fault, e.g. an operation id the coordinator
/// never handed out:
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{AsyncCoordinator, Error, OperationId};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut coordinator = AsyncCoordinator::new(&ctx)?;
/// let err = coordinator.wait(OperationId(42)).unwrap_err();
/// assert!(matches!(err, Error::UnknownOperation { id: OperationId(42), next: OperationId(1) }));
/// assert_eq!(
///     err.to_string(),
///     "operation 42 is unknown to this coordinator (the next id would be operation 1)"
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the safe driver layer failed.
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// The operation graph under the coordinator refused something.
    #[error(transparent)]
    Graph(#[from] engine::Error),
    /// The stream pool failed.
    #[error(transparent)]
    Pool(#[from] pool::Error),
    /// A triple-buffer slot was asked to move where its state machine does not go.
    #[error("triple-buffer slot {slot}: illegal transition {from:?} -> {to:?}{held}", held = if *.held { " (a guard still holds it)" } else { "" })]
    IllegalTransition {
        /// The slot index (0..3).
        slot: usize,
        /// Its state when the transition was attempted.
        from: SlotState,
        /// The state asked for.
        to: SlotState,
        /// Whether a guard held the slot at the time.
        held: bool,
    },
    /// An operation id that this coordinator never handed out.
    #[error("{id} is unknown to this coordinator (the next id would be {next})")]
    UnknownOperation {
        /// The id asked for.
        id: crate::OperationId,
        /// The next id the coordinator will hand out.
        next: crate::OperationId,
    },
    /// Host and device sides of a copy differ in length.
    #[error(
        "{operation}: the device buffer holds {device} element(s) but the host side holds {host}"
    )]
    LengthMismatch {
        /// The operation.
        operation: &'static str,
        /// Device buffer length.
        device: usize,
        /// Host length.
        host: usize,
    },
    /// A stage id that was never handed out by `add_stage`.
    #[error("{stage} does not exist (the manager has {stages} stage(s))")]
    UnknownStage {
        /// The id asked for.
        stage: StageId,
        /// How many stages exist.
        stages: usize,
    },
    /// A stage listed twice in an order.
    #[error("{stage} ({name:?}) appears more than once in the order")]
    DuplicateStage {
        /// The stage.
        stage: StageId,
        /// The stage's name.
        name: String,
    },
    /// A stage reads a buffer that is neither a pipeline input nor written by an earlier stage.
    #[error(
        "{stage} ({name:?}) reads {buffer}, which is neither a pipeline input nor written by an earlier stage"
    )]
    ReadBeforeWrite {
        /// The stage.
        stage: StageId,
        /// The stage's name.
        name: String,
        /// The buffer.
        buffer: BufferId,
    },
    /// The stages' data flow forms a cycle.
    #[error("the stages' data flow forms a cycle: {cycle}")]
    StageCycle {
        /// The stages on the cycle, e.g. `0 "a" -> 1 "b" -> 0 "a"`.
        cycle: String,
    },
    /// A stage passes a buffer to its kernel that it does not declare.
    #[error(
        "{stage} ({name:?}) passes {buffer} to its kernel without listing it in input_buffers or output_buffers"
    )]
    UndeclaredBuffer {
        /// The stage.
        stage: StageId,
        /// The stage's name.
        name: String,
        /// The buffer.
        buffer: BufferId,
    },
    /// A stage's arguments do not fit its kernel's signature over the
    /// pipeline's buffers: a count or scalar type that differs, or buffers
    /// of an element type the kernel does not take (its buffer parameters
    /// must be `T*` of the pipeline's `T`).
    #[error("{stage} ({name:?}): {source}")]
    StageArguments {
        /// The stage.
        stage: StageId,
        /// The stage's name.
        name: String,
        /// What the kernel's signature check said.
        #[source]
        source: driver::Error,
    },
    /// A buffer that is not one of the pipeline's inputs, where an input is needed.
    #[error("{buffer} is not a pipeline input")]
    NotAnInput {
        /// The buffer.
        buffer: BufferId,
    },
    /// A buffer that is not one of the pipeline's outputs, where an output is needed.
    #[error("{buffer} is not a pipeline output")]
    NotAnOutput {
        /// The buffer.
        buffer: BufferId,
    },
    /// The pipeline was run before `set_order`.
    #[error("the pipeline has no execution order: call set_order first")]
    NoOrder,
    /// Something about the pipeline's configuration is not usable.
    #[error("invalid pipeline configuration: {0}")]
    InvalidConfig(String),
    /// An environment variable holds a value that cannot be used (the
    /// message names the variable and the value).
    #[error(transparent)]
    InvalidEnv(#[from] driver::sys::env::EnvError),
    /// A batch does not match the arrays the planner was built for.
    #[error("batch key {key:?}: {reason}")]
    BatchMismatch {
        /// The key.
        key: String,
        /// What does not match.
        reason: String,
    },
    /// A process loader's worker died (killed, crashed, a fill that
    /// panicked, or exited) while it held a job.
    #[error("process loader: worker {worker} (pid {pid}) {status} {}", holding(*.batch))]
    WorkerDied {
        /// The worker's index.
        worker: usize,
        /// Its process id.
        pid: u32,
        /// The batch it was filling, if it held one.
        batch: Option<u64>,
        /// How it ended, e.g. "was killed by signal 9".
        status: String,
    },
    /// A process loader's batch did not arrive within its deadline.
    #[error(
        "process loader: batch {batch} did not arrive within {waited:?}: worker {worker} (pid {pid}) holds it"
    )]
    WorkerTimeout {
        /// The worker holding the batch.
        worker: usize,
        /// Its process id.
        pid: u32,
        /// The batch waited for.
        batch: u64,
        /// The deadline.
        waited: std::time::Duration,
    },
    /// A process loader waited past its deadline for an upload to finish
    /// reading a slot: every slot was behind an upload, so no worker could
    /// fill the next batch (the GPU stream is stalled or far behind).
    #[error(
        "process loader: batch {batch} waits for a free slot, but the upload of slot {slot} \
         (stream {stream}) did not complete within {waited:?}"
    )]
    UploadTimeout {
        /// The batch waiting for a slot.
        batch: u64,
        /// The oldest slot behind an upload.
        slot: usize,
        /// The stream of the upload waited for.
        stream: u64,
        /// The deadline.
        waited: std::time::Duration,
    },
    /// A process loader could not set up its processes or memory.
    #[error("process loader: {what}: {source}")]
    LoaderIo {
        /// What it was doing.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A process loader that failed earlier was asked again; the message is
    /// the first error's.
    #[error("the process loader failed earlier: {0}")]
    LoaderFailed(String),
    /// The managed context was asked for something its mode does not have.
    #[error("{0}")]
    Mode(&'static str),
}

/// The end of [`Error::WorkerDied`]'s message: the batch a worker held.
fn holding(batch: Option<u64>) -> String {
    match batch {
        Some(batch) => format!("while filling batch {batch}"),
        None => "while holding no batch".to_owned(),
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of the pipeline inside work that returns a driver `Result`
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
