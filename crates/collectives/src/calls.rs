//! The collectives as methods of a [`Communicator`], each run alone: the
//! seed-shaped calls, one-line views on [`Collective`].

use crate::collective::Collective;
use crate::communicator::Communicator;
use crate::error::Result;
use crate::types::{NcclType, ReduceOp};
use driver::{DeviceMemory, DeviceMemoryMut, Stream};

impl Communicator {
    /// Every rank's `send` combined by `op` into every rank's `recv`.
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, ReduceOp};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let comm = Communicator::all_devices(&[ctx.clone()]).unwrap().remove(0);
    /// let stream = Stream::new(&ctx).unwrap();
    /// let send = DeviceBuffer::from_slice(&stream, &[1u32, 2, 3]).unwrap();
    /// let mut recv = DeviceBuffer::<u32>::new_async(&stream, 3).unwrap();
    /// comm.all_reduce(&stream, &send, &mut recv, ReduceOp::Sum).unwrap();
    /// assert_eq!(recv.to_vec(&stream).unwrap(), [1, 2, 3]); // one rank: itself
    /// let mut short = DeviceBuffer::<u32>::new_async(&stream, 2).unwrap();
    /// assert!(comm.all_reduce(&stream, &send, &mut short, ReduceOp::Sum).is_err());
    /// ```
    pub fn all_reduce<T, S, D>(
        &self,
        stream: &Stream,
        send: &S,
        recv: &mut D,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::all_reduce(self, stream, send, recv, op)?.run()
    }

    /// [`Communicator::all_reduce`] with `buffer` as both send and receive buffer.
    pub fn all_reduce_in_place<T, D>(
        &self,
        stream: &Stream,
        buffer: &mut D,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::all_reduce_in_place(self, stream, buffer, op)?.run()
    }

    /// The root's `send` into every rank's `recv` (`send` is read on the
    /// root only, but every rank passes one of the same length).
    pub fn broadcast<T, S, D>(
        &self,
        stream: &Stream,
        send: &S,
        recv: &mut D,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::broadcast(self, stream, send, recv, root)?.run()
    }

    /// The root's `buffer` into every rank's `buffer`.
    pub fn broadcast_in_place<T, D>(
        &self,
        stream: &Stream,
        buffer: &mut D,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::broadcast_in_place(self, stream, buffer, root)?.run()
    }

    /// Every rank's `send` combined by `op` into the root's `recv` (other
    /// ranks' `recv` is left alone).
    pub fn reduce<T, S, D>(
        &self,
        stream: &Stream,
        send: &S,
        recv: &mut D,
        op: ReduceOp,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::reduce(self, stream, send, recv, op, root)?.run()
    }

    /// Every rank's `send` side by side, in rank order, in every rank's
    /// `recv`, which holds `size()` times as many elements.
    pub fn all_gather<T, S, D>(&self, stream: &Stream, send: &S, recv: &mut D) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::all_gather(self, stream, send, recv)?.run()
    }

    /// Every rank's `send` (`size()` times `recv`'s length) combined by
    /// `op`; rank `r` gets the `r`-th slice of the result in `recv`.
    pub fn reduce_scatter<T, S, D>(
        &self,
        stream: &Stream,
        send: &S,
        recv: &mut D,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::reduce_scatter(self, stream, send, recv, op)?.run()
    }

    /// Send `send` to rank `peer` (`ncclSend`), which receives it with
    /// [`Communicator::recv`] of the same count and element type. Sends and
    /// receives between two ranks meet in call order.
    ///
    /// Alone, the call enqueues at once; a rank that both sends to and
    /// receives from others in one step (a ring, an exchange) issues them
    /// together in a [`crate::Group`], as NCCL requires, so no pair waits
    /// for another. When the peer lives in this process, the call waits
    /// until the peer has posted its receive and checks that the two agree
    /// ([`Error::PeerMismatch`](crate::Error::PeerMismatch)); a peer outside `0..size()` is
    /// [`Error::InvalidPeer`](crate::Error::InvalidPeer).
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, Group};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> Result<(), cuda_streams_collectives::Error> {
    /// let contexts = Context::all()?;
    /// if contexts.len() < 2 { return Ok(()); }
    /// let comms = Communicator::all_devices(&contexts[..2])?;
    /// let streams = [Stream::new(&contexts[0])?, Stream::new(&contexts[1])?];
    /// let activations = DeviceBuffer::from_slice(&streams[0], &[1.5f32; 8])?;
    /// let mut received = DeviceBuffer::<f32>::new_async(&streams[1], 8)?;
    /// // One thread drives both ranks: a group.
    /// let mut group = Group::new();
    /// group.send(&comms[0], &streams[0], &activations, 1)?;
    /// group.recv(&comms[1], &streams[1], &mut received, 0)?;
    /// group.end()?;
    /// assert_eq!(received.to_vec(&streams[1])?, [1.5; 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn send<T, S>(&self, stream: &Stream, send: &S, peer: usize) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
    {
        Collective::send(self, stream, send, peer)?.run()
    }

    /// Receive into `recv` what rank `peer` sends (`ncclRecv`); see
    /// [`Communicator::send`].
    pub fn recv<T, D>(&self, stream: &Stream, recv: &mut D, peer: usize) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::recv(self, stream, recv, peer)?.run()
    }

    /// Every rank sends the `p`-th of `size()` equal chunks of `send` to
    /// rank `p`, and receives rank `p`'s chunk into the `p`-th chunk of
    /// `recv`: grouped sends and receives, as NCCL documents all-to-all.
    /// Both buffers hold `size()` chunks of the same length.
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, Group};
    /// use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> Result<(), cuda_streams_collectives::Error> {
    /// let contexts = Context::all()?;
    /// let comms = Communicator::all_devices(&contexts)?;
    /// let n = comms.len();
    /// let streams = contexts.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// // Rank r's chunk for rank p holds 10 * r + p.
    /// let sends = streams.iter().enumerate()
    ///     .map(|(r, s)| DeviceBuffer::from_slice(s, &(0..n).map(|p| (10 * r + p) as u32).collect::<Vec<_>>()))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut recvs = streams.iter()
    ///     .map(|s| DeviceBuffer::<u32>::new_async(s, n))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut group = Group::new();
    /// for (r, recv) in recvs.iter_mut().enumerate() {
    ///     group.all_to_all(&comms[r], &streams[r], &sends[r], recv)?;
    /// }
    /// group.end()?;
    /// for (p, (stream, recv)) in streams.iter().zip(&recvs).enumerate() {
    ///     let expected: Vec<u32> = (0..n).map(|r| (10 * r + p) as u32).collect();
    ///     assert_eq!(recv.to_vec(stream)?, expected);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn all_to_all<T, S, D>(&self, stream: &Stream, send: &S, recv: &mut D) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::all_to_all(self, stream, send, recv)?.run()
    }

    /// Every rank's `send` into the root's `recv`, side by side in rank
    /// order (grouped sends and receives). The root passes `Some(recv)` of
    /// `size()` times `send`'s length; other ranks' `recv` is not used.
    pub fn gather<T, S, D>(
        &self,
        stream: &Stream,
        send: &S,
        recv: Option<&mut D>,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::gather(self, stream, send, recv, root)?.run()
    }

    /// The root's `send`, cut into `size()` equal chunks, one to each
    /// rank's `recv` (grouped sends and receives). The root passes
    /// `Some(send)` of `size()` times `recv`'s length; other ranks' `send`
    /// is not used.
    pub fn scatter<T, S, D>(
        &self,
        stream: &Stream,
        send: Option<&S>,
        recv: &mut D,
        root: usize,
    ) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        Collective::scatter(self, stream, send, recv, root)?.run()
    }
}
