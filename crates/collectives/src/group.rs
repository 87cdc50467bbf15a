//! One collective as checked and issued, and groups of them.

use crate::communicator::{
    Communicator, all_gather_op, all_reduce_in_place_op, all_reduce_op, all_to_all_ops,
    broadcast_in_place_op, broadcast_op, gather_ops, recv_op, reduce_op, reduce_scatter_op,
    scatter_ops, send_op,
};
use crate::error::{Error, Result};
use crate::meeting::Meeting;
use crate::table::check;
use crate::types::{NcclType, ReduceOp};
use driver::{
    BufferUse, Capture, Context, DeviceMemory, DeviceMemoryMut, GraphArg, PreparedWork, Stream,
};
use engine::{EventPriority, OperationGraph, OperationId, OperationType};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;
use sys::CUdeviceptr;
use sys::nccl::{ncclDataType_t, ncclRedOp_t};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    /// To the peer in `Shape::root`.
    Send,
    /// From the peer in `Shape::root`.
    Recv,
}

impl Kind {
    /// A send or receive (matched with one peer), not a collective (of
    /// every rank).
    pub(crate) fn is_p2p(self) -> bool {
        matches!(self, Self::Send | Self::Recv)
    }

    /// The method's name, for errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::Send => "send",
            Self::Recv => "recv",
        }
    }
}

/// What the ranks of one collective must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) kind: Kind,
    /// Elements per rank as NCCL counts them.
    pub(crate) count: usize,
    pub(crate) dtype: ncclDataType_t,
    pub(crate) op: Option<ReduceOp>,
    /// The root; for a send or receive, the peer.
    pub(crate) root: usize,
    /// Captured into a graph, to run at its replays: the ranks in this
    /// process must all capture a step's collectives or none (NCCL forbids
    /// mixing captured and eager calls of a communicator within a step).
    pub(crate) captured: bool,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} element(s) of ", self.kind.name(), self.count)?;
        match type_name(self.dtype) {
            Some(name) => write!(f, "{name}")?,
            None => write!(f, "NCCL type {}", self.dtype.0)?,
        }
        if let Some(op) = self.op {
            write!(f, ", {op:?}")?;
        }
        match self.kind {
            Kind::Broadcast | Kind::Reduce => write!(f, ", root {}", self.root)?,
            Kind::Send => write!(f, " to rank {}", self.root)?,
            Kind::Recv => write!(f, " from rank {}", self.root)?,
            _ => {}
        }
        if self.captured {
            write!(f, ", captured into a graph")?;
        }
        Ok(())
    }
}

/// The Rust name of an element type this crate offers.
fn type_name(dtype: ncclDataType_t) -> Option<&'static str> {
    type D = ncclDataType_t;
    Some(match dtype {
        D::ncclInt8 => "i8",
        D::ncclUint8 => "u8",
        D::ncclInt32 => "i32",
        D::ncclUint32 => "u32",
        D::ncclInt64 => "i64",
        D::ncclUint64 => "u64",
        D::ncclFloat32 => "f32",
        D::ncclFloat64 => "f64",
        _ => return None,
    })
}

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
/// on its stream and issued (`launch`).
pub(crate) struct Op<'a> {
    comm: &'a Communicator,
    stream: &'a Stream,
    shape: Shape,
    send: CUdeviceptr,
    recv: CUdeviceptr,
    uses: Uses<'a>,
    bytes: usize,
}

