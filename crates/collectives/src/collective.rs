//! Every collective this crate offers, defined once: its lengths checked
//! and cut into the NCCL calls of one rank ([`Collective`]). The methods of
//! [`Communicator`] and [`crate::Group`] are one-line views on it.

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::issue::{Grouping, Meet, issue};
use crate::rank_call::{RankCall, Uses};
use crate::shape::{Kind, Shape};
use crate::types::{NcclType, ReduceOp};
use driver::{BufferUse, Context, DeviceMemory, DeviceMemoryMut, Stream};
use smallvec::{SmallVec, smallvec};

/// One rank's part of one collective: its arguments checked against the
/// communicator (devices, lengths, root or peer), its buffers borrowed
/// until it has run. Run it alone ([`Collective::run`], which is what
/// [`Communicator::all_reduce`] and its siblings do) or with others in a
/// [`crate::Group`] ([`crate::Group::add`]).
///
/// ```
/// use cuda_streams_collectives::{Collective, Communicator, ReduceOp};
/// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> Result<(), cuda_streams_collectives::Error> {
/// let ctx = Context::new(0)?;
/// let comm = Communicator::all_devices(&[ctx.clone()])?.remove(0);
/// let stream = Stream::new(&ctx)?;
/// let mut grads = DeviceBuffer::from_slice(&stream, &[2.0f32; 4])?;
/// let sum = Collective::all_reduce_in_place(&comm, &stream, &mut grads, ReduceOp::Sum)?;
/// sum.run()?; // the same as comm.all_reduce_in_place(&stream, &mut grads, ReduceOp::Sum)
/// assert_eq!(grads.to_vec(&stream)?, [2.0; 4]); // one rank: itself
/// # Ok(())
/// # }
/// ```
#[must_use = "a collective does nothing until it is run or added to a group"]
pub struct Collective<'a> {
    /// Its NCCL calls: one, or the sends and receives it is made of.
    pub(crate) calls: SmallVec<[RankCall<'a>; 1]>,
    /// Made of several calls (an all-to-all, a gather, a scatter), which
    /// NCCL needs grouped even when the collective runs alone.
    grouping: Grouping,
}

impl<'a> Collective<'a> {
    fn alone(call: RankCall<'a>) -> Self {
        Self {
            calls: smallvec![call],
            grouping: Grouping::Alone,
        }
    }

    fn grouped(calls: SmallVec<[RankCall<'a>; 1]>) -> Self {
        Self {
            calls,
            grouping: Grouping::Grouped,
        }
    }

    /// Run it now, checked against the other ranks of the communicator in
    /// this process first (see [`Communicator`]).
    pub fn run(self) -> Result<()> {
        issue(&self.calls, self.grouping, Meet::Yes, Context::force_bind)
    }

    /// [`Communicator::all_reduce`].
    pub fn all_reduce<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        op: ReduceOp,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        between(comm, stream, send, recv, Kind::AllReduce, Some(op), 0).map(Self::alone)
    }

