//! Operations captured into a CUDA graph once and replayed many times: the
//! builder of [`OperationGraph::op`] with capture in place of eager work.
//!
//! Each operation is captured on its stream after its dependencies, as the
//! eager graph would enqueue it: a dependency on another stream is a wait on
//! the dependency's completion event, recorded inside the capture, so it
//! becomes an edge of the CUDA graph. A stream joins the capture at its first
//! operation, forked from the origin stream, and every stream is joined back
//! into the origin at the end. Completion callbacks become host nodes, so they
//! fire at every replay, when the GPU gets there.

use crate::error::{Error, Result};
use crate::graph::OperationGraph;
use driver::{Capture, Graph, GraphExec, PooledEvent, Stream};
use std::fmt;
use std::sync::Arc;

/// The id of an operation captured by a [`GraphCapture`]: its capture
/// ([`driver::Capture::id`]) and its place in it, from 1. A type of its own,
/// not an [`OperationId`](crate::OperationId): an eager operation cannot be
/// made to depend on a captured one (that does not compile), and a captured
/// operation's dependency on another capture's operation is refused with
/// [`Error::UnknownCaptureDependency`], naming both captures.
///
/// ```
/// use cuda_streams_engine::{Error, OperationGraph};
/// use cuda_streams_engine::driver::{Context, Stream};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let graph = OperationGraph::for_context(&ctx);
/// let mut first = graph.capture(&stream)?;
/// let id = first.op(&stream).run(|_, _| Ok(()))?;
/// assert_eq!(id.index(), 1);
/// first.finish()?;
/// let mut second = graph.capture(&stream)?;
/// let err = second.op(&stream).after(&[id]).run(|_, _| Ok(())).unwrap_err();
/// assert!(matches!(err, Error::UnknownCaptureDependency { .. }));
/// assert!(err.to_string().contains(&format!("of capture {}", id.capture())), "{err}");
/// assert!(err.to_string().contains("it belongs to another capture"), "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CaptureOpId {
    capture: u64,
    index: u64,
}

impl CaptureOpId {
    /// The capture it belongs to ([`driver::Capture::id`]).
    pub fn capture(self) -> u64 {
        self.capture
    }

    /// Its place in the capture, from 1.
    pub fn index(self) -> u64 {
        self.index
    }
}

impl fmt::Display for CaptureOpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "captured operation {} of capture {}",
            self.index, self.capture
        )
    }
}

/// A completion callback of a captured operation (it runs at every replay).
type ReplayCallback = Box<dyn Fn() + Send + Sync + 'static>;

struct Captured {
    stream: Arc<Stream>,
    /// Recorded in the capture right after the operation's work.
    completion: PooledEvent,
}

/// Operations being captured into a CUDA graph, from
/// [`OperationGraph::capture`]. [`GraphCapture::finish`] ends the capture
/// and instantiates the graph as a [`ReplayGraph`].
///
/// ```
/// use cuda_streams_engine::OperationGraph;
/// use cuda_streams_engine::driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
/// use std::sync::Arc;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let (a, b) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
/// let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, 256)?);
/// let graph = OperationGraph::for_context(&ctx);
///
/// let mut capture = graph.capture(&a)?;
/// let first = capture.op(&a).label("fill 1").run(|c, s| {
///     let args = [GraphArg::from(256u64), 1.0f32.into(), GraphArg::write(&out)];
///     c.launch(s, &fill, LaunchConfig::for_num_elems(256), &args)
/// })?;
/// capture.op(&b).after(&[first]).label("fill 2").run(|c, s| {
///     let args = [GraphArg::from(256u64), 2.0f32.into(), GraphArg::write(&out)];
///     c.launch(s, &fill, LaunchConfig::for_num_elems(256), &args)
/// })?;
/// let replay = capture.finish()?;
/// replay.replay(&a, 3)?;
/// assert_eq!(out.to_vec(&a)?, vec![2.0; 256]); // the second fill runs after the first
/// # Ok(())
/// # }
/// ```
#[must_use = "captured operations replay only once the capture is finished"]
pub struct GraphCapture<'g> {
    graph: &'g OperationGraph,
    capture: Capture,
    origin: Arc<Stream>,
    /// Streams forked into the capture, besides the origin.
    forked: Vec<Arc<Stream>>,
    /// The operations, by id - 1.
    ops: Vec<Captured>,
}

