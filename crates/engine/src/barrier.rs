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
/// operation, complete once every stream has finished the work enqueued on
/// it before the barrier. Every stream of the barrier passes it at that
/// moment (each waits for the operation's completion event), so the one id
/// stands for every stream's side of it.
#[must_use = "depend on the barrier (`id`) or wait for it"]
pub struct Barrier {
    op: Op,
    streams: Vec<u64>,
}

impl OperationGraph {
    /// A device-side barrier over `streams`, as an operation of this graph:
    /// work enqueued on any of them from now on waits until every one has
    /// finished the work enqueued before this call. The host does not wait.
    ///
    /// It is the driver's one device-side barrier
    /// ([`Stream::barrier_through`]): a join and a fork through the first
    /// stream, whose gathering point is an operation of this graph on the
    /// first stream (built with [`op`](Self::op), kind
    /// [`OperationType::Barrier`]), enqueued after the first stream has
    /// joined the others (one event each); each other stream then waits for
    /// its completion event. One event per stream and two waits per other
    /// stream, the shape of [`Stream::barrier`]. Later operations depend on
    /// [`Barrier::id`].
    ///
    /// Fails with [`Error::EmptyBarrier`] for no streams. When a driver call
    /// fails part-way, the error is returned; an operation already made is
    /// complete (nothing waits on it forever).
    ///
    /// ```
    /// use cuda_streams_engine::OperationGraph;
    /// use cuda_streams_engine::driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let (a, b, c) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let graph = OperationGraph::for_context(&ctx);
    /// let mut data = DeviceBuffer::<u32>::new(&ctx, 256)?;
    /// b.memset_u32_async(&mut data, 6)?;
    /// let barrier = graph.barrier(&[&*a, &*b])?;
    /// // c is not in the barrier, but an operation after it sees b's memset.
    /// let mut host = PinnedBuffer::<u32>::new(&ctx, 256)?;
    /// let read = graph.op(&c).after(&[barrier.id()])
    ///     .run(|s| s.copy_to_host_async(&mut host, &data))?;
    /// read.wait()?;
    /// assert!(host.as_slice()?.iter().all(|&v| v == 6));
    /// assert_eq!(barrier.streams(), [a.id(), b.id()]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn barrier<S: Borrow<Stream>>(&self, streams: &[S]) -> Result<Barrier> {
        let refs: Vec<&Stream> = streams.iter().map(Borrow::borrow).collect();
        let gathered = Stream::barrier_through(
            &refs,
            |first| {
                self.op(first)
                    .kind(OperationType::Barrier)
                    .label("barrier")
                    .run(|_| Ok(()))
            },
            Op::event,
        )?;
        // Not `ok_or`: the error would be made and dropped at every barrier.
        let Some(op) = gathered else {
            return Err(Error::EmptyBarrier);
        };
        Ok(Barrier {
            op,
            streams: refs.iter().map(|s| s.id()).collect(),
        })
    }
}

impl Barrier {
    /// The barrier's operation: complete once every stream has finished the
    /// work enqueued before the barrier.
    pub fn id(&self) -> OperationId {
        self.op.id()
    }

    /// The ids of the streams it was built over, in the order given.
    pub fn streams(&self) -> &[u64] {
        &self.streams
    }

    /// Whether the GPU has passed the barrier (never blocks).
    pub fn is_done(&self) -> Result<bool> {
        self.op.is_done()
    }

    /// Block until every stream has passed the barrier.
    pub fn wait(&self) -> Result<()> {
        self.op.wait()
    }
}

impl fmt::Debug for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier")
            .field("id", &self.id())
            .field("streams", &self.streams)
            .finish()
    }
}
