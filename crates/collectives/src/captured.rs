//! Collectives captured into CUDA graphs: recorded once through a
//! [`Capture`], run at every replay of the graph's instances.
//!
//! A captured collective outlives the call that made it, so the borrowed
//! buffers of eager collectives will not do: buffers come by `Arc`, as for
//! any captured work, and the graph keeps them and the communicator alive
//! while it or an instance of it exists (see [`Capture::record_external`]).

use crate::collective::{all_to_all_chunk, count_between, shape};
use crate::communicator::Communicator;
use crate::error::Result;
use crate::issue::record;
use crate::rank_call::RankCall;
use crate::shape::Kind;
use crate::types::{NcclType, ReduceOp};
use driver::{Capture, DeviceBuffer, DeviceMemory, GraphArg, Stream};
use std::sync::Arc;

/// One rank's collectives captured into a graph, from
/// [`Communicator::captured`].
///
/// Each call is checked like the eager one (devices, lengths, peers), and
/// against the other ranks of the communicator in this process, which must
/// capture the same collectives ([`Error::RanksDisagree`](crate::Error::RanksDisagree) otherwise, also
/// when one captures what another runs eagerly). Then it is recorded on a
/// stream of the capture, and runs at every replay. NCCL's rules for
/// captured collectives hold: capture a communicator's collectives from one
/// thread, and do not mix captured and eager collectives of a communicator
/// within a step (`docs/multi-gpu.md`, "Captured collectives").
///
/// ```
/// use cuda_streams_collectives::{Communicator, ReduceOp};
/// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
/// use std::sync::Arc;
/// # fn main() -> Result<(), cuda_streams_collectives::Error> {
/// let ctx = Context::new(0)?;
/// let comm = Communicator::all_devices(&[ctx.clone()])?.remove(0);
/// let stream = Stream::new(&ctx)?;
/// let grads = Arc::new(DeviceBuffer::from_slice(&stream, &[1.0f32; 8])?);
/// let mut capture = stream.begin_capture()?;
/// comm.captured(&mut capture).all_reduce_in_place(&stream, &grads, ReduceOp::Sum)?;
/// let graph = capture.end()?;
/// let exec = graph.instantiate()?;
/// drop((graph, comm)); // the instance keeps the communicator
/// for _ in 0..3 {
///     exec.launch(&stream)?;
/// }
/// assert_eq!(grads.to_vec(&stream)?, [1.0; 8]); // one rank: itself
/// # Ok(())
/// # }
/// ```
#[must_use = "a captured-collectives view does nothing until a collective is captured"]
pub struct CapturedCollectives<'c> {
    comm: &'c Communicator,
    capture: &'c mut Capture,
}

impl Communicator {
    /// This rank's collectives captured into `capture` instead of run: the
    /// graph keeps their buffers and this communicator alive while it or
    /// an instance of it exists.
    pub fn captured<'c>(&'c self, capture: &'c mut Capture) -> CapturedCollectives<'c> {
        CapturedCollectives {
            comm: self,
            capture,
        }
    }
}

impl CapturedCollectives<'_> {
    /// [`Communicator::all_reduce`], captured on `stream`.
    pub fn all_reduce<T, S>(
        &mut self,
        stream: &Stream,
        send: &Arc<S>,
        recv: &Arc<DeviceBuffer<T>>,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        let kind = Kind::AllReduce;
        let (count, moved) = count_between(self.comm, kind, send.device_len(), recv.device_len())?;
        let shape = shape::<T>(kind, count, Some(op), 0);
        let (s, r) = (send.device_ptr(), recv.device_ptr());
        let op = RankCall::captured(self.comm, stream, shape, s, r, moved * size_of::<T>())?;
        let args = [GraphArg::read(send), GraphArg::write(recv)];
        record(&[op], self.capture, &args)
    }

    /// [`Communicator::all_reduce_in_place`], captured on `stream`.
    pub fn all_reduce_in_place<T: NcclType>(
        &mut self,
        stream: &Stream,
        buffer: &Arc<DeviceBuffer<T>>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = buffer.device_len();
        let shape = shape::<T>(Kind::AllReduce, count, Some(op), 0);
        let ptr = buffer.device_ptr();
        let op = RankCall::captured(self.comm, stream, shape, ptr, ptr, count * size_of::<T>())?;
        record(&[op], self.capture, &[GraphArg::write(buffer)])
    }

    /// [`Communicator::send`], captured on `stream`.
    pub fn send<T, S>(&mut self, stream: &Stream, send: &Arc<S>, peer: usize) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        let count = send.device_len();
        let shape = shape::<T>(Kind::Send, count, None, peer);
        let ptr = send.device_ptr();
        let op = RankCall::captured(self.comm, stream, shape, ptr, 0, count * size_of::<T>())?;
        record(&[op], self.capture, &[GraphArg::read(send)])
    }

    /// [`Communicator::recv`], captured on `stream`.
    pub fn recv<T: NcclType>(
        &mut self,
        stream: &Stream,
        recv: &Arc<DeviceBuffer<T>>,
        peer: usize,
    ) -> Result<()> {
        let count = recv.device_len();
        let shape = shape::<T>(Kind::Recv, count, None, peer);
        let ptr = recv.device_ptr();
        let op = RankCall::captured(self.comm, stream, shape, 0, ptr, count * size_of::<T>())?;
        record(&[op], self.capture, &[GraphArg::write(recv)])
    }

    /// [`Communicator::all_to_all`], captured on `stream` (one NCCL group
    /// of a send and a receive per rank).
    pub fn all_to_all<T, S>(
        &mut self,
        stream: &Stream,
        send: &Arc<S>,
        recv: &Arc<DeviceBuffer<T>>,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T> + Send + Sync + 'static,
    {
        let n = self.comm.size();
        let chunk = all_to_all_chunk(self.comm, send.device_len(), recv.device_len())?;
        let bytes = chunk * size_of::<T>();
        let (s, r) = (send.device_ptr(), recv.device_ptr());
        let mut ops = Vec::with_capacity(2 * n);
        for peer in 0..n {
            let offset = (peer * bytes) as sys::CUdeviceptr;
            let send_shape = shape::<T>(Kind::Send, chunk, None, peer);
            ops.push(RankCall::captured(
                self.comm,
                stream,
                send_shape,
                s + offset,
                0,
                bytes,
            )?);
            let recv_shape = shape::<T>(Kind::Recv, chunk, None, peer);
            ops.push(RankCall::captured(
                self.comm,
                stream,
                recv_shape,
                0,
                r + offset,
                bytes,
            )?);
        }
        record(
            &ops,
            self.capture,
            &[GraphArg::read(send), GraphArg::write(recv)],
        )
    }
}

impl std::fmt::Debug for CapturedCollectives<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedCollectives")
            .field("rank", &self.comm.rank())
            .field("capture", &self.capture)
            .finish()
    }
}