    /// [`Communicator::all_reduce_in_place`].
    pub fn all_reduce_in_place<T, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        buffer: &'a mut D,
        op: ReduceOp,
    ) -> Result<Self>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        in_place(comm, stream, buffer, Kind::AllReduce, Some(op), 0).map(Self::alone)
    }

    /// [`Communicator::broadcast`].
    pub fn broadcast<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        root: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        between(comm, stream, send, recv, Kind::Broadcast, None, root).map(Self::alone)
    }

    /// [`Communicator::broadcast_in_place`].
    pub fn broadcast_in_place<T, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        buffer: &'a mut D,
        root: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        in_place(comm, stream, buffer, Kind::Broadcast, None, root).map(Self::alone)
    }

    /// [`Communicator::reduce`].
    pub fn reduce<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        op: ReduceOp,
        root: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        between(comm, stream, send, recv, Kind::Reduce, Some(op), root).map(Self::alone)
    }

    /// [`Communicator::all_gather`].
    pub fn all_gather<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        between(comm, stream, send, recv, Kind::AllGather, None, 0).map(Self::alone)
    }

    /// [`Communicator::reduce_scatter`].
    pub fn reduce_scatter<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        op: ReduceOp,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        between(comm, stream, send, recv, Kind::ReduceScatter, Some(op), 0).map(Self::alone)
    }

    /// [`Communicator::send`].
    pub fn send<T, S>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        peer: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
    {
        let (ptr, count) = (send.device_ptr(), send.device_len());
        let uses = Uses::One([BufferUse::read(send)]);
        part::<T>(comm, stream, Kind::Send, ptr, 0..count, peer, uses).map(Self::alone)
    }

    /// [`Communicator::recv`].
    pub fn recv<T, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        recv: &'a mut D,
        peer: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        let (ptr, count) = (recv.device_ptr(), recv.device_len());
        let uses = Uses::One([BufferUse::write(recv)]);
        part::<T>(comm, stream, Kind::Recv, ptr, 0..count, peer, uses).map(Self::alone)
    }

    /// [`Communicator::all_to_all`]: a send and a receive per rank.
    pub fn all_to_all<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        let chunk = all_to_all_chunk(comm, send.device_len(), recv.device_len())?;
        let (s, r) = (send.device_ptr(), recv.device_ptr());
        let mut send_use = Some(BufferUse::read(send));
        let mut recv_use = Some(BufferUse::write(recv));
        let mut calls = SmallVec::with_capacity(2 * comm.size());
        for peer in 0..comm.size() {
            let elems = peer * chunk..(peer + 1) * chunk;
            let uses = Uses::from_option(send_use.take());
            calls.push(part::<T>(
                comm,
                stream,
                Kind::Send,
                s,
                elems.clone(),
                peer,
                uses,
            )?);
            let uses = Uses::from_option(recv_use.take());
            calls.push(part::<T>(comm, stream, Kind::Recv, r, elems, peer, uses)?);
        }
        Ok(Self::grouped(calls))
    }

    /// [`Communicator::gather`]: the root receives a part from every rank,
    /// every rank sends its part to the root.
    pub fn gather<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: Option<&'a mut D>,
        root: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        let count = send.device_len();
        let whole = recv.map(|recv| (recv.device_ptr(), recv.device_len(), BufferUse::write(recv)));
        let mut calls = root_side::<T>(comm, stream, "gather", Kind::Recv, root, count, whole)?;
        calls.push(Self::send(comm, stream, send, root)?.calls.remove(0));
        Ok(Self::grouped(calls))
    }

    /// [`Communicator::scatter`]: the root sends a part to every rank,
    /// every rank receives its part from the root.
    pub fn scatter<T, S, D>(
        comm: &'a Communicator,
        stream: &'a Stream,
        send: Option<&'a S>,
        recv: &'a mut D,
        root: usize,
    ) -> Result<Self>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        let count = recv.device_len();
        let whole = send.map(|send| (send.device_ptr(), send.device_len(), BufferUse::read(send)));
        let mut calls = root_side::<T>(comm, stream, "scatter", Kind::Send, root, count, whole)?;
        calls.push(Self::recv(comm, stream, recv, root)?.calls.remove(0));
        Ok(Self::grouped(calls))
    }
}

impl std::fmt::Debug for Collective<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collective")
            .field("calls", &self.calls.len())
            .finish()
    }
}

/// `Err` naming the collective, rank and buffer unless a buffer holds the
/// `expected` elements.
pub(crate) fn check_len(
    comm: &Communicator,
    collective: &'static str,
    buffer: &'static str,
    expected: usize,
    actual: usize,
) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::CountMismatch {
            collective,
            rank: comm.rank(),
            buffer,
            expected,
            actual,
        })
    }
}

/// The elements each rank gets of an all-to-all's buffers of `send_len`
/// and `recv_len` elements, which must be equal and a multiple of the
/// communicator's size.
pub(crate) fn all_to_all_chunk(
    comm: &Communicator,
    send_len: usize,
    recv_len: usize,
) -> Result<usize> {
    let n = comm.size();
    if !send_len.is_multiple_of(n) {
        return Err(Error::CountMismatch {
            collective: "all_to_all",
            rank: comm.rank(),
            buffer: "send buffer",
            expected: send_len.next_multiple_of(n),
            actual: send_len,
        });
    }
    check_len(comm, "all_to_all", "receive buffer", send_len, recv_len)?;
    Ok(send_len / n)
}

pub(crate) fn shape<T: NcclType>(
    kind: Kind,
    count: usize,
    op: Option<ReduceOp>,
    root: usize,
) -> Shape {
    Shape {
        kind,
        count,
        dtype: T::DATA_TYPE,
        op,
        root,
        captured: false,
    }
}

