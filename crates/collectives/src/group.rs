//! Groups of collectives, issued together.

use crate::collective::Collective;
use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::issue::{Grouping, Meet, issue, whole_round_agrees};
use crate::meeting::Meeting;
use crate::rank_call::RankCall;
use crate::shape::Kind;
use crate::types::{NcclType, ReduceOp};
use driver::{Context, DeviceMemory, DeviceMemoryMut, Stream};
use engine::{EventPriority, OperationGraph, OperationId, OperationType};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    pub(crate) ops: Vec<RankCall<'a>>,
}

impl<'a> Group<'a> {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `collective` to the group. The methods below are this, for each
    /// kind of collective: `group.all_reduce(comm, ..)` is
    /// `group.add(Collective::all_reduce(comm, ..)?)`.
    ///
    /// ```
    /// use cuda_streams_collectives::{Collective, Communicator, Group, ReduceOp};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> Result<(), cuda_streams_collectives::Error> {
    /// let contexts = Context::all()?;
    /// let comms = Communicator::all_devices(&contexts)?;
    /// let streams = contexts.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let mut buffers = streams
    ///     .iter()
    ///     .map(|s| DeviceBuffer::from_slice(s, &[1u32; 4]))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut group = Group::new();
    /// for ((comm, stream), buffer) in comms.iter().zip(&streams).zip(&mut buffers) {
    ///     group.add(Collective::all_reduce_in_place(comm, stream, buffer, ReduceOp::Sum)?);
    /// }
    /// assert_eq!(group.len(), comms.len());
    /// group.end()?;
    /// for (stream, buffer) in streams.iter().zip(&buffers) {
    ///     assert_eq!(buffer.to_vec(stream)?, [comms.len() as u32; 4]);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn add(&mut self, collective: Collective<'a>) {
        self.ops.extend(collective.calls);
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
        self.add(Collective::all_reduce(comm, stream, send, recv, op)?);
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
        self.add(Collective::all_reduce_in_place(comm, stream, buffer, op)?);
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
        self.add(Collective::broadcast(comm, stream, send, recv, root)?);
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
        self.add(Collective::broadcast_in_place(comm, stream, buffer, root)?);
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
        self.add(Collective::reduce(comm, stream, send, recv, op, root)?);
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
        self.add(Collective::all_gather(comm, stream, send, recv)?);
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
        self.add(Collective::reduce_scatter(comm, stream, send, recv, op)?);
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
        self.add(Collective::send(comm, stream, send, peer)?);
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
        self.add(Collective::recv(comm, stream, recv, peer)?);
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
        self.add(Collective::all_to_all(comm, stream, send, recv)?);
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
        self.add(Collective::gather(comm, stream, send, recv, root)?);
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
        self.add(Collective::scatter(comm, stream, send, recv, root)?);
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
        issue(&self.ops, Grouping::Grouped, meet, Context::force_bind)
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
        let issued = issue(&self.ops, Grouping::Grouped, meet, Context::force_bind);
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
    /// (`issue` does, once every op has its step).
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
        // `issue` takes the gates for the calls themselves).
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
