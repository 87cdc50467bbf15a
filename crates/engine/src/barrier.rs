//! The barrier node: every stream's work after it waits for every stream's
//! work before it, as operations of the graph that later operations can
//! depend on.

use crate::error::{Error, Result};
use crate::graph::OperationGraph;
use crate::op::Op;
use crate::operation::{OperationId, OperationType};
use driver::Stream;
use std::borrow::Borrow;
use std::fmt;

/// A barrier over some streams, from [`OperationGraph::barrier`]: one
/// operation per stream, each complete when its stream has passed the
/// barrier, that is, when every stream has finished the work enqueued on it
/// before the barrier.
#[must_use = "depend on the barrier (`id`, `on`) or wait for it"]
pub struct Barrier {
    /// The departure of each stream, in the order given.
    departures: Vec<(u64, Op)>,
}

impl OperationGraph {
    /// A device-side barrier over `streams`, as operations of this graph:
    /// work enqueued on any of them from now on waits until every one has
    /// finished the work enqueued before this call. The host does not wait.
    ///
    /// It is built with [`op`](Self::op), as operations of kind
    /// [`OperationType::Barrier`]: on each stream an arrival (its completion
    /// event marks the stream's current end), then on each stream a
    /// departure that depends on every arrival (one `cuStreamWaitEvent` per
    /// other stream, the waits [`Stream::barrier`] makes). The departures'
    /// ids are what later operations depend on: [`Barrier::id`] stands for
    /// the whole barrier, [`Barrier::on`] for one stream's side of it.
    ///
    /// Fails with [`Error::EmptyBarrier`] for no streams. When a driver call
    /// fails part-way, the operations built so far are completed (nothing
    /// waits on them forever) and the error is returned.
    ///
    /// ```
    /// use cuda_streams_engine::OperationGraph;
    /// use cuda_streams_engine::driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let (a, b, c) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let graph = OperationGraph::for_context(&ctx);
    /// let mut data = DeviceBuffer::<u32>::new(&ctx, 256)?;
    /// a.memset_u32_async(&mut data, 6)?;
    /// let barrier = graph.barrier(&[&*a, &*b])?;
    /// // c is not in the barrier, but an operation after it sees a's memset.
    /// let mut host = PinnedBuffer::<u32>::new(&ctx, 256)?;
    /// let read = graph.op(&c).after(&[barrier.id()])
    ///     .run(|s| s.copy_to_host_async(&mut host, &data))?;
    /// read.wait()?;
    /// assert!(host.as_slice()?.iter().all(|&v| v == 6));
    /// assert_eq!(barrier.ids().len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn barrier<S: Borrow<Stream>>(&self, streams: &[S]) -> Result<Barrier> {
        if streams.is_empty() {
            return Err(Error::EmptyBarrier);
        }
        let arrivals = streams
            .iter()
            .map(|stream| {
                self.op(stream.borrow())
                    .kind(OperationType::Barrier)
                    .label("barrier arrival")
                    .run(|_| Ok(()))
                    .map(|op| op.id())
            })
            .collect::<Result<Vec<OperationId>>>()?;
        let departures = streams
            .iter()
            .map(|stream| {
                let stream = stream.borrow();
                let op = self
                    .op(stream)
                    .after(&arrivals)
                    .kind(OperationType::Barrier)
                    .label("barrier")
                    .run(|_| Ok(()))?;
                Ok((stream.id(), op))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Barrier { departures })
    }
}

impl Barrier {
    /// The barrier as one operation: complete once every stream has finished
    /// the work enqueued before the barrier. (The departure on the first
    /// stream, which depends on every stream's arrival.)
    pub fn id(&self) -> OperationId {
        self.departures[0].1.id()
    }

    /// The operation after which `stream` has passed the barrier, or `None`
    /// for a stream not in it.
    pub fn on(&self, stream: &Stream) -> Option<OperationId> {
        self.departures
            .iter()
            .find(|(id, _)| *id == stream.id())
            .map(|(_, op)| op.id())
    }

    /// Every stream's departure, in the order the streams were given.
    pub fn ids(&self) -> Vec<OperationId> {
        self.departures.iter().map(|(_, op)| op.id()).collect()
    }

    /// Block until every stream has passed the barrier.
    pub fn wait(&self) -> Result<()> {
        self.departures.iter().try_for_each(|(_, op)| op.wait())
    }
}

impl fmt::Debug for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier")
            .field(
                "streams",
                &self.departures.iter().map(|(s, _)| s).collect::<Vec<_>>(),
            )
            .field("ids", &self.ids())
            .finish()
    }
}
