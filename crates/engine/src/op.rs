//! The idiomatic way in: `graph.op(&stream).after(&[a]).label("fill").run(|s| …)`.
//! The operation is registered, begun, given its work and completed in one
//! call, so it cannot be left half-done.

use crate::error::{Error, Result};
use crate::graph::{Deps, OpMeta, OperationGraph};
use crate::operation::{EventPriority, OperationId, OperationType};
use crate::source::StreamSource;
use driver::{PooledEvent, Stream};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// An operation being described; [`run`](Self::run) enqueues it. From
/// [`OperationGraph::op`].
///
/// ```
/// use cuda_streams_engine::{OperationGraph, OperationType, EventPriority};
/// use cuda_streams_engine::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let graph = OperationGraph::for_context(&ctx);
/// let mut buf = DeviceBuffer::<u8>::new(&ctx, 64)?;
/// let clear = graph
///     .op(&stream)
///     .kind(OperationType::MemoryTransfer)
///     .priority(EventPriority::High)
///     .label("clear")
///     .run(|s| s.memset_u8_async(&mut buf, 0))?;
/// let meta = graph.metadata(clear.id()).expect("not retired yet");
/// assert_eq!((meta.description.as_str(), meta.priority), ("clear", EventPriority::High));
/// clear.wait()?;
/// # Ok(())
/// # }
/// ```
#[must_use = "an operation builder does nothing until `run`"]
pub struct OpBuilder<'g> {
    graph: &'g OperationGraph,
    place: Place<'g>,
    after: Deps,
    label: Cow<'static, str>,
    kind: OperationType,
    priority: EventPriority,
}