impl<'a> Op<'a> {
    /// Check what can be checked locally (the stream's device and capture,
    /// the root, each buffer's device). Nothing is enqueued and the stream
    /// order is not consulted yet: NCCL puts a group's collectives on their
    /// streams only at `ncclGroupEnd`, so `launch` checks the buffers' uses
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
        // `launch` holds the gate from the check through the tracking).
        drop(op.gate()?);
        stream.check_uses(op.uses.as_slice())?;
        Ok(op)
    }

    /// An op to capture into a graph: checked like [`Op::new`]'s, with no
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
    fn gate(&self) -> Result<driver::EnqueueGate<'_>> {
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
    /// on the stream ([`Op::finish`]).
    fn prepare(&self) -> Result<PreparedWork<'_>> {
        self.stream
            .prepare_uses(self.uses.as_slice())
            .map_err(|err| match err {
                driver::Error::StreamCapturing { .. } => self.capturing(),
                other => Error::from(other),
            })
    }

    /// Issue the NCCL call (inside a group, NCCL enqueues it at the end).
    fn issue(&self, in_group: bool) -> Result<()> {
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
        // tracked on the stream, which `launch` does for every call it hands
        // to NCCL, whatever fails after; the stream is not capturing
        // (checked by `launch` just before), so the work runs now. Captured
        // (`record`), the graph keeps every buffer and the communicator
        // alive for all its replays, and orders the buffers at each.
        let (call, code) = unsafe {
            match self.shape.kind {
                Kind::AllReduce => (
                    "ncclAllReduce",
                    (nccl.ncclAllReduce)(send, recv, count, dtype, op, comm, stream),
                ),
                Kind::Broadcast => (
                    "ncclBroadcast",
                    (nccl.ncclBroadcast)(send, recv, count, dtype, root, comm, stream),
                ),
                Kind::Reduce => (
                    "ncclReduce",
                    (nccl.ncclReduce)(send, recv, count, dtype, op, root, comm, stream),
                ),
                Kind::AllGather => (
                    "ncclAllGather",
                    (nccl.ncclAllGather)(send, recv, count, dtype, comm, stream),
                ),
                Kind::ReduceScatter => (
                    "ncclReduceScatter",
                    (nccl.ncclReduceScatter)(send, recv, count, dtype, op, comm, stream),
                ),
                Kind::Send => (
                    "ncclSend",
                    (nccl.ncclSend)(send, count, dtype, root, comm, stream),
                ),
                Kind::Recv => (
                    "ncclRecv",
                    (nccl.ncclRecv)(recv, count, dtype, root, comm, stream),
                ),
            }
        };
        // Inside a group a non-blocking communicator's call settles at the
        // group's end.
        if code == sys::nccl::ncclResult_t::ncclInProgress && in_group {
            return Ok(());
        }
        check(nccl, call, comm, self.comm.settle(code))
    }

    /// After the call (and the group's end): the step lands, and frees and
    /// host access of the buffers wait for the collective.
    fn finish(&self, prepared: PreparedWork<'_>, counted: bool) -> Result<()> {
        if counted {
            self.stream.record_memory_transfer(self.bytes);
        }
        prepared.enqueued().map_err(Error::from)
    }

    /// Check against the other ranks in this process, then issue and track
    /// a collective outside any group.
    pub(crate) fn run_alone(self) -> Result<()> {
        let ops = std::slice::from_ref(&self);
        launch(ops, Issue::Alone, Meet::Yes, Context::force_bind)
    }
}

/// Check a call of several ops (an all-to-all, a gather) against the other
/// ranks in this process, then issue them in one NCCL group.
pub(crate) fn run_grouped(ops: Vec<Op<'_>>) -> Result<()> {
    launch(&ops, Issue::Grouped, Meet::Yes, Context::force_bind)
}

/// Whether `launch` meets the other ranks in this process before the calls
/// (`No`: the caller has established that they agree).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Meet {
    Yes,
    No,
}

/// Whether NCCL took each op of a call (most calls hold a few).
type Handed = SmallVec<[bool; 8]>;

/// Whether `launch` wraps its calls in `ncclGroupStart`/`ncclGroupEnd`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Issue {
    Alone,
    Grouped,
}

