//! Every collective this crate offers, defined once: its lengths checked
//! and cut into the NCCL calls of one rank.

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::rank_call::{Op, Uses};
use crate::shape::{Kind, Shape};
use crate::types::{NcclType, ReduceOp};
use driver::{BufferUse, DeviceMemory, DeviceMemoryMut, Stream};

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

/// A collective reading `send` and writing `recv`; `shape` names it and its
/// count, `bytes` is what it moves (for the stream's counters).
fn between<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
    shape: Shape,
    bytes: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let (s, r) = (send.device_ptr(), recv.device_ptr());
    let uses = Uses::Two([BufferUse::read(send), BufferUse::write(recv)]);
    Op::new(comm, stream, shape, s, r, uses, bytes)
}

/// A collective over one buffer, in place.
fn in_place<'a, T, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    buffer: &'a mut D,
    kind: Kind,
    op: Option<ReduceOp>,
    root: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = buffer.device_len();
    let ptr = buffer.device_ptr();
    let uses = Uses::One([BufferUse::write(buffer)]);
    let shape = shape::<T>(kind, count, op, root);
    Op::new(comm, stream, shape, ptr, ptr, uses, count * size_of::<T>())
}

pub(crate) fn all_reduce_op<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
    op: ReduceOp,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = send.device_len();
    check_len(
        comm,
        "all_reduce",
        "receive buffer",
        count,
        recv.device_len(),
    )?;
    let shape = shape::<T>(Kind::AllReduce, count, Some(op), 0);
    between(comm, stream, send, recv, shape, count * size_of::<T>())
}

pub(crate) fn all_reduce_in_place_op<'a, T, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    buffer: &'a mut D,
    op: ReduceOp,
) -> Result<Op<'a>>
where
    T: NcclType,
    D: DeviceMemoryMut<Elem = T>,
{
    in_place(comm, stream, buffer, Kind::AllReduce, Some(op), 0)
}

pub(crate) fn broadcast_op<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
    root: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = recv.device_len();
    check_len(comm, "broadcast", "send buffer", count, send.device_len())?;
    let shape = shape::<T>(Kind::Broadcast, count, None, root);
    between(comm, stream, send, recv, shape, count * size_of::<T>())
}

pub(crate) fn broadcast_in_place_op<'a, T, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    buffer: &'a mut D,
    root: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    D: DeviceMemoryMut<Elem = T>,
{
    in_place(comm, stream, buffer, Kind::Broadcast, None, root)
}

pub(crate) fn reduce_op<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
    op: ReduceOp,
    root: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = send.device_len();
    check_len(comm, "reduce", "receive buffer", count, recv.device_len())?;
    let shape = shape::<T>(Kind::Reduce, count, Some(op), root);
    between(comm, stream, send, recv, shape, count * size_of::<T>())
}

pub(crate) fn all_gather_op<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = send.device_len();
    let whole = count.saturating_mul(comm.size());
    check_len(
        comm,
        "all_gather",
        "receive buffer",
        whole,
        recv.device_len(),
    )?;
    let shape = shape::<T>(Kind::AllGather, count, None, 0);
    between(comm, stream, send, recv, shape, whole * size_of::<T>())
}

pub(crate) fn reduce_scatter_op<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
    op: ReduceOp,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = recv.device_len();
    let whole = count.saturating_mul(comm.size());
    check_len(
        comm,
        "reduce_scatter",
        "send buffer",
        whole,
        send.device_len(),
    )?;
    let shape = shape::<T>(Kind::ReduceScatter, count, Some(op), 0);
    between(comm, stream, send, recv, shape, whole * size_of::<T>())
}

pub(crate) fn send_op<'a, T, S>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    peer: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
{
    let count = send.device_len();
    let ptr = send.device_ptr();
    let shape = shape::<T>(Kind::Send, count, None, peer);
    let uses = Uses::One([BufferUse::read(send)]);
    Op::new(comm, stream, shape, ptr, 0, uses, count * size_of::<T>())
}

pub(crate) fn recv_op<'a, T, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    recv: &'a mut D,
    peer: usize,
) -> Result<Op<'a>>
where
    T: NcclType,
    D: DeviceMemoryMut<Elem = T>,
{
    let count = recv.device_len();
    let ptr = recv.device_ptr();
    let shape = shape::<T>(Kind::Recv, count, None, peer);
    let uses = Uses::One([BufferUse::write(recv)]);
    Op::new(comm, stream, shape, 0, ptr, uses, count * size_of::<T>())
}

