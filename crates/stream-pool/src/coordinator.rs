//! Coordinating a set of streams: declared dependencies (acyclic, checked
//! with petgraph), barriers, parallel host work and completion callbacks.

use crate::error::{Error, Result, StreamFailure};
use driver::Stream;
use petgraph::algo::{is_cyclic_directed, toposort};
use petgraph::graphmap::DiGraphMap;
use std::collections::HashMap;
use std::fmt;
use std::hash::RandomState;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Stream ids; an edge `a -> b` means "a waits for b".
type WaitGraph = DiGraphMap<u64, (), RandomState>;

/// Dependencies, barriers, parallel execution and completion callbacks over a
/// fixed set of streams.
///
/// Everything here is enqueued on the GPU; nothing blocks the host:
/// a dependency is one `cuEventRecord` on the prerequisite and one
/// `cuStreamWaitEvent` on the dependent ([`Stream::wait_stream`]), a barrier
/// one event per stream ([`Stream::barrier`]), all from the context's event
/// pool. Cycles are refused by the workspace's one cycle check
/// (`cuda_streams_engine::cycle`).
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
    graph: WaitGraph,
    pending: Vec<Arc<AtomicUsize>>,
}

impl MultiStreamCoordinator {
    /// Coordinate `streams` (a stream given twice counts once).
    pub fn new(streams: impl IntoIterator<Item = Arc<Stream>>) -> Self {
        let mut coordinator = Self {
            streams: Vec::new(),
            position: HashMap::new(),
            graph: WaitGraph::default(),
            pending: Vec::new(),
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
        self.position.insert(id, self.streams.len());
        self.graph.add_node(id);
        self.streams.push(stream);
        self.pending.push(Arc::default());
    }

    /// The coordinated streams, in the order given.
    pub fn streams(&self) -> &[Arc<Stream>] {
        &self.streams
    }

    fn index_of(&self, stream: &Stream) -> Result<usize> {
        self.position
            .get(&stream.id())
            .copied()
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
        let (d, p) = (dependent.id(), prerequisite.id());
        if let Some(cycle) = engine::cycle::closes_cycle(&self.graph, d, p) {
            return Err(Error::Cycle { path: cycle });
        }
        dependent.wait_stream(prerequisite)?;
        self.graph.add_edge(d, p, ());
        Ok(())
    }

    /// Forget a dependency (work already ordered stays ordered). Returns
    /// whether there was one.
    pub fn remove_dependency(&mut self, dependent: &Stream, prerequisite: &Stream) -> bool {
        self.graph
            .remove_edge(dependent.id(), prerequisite.id())
            .is_some()
    }

    /// The declared dependencies as `(dependent id, prerequisite id)`.
    pub fn dependencies(&self) -> Vec<(u64, u64)> {
        self.graph.all_edges().map(|(d, p, _)| (d, p)).collect()
    }

    /// Whether the declared dependencies contain a cycle. `add_dependency`
    /// refuses the edge that would close one, so this stays `false`; it is a
    /// check for callers that assert the invariant.
    pub fn has_cycles(&self) -> bool {
        is_cyclic_directed(&self.graph)
    }

    /// Apply every declared dependency again, for the work enqueued since:
    /// prerequisites first (topological order), so a chain `c -> b -> a` puts
    /// `c` after `a`'s current end in one call.
    pub fn apply_dependencies(&self) -> Result<()> {
        let order = toposort(&self.graph, None).map_err(|cycle| Error::Cycle {
            path: vec![cycle.node_id(), cycle.node_id()],
        })?;
        for &id in order.iter().rev() {
            let dependent = &self.streams[self.position[&id]];
            for prerequisite in self.graph.neighbors(id) {
                dependent.wait_stream(&self.streams[self.position[&prerequisite]])?;
            }
        }
        Ok(())
    }

    /// A barrier: work enqueued on any stream after this call waits until
    /// every stream has finished the work enqueued before it.
    ///
    /// One event per stream, recorded at each stream's current end, then each
    /// stream waits on every other stream's event. The host does not wait.
    pub fn create_barrier(&self) -> Result<()> {
        let streams: Vec<&Stream> = self.streams.iter().map(|s| &**s).collect();
        Ok(Stream::barrier(&streams)?)
    }

    /// Run `f(stream)` for every stream at once, one CPU thread each, and
    /// wait for all. Every failure is kept ([`Error::Parallel`], in stream
    /// order); a panic in `f` is caught and reported as a failure.
    pub fn execute_parallel<F>(&self, f: F) -> Result<()>
    where
        F: Fn(&Arc<Stream>) -> Result<()> + Sync,
    {
        let f = &f;
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .streams
                .iter()
                .map(|stream| {
                    std::thread::Builder::new()
                        .name(format!("stream-{}", stream.id()))
                        .spawn_scoped(scope, move || run_caught(f, stream))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| match handle {
                    Ok(handle) => handle
                        .join()
                        .unwrap_or_else(|_| Err(Error::other("the worker thread panicked"))),
                    Err(spawn) => Err(Error::other(spawn)),
                })
                .collect()
        });
        let failures: Vec<StreamFailure> = results
            .into_iter()
            .zip(&self.streams)
            .filter_map(|(result, stream)| {
                result.err().map(|error| StreamFailure {
                    stream: stream.id(),
                    error,
                })
            })
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Parallel {
                failures,
                total: self.streams.len(),
            })
        }
    }

    /// Run `f` once, when the GPU reaches the current end of `stream`
    /// (`cuLaunchHostFunc`), on a driver thread. There is no
    /// `execute_callbacks`: callbacks fire by themselves, not at a
    /// synchronize. `f` must not call the driver (see
    /// `driver::Stream::add_callback`); a panic in it is caught.
    pub fn add_completion_callback<F>(&self, stream: &Stream, f: F) -> Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        let index = self.index_of(stream)?;
        let pending = Arc::clone(&self.pending[index]);
        pending.fetch_add(1, Ordering::AcqRel);
        let settle = Settle(Arc::clone(&pending));
        // When the driver refuses the callback, the closure is dropped unrun
        // and its `Settle` undoes the count.
        stream.add_callback(move || {
            let _settle = settle;
            f();
        })?;
        Ok(())
    }

    /// Completion callbacks added on `stream` that have not fired yet.
    pub fn pending_callbacks(&self, stream: &Stream) -> Result<usize> {
        Ok(self.pending[self.index_of(stream)?].load(Ordering::Acquire))
    }
}

/// Counts a completion callback as settled when dropped: after it ran (even
/// if it panicked), or when the driver refused it.
struct Settle(Arc<AtomicUsize>);

impl Drop for Settle {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn run_caught<F>(f: &F, stream: &Arc<Stream>) -> Result<()>
where
    F: Fn(&Arc<Stream>) -> Result<()>,
{
    catch_unwind(AssertUnwindSafe(|| f(stream))).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a non-string payload".into());
        Err(Error::other(format!("panicked: {message}")))
    })
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
