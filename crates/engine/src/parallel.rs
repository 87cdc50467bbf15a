//! The parallel node: host code run once per stream, each on its own CPU
//! thread, each as an operation of the graph.

use crate::error::Error;
use crate::graph::OperationGraph;
use crate::op::Op;
use crate::operation::{OperationId, OperationType};
use driver::{Stream, panic_message};
use std::borrow::Borrow;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// Host code to run on several streams at once, from
/// [`OperationGraph::parallel`]; [`run`](Self::run) runs it.
///
/// ```
/// use cuda_streams_engine::OperationGraph;
/// use cuda_streams_engine::driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
/// use std::sync::Mutex;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let streams = [Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?];
/// let graph = OperationGraph::for_context(&ctx);
/// let buffers: Vec<Mutex<DeviceBuffer<u32>>> = (0..3)
///     .map(|_| DeviceBuffer::new(&ctx, 64).map(Mutex::new))
///     .collect::<Result<_, _>>()?;
/// // One thread per stream, each filling its own buffer.
/// let run = graph.parallel(&streams).label("fill").run(|stream| {
///     let i = streams.iter().position(|s| s.id() == stream.id()).unwrap();
///     let mut buffer = buffers[i].lock().unwrap();
///     stream.memset_u32_async(&mut *buffer, i as u32 + 1)
/// });
/// assert!(run.is_ok());
/// // An operation after every branch sees every branch's work.
/// let mut host = PinnedBuffer::<u32>::new(&ctx, 64)?;
/// let last = buffers[2].lock().unwrap();
/// let read = graph.op(&streams[0]).after(&run.ids())
///     .run(|s| s.copy_to_host_async(&mut host, &*last))?;
/// read.wait()?;
/// assert!(host.as_slice()?.iter().all(|&v| v == 3));
/// # Ok(())
/// # }
/// ```
#[must_use = "a parallel node does nothing until `run`"]
pub struct ParallelBuilder<'g> {
    graph: &'g OperationGraph,
    streams: Vec<Arc<Stream>>,
    after: Vec<OperationId>,
    label: String,
    kind: OperationType,
}

/// Why one branch of a parallel node failed, in [`Branch::error`].
#[derive(Debug)]
#[non_exhaustive]
pub enum BranchError<E> {
    /// The closure returned this error.
    Failed(E),
    /// The closure panicked; the panic's message. The panic was caught, the
    /// other branches ran on.
    Panicked(String),
    /// The graph could not run the branch as an operation: the closure did
    /// not run (e.g. an unknown dependency given to `after`), or it ran and
    /// its completion event could not be recorded.
    Engine(Error),
    /// The branch's thread could not be started; the closure did not run.
    Spawn(std::io::Error),
}

impl<E: fmt::Display> fmt::Display for BranchError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BranchError::Failed(err) => err.fmt(f),
            BranchError::Panicked(message) => write!(f, "panicked: {message}"),
            BranchError::Engine(err) => err.fmt(f),
            BranchError::Spawn(err) => write!(f, "starting the branch's thread failed: {err}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BranchError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BranchError::Failed(err) => Some(err),
            BranchError::Panicked(_) => None,
            BranchError::Engine(err) => Some(err),
            BranchError::Spawn(err) => Some(err),
        }
    }
}

/// One stream's branch of a parallel node.
#[derive(Debug)]
#[non_exhaustive]
pub struct Branch<E> {
    /// The stream it ran on.
    pub stream: Arc<Stream>,
    /// Its operation, when the graph ran it as one: complete after whatever
    /// the closure enqueued, even when the closure failed or panicked, so
    /// depending on it never hangs.
    pub op: Option<Op>,
    /// What went wrong, or `None`.
    pub error: Option<BranchError<E>>,
}

/// What a parallel node did, from [`ParallelBuilder::run`]: every branch, in
/// the order the streams were given, each failure kept.
#[derive(Debug)]
#[must_use = "a parallel node's failures are in its branches"]
pub struct ParallelRun<E> {
    /// Each stream's branch.
    pub branches: Vec<Branch<E>>,
}

impl<E> ParallelRun<E> {
    /// The branches' operation ids (of every branch the graph ran as an
    /// operation, failed or not), to make later operations depend on all
    /// of them.
    pub fn ids(&self) -> Vec<OperationId> {
        self.branches
            .iter()
            .filter_map(|b| b.op.as_ref().map(Op::id))
            .collect()
    }

    /// Whether every branch succeeded.
    pub fn is_ok(&self) -> bool {
        self.branches.iter().all(|b| b.error.is_none())
    }

