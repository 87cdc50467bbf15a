//! One NCCL call of one rank: its arguments checked, ready to be ordered on
//! its stream and issued.

use crate::communicator::Communicator;
use crate::error::{Error, Result};

use crate::shape::{Kind, Shape};
use crate::types::ReduceOp;
use driver::{BufferUse, PreparedWork, Stream};
use std::ffi::c_void;
use sys::CUdeviceptr;
use sys::nccl::{Progress, ncclRedOp_t, result};

/// The buffers one op lends (none, one or two), inline: an op costs no
/// allocation. `Copy` and without `Drop` (unlike a `SmallVec`, whose `Drop`
/// would make a `Group` outlive-check its borrows).
#[derive(Clone, Copy)]
pub(crate) enum Uses<'a> {
    None,
    One([BufferUse<'a>; 1]),
    Two([BufferUse<'a>; 2]),
}

impl<'a> Uses<'a> {
    /// One buffer, or none.
    pub(crate) fn from_option(used: Option<BufferUse<'a>>) -> Self {
        used.map_or(Self::None, |used| Self::One([used]))
    }

    pub(crate) fn as_slice(&self) -> &[BufferUse<'a>] {
        match self {
            Self::None => &[],
            Self::One(uses) => uses,
            Self::Two(uses) => uses,
        }
    }
}

/// One collective of one rank: its arguments checked, ready to be ordered
/// on its stream and issued (`issue`).
pub(crate) struct RankCall<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) stream: &'a Stream,
    pub(crate) shape: Shape,
    send: CUdeviceptr,
    recv: CUdeviceptr,
    uses: Uses<'a>,
    bytes: usize,
}

impl<'a> RankCall<'a> {
    /// Check what can be checked locally (the stream's device and capture,
    /// the root, each buffer's device). Nothing is enqueued and the stream
    /// order is not consulted yet: NCCL puts a group's collectives on their
    /// streams only at `ncclGroupEnd`, so `issue` checks the buffers' uses
    /// and gives the collective its step in the stream order right before.
    pub(crate) fn new(
        comm: &'a Communicator,
        stream: &'a Stream,
        shape: Shape,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        uses: Uses<'a>,
        bytes: usize,
    ) -> Result<Self> {
        let op = Self::checked(comm, stream, shape, send, recv, uses, bytes)?;
        // Refused at the call, not only at the group's end (a snapshot:
        // `issue` holds the gate from the check through the tracking).
        drop(op.gate()?);
        stream.check_uses(op.uses.as_slice())?;
        Ok(op)
    }

    /// An op to capture into a graph: checked like [`RankCall::new`]'s, with no
    /// uses (the graph keeps the buffers and orders them at each replay).
    pub(crate) fn captured(
        comm: &'a Communicator,
        stream: &'a Stream,
        shape: Shape,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        bytes: usize,
    ) -> Result<Self> {
        let shape = Shape {
            captured: true,
            ..shape
        };
        Self::checked(comm, stream, shape, send, recv, Uses::None, bytes)
    }

    /// What can be checked locally: the stream's device, the root or peer.
    fn checked(
        comm: &'a Communicator,
        stream: &'a Stream,
        shape: Shape,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        uses: Uses<'a>,
        bytes: usize,
    ) -> Result<Self> {
        if stream.context().id() != comm.context().id() {
            return Err(Error::WrongStream {
                rank: comm.rank(),
                comm_device: comm.context().ordinal(),
                stream_device: stream.context().ordinal(),
            });
        }
        if shape.kind.is_p2p() && shape.root >= comm.size() {
            return Err(Error::InvalidPeer {
                operation: shape.kind.name(),
                rank: comm.rank(),
                peer: shape.root,
                nranks: comm.size(),
            });
        }
        if shape.root >= comm.size() {
            return Err(Error::InvalidRoot {
                root: shape.root,
                nranks: comm.size(),
            });
        }
        Ok(Self {
            comm,
            stream,
            shape,
            send,
            recv,
            uses,
            bytes,
        })
    }

    /// `Err` while the op's stream is being captured: the graph would keep
    /// neither buffer for its replays.
    pub(crate) fn gate(&self) -> Result<driver::EnqueueGate<'_>> {
        self.stream
            .enqueue_gate("a collective")
            .map_err(|_| self.capturing())
    }

    fn capturing(&self) -> Error {
        Error::StreamCapturing {
            collective: self.shape.kind.name(),
            rank: self.comm.rank(),
            stream: self.stream.id(),
        }
    }

    /// Right before the NCCL calls: hold the stream out of captures, order
    /// it after the buffers' allocations, check the uses against the stream
    /// order and take the collective's step, which stays in flight (no
    /// event recorded on the stream covers it) until NCCL has put the work
    /// on the stream ([`RankCall::finish`]).
    pub(crate) fn prepare(&self) -> Result<PreparedWork<'_>> {
        self.stream
            .prepare_uses(self.uses.as_slice())
            .map_err(|err| match err {
                driver::Error::StreamCapturing { .. } => self.capturing(),
                other => Error::from(other),
            })
    }

    /// Issue the NCCL call (inside a group, NCCL enqueues it at the end).
    pub(crate) fn issue(&self, in_group: bool) -> Result<()> {
        let nccl = self.comm.nccl();
        let (send, recv) = (
            self.send as usize as *const c_void,
            self.recv as usize as *mut c_void,
        );
        let (count, dtype, comm, stream) = (
            self.shape.count,
            self.shape.dtype,
            self.comm.as_raw(),
            self.stream.as_raw(),
        );
        let op = self.shape.op.map_or(ncclRedOp_t::ncclSum, ReduceOp::raw);
        let root = self.shape.root as i32;
        // Inside a group NCCL makes each communicator's device current
        // itself at the group's end (its one-thread, many-devices example
        // sets none); alone, the call expects its device current.
        if !in_group {
            self.comm.context().bind()?;
        }
        // SAFETY: each buffer holds the elements the collective touches on
        // this rank (checked when the op was made) and is of the
        // communicator's device (checked by `check_uses` and `prepare_uses`,
        // or by `Capture::record_external`). Eager, it stays alive until the
        // stream has passed the collective: the op borrows it until it is
        // tracked on the stream, which `issue` does for every call it hands
        // to NCCL, whatever fails after; the stream is not capturing
        // (checked by `issue` just before), so the work runs now. Captured
        // (`record`), the graph keeps every buffer and the communicator
        // alive for all its replays, and orders the buffers at each. The
        // communicator is live: the op borrows it.
        let issued = unsafe {
            match self.shape.kind {
                Kind::AllReduce => {
                    result::all_reduce(nccl, send, recv, count, dtype, op, comm, stream)
                }
                Kind::Broadcast => {
                    result::broadcast(nccl, send, recv, count, dtype, root, comm, stream)
                }
                Kind::Reduce => {
                    result::reduce(nccl, send, recv, count, dtype, op, root, comm, stream)
                }
                Kind::AllGather => result::all_gather(nccl, send, recv, count, dtype, comm, stream),
                Kind::ReduceScatter => {
                    result::reduce_scatter(nccl, send, recv, count, dtype, op, comm, stream)
                }
                Kind::Send => result::send(nccl, send, count, dtype, root, comm, stream),
                Kind::Recv => result::recv(nccl, recv, count, dtype, root, comm, stream),
            }
        }?;
        match issued {
            Progress::Done(()) => Ok(()),
            // Inside a group a non-blocking communicator's call settles at
            // the group's end.
            Progress::InProgress(()) if in_group => Ok(()),
            Progress::InProgress(()) => self.comm.settle(),
        }
    }

    /// After the call (and the group's end): the step lands, and frees and
    /// host access of the buffers wait for the collective.
    pub(crate) fn finish(&self, prepared: PreparedWork<'_>, counted: bool) -> Result<()> {
        if counted {
            self.stream.record_memory_transfer(self.bytes);
        }
        prepared.enqueued().map_err(Error::from)
    }
}