/// The elements per rank NCCL counts for a collective of `kind` (one of
/// AllReduce, Broadcast, Reduce, AllGather, ReduceScatter) between buffers
/// of `send_len` and `recv_len` elements, and the elements it moves: `Err`
/// naming the buffer whose length does not fit the other's.
pub(crate) fn count_between(
    comm: &Communicator,
    kind: Kind,
    send_len: usize,
    recv_len: usize,
) -> Result<(usize, usize)> {
    let whole = |count: usize| count.saturating_mul(comm.size());
    // (count, the buffer checked, its length needed, its length, moved)
    let (count, buffer, expected, actual, moved) = match kind {
        Kind::AllReduce | Kind::Reduce => {
            (send_len, "receive buffer", send_len, recv_len, send_len)
        }
        Kind::Broadcast => (recv_len, "send buffer", recv_len, send_len, recv_len),
        Kind::AllGather => (
            send_len,
            "receive buffer",
            whole(send_len),
            recv_len,
            whole(send_len),
        ),
        Kind::ReduceScatter => (
            recv_len,
            "send buffer",
            whole(recv_len),
            send_len,
            whole(recv_len),
        ),
        // One buffer each, cut by `part`.
        Kind::Send | Kind::Recv => (send_len.max(recv_len), "", 0, 0, send_len.max(recv_len)),
    };
    check_len(comm, kind.name(), buffer, expected, actual)?;
    Ok((count, moved))
}

/// A collective of `kind` reading `send` and writing `recv`.
fn between<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
    kind: Kind,
    op: Option<ReduceOp>,
    root: usize,
) -> Result<RankCall<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let (count, moved) = count_between(comm, kind, send.device_len(), recv.device_len())?;
    let shape = shape::<T>(kind, count, op, root);
    let (s, r) = (send.device_ptr(), recv.device_ptr());
    let uses = Uses::Two([BufferUse::read(send), BufferUse::write(recv)]);
    RankCall::new(comm, stream, shape, s, r, uses, moved * size_of::<T>())
}

/// A collective over one buffer, in place.
fn in_place<'a, T, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    buffer: &'a mut D,
    kind: Kind,
    op: Option<ReduceOp>,
    root: usize,
) -> Result<RankCall<'a>>
where
    T: NcclType,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = buffer.device_len();
    let ptr = buffer.device_ptr();
    let uses = Uses::One([BufferUse::write(buffer)]);
    let shape = shape::<T>(kind, count, op, root);
    RankCall::new(comm, stream, shape, ptr, ptr, uses, count * size_of::<T>())
}

/// One send or receive of the elements `elems` of a buffer at `base`,
/// lending the buffer uses `uses` (a part whose buffer another part of the
/// same collective lends lends none).
fn part<'a, T: NcclType>(
    comm: &'a Communicator,
    stream: &'a Stream,
    kind: Kind,
    base: sys::CUdeviceptr,
    elems: std::ops::Range<usize>,
    peer: usize,
    uses: Uses<'a>,
) -> Result<RankCall<'a>> {
    let count = elems.len();
    let ptr = base + (elems.start * size_of::<T>()) as sys::CUdeviceptr;
    let shape = shape::<T>(kind, count, None, peer);
    let (send, recv) = if kind == Kind::Send {
        (ptr, 0)
    } else {
        (0, ptr)
    };
    RankCall::new(
        comm,
        stream,
        shape,
        send,
        recv,
        uses,
        count * size_of::<T>(),
    )
}

/// The root's side of a gather (`kind` is `Recv`) or scatter (`Send`) of
/// `count` elements per rank: one part of the root's `whole` buffer (its
/// pointer, length and use) per peer, the buffer's use lent once (by the
/// first part). Other ranks have no side: none.
fn root_side<'a, T: NcclType>(
    comm: &'a Communicator,
    stream: &'a Stream,
    operation: &'static str,
    kind: Kind,
    root: usize,
    count: usize,
    whole: Option<(sys::CUdeviceptr, usize, BufferUse<'a>)>,
) -> Result<SmallVec<[RankCall<'a>; 1]>> {
    if root >= comm.size() {
        return Err(Error::InvalidRoot {
            root,
            nranks: comm.size(),
        });
    }
    let mut calls = SmallVec::new();
    if comm.rank() != root {
        return Ok(calls);
    }
    let buffer = if kind == Kind::Recv {
        "receive buffer"
    } else {
        "send buffer"
    };
    let Some((base, len, whole_use)) = whole else {
        return Err(Error::MissingBuffer {
            operation,
            rank: comm.rank(),
            buffer,
        });
    };
    check_len(
        comm,
        operation,
        buffer,
        count.saturating_mul(comm.size()),
        len,
    )?;
    calls.reserve(comm.size() + 1);
    let mut pending = Some(whole_use);
    for peer in 0..comm.size() {
        let uses = Uses::from_option(pending.take());
        let elems = peer * count..(peer + 1) * count;
        calls.push(part::<T>(comm, stream, kind, base, elems, peer, uses)?);
    }
    Ok(calls)
}