    /// The branches that failed, in stream order.
    pub fn failures(&self) -> impl Iterator<Item = &Branch<E>> {
        self.branches.iter().filter(|b| b.error.is_some())
    }

    /// Block until the GPU has finished every branch's operation.
    pub fn wait(&self) -> crate::Result<()> {
        self.branches
            .iter()
            .filter_map(|b| b.op.as_ref())
            .try_for_each(Op::wait)
    }
}

impl OperationGraph {
    /// Describe host code to run once per stream of `streams`, each on its
    /// own CPU thread at the same time, each as an operation of this graph
    /// (kind [`OperationType::Kernel`] unless set): the branch's stream
    /// first waits for the dependencies given to
    /// [`after`](ParallelBuilder::after), then the closure enqueues its work,
    /// then the operation completes. [`ParallelBuilder::run`] runs it.
    pub fn parallel<S: Borrow<Stream>>(&self, streams: &[S]) -> ParallelBuilder<'_> {
        ParallelBuilder {
            graph: self,
            streams: streams.iter().map(|s| s.borrow().to_arc()).collect(),
            after: Vec::new(),
            label: "parallel".to_string(),
            kind: OperationType::Kernel,
        }
    }
}

impl ParallelBuilder<'_> {
    /// Every branch runs after these operations.
    pub fn after(mut self, dependencies: &[OperationId]) -> Self {
        self.after.extend_from_slice(dependencies);
        self
    }

    /// A name for the branches' operations (default `parallel`).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// What kind of work the branches are (metadata).
    pub fn kind(mut self, kind: OperationType) -> Self {
        self.kind = kind;
        self
    }

    /// Run `f(stream)` for every stream at once, one CPU thread each (named
    /// `stream-<id>`), and wait for all of them on the host (not for their
    /// GPU work). Every failure is kept, each in its branch; a panic in `f`
    /// is caught and becomes [`BranchError::Panicked`]. A branch whose
    /// closure failed is still a completed operation, ordered after whatever
    /// it enqueued.
    pub fn run<F, E>(self, f: F) -> ParallelRun<E>
    where
        F: Fn(&Arc<Stream>) -> Result<(), E> + Sync,
        E: Send,
    {
        let ParallelBuilder {
            graph,
            streams,
            after,
            label,
            kind,
        } = self;
        let (f, after, label) = (&f, &after[..], &label[..]);
        let branches = std::thread::scope(|scope| {
            let handles: Vec<_> = streams
                .iter()
                .map(|stream| {
                    std::thread::Builder::new()
                        .name(format!("stream-{}", stream.id()))
                        .spawn_scoped(scope, move || branch(graph, stream, after, label, kind, f))
                })
                .collect();
            handles
                .into_iter()
                .zip(&streams)
                .map(|(handle, stream)| {
                    let (op, error) = match handle {
                        Ok(handle) => handle.join().unwrap_or_else(|panic| {
                            let message = panic_message(panic.as_ref());
                            (None, Some(BranchError::Panicked(message)))
                        }),
                        Err(spawn) => (None, Some(BranchError::Spawn(spawn))),
                    };
                    Branch {
                        stream: Arc::clone(stream),
                        op,
                        error,
                    }
                })
                .collect()
        });
        ParallelRun { branches }
    }
}

/// One branch, on its own thread: the closure as the work of one operation.
fn branch<F, E>(
    graph: &OperationGraph,
    stream: &Arc<Stream>,
    after: &[OperationId],
    label: &str,
    kind: OperationType,
    f: &F,
) -> (Option<Op>, Option<BranchError<E>>)
where
    F: Fn(&Arc<Stream>) -> Result<(), E>,
{
    let mut outcome = None;
    let op = graph
        .op(stream)
        .after(after)
        .kind(kind)
        .label(label.to_string())
        .run(|_| {
            outcome = Some(match catch_unwind(AssertUnwindSafe(|| f(stream))) {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(BranchError::Failed(err)),
                Err(panic) => Some(BranchError::Panicked(panic_message(panic.as_ref()))),
            });
            // The closure's failure is the branch's, not the operation's:
            // the operation completes either way.
            Ok(())
        });
    match (op, outcome) {
        (Ok(op), outcome) => (Some(op), outcome.flatten()),
        (Err(err), Some(Some(failure))) => {
            tracing::error!(
                stream = stream.id(),
                "a parallel branch failed ({}) and its operation could not complete: {err}",
                match &failure {
                    BranchError::Panicked(_) => "panicked",
                    _ => "returned an error",
                }
            );
            (None, Some(failure))
        }
        (Err(err), _) => (None, Some(BranchError::Engine(err))),
    }
}