/// Where an operation runs: the caller's stream, or one the engine takes.
enum Place<'g> {
    Stream(&'g Stream),
    Source(&'g dyn StreamSource),
}

impl OperationGraph {
    /// Describe an operation on `stream`; [`OpBuilder::run`] enqueues it.
    /// Its kind defaults to [`OperationType::Kernel`] and its priority to
    /// [`EventPriority::Normal`] (both metadata here: the caller chose the
    /// stream; with [`op_from`](Self::op_from) the priority picks it).
    #[inline]
    pub fn op<'a>(&'a self, stream: &'a Stream) -> OpBuilder<'a> {
        OpBuilder::at(self, Place::Stream(stream))
    }

    /// Describe an operation whose stream the engine takes from `source`
    /// when it runs, by its priority ([`EventPriority::stream_class`]).
    ///
    /// ```
    /// use cuda_streams_engine::{EventPriority, OperationGraph, StreamSource};
    /// use cuda_streams_engine::driver::{Context, Stream, StreamPriority};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_engine::Result<()> {
    /// // Any type can hand out streams; a stream pool is the usual one.
    /// struct TwoClasses { urgent: Arc<Stream>, other: Arc<Stream> }
    /// impl StreamSource for TwoClasses {
    ///     fn stream_for(&self, class: StreamPriority) -> Arc<Stream> {
    ///         match class {
    ///             StreamPriority::High => self.urgent.clone(),
    ///             _ => self.other.clone(),
    ///         }
    ///     }
    /// }
    /// let ctx = Context::new(0)?;
    /// let source = TwoClasses {
    ///     urgent: Stream::new_with_priority(&ctx, StreamPriority::High)?,
    ///     other: Stream::new(&ctx)?,
    /// };
    /// let graph = OperationGraph::for_context(&ctx);
    /// let op = graph.op_from(&source).priority(EventPriority::Critical).run(|_| Ok(()))?;
    /// assert_eq!(graph.metadata(op.id()).unwrap().stream_id, source.urgent.id());
    /// # Ok(())
    /// # }
    /// ```
    pub fn op_from<'g>(&'g self, source: &'g dyn StreamSource) -> OpBuilder<'g> {
        OpBuilder::from_source(self, source)
    }
}

impl<'g> OpBuilder<'g> {
    #[inline]
    fn at(graph: &'g OperationGraph, place: Place<'g>) -> Self {
        OpBuilder {
            graph,
            place,
            after: Deps::new(),
            label: Cow::Borrowed(""),
            kind: OperationType::Kernel,
            priority: EventPriority::Normal,
        }
    }

    pub(crate) fn from_source(graph: &'g OperationGraph, source: &'g dyn StreamSource) -> Self {
        Self::at(graph, Place::Source(source))
    }
}

impl<'g> OpBuilder<'g> {
    /// Run after these operations (of the same graph; completed, or built
    /// with [`run`](Self::run), which completes them).
    #[inline]
    pub fn after(mut self, dependencies: &[OperationId]) -> Self {
        if self.after.is_empty() {
            // The usual first call: a copy into the inline buffer, without
            // `extend`'s capacity check (a call of its own).
            self.after = Deps::from_slice(dependencies);
        } else {
            self.after.extend_from_slice(dependencies);
        }
        self
    }

    /// A name for traces, errors and reports. A `&'static str` is kept as
    /// it is: the operation then costs no allocation for its name, nor a
    /// free when it retires.
    #[inline]
    pub fn label(mut self, label: impl Into<Cow<'static, str>>) -> Self {
        self.label = label.into();
        self
    }

    /// What kind of work it is (metadata).
    #[inline]
    pub fn kind(mut self, kind: OperationType) -> Self {
        self.kind = kind;
        self
    }

    /// How urgent it is: orders [`OperationGraph::ready_operations`], and
    /// picks the stream class when the engine chooses the stream
    /// ([`OperationGraph::op_from`]).
    #[inline]
    pub fn priority(mut self, priority: EventPriority) -> Self {
        self.priority = priority;
        self
    }

    /// Register the operation, make its stream wait for its dependencies on
    /// other streams, enqueue `work` on the stream, and complete it.
    ///
    /// When `work` fails, the operation is completed all the same (whatever
    /// it enqueued stays ordered before its dependants) and the error is
    /// [`Error::OperationFailed`], naming it.
    ///
    /// `work` returns a driver `Result`, and `?` inside it works on the
    /// calls of every crate of the workspace: each crate's error converts
    /// into [`driver::Error`] (a driver failure as itself, anything else
    /// as [`driver::Error::Other`], which keeps the error whole and its
    /// source chain), so an allocator's, a profiler's or the facade's error
    /// comes out of `run` as the operation's failure:
    /// `source.downcast_ref::<cuda_streams_allocator::Error>()` gives it
    /// back.
    pub fn run(self, work: impl FnOnce(&Stream) -> driver::Result<()>) -> Result<Op> {
        let OpBuilder {
            graph,
            place,
            after,
            label,
            kind,
            priority,
        } = self;
        let meta = OpMeta {
            kind,
            priority,
            dependencies: after,
            label,
        };
        let chosen;
        let stream = match place {
            Place::Stream(stream) => stream,
            Place::Source(source) => {
                chosen = source.stream_for(priority.stream_class());
                &*chosen
            }
        };
        let (id, event, outcome) = graph.run_op(meta, stream, work)?;
        match outcome {
            Ok(()) => Ok(Op { id, event }),
            Err(failure) => {
                let (source, label) = *failure;
                Err(Error::OperationFailed {
                    operation: id,
                    label,
                    source,
                })
            }
        }
    }
}

impl OpBuilder<'_> {
    /// A fork/join as one operation: after its dependencies, its stream
    /// forks to `branches` ([`Stream::fork`], one event), `work(i, branch)`
    /// enqueues branch `i`'s work, and the stream joins them
    /// ([`Stream::join`], one event per branch). The operation completes on
    /// its own stream after the join, so a dependant waits for every branch.
    ///
    /// It costs the driver calls a fork/join needs and the graph's
    /// bookkeeping of a single operation, where one operation per branch
    /// would cost that bookkeeping once per branch. The branches have no ids
    /// of their own: build them with [`run`](Self::run) when something must
    /// depend on one branch alone.
    ///
    /// When a branch's work fails, the other branches still run, the join is
    /// still made (whatever was enqueued stays ordered before dependants) and
    /// the error is [`Error::OperationFailed`], naming the operation.
    ///
    /// ```
    /// use cuda_streams_engine::OperationGraph;
    /// use cuda_streams_engine::driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// # fn main() -> cuda_streams_engine::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let main = Stream::new(&ctx)?;
    /// let branches = [Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?];
    /// let graph = OperationGraph::for_context(&ctx);
    /// let mut parts: Vec<DeviceBuffer<u32>> =
    ///     (0..3).map(|_| DeviceBuffer::new(&ctx, 256)).collect::<Result<_, _>>()?;
    /// let refs: Vec<&Stream> = branches.iter().map(|b| &**b).collect();
    /// let mut next = parts.iter_mut();
    /// let fan = graph.op(&main).label("fill parts").fork_join(&refs, |i, s| {
    ///     let part = next.next().expect("one part per branch");
    ///     s.memset_u32_async(part, i as u32 + 1)
    /// })?;
    /// let mut host = PinnedBuffer::<u32>::new(&ctx, 256)?;
    /// let read = graph.op(&main).after(&[fan.id()])
    ///     .run(|s| s.copy_to_host_async(&mut host, &parts[2]))?;
    /// read.wait()?;
    /// assert!(host.as_slice()?.iter().all(|&v| v == 3));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fork_join(
        self,
        branches: &[&Stream],
        mut work: impl FnMut(usize, &Stream) -> driver::Result<()>,
    ) -> Result<Op> {
        self.run(|root| {
            root.fork(branches)?;
            let mut first_failure = None;
            for (i, branch) in branches.iter().enumerate() {
                if let Err(err) = work(i, branch) {
                    first_failure.get_or_insert(err);
                }
            }
            root.join(branches)?;
            first_failure.map_or(Ok(()), Err)
        })
    }
}

