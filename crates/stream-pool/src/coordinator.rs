//! Coordinating a set of streams, as a view on the engine's operation
//! graph: standing stream dependencies, barriers, parallel host work and
//! completion callbacks are the graph's.

use crate::error::{Error, Result, StreamFailure};
use driver::Stream;
use engine::{BranchError, OperationGraph, OperationType};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// The label of a completion callback's operation, by which the graph's
/// operations in flight are told apart from others on the same stream.
const CALLBACK_LABEL: &str = "completion callback";

/// Dependencies, barriers, parallel execution and completion callbacks over a
/// fixed set of streams: a view on one [`OperationGraph`]
/// ([`graph`](Self::graph)), so the work it orders is made of the graph's
/// operations and can be mixed with the graph's builder.
///
/// Everything here is enqueued on the GPU; nothing blocks the host:
/// a dependency is one `cuEventRecord` on the prerequisite and one
/// `cuStreamWaitEvent` on the dependent, kept as the graph's standing stream
/// dependency ([`OperationGraph::add_stream_dependency`]); a barrier is the
/// graph's barrier node ([`OperationGraph::barrier`]); `execute_parallel` is
/// its parallel node ([`OperationGraph::parallel`]); a completion callback is
/// a host-function operation. Cycles are refused by the workspace's one cycle
/// check (`cuda_streams_engine::cycle`).
///
/// ```
/// use cuda_streams_stream_pool::driver::{Context, Stream};
/// use cuda_streams_stream_pool::MultiStreamCoordinator;
/// let ctx = Context::new(0).unwrap();
/// let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
/// let mut coordinator = MultiStreamCoordinator::new([a.clone(), b.clone()]);
/// coordinator.add_dependency(&b, &a).unwrap(); // b waits for a's work so far
/// let err = coordinator.add_dependency(&a, &b).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     format!("dependency would close a cycle: stream {0} -> stream {1} -> stream {0}", a.id(), b.id())
/// );
/// assert!(!coordinator.has_cycles());
/// coordinator.create_barrier().unwrap();
/// ```
pub struct MultiStreamCoordinator {
    streams: Vec<Arc<Stream>>,
    position: HashMap<u64, usize>,
    /// `None` until the first stream gives it a context. What is in flight
    /// (completion callbacks included) is the graph's to say.
    graph: Option<Arc<OperationGraph>>,
}

impl MultiStreamCoordinator {
    /// Coordinate `streams` (a stream given twice counts once), on a graph of
    /// its own ([`OperationGraph::for_context`] of the first stream's
    /// context).
    pub fn new(streams: impl IntoIterator<Item = Arc<Stream>>) -> Self {
        Self::build(None, streams)
    }