/// One send or receive of the elements `elems` of a buffer
/// whose use another op of the same call carries (`uses`, or none).
fn part<'a, T: NcclType>(
    comm: &'a Communicator,
    stream: &'a Stream,
    kind: Kind,
    base: sys::CUdeviceptr,
    elems: std::ops::Range<usize>,
    peer: usize,
    uses: Uses<'a>,
) -> Result<Op<'a>> {
    let count = elems.len();
    let ptr = base + (elems.start * size_of::<T>()) as sys::CUdeviceptr;
    let shape = shape::<T>(kind, count, None, peer);
    let (send, recv) = if kind == Kind::Send {
        (ptr, 0)
    } else {
        (0, ptr)
    };
    Op::new(
        comm,
        stream,
        shape,
        send,
        recv,
        uses,
        count * size_of::<T>(),
    )
}

fn check_root(comm: &Communicator, root: usize) -> Result<()> {
    if root < comm.size() {
        Ok(())
    } else {
        Err(Error::InvalidRoot {
            root,
            nranks: comm.size(),
        })
    }
}

pub(crate) fn all_to_all_ops<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: &'a mut D,
) -> Result<Vec<Op<'a>>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    let n = comm.size();
    let len = send.device_len();
    if !len.is_multiple_of(n) {
        return Err(Error::CountMismatch {
            collective: "all_to_all",
            rank: comm.rank(),
            buffer: "send buffer",
            expected: len.next_multiple_of(n),
            actual: len,
        });
    }
    check_len(comm, "all_to_all", "receive buffer", len, recv.device_len())?;
    let chunk = len / n;
    let (s, r) = (send.device_ptr(), recv.device_ptr());
    let mut send_use = Some(BufferUse::read(send));
    let mut recv_use = Some(BufferUse::write(recv));
    let mut ops = Vec::with_capacity(2 * n);
    for peer in 0..n {
        let uses = Uses::from_option(send_use.take());
        ops.push(part::<T>(
            comm,
            stream,
            Kind::Send,
            s,
            peer * chunk..(peer + 1) * chunk,
            peer,
            uses,
        )?);
        let uses = Uses::from_option(recv_use.take());
        ops.push(part::<T>(
            comm,
            stream,
            Kind::Recv,
            r,
            peer * chunk..(peer + 1) * chunk,
            peer,
            uses,
        )?);
    }
    Ok(ops)
}

/// The root's side of a gather (`Kind::Recv`) or scatter (`Kind::Send`):
/// one part of `count` elements of the root's buffer at `base` per peer,
/// the buffer's use tracked once (by the first part).
fn root_parts<'a, T: NcclType>(
    comm: &'a Communicator,
    stream: &'a Stream,
    kind: Kind,
    base: sys::CUdeviceptr,
    count: usize,
    whole_use: BufferUse<'a>,
    ops: &mut Vec<Op<'a>>,
) -> Result<()> {
    let mut pending = Some(whole_use);
    for peer in 0..comm.size() {
        let uses = Uses::from_option(pending.take());
        let elems = peer * count..(peer + 1) * count;
        ops.push(part::<T>(comm, stream, kind, base, elems, peer, uses)?);
    }
    Ok(())
}

pub(crate) fn gather_ops<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: &'a S,
    recv: Option<&'a mut D>,
    root: usize,
) -> Result<Vec<Op<'a>>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    check_root(comm, root)?;
    let count = send.device_len();
    let mut ops = Vec::with_capacity(comm.size() + 1);
    if comm.rank() == root {
        let whole = count.saturating_mul(comm.size());
        let Some(recv) = recv else {
            return Err(Error::MissingBuffer {
                operation: "gather",
                rank: comm.rank(),
                buffer: "receive buffer",
            });
        };
        check_len(comm, "gather", "receive buffer", whole, recv.device_len())?;
        let r = recv.device_ptr();
        root_parts::<T>(
            comm,
            stream,
            Kind::Recv,
            r,
            count,
            BufferUse::write(recv),
            &mut ops,
        )?;
    }
    ops.push(send_op(comm, stream, send, root)?);
    Ok(ops)
}

pub(crate) fn scatter_ops<'a, T, S, D>(
    comm: &'a Communicator,
    stream: &'a Stream,
    send: Option<&'a S>,
    recv: &'a mut D,
    root: usize,
) -> Result<Vec<Op<'a>>>
where
    T: NcclType,
    S: DeviceMemory<Elem = T>,
    D: DeviceMemoryMut<Elem = T>,
{
    check_root(comm, root)?;
    let count = recv.device_len();
    let mut ops = Vec::with_capacity(comm.size() + 1);
    if comm.rank() == root {
        let whole = count.saturating_mul(comm.size());
        let Some(send) = send else {
            return Err(Error::MissingBuffer {
                operation: "scatter",
                rank: comm.rank(),
                buffer: "send buffer",
            });
        };
        check_len(comm, "scatter", "send buffer", whole, send.device_len())?;
        let s = send.device_ptr();
        root_parts::<T>(
            comm,
            stream,
            Kind::Send,
            s,
            count,
            BufferUse::read(send),
            &mut ops,
        )?;
    }
    ops.push(recv_op(comm, stream, recv, root)?);
    Ok(ops)
}