/// The one place collectives reach NCCL: every op prepared (capture check,
/// stream order check, step taken and held in flight), the meeting with the
/// other ranks in this process, the calls (one alone, or a group), then
/// every step landed and every call handed to NCCL tracked, whatever failed
/// after it (a tracked use that did not run costs a wait; an untracked one
/// that did would let a free or host access overtake the collective).
/// Returns the first error.
///
/// The steps are taken before the meeting, so that a refused call meets no
/// one (a rank that meets the others and then makes no NCCL call would
/// leave theirs unmatched), and land only once NCCL has enqueued the work
/// (inside a group, at `ncclGroupEnd`): an event recorded on a stream in
/// between does not cover its collective. Work another thread enqueues on
/// one of these streams meanwhile goes before the collective, as the
/// tracker sees it too (a record covers neither until the collective's
/// step lands).
///
/// `rebind` makes the first op's context current again after NCCL, which
/// switches devices as it launches (`Context::force_bind`).
fn launch(
    ops: &[Op<'_>],
    issue: Issue,
    meet_first: Meet,
    rebind: impl FnOnce(&Context) -> driver::Result<()>,
) -> Result<()> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    if ops
        .iter()
        .any(|op| op.comm.context().kind() != first.comm.context().kind())
    {
        return Err(Error::MixedDrivers);
    }
    // Every stream before any call, so a refused group issues nothing; the
    // gates never wait, so holding several cannot deadlock. Dropped on an
    // error before the calls, the steps land with nothing enqueued, which
    // orders nothing that did not happen (`PreparedWork`).
    let mut prepared: SmallVec<[PreparedWork<'_>; 8]> = SmallVec::with_capacity(ops.len());
    for op in ops {
        prepared.push(op.prepare()?);
    }
    if meet_first == Meet::Yes {
        meet(ops)?;
    }
    let (handed, result) = issue_all(ops, issue)?;
    // Not `?`: the calls are enqueued, and must be tracked first.
    let mut result = result;
    let rebound = rebind(first.comm.context()).map_err(Error::from);
    // Ops after a failed call in a group were never handed to NCCL: their
    // steps land untracked when the rest of `prepared` drops.
    for ((op, work), &took) in ops.iter().zip(prepared).zip(&handed) {
        let tracked = op.finish(work, took);
        result = result.and(tracked);
    }
    result.and(rebound)
}

/// The NCCL calls of `ops` (one alone, or a group): whether NCCL took
/// each op handed to it, and the first error. `Err` only when the group
/// could not be opened (nothing was handed over).
fn issue_all(ops: &[Op<'_>], issue: Issue) -> Result<(Handed, Result<()>)> {
    let Some(first) = ops.first() else {
        return Ok((Handed::new(), Ok(())));
    };
    let nccl = first.comm.nccl();
    // Each op handed to NCCL, and whether NCCL took it.
    let mut handed = Handed::with_capacity(ops.len());
    let mut result = Ok(());
    match issue {
        Issue::Alone => {
            for op in ops {
                let issued = op.issue(false);
                handed.push(issued.is_ok());
                result = result.and(issued);
            }
        }
        Issue::Grouped => {
            // SAFETY: no arguments.
            let code = unsafe { (nccl.ncclGroupStart)() };
            check(nccl, "ncclGroupStart", std::ptr::null_mut(), code)?;
            for op in ops {
                let issued = op.issue(true);
                handed.push(issued.is_ok());
                if issued.is_err() {
                    result = issued;
                    break;
                }
            }
            // SAFETY: no arguments; closes the group opened above.
            let mut code = unsafe { (nccl.ncclGroupEnd)() };
            // Non-blocking communicators finish the group's launches in the
            // background: wait until each has.
            if code == sys::nccl::ncclResult_t::ncclInProgress {
                for (op, _) in ops.iter().zip(&handed).filter(|(_, ok)| **ok) {
                    code = op.comm.settle(sys::nccl::ncclResult_t::ncclInProgress);
                    if code != sys::nccl::ncclResult_t::ncclSuccess {
                        break;
                    }
                }
            }
            result = result.and(check(nccl, "ncclGroupEnd", std::ptr::null_mut(), code));
        }
    }
    Ok((handed, result))
}

/// Capture `ops`, all of one rank and stream, into `capture` (one NCCL
/// group when there are several): once the capture has checked the stream,
/// checked against the other ranks in this process, then recorded with `args`' buffers and the communicator
/// kept alive by the graph. Nothing is tracked now: each replay orders the
/// buffers.
pub(crate) fn record(ops: &[Op<'_>], capture: &mut Capture, args: &[GraphArg]) -> Result<()> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    debug_assert!(
        ops.iter()
            .all(|op| std::ptr::eq(op.comm, first.comm) && op.stream.id() == first.stream.id())
    );
    let issue = if ops.len() > 1 {
        Issue::Grouped
    } else {
        Issue::Alone
    };
    // SAFETY: NCCL enqueues the calls on the ops' one stream, which the
    // capture checks is in it; they touch the buffers the ops' pointers
    // come from, which are `args` (send buffers read, receive buffers lent
    // with `GraphArg::write`), and the communicator `keep_alive` holds.
    unsafe {
        capture.record_external(first.stream, args, first.comm.keep_alive(), || {
            // Met only once the capture has taken the stream: a call that
            // meets the other ranks and then makes no NCCL call would leave
            // theirs unmatched.
            meet(ops)?;
            let (_, result) = issue_all(ops, issue)?;
            let rebound = first.comm.context().force_bind().map_err(Error::from);
            result.and(rebound)
        })
    }
}

/// The common case of one thread driving every rank of a communicator made
/// by `all_devices`, one collective each (a data-parallel step): `true`
/// when the ops are exactly that and every rank's shape is the first's,
/// which is all the general checks (`Group::check_ranks`, `meet`) would
/// establish, at the cost of one comparison per rank, with no lock and no
/// allocation. No other thread can hold these ranks (the group borrows
/// each, and a `Communicator` is not `Sync`), so there is no one to meet.
/// `false` sends the ops down the general path, which also names any
/// disagreement.
fn whole_round_agrees(ops: &[Op<'_>]) -> bool {
    let Some(first) = ops.first() else {
        return false;
    };
    let n = first.comm.size();
    if ops.len() != n || n > 64 {
        return false;
    }
    let mut seen = 0u64;
    for op in ops {
        if !op.comm.made_together
            || !Arc::ptr_eq(op.comm.meeting(), first.comm.meeting())
            || op.shape != first.shape
            || op.shape.kind.is_p2p()
        {
            return false;
        }
        seen |= 1 << op.comm.rank();
    }
    seen.count_ones() as usize == n
}

/// Post the ops' shapes, per communicator and rank, to the meetings of the
/// ranks in this process, and wait for every verdict. Every meeting is
/// posted to before any is waited on, so calls that each hold ranks of
/// several communicators cannot wait for each other in a circle.
fn meet(ops: &[Op<'_>]) -> Result<()> {
    // The common case of one rank per process costs one branch per op: no
    // lock, no allocation.
    if ops.iter().all(|op| op.comm.alone_here) {
        return Ok(());
    }
    /// Each rank's collectives, in call order.
    type Calls = BTreeMap<usize, Vec<Shape>>;
    let mut meetings: Vec<(&Arc<Meeting>, Calls)> = Vec::new();
    for op in ops.iter().filter(|op| !op.comm.alone_here) {
        let meeting = op.comm.meeting();
        let calls = match meetings.iter_mut().find(|(m, _)| Arc::ptr_eq(m, meeting)) {
            Some((_, calls)) => calls,
            None => {
                meetings.push((meeting, BTreeMap::new()));
                &mut meetings.last_mut().unwrap_or_else(|| unreachable!()).1
            }
        };
        calls.entry(op.comm.rank()).or_default().push(op.shape);
    }
    // Every post first (a refusal of one call posts nothing anywhere).
    for (meeting, calls) in &meetings {
        meeting.check_pairs_within(calls)?;
    }
    // A communicator driven whole by this call (every rank of one made by
    // `all_devices`) is judged here: no other thread can hold its ranks.
    let whole = |meeting: &Arc<Meeting>, calls: &Calls| {
        ops.iter()
            .filter(|op| Arc::ptr_eq(op.comm.meeting(), meeting))
            .all(|op| op.comm.made_together && calls.len() == op.comm.size())
    };
    for (meeting, calls) in &meetings {
        if whole(meeting, calls) {
            meeting.judge_whole(calls)?;
        }
    }
    let tickets: Vec<_> = meetings
        .into_iter()
        .filter(|(meeting, calls)| !whole(meeting, calls))
        .filter_map(|(meeting, calls)| meeting.post(calls.into_iter().collect()))
        .collect();
    // Every ticket waited for, so each round's verdict is collected.
    let mut result = Ok(());
    for ticket in tickets {
        result = result.and(ticket.wait().map_err(Error::from));
    }
    result
}

/// Collectives issued together (`ncclGroupStart` ... `ncclGroupEnd`): how
/// one thread drives several ranks (NCCL needs it, or the first rank's call
/// may wait for the others), and how several collectives fuse.
///
/// Each call checks its own rank's arguments at once; [`Group::end`] then,
/// before any call reaches NCCL, checks that every rank of each
/// communicator made by [`Communicator::all_devices`] takes part, that no
/// stream is being captured, and that the ranks in this process agree (the
/// same collectives, counts, types, operations and roots, in order): those
/// in the group among themselves, and ranks driven by other threads
/// through their own calls, which the group waits for (see
/// [`Communicator`]'s checks). Then it issues them. The buffers stay
/// borrowed until then. A group dropped without `end` issues nothing.
///
/// ```
/// use cuda_streams_collectives::{Communicator, Error, Group, ReduceOp};
/// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> Result<(), cuda_streams_collectives::Error> {
/// let contexts = Context::all()?;
/// if contexts.len() < 2 { return Ok(()); }
/// let comms = Communicator::all_devices(&contexts[..2])?;
/// let streams = [Stream::new(&contexts[0])?, Stream::new(&contexts[1])?];
/// let mut a = DeviceBuffer::from_slice(&streams[0], &[1.0f32; 8])?;
/// let mut b = DeviceBuffer::from_slice(&streams[1], &[2.0f32; 4])?; // 4, not 8
/// let mut group = Group::new();
/// group.all_reduce_in_place(&comms[0], &streams[0], &mut a, ReduceOp::Sum)?;
/// group.all_reduce_in_place(&comms[1], &streams[1], &mut b, ReduceOp::Sum)?;
/// let err = group.end().unwrap_err(); // before NCCL saw either
/// assert!(matches!(err, Error::RanksDisagree { .. }), "{err}");
/// assert!(err.to_string().contains("rank 1"), "{err}");
/// # Ok(())
/// # }
/// ```
#[must_use = "a group issues its collectives only at `end()`"]
#[derive(Default)]
pub struct Group<'a> {
    ops: Vec<Op<'a>>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`Communicator::all_reduce`] in the group.
    pub fn all_reduce<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops.push(all_reduce_op(comm, stream, send, recv, op)?);
        Ok(())
    }

    /// [`Communicator::all_reduce_in_place`] in the group.
    pub fn all_reduce_in_place<T, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        buffer: &'a mut D,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops
            .push(all_reduce_in_place_op(comm, stream, buffer, op)?);
        Ok(())
    }

    /// [`Communicator::broadcast`] in the group.
    pub fn broadcast<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops.push(broadcast_op(comm, stream, send, recv, root)?);
        Ok(())
    }

    /// [`Communicator::broadcast_in_place`] in the group.
    pub fn broadcast_in_place<T, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        buffer: &'a mut D,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops
            .push(broadcast_in_place_op(comm, stream, buffer, root)?);
        Ok(())
    }

    /// [`Communicator::reduce`] in the group.
    pub fn reduce<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        op: ReduceOp,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops
            .push(reduce_op(comm, stream, send, recv, op, root)?);
        Ok(())
    }

    /// [`Communicator::all_gather`] in the group.
    pub fn all_gather<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops.push(all_gather_op(comm, stream, send, recv)?);
        Ok(())
    }

    /// [`Communicator::reduce_scatter`] in the group.
    pub fn reduce_scatter<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops
            .push(reduce_scatter_op(comm, stream, send, recv, op)?);
        Ok(())
    }

    /// [`Communicator::send`] in the group.
    pub fn send<T, S>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        peer: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
    {
        self.ops.push(send_op(comm, stream, send, peer)?);
        Ok(())
    }

    /// [`Communicator::recv`] in the group.
    pub fn recv<T, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        recv: &'a mut D,
        peer: usize,
    ) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops.push(recv_op(comm, stream, recv, peer)?);
        Ok(())
    }

    /// [`Communicator::all_to_all`] in the group (how one thread drives
    /// every rank's part).
    pub fn all_to_all<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: &'a mut D,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops.extend(all_to_all_ops(comm, stream, send, recv)?);
        Ok(())
    }

    /// [`Communicator::gather`] in the group.
    pub fn gather<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: &'a S,
        recv: Option<&'a mut D>,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops.extend(gather_ops(comm, stream, send, recv, root)?);
        Ok(())
    }

    /// [`Communicator::scatter`] in the group.
    pub fn scatter<T, S, D>(
        &mut self,
        comm: &'a Communicator,
        stream: &'a Stream,
        send: Option<&'a S>,
        recv: &'a mut D,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        self.ops
            .extend(scatter_ops(comm, stream, send, recv, root)?);
        Ok(())
    }

    /// How many NCCL calls the group holds (an all-to-all is one send and
    /// one receive per rank).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the group holds none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Check the ranks against each other, then issue every collective in
    /// one NCCL group and track the buffers. When a call fails, the group is
    /// still closed and every call handed to NCCL tracked; the first error
    /// is returned.
    pub fn end(self) -> Result<()> {
        let meet = self.check_ranks()?;
        launch(&self.ops, Issue::Grouped, meet, Context::force_bind)
    }

    /// [`Group::end`] as operations of `graph`: one operation per stream the
    /// group uses (its kind [`OperationType::AllReduce`],
    /// [`OperationType::Broadcast`] for Broadcast and AllGather, or
    /// [`OperationType::Reduction`] for Reduce and ReduceScatter), each after
    /// `after`, which may be operations on any device. Dependants order after
    /// the collectives like after any operation. Returns the operations'
    /// ids, in the order the group first used their streams.
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, Group, ReduceOp};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// use cuda_streams_collectives::engine::{OperationGraph, OperationType};
    /// # fn main() -> Result<(), cuda_streams_collectives::Error> {
    /// let contexts = Context::all()?;
    /// let comms = Communicator::all_devices(&contexts)?;
    /// let streams = contexts.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let graph = OperationGraph::for_context(&contexts[0]);
    /// let mut grads = Vec::new();
    /// let mut fills = Vec::new();
    /// for stream in &streams {
    ///     let mut g = DeviceBuffer::<f32>::new_async(stream, 256)?;
    ///     fills.push(graph.op(stream).label("gradients").run(|s| s.memset_u32_async(&mut g, 1.0f32.to_bits()))?.id());
    ///     grads.push(g);
    /// }
    /// let mut group = Group::new();
    /// for ((comm, stream), g) in comms.iter().zip(&streams).zip(&mut grads) {
    ///     group.all_reduce_in_place(comm, stream, g, ReduceOp::Sum)?;
    /// }
    /// let reduced = group.end_in(&graph, &fills, "all-reduce gradients")?;
    /// let kind = graph.metadata(reduced[0]).map(|m| m.operation_type);
    /// assert!(kind.is_none() || kind == Some(OperationType::AllReduce)); // None once retired
    /// let n = comms.len() as f32;
    /// for (stream, g) in streams.iter().zip(&grads) {
    ///     assert_eq!(g.to_vec(stream)?, vec![n; 256]);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn end_in(
        self,
        graph: &OperationGraph,
        after: &[OperationId],
        label: &str,
    ) -> Result<Vec<OperationId>> {
        let meet = self.check_ranks()?;
        let mut streams: Vec<(&Stream, OperationType)> = Vec::new();
        for op in &self.ops {
            if !streams.iter().any(|(s, _)| s.id() == op.stream.id()) {
                let kind = match op.shape.kind {
                    Kind::AllReduce => OperationType::AllReduce,
                    Kind::Broadcast | Kind::AllGather => OperationType::Broadcast,
                    Kind::Reduce | Kind::ReduceScatter => OperationType::Reduction,
                    Kind::Send | Kind::Recv => OperationType::MemoryTransfer,
                };
                streams.push((op.stream, kind));
            }
        }
        let mut ids = Vec::with_capacity(streams.len());
        for (stream, kind) in &streams {
            let id = graph.register_operation(
                *kind,
                EventPriority::Normal,
                &stream.to_arc(),
                after.to_vec(),
                label,
            )?;
            graph.begin_operation(id, stream)?;
            ids.push(id);
        }
        // After `begin_operation`'s waits: the collectives' uses are checked
        // with what those waits ordered.
        let issued = launch(&self.ops, Issue::Grouped, meet, Context::force_bind);
        // Completed even when a call failed: what was enqueued stays
        // ordered before the dependants.
        let mut completed = Ok(());
        for &id in &ids {
            completed = completed.and(graph.complete_operation(id).map_err(Error::from));
        }
        issued.and(completed).map(|()| ids)
    }

    /// Before any call reaches NCCL: every rank of each communicator made
    /// by [`Communicator::all_devices`] takes part (one thread drives them
    /// all, so a rank left out would never come), no stream is capturing,
    /// and the ranks in this group agree among themselves. Whether they
    /// must still meet the other threads' calls for their other ranks
    /// (`launch` does, once every op has its step).
    fn check_ranks(&self) -> Result<Meet> {
        if whole_round_agrees(&self.ops) {
            return Ok(Meet::No);
        }
        // communicator -> (size, rank -> its calls)
        let mut together: Vec<(&Arc<Meeting>, usize, BTreeMap<usize, usize>)> = Vec::new();
        for op in self
            .ops
            .iter()
            .filter(|op| op.comm.made_together && !op.shape.kind.is_p2p())
        {
            let meeting = op.comm.meeting();
            let index = match together.iter().position(|(m, ..)| Arc::ptr_eq(m, meeting)) {
                Some(index) => index,
                None => {
                    together.push((meeting, op.comm.size(), BTreeMap::new()));
                    together.len() - 1
                }
            };
            *together[index].2.entry(op.comm.rank()).or_default() += 1;
        }
        for (_, nranks, ranks) in &together {
            let (&rank0, &calls0) = ranks.iter().next().unwrap_or_else(|| unreachable!());
            for rank in 0..*nranks {
                let calls = ranks.get(&rank).copied().unwrap_or(0);
                if calls != calls0 {
                    return Err(Error::MissingRank {
                        rank: rank0,
                        calls_here: calls0,
                        other_rank: rank,
                        calls_there: calls,
                    });
                }
            }
        }
        // Sends and receives of a communicator one thread drives whole
        // (`all_devices`) can only be matched within the group.
        for op in self.ops.iter().filter(|op| op.comm.made_together) {
            let rank = op.comm.rank();
            let peer = op.shape.root;
            let (from, to) = match op.shape.kind {
                Kind::Send => (rank, peer),
                Kind::Recv => (peer, rank),
                _ => continue,
            };
            let count = |kind: Kind, holder: usize, other: usize| {
                self.ops
                    .iter()
                    .filter(|o| {
                        Arc::ptr_eq(o.comm.meeting(), op.comm.meeting())
                            && o.shape.kind == kind
                            && o.comm.rank() == holder
                            && o.shape.root == other
                    })
                    .count()
            };
            let (sends, recvs) = (count(Kind::Send, from, to), count(Kind::Recv, to, from));
            if sends != recvs {
                return Err(Error::UnmatchedPeer {
                    from,
                    to,
                    sends,
                    recvs,
                });
            }
        }
        // Refused before anything is registered or met (a snapshot:
        // `launch` takes the gates for the calls themselves).
        for op in &self.ops {
            drop(op.gate()?);
        }
        Ok(Meet::Yes)
    }
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("collectives", &self.ops.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use driver::DeviceBuffer;
    use test_support::Gate;

    /// The lock-free path is what one thread driving a whole `all_devices`
    /// communicator takes for one collective per rank, and only then.
    #[test]
    fn a_whole_matching_round_skips_the_meeting_and_nothing_else_does() {
        let contexts = Context::all().unwrap();
        if contexts.len() < 2 {
            eprintln!(
                "skipped: needs two devices, the driver reports {}",
                contexts.len()
            );
            return;
        }
        let comms = Communicator::all_devices(&contexts).unwrap();
        let streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
        let mut bufs: Vec<DeviceBuffer<f32>> = streams
            .iter()
            .enumerate()
            .map(|(r, s)| DeviceBuffer::from_slice(s, &vec![1.0; 8 + r % 2]).unwrap())
            .collect();
        let n = comms.len();
        let round = |bufs: &mut [DeviceBuffer<f32>], ranks: usize| {
            let mut group = Group::new();
            for ((comm, stream), buf) in comms.iter().zip(&streams).zip(bufs).take(ranks) {
                group
                    .all_reduce_in_place(comm, stream, buf, ReduceOp::Sum)
                    .unwrap();
            }
            whole_round_agrees(&group.ops)
        };
        // Rank 1's buffer is one longer: the general path names it.
        assert!(!round(&mut bufs, n));
        let mut same: Vec<DeviceBuffer<f32>> = streams
            .iter()
            .map(|s| DeviceBuffer::from_slice(s, &[1.0; 8]).unwrap())
            .collect();
        assert!(round(&mut same, n));
        assert!(!round(&mut same, n - 1), "a rank left out");
    }

    /// A failure after NCCL has the calls still tracks each of them: send
    /// buffers dropped at once on their home streams are freed only after
    /// the held collectives read them. The failure is injected into
    /// `launch`'s rebinding: on the software driver `cuCtxSetCurrent` fails
    /// only inside a stream callback (where `bind` refuses first) or for a
    /// context no longer alive (the communicator holds its context), so no
    /// public call provokes it.
    #[test]
    fn calls_handed_to_nccl_are_tracked_when_rebinding_fails() {
        let contexts = Context::all().unwrap();
        if contexts.len() < 2 {
            eprintln!(
                "skipped: needs two devices, the driver reports {}",
                contexts.len()
            );
            return;
        }
        let contexts = &contexts[..2];
        let comms = Communicator::all_devices(contexts).unwrap();
        let streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
        // Uploaded on other streams, whose frees the collectives' streams
        // must hold back.
        let homes: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
        let send: Vec<DeviceBuffer<u32>> = homes
            .iter()
            .enumerate()
            .map(|(r, s)| DeviceBuffer::from_slice(s, &[r as u32 + 1; 4096]).unwrap())
            .collect();
        let mut recv: Vec<DeviceBuffer<u32>> = streams
            .iter()
            .map(|s| DeviceBuffer::from_slice(s, &[0; 4096]).unwrap())
            .collect();
        let gates: Vec<Gate> = streams.iter().map(|s| Gate::close(s)).collect();
        let mut group = Group::new();
        for (i, out) in recv.iter_mut().enumerate() {
            group
                .all_reduce(&comms[i], &streams[i], &send[i], out, ReduceOp::Sum)
                .unwrap();
        }
        let injected = |_: &Context| {
            Err(driver::Error::InsideCallback {
                operation: "rebinding (injected)",
            })
        };
        let err = launch(&group.ops, Issue::Grouped, Meet::No, injected).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        drop(group);
        drop(send);
        drop(gates);
        for (stream, out) in streams.iter().zip(&recv) {
            assert_eq!(out.to_vec(stream).unwrap(), vec![3; 4096]);
        }
    }
}