    /// Coordinate `streams` as a view on `graph`, shared with other
    /// coordinators and with code using the graph's builder: the standing
    /// dependencies are the graph's, so every view sees them.
    ///
    /// ```
    /// use cuda_streams_stream_pool::driver::{Context, Stream};
    /// use cuda_streams_stream_pool::engine::OperationGraph;
    /// use cuda_streams_stream_pool::MultiStreamCoordinator;
    /// use std::sync::Arc;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let (a, b, c) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let graph = Arc::new(OperationGraph::for_context(&ctx));
    /// let mut first = MultiStreamCoordinator::with_graph(&graph, [a.clone(), b.clone()]);
    /// let mut second = MultiStreamCoordinator::with_graph(&graph, [b.clone(), c.clone()]);
    /// first.add_dependency(&b, &a)?;
    /// second.add_dependency(&c, &b)?;
    /// // a waiting for c would close a cycle through both views.
    /// assert!(graph.add_stream_dependency(&a, &c).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_graph(
        graph: &Arc<OperationGraph>,
        streams: impl IntoIterator<Item = Arc<Stream>>,
    ) -> Self {
        Self::build(Some(Arc::clone(graph)), streams)
    }

    fn build(
        graph: Option<Arc<OperationGraph>>,
        streams: impl IntoIterator<Item = Arc<Stream>>,
    ) -> Self {
        let mut coordinator = Self {
            streams: Vec::new(),
            position: HashMap::new(),
            graph,
        };
        for stream in streams {
            coordinator.add_stream(stream);
        }
        coordinator
    }

    /// Add a stream (no effect when it is already here).
    pub fn add_stream(&mut self, stream: Arc<Stream>) {
        let id = stream.id();
        if self.position.contains_key(&id) {
            return;
        }
        if self.graph.is_none() {
            self.graph = Some(Arc::new(OperationGraph::for_context(stream.context())));
        }
        self.position.insert(id, self.streams.len());
        self.streams.push(stream);
    }

    /// The coordinated streams, in the order given.
    pub fn streams(&self) -> &[Arc<Stream>] {
        &self.streams
    }

    /// The operation graph this coordinator is a view on (`None` only while
    /// it has no stream: the graph takes its events from the first stream's
    /// context). Use it to mix builder operations with the coordinator's
    /// work: `graph.op(&stream).after(&[...])`, barriers with ids, parallel
    /// nodes whose branches later operations depend on.
    pub fn graph(&self) -> Option<&Arc<OperationGraph>> {
        self.graph.as_ref()
    }

    fn index_of(&self, stream: &Stream) -> Result<usize> {
        self.position
            .get(&stream.id())
            .copied()
            .ok_or(Error::UnknownStream { id: stream.id() })
    }

    /// The graph, once a stream was given (every stream-taking method checks
    /// the stream first, so after `index_of` this is `Some`).
    fn engine(&self, stream: &Stream) -> Result<&OperationGraph> {
        self.graph
            .as_deref()
            .ok_or(Error::UnknownStream { id: stream.id() })
    }

    /// Make work enqueued on `dependent` from now on wait until
    /// `prerequisite` has finished the work enqueued on it so far, and keep
    /// the dependency for [`apply_dependencies`](Self::apply_dependencies).
    ///
    /// Fails, changing nothing, when `prerequisite` already waits for
    /// `dependent` (directly or through other streams): the error names the
    /// cycle, each stream waiting for the next.
    pub fn add_dependency(&mut self, dependent: &Stream, prerequisite: &Stream) -> Result<()> {
        self.index_of(dependent)?;
        self.index_of(prerequisite)?;
        Ok(self
            .engine(dependent)?
            .add_stream_dependency(dependent, prerequisite)?)
    }

    /// Forget a dependency (work already ordered stays ordered). Returns
    /// whether there was one.
    pub fn remove_dependency(&mut self, dependent: &Stream, prerequisite: &Stream) -> bool {
        self.graph
            .as_ref()
            .is_some_and(|graph| graph.remove_stream_dependency(dependent, prerequisite))
    }

    /// The declared dependencies as `(dependent id, prerequisite id)` (the
    /// graph's standing stream dependencies, which other views on a shared
    /// graph add to as well).
    pub fn dependencies(&self) -> Vec<(u64, u64)> {
        self.graph
            .as_ref()
            .map(|graph| graph.stream_dependencies())
            .unwrap_or_default()
    }

    /// Whether the declared dependencies contain a cycle. `add_dependency`
    /// refuses the edge that would close one, so this stays `false`; it is a
    /// check for callers that assert the invariant.
    pub fn has_cycles(&self) -> bool {
        self.graph
            .as_ref()
            .is_some_and(|graph| graph.has_stream_cycles())
    }

    /// Apply every declared dependency again, for the work enqueued since:
    /// prerequisites first (topological order), so a chain `c -> b -> a` puts
    /// `c` after `a`'s current end in one call.
    pub fn apply_dependencies(&self) -> Result<()> {
        match &self.graph {
            Some(graph) => graph.apply_stream_dependencies().map_err(Error::from),
            None => Ok(()),
        }
    }

    /// A barrier: work enqueued on any stream after this call waits until
    /// every stream has finished the work enqueued before it.
    ///
    /// The graph's barrier node ([`OperationGraph::barrier`]): one event per
    /// stream; the first stream waits for the others' events, and the others
    /// wait for the barrier operation's completion event on the first. The
    /// host does not wait. For the barrier's operation id, call
    /// `coordinator.graph()` and its `barrier` directly.
    pub fn create_barrier(&self) -> Result<()> {
        match &self.graph {
            Some(graph) if !self.streams.is_empty() => {
                graph.barrier(&self.streams).map(drop).map_err(Error::from)
            }
            _ => Ok(()),
        }
    }

    /// Run `f(stream)` for every stream at once, one CPU thread each, and
    /// wait for all. Every failure is kept ([`Error::Parallel`], in stream
    /// order); a panic in `f` is caught and reported as a failure.
    ///
    /// The graph's parallel node ([`OperationGraph::parallel`]): each call
    /// is one operation on its stream; to depend on them, call the graph's
    /// `parallel` directly and use the run's `ids()`.
    pub fn execute_parallel<F>(&self, f: F) -> Result<()>
    where
        F: Fn(&Arc<Stream>) -> Result<()> + Sync,
    {
        let Some(graph) = &self.graph else {
            return Ok(());
        };
        let run = graph
            .parallel(&self.streams)
            .label("execute_parallel")
            .run(f);
        let total = run.branches.len();
        let failures: Vec<StreamFailure> = run
            .branches
            .into_iter()
            .filter_map(|branch| {
                branch.error.map(|error| StreamFailure {
                    stream: branch.stream.id(),
                    error: match error {
                        BranchError::Failed(error) => error,
                        BranchError::Panicked(message) => {
                            Error::other(format!("panicked: {message}"))
                        }
                        BranchError::Engine(error) => error.into(),
                        BranchError::Spawn(error) => Error::other(error),
                        other => Error::other(other.to_string()),
                    },
                })
            })
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Parallel { failures, total })
        }
    }

    /// Run `f` once, when the GPU reaches the current end of `stream`
    /// (`cuLaunchHostFunc`), on a driver thread. There is no
    /// `execute_callbacks`: callbacks fire by themselves, not at a
    /// synchronize. `f` must not call the driver (see
    /// `driver::Stream::add_callback`); a panic in it is caught and reported
    /// by the stream (`Stream::check_callback_panics`).
    ///
    /// The callback is the work of one operation of the graph (kind
    /// [`OperationType::Synchronization`], label `completion callback`),
    /// complete once `f` has run.
    pub fn add_completion_callback<F>(&self, stream: &Stream, f: F) -> Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        self.index_of(stream)?;
        // The graph keeps the operation until the GPU has passed it, and
        // its event goes back to the pool then.
        let _op = self
            .engine(stream)?
            .op(stream)
            .kind(OperationType::Synchronization)
            .label(CALLBACK_LABEL)
            .run(|s| s.add_callback(f))?;
        Ok(())
    }

    /// Completion callbacks added on `stream` that have not finished yet:
    /// the graph's callback operations in flight there (its completion
    /// trail). On a graph shared with other views, their completion
    /// callbacks on `stream` count too.
    pub fn pending_callbacks(&self, stream: &Stream) -> Result<usize> {
        self.index_of(stream)?;
        let graph = self.engine(stream)?;
        let callbacks = graph
            .in_flight(stream)
            .into_iter()
            .filter_map(|id| graph.metadata(id))
            .filter(|meta| {
                meta.operation_type == OperationType::Synchronization
                    && meta.description == CALLBACK_LABEL
            })
            .count();
        Ok(callbacks)
    }
}

impl fmt::Debug for MultiStreamCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiStreamCoordinator")
            .field(
                "streams",
                &self.streams.iter().map(|s| s.id()).collect::<Vec<_>>(),
            )
            .field("dependencies", &self.dependencies())
            .finish_non_exhaustive()
    }
}