impl OperationGraph {
    /// Capture operations into a CUDA graph instead of running them: the
    /// capture begins on `origin` ([`driver::Stream::begin_capture`]), and
    /// other streams are forked in at their first operation.
    ///
    /// The captured operations get ids of their own type ([`CaptureOpId`]),
    /// valid within the capture only (they are never registered in this
    /// graph, whose [`OperationId`](crate::OperationId)s mean eager
    /// operations).
    pub fn capture(&self, origin: &Stream) -> Result<GraphCapture<'_>> {
        let capture = origin.begin_capture()?;
        Ok(GraphCapture {
            graph: self,
            capture,
            origin: origin.to_arc(),
            forked: Vec::new(),
            ops: Vec::new(),
        })
    }
}

impl<'g> GraphCapture<'g> {
    /// Describe an operation on `stream`; [`CaptureOpBuilder::run`] captures it.
    pub fn op(&mut self, stream: &Stream) -> CaptureOpBuilder<'_, 'g> {
        CaptureOpBuilder {
            capture: self,
            stream: stream.to_arc(),
            after: Vec::new(),
            label: String::new(),
            callbacks: Vec::new(),
        }
    }

    /// Operations captured so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was captured yet.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The driver's capture, for work outside any operation (it is ordered
    /// only by the stream it is enqueued on).
    pub fn driver_capture(&mut self) -> &mut Capture {
        &mut self.capture
    }

    /// The id the next captured operation gets.
    fn next_id(&self) -> CaptureOpId {
        CaptureOpId {
            capture: self.capture.id(),
            index: self.ops.len() as u64 + 1,
        }
    }

    /// Bring `stream` into the capture if it is not in it yet.
    fn enter(&mut self, stream: &Arc<Stream>) -> Result<()> {
        if stream.id() == self.origin.id() || self.forked.iter().any(|s| s.id() == stream.id()) {
            return Ok(());
        }
        self.capture.fork(&self.origin, &[stream])?;
        self.forked.push(Arc::clone(stream));
        Ok(())
    }

    /// End the capture (every stream joined back into the origin) and
    /// instantiate the graph.
    pub fn finish(self) -> Result<ReplayGraph> {
        let (graph, operations) = self.end()?;
        let exec = graph.instantiate()?;
        Ok(ReplayGraph {
            operations,
            graph,
            exec,
        })
    }

    /// End the capture (every stream joined back into the origin): the
    /// graph and the number of operations captured.
    fn end(mut self) -> Result<(Graph, usize)> {
        let forked: Vec<&Stream> = self.forked.iter().map(|s| &**s).collect();
        if !forked.is_empty() {
            self.capture.join(&self.origin, &forked)?;
        }
        let graph = self.capture.end()?;
        tracing::debug!(
            operations = self.ops.len(),
            nodes = graph.node_count(),
            streams = forked.len() + 1,
            "operation graph captured"
        );
        Ok((graph, self.ops.len()))
    }
}

impl fmt::Debug for GraphCapture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphCapture")
            .field("origin", &self.origin.id())
            .field("operations", &self.ops.len())
            .field("graph", &self.graph)
            .finish()
    }
}

/// An operation being described for capture; from [`GraphCapture::op`].
#[must_use = "an operation builder does nothing until `run`"]
pub struct CaptureOpBuilder<'c, 'g> {
    capture: &'c mut GraphCapture<'g>,
    stream: Arc<Stream>,
    after: Vec<CaptureOpId>,
    label: String,
    callbacks: Vec<ReplayCallback>,
}

impl CaptureOpBuilder<'_, '_> {
    /// Run after these operations of the same capture.
    pub fn after(mut self, dependencies: &[CaptureOpId]) -> Self {
        self.after.extend_from_slice(dependencies);
        self
    }

    /// A name for traces and errors.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Run `f` on a driver thread when a replay has finished the
    /// operation's work: a host node, so it fires at every replay. As for
    /// stream callbacks, `f` must be quick and must not call the driver.
    pub fn on_complete(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.callbacks.push(Box::new(f));
        self
    }

    /// Capture the operation: its stream waits (inside the capture) for its
    /// dependencies on other streams, then `work` enqueues its nodes through
    /// the capture on the stream, then its callbacks and completion event
    /// follow. Returns its id within the capture.
    pub fn run(
        self,
        work: impl FnOnce(&mut Capture, &Stream) -> driver::Result<()>,
    ) -> Result<CaptureOpId> {
        let id = self.capture.next_id();
        let label = self.label.clone();
        self.run_with(|capture, stream| {
            work(capture, stream).map_err(|source| Error::CapturedOperationFailed {
                operation: id,
                label,
                source: Box::new(source),
            })
        })
    }