/// An enqueued operation of an [`OperationGraph`]: its id, to depend on, and
/// its completion, to wait for. Dropping it forgets nothing: the graph keeps
/// the operation until the GPU has passed it.
#[must_use = "depend on the operation (`id`) or wait for it"]
pub struct Op {
    id: OperationId,
    event: Arc<PooledEvent>,
}

impl Op {
    /// Its id in the graph.
    #[inline]
    pub fn id(&self) -> OperationId {
        self.id
    }

    /// Block until the GPU has finished it.
    pub fn wait(&self) -> Result<()> {
        Ok(self.event.synchronize()?)
    }

    /// Its completion event, recorded on its stream right after its work
    /// (to make other streams wait on it, or to time it).
    pub fn event(&self) -> &driver::Event {
        &self.event
    }

    /// Whether the GPU has finished it (never blocks).
    pub fn is_done(&self) -> Result<bool> {
        Ok(self.event.query()?)
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op").field("id", &self.id).finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::{OperationGraph, OperationId};
    use driver::{Context, Stream};

    /// Each `after` adds to the dependencies given before, the first
    /// (copied in whole) and the later ones (appended) alike, past the
    /// inline capacity too.
    #[test]
    fn after_calls_add_up() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let graph = OperationGraph::for_context(&ctx);
        let ids: Vec<OperationId> = (0..6)
            .map(|_| graph.op(&stream).run(|_| Ok(())).unwrap().id())
            .collect();
        let op = graph
            .op(&stream)
            .after(&ids[..1])
            .after(&[])
            .after(&ids[1..3])
            .after(&ids[3..])
            .run(|_| Ok(()))
            .unwrap();
        let meta = graph.metadata(op.id()).expect("not retired yet");
        assert_eq!(meta.dependencies, ids);
        op.wait().unwrap();
    }
}