    /// [`CaptureOpBuilder::run`] for work whose errors are another crate's
    /// (an NCCL collective captured with
    /// `cuda_streams_collectives::Communicator::captured`): `work`'s error
    /// is returned as it is.
    pub fn run_with<E: From<Error>>(
        self,
        work: impl FnOnce(&mut Capture, &Stream) -> std::result::Result<(), E>,
    ) -> std::result::Result<CaptureOpId, E> {
        let CaptureOpBuilder {
            capture,
            stream,
            after,
            label: _,
            callbacks,
        } = self;
        let id = capture.next_id();
        for &dependency in &after {
            let reason = if dependency.capture != id.capture {
                "it belongs to another capture"
            } else if dependency.index == 0 || dependency.index >= id.index {
                "no such operation was captured"
            } else {
                continue;
            };
            return Err(Error::UnknownCaptureDependency {
                operation: id,
                dependency,
                reason,
            }
            .into());
        }
        capture.enter(&stream)?;
        for dependency in &after {
            let dep = &capture.ops[dependency.index as usize - 1];
            if dep.stream.id() != stream.id() {
                stream.wait_event(&dep.completion).map_err(Error::from)?;
            }
        }
        work(&mut capture.capture, &stream)?;
        for callback in callbacks {
            capture
                .capture
                .add_callback(&stream, callback)
                .map_err(Error::from)?;
        }
        let completion = stream.mark().map_err(Error::from)?;
        capture.ops.push(Captured { stream, completion });
        Ok(id)
    }
}

/// A captured operation graph, instantiated: replay it on any stream of its
/// context ([`ReplayGraph::replay`]).
pub struct ReplayGraph {
    operations: usize,
    graph: Graph,
    exec: GraphExec,
}

impl ReplayGraph {
    /// Enqueue `times` replays on `stream`, one after the other; they are
    /// ordered with the stream's other work like any other work.
    pub fn replay(&self, stream: &Stream, times: usize) -> Result<()> {
        for _ in 0..times {
            self.exec.launch(stream)?;
        }
        Ok(())
    }

    /// The operations captured.
    pub fn operation_count(&self) -> usize {
        self.operations
    }

    /// The CUDA graph's nodes (kernels, copies, memsets, callbacks).
    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }

    /// The executable graph (to upload or update it).
    pub fn exec(&mut self) -> &mut GraphExec {
        &mut self.exec
    }

    /// Take new arguments (kernel scalars, buffers, callbacks) from
    /// `capture`, which captured the same sequence of operations (same
    /// streams, dependencies, kernels and node kinds) with other arguments,
    /// without instantiating again ([`GraphExec::update`]). Replays already
    /// enqueued keep the old arguments. On failure
    /// ([`driver::Error::GraphUpdate`], e.g. another shape) this replay
    /// graph is unchanged and still replays the old arguments.
    ///
    /// ```
    /// use cuda_streams_engine::{GraphCapture, OperationGraph, Result};
    /// use cuda_streams_engine::driver::{Context, DeviceBuffer, GraphArg, Kernel, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
    /// let out = Arc::new(DeviceBuffer::<f32>::new(&ctx, 64)?);
    /// let graph = OperationGraph::for_context(&ctx);
    /// // One function captures the step, so every capture has the same shape.
    /// let step = |value: f32| -> Result<GraphCapture<'_>> {
    ///     let mut capture = graph.capture(&stream)?;
    ///     capture.op(&stream).label("fill").run(|c, s| {
    ///         let args = [GraphArg::from(64u64), value.into(), GraphArg::write(&out)];
    ///         c.launch(s, &fill, LaunchConfig::for_num_elems(64), &args)
    ///     })?;
    ///     Ok(capture)
    /// };
    /// let mut replay = step(1.0)?.finish()?;
    /// replay.replay(&stream, 1)?;
    /// assert_eq!(out.to_vec(&stream)?, vec![1.0; 64]);
    /// replay.update(step(2.0)?)?; // a new argument, the same executable graph
    /// replay.replay(&stream, 1)?;
    /// assert_eq!(out.to_vec(&stream)?, vec![2.0; 64]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn update(&mut self, capture: GraphCapture<'_>) -> Result<()> {
        let (graph, operations) = capture.end()?;
        self.exec.update(&graph)?;
        self.graph = graph;
        self.operations = operations;
        Ok(())
    }
}

impl fmt::Debug for ReplayGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayGraph")
            .field("operations", &self.operations)
            .field("nodes", &self.graph.node_count())
            .finish()
    }
}
