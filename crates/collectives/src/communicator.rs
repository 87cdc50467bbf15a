//! Communicators: one rank each, on one device's context.

use crate::error::{Error, Result};
use crate::group::{Kind, Op, Shape, Uses};
use crate::meeting::Meeting;
use crate::one_process::explain_join_failure;
use crate::table::{check, for_context};
use crate::types::{NcclType, ReduceOp, UniqueId};
use driver::{BufferUse, Context, DeviceMemory, DeviceMemoryMut, Stream};
use std::fmt;
use std::sync::Arc;
use sys::nccl::{Nccl, ncclComm_t, ncclConfig_t, ncclResult_t};

/// One rank of an NCCL communicator, on one device.
///
/// Collectives take the rank's stream (of the communicator's device) and
/// typed buffers of that device: the send buffer is read, the receive buffer
/// written, both tracked on the stream like a copy's, so neither is freed
/// before the collective has run. Lengths are checked against the collective
/// and the communicator's size before NCCL sees the call.
///
/// A communicator may move between threads (`Send`) but not be shared
/// (`!Sync`): NCCL forbids concurrent calls on one communicator. Driving
/// several ranks from one thread needs a [`crate::Group`], as NCCL requires.
///
/// # What is checked before NCCL sees a collective
///
/// - This rank's arguments: the stream's and buffers' device, the lengths,
///   the root, and that the stream is not being captured into a graph
///   ([`Error::StreamCapturing`]: the graph would keep none of the buffers
///   for its replays).
/// - **The ranks against each other, where they share this process**
///   (`all_devices`, or `init_rank` called from several threads): a
///   collective made alone waits until every other rank of the
///   communicator in this process has made its own (NCCL's call may block
///   the same way), then all go on to NCCL or none does. Ranks that
///   disagree on the collective, count, element type, operation or root
///   all get [`Error::RanksDisagree`], naming both ranks and values; ranks
///   that group their collectives differently get [`Error::MissingRank`].
///   A rank whose communicator is dropped or aborted ends the others' wait
///   ([`Error::RankGone`]). A call refused by its own rank's checks counts
///   for nothing: the others wait for that rank's next collective.
/// - **Ranks in other processes are not compared**: nothing here sees
///   their calls, and NCCL does not check them. With one rank per process,
///   collectives that disagree hang or read and write past the buffers on
///   GPUs; keep every rank's sequence of collectives identical.
///
/// Dropping it destroys the communicator (`ncclCommDestroy`, which waits for
/// its collectives); [`Communicator::abort`] gives up on them instead.
pub struct Communicator {
    raw: ncclComm_t,
    nccl: &'static Nccl,
    /// Owns `raw`: shared with the graphs that captured this rank's
    /// collectives, so the communicator outlives their replays. `None` only
    /// once `abort` has taken it.
    handle: Option<Arc<Handle>>,
    ctx: Arc<Context>,
    rank: usize,
    nranks: usize,
    /// Shared by the communicator's ranks in this process, which compare
    /// their collectives there before NCCL sees them.
    meeting: Arc<Meeting>,
    /// Made by `all_devices`, to be driven together: a group holds every
    /// rank or none.
    pub(crate) made_together: bool,
    /// No other rank of the communicator lives in this process: nothing to
    /// compare with, so calls skip the meeting.
    pub(crate) alone_here: bool,
    /// A non-blocking communicator: calls may answer `ncclInProgress`.
    blocking: bool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time; `Communicator` is not `Sync`, so calls on one are never concurrent.
unsafe impl Send for Communicator {}

impl Communicator {
    /// One communicator per context, rank `i` on `contexts[i]`
    /// (`ncclCommInitAll`). The devices must be distinct and of one driver.
    pub fn all_devices(contexts: &[Arc<Context>]) -> Result<Vec<Communicator>> {
        let Some(first) = contexts.first() else {
            return Err(Error::NoDevices);
        };
        let mut ordinals = Vec::with_capacity(contexts.len());
        for ctx in contexts {
            if ctx.kind() != first.kind() {
                return Err(Error::MixedDrivers);
            }
            if ordinals.contains(&ctx.ordinal()) {
                return Err(Error::DuplicateDevice {
                    ordinal: ctx.ordinal(),
                });
            }
            ordinals.push(ctx.ordinal());
        }
        let nccl = for_context(first)?;
        let mut raw = vec![std::ptr::null_mut(); contexts.len()];
        first.bind()?;
        // SAFETY: `raw` holds one slot per device and `ordinals` one ordinal
        // per device, as ncclCommInitAll reads and writes them.
        let code = unsafe {
            (nccl.ncclCommInitAll)(raw.as_mut_ptr(), raw.len() as i32, ordinals.as_ptr())
        };
        // NCCL switches devices while it initialises: resynchronise the cache.
        first.force_bind()?;
        check(nccl, "ncclCommInitAll", std::ptr::null_mut(), code)?;
        let meeting = Meeting::all_local(contexts.len());
        tracing::debug!(
            ranks = contexts.len(),
            "NCCL communicators over {ordinals:?}"
        );
        Ok(raw
            .into_iter()
            .zip(contexts)
            .enumerate()
            .map(|(rank, (raw, ctx))| Communicator {
                raw,
                nccl,
                handle: Some(Handle::new(raw, nccl, ctx, rank)),
                ctx: Arc::clone(ctx),
                rank,
                nranks: contexts.len(),
                meeting: Arc::clone(&meeting),
                made_together: true,
                alone_here: contexts.len() < 2,
                blocking: true,
            })
            .collect())
    }

    /// Rank `rank` of an `nranks`-rank communicator named by `id`, on `ctx`
    /// (`ncclCommInitRank`). Blocks until every rank has joined, as NCCL
    /// does; the others call this in their own threads, processes or hosts
    /// with the same id.
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, UniqueId};
    /// use cuda_streams_collectives::driver::Context;
    /// let id = UniqueId::new().unwrap();
    /// let contexts = Context::all().unwrap();
    /// let n = contexts.len();
    /// let comms = std::thread::scope(|s| {
    ///     let joins: Vec<_> = contexts
    ///         .iter()
    ///         .enumerate()
    ///         .map(|(rank, ctx)| s.spawn(move || Communicator::init_rank(ctx, n, &id, rank)))
    ///         .collect();
    ///     joins.into_iter().map(|j| j.join().unwrap().unwrap()).collect::<Vec<_>>()
    /// });
    /// assert!(comms.iter().enumerate().all(|(r, c)| c.rank() == r && c.size() == n));
    /// ```
    pub fn init_rank(
        ctx: &Arc<Context>,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
    ) -> Result<Communicator> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::InvalidRank { rank, nranks });
        }
        let nccl = for_context(ctx)?;
        let mut raw = std::ptr::null_mut();
        ctx.bind()?;
        // Before the NCCL call, which returns once every rank has made it.
        let meeting = Meeting::join(id.to_bytes(), nranks, rank);
        // SAFETY: writes one communicator through a valid pointer; the id is
        // passed by value as nccl.h declares.
        let code = unsafe { (nccl.ncclCommInitRank)(&mut raw, nranks as i32, id.0, rank as i32) };
        let made = ctx
            .force_bind()
            .map_err(Error::from)
            .and_then(|()| check(nccl, "ncclCommInitRank", std::ptr::null_mut(), code));
        if let Err(err) = made {
            meeting.unjoin(rank);
            return Err(explain_join_failure(ctx, id, rank, err));
        }
        // Every rank has joined NCCL, so every rank of this process has
        // joined the meeting.
        let alone_here = meeting.local_ranks() < 2;
        Ok(Communicator {
            raw,
            nccl,
            handle: Some(Handle::new(raw, nccl, ctx, rank)),
            ctx: Arc::clone(ctx),
            rank,
            nranks,
            meeting,
            made_together: false,
            alone_here,
            blocking: true,
        })
    }

    /// [`Communicator::init_rank`] that gives up when the other ranks have
    /// not all joined within `timeout`: the communicator is made
    /// non-blocking (`ncclCommInitRankConfig` with `blocking = 0`), its
    /// state polled with `ncclCommGetAsyncError`, and aborted
    /// (`ncclCommAbort`) at the deadline, which is [`Error::JoinTimeout`].
    ///
    /// ```
    /// use cuda_streams_collectives::{Communicator, Error, UniqueId};
    /// use cuda_streams_collectives::driver::Context;
    /// use std::time::Duration;
    /// let ctx = Context::new(0).unwrap();
    /// let id = UniqueId::new().unwrap();
    /// // Rank 1 never comes.
    /// let err = Communicator::init_rank_within(&ctx, 2, &id, 0, Duration::from_millis(200)).unwrap_err();
    /// assert!(matches!(err, Error::JoinTimeout { rank: 0, nranks: 2, .. }), "{err}");
    /// ```
    pub fn init_rank_within(
        ctx: &Arc<Context>,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        timeout: std::time::Duration,
    ) -> Result<Communicator> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::InvalidRank { rank, nranks });
        }
        let nccl = for_context(ctx)?;
        let mut config = nonblocking_config();
        let mut raw = std::ptr::null_mut();
        ctx.bind()?;
        let start = std::time::Instant::now();
        // Before the NCCL call, which completes once every rank has made it.
        let meeting = Meeting::join(id.to_bytes(), nranks, rank);
        // SAFETY: writes one communicator through a valid pointer; the config
        // is initialised as NCCL_CONFIG_INITIALIZER does, and read only
        // during the call.
        let code = unsafe {
            (nccl.ncclCommInitRankConfig)(&mut raw, nranks as i32, id.0, rank as i32, &mut config)
        };
        let made = ctx.force_bind().map_err(Error::from).and_then(|()| {
            if code == ncclResult_t::ncclInProgress {
                Ok(())
            } else {
                check(nccl, "ncclCommInitRankConfig", std::ptr::null_mut(), code)
            }
        });
        if let Err(err) = made {
            meeting.unjoin(rank);
            return Err(explain_join_failure(ctx, id, rank, err));
        }
        // From here the communicator is destroyed (or aborted) on every
        // path, which tells the meeting.
        let mut comm = Communicator {
            raw,
            nccl,
            handle: Some(Handle::new(raw, nccl, ctx, rank)),
            ctx: Arc::clone(ctx),
            rank,
            nranks,
            meeting,
            made_together: false,
            // Set once every rank has joined (below).
            alone_here: false,
            blocking: false,
        };
        // Polled, with a growing pause: NCCL's bootstrap runs on its own
        // threads and offers no way to wait for it.
        let mut pause = std::time::Duration::from_micros(50);
        loop {
            match comm.state()? {
                ncclResult_t::ncclSuccess => {
                    comm.alone_here = comm.meeting.local_ranks() < 2;
                    return Ok(comm);
                }
                ncclResult_t::ncclInProgress if start.elapsed() < timeout => {
                    std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
                    pause = (pause * 2).min(std::time::Duration::from_millis(10));
                }
                ncclResult_t::ncclInProgress => {
                    let waited = start.elapsed();
                    if let Err(err) = comm.abort() {
                        tracing::warn!(rank, "aborting a communicator that timed out: {err}");
                    }
                    return Err(Error::JoinTimeout {
                        rank,
                        nranks,
                        waited,
                    });
                }
                other => {
                    // An error (success returned above): say which.
                    check(nccl, "ncclCommInitRankConfig", comm.raw, other)?;
                    comm.alone_here = comm.meeting.local_ranks() < 2;
                    return Ok(comm);
                }
            }
        }
    }

    /// `ncclCommGetAsyncError`'s answer.
    fn state(&self) -> Result<ncclResult_t> {
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator; writes one result.
        let code = unsafe { (self.nccl.ncclCommGetAsyncError)(self.raw, &mut state) };
        check(self.nccl, "ncclCommGetAsyncError", self.raw, code)?;
        Ok(state)
    }

    /// For a non-blocking communicator, a call's `ncclInProgress` becomes
    /// its outcome once NCCL has finished it; anything else passes through.
    pub(crate) fn settle(&self, code: ncclResult_t) -> ncclResult_t {
        if self.blocking || code != ncclResult_t::ncclInProgress {
            return code;
        }
        loop {
            match self.state() {
                Ok(ncclResult_t::ncclInProgress) => std::thread::yield_now(),
                Ok(state) => return state,
                Err(_) => return ncclResult_t::ncclInternalError,
            }
        }
    }

    /// This rank's number, from 0.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the communicator has.
    pub fn size(&self) -> usize {
        self.nranks
    }

    /// The context of this rank's device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Where this rank meets the communicator's other ranks in this process.
    pub(crate) fn meeting(&self) -> &Arc<Meeting> {
        &self.meeting
    }

    /// The raw handle, for NCCL calls this crate does not wrap.
    pub fn as_raw(&self) -> ncclComm_t {
        self.raw
    }

    /// The NCCL function table this communicator calls (libnccl's or the
    /// software NCCL's), for raw calls beside this crate's.
    pub fn nccl(&self) -> &'static Nccl {
        self.nccl
    }

    /// `Ok` unless a collective of this communicator failed after it was
    /// enqueued (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Result<()> {
        let mut error = sys::nccl::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator; writes one result.
        let code = unsafe { (self.nccl.ncclCommGetAsyncError)(self.raw, &mut error) };
        check(self.nccl, "ncclCommGetAsyncError", self.raw, code)?;
        error.result().map_err(|source| Error::Async {
            rank: self.rank,
            source,
        })
    }

    /// Give up on the communicator's pending collectives (`ncclCommAbort`):
    /// what a rank does when a peer never joins or a collective hangs.
    ///
    /// Refused ([`Error::CommunicatorInGraph`]) while a graph or an
    /// instance of one holds collectives captured on this rank
    /// ([`Communicator::captured`]): their replays would call a freed
    /// communicator. This handle is released then, and the communicator
    /// destroyed (`ncclCommDestroy`) with the last graph that holds it.
    pub fn abort(mut self) -> Result<()> {
        self.raw = std::ptr::null_mut();
        let handle = self.handle.take().unwrap_or_else(|| unreachable!());
        let mut handle = match Arc::try_unwrap(handle) {
            Ok(handle) => handle,
            Err(shared) => {
                return Err(Error::CommunicatorInGraph {
                    rank: self.rank,
                    holders: Arc::strong_count(&shared) - 1,
                });
            }
        };
        let raw = std::mem::replace(&mut handle.raw, std::ptr::null_mut());
        // SAFETY: a live communicator, no graph holds it (the handle was
        // ours alone), aborted once (the handle's Drop skips null).
        let code = unsafe { (self.nccl.ncclCommAbort)(raw) };
        check(self.nccl, "ncclCommAbort", std::ptr::null_mut(), code)
    }

    /// What a graph holds to keep this rank's communicator alive.
    pub(crate) fn keep_alive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        let handle = self.handle.as_ref().unwrap_or_else(|| unreachable!());
        Arc::clone(handle) as Arc<dyn std::any::Any + Send + Sync>
    }

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
        all_reduce_op(self, stream, send, recv, op)?.run_alone()
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
        all_reduce_in_place_op(self, stream, buffer, op)?.run_alone()
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
        broadcast_op(self, stream, send, recv, root)?.run_alone()
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
        broadcast_in_place_op(self, stream, buffer, root)?.run_alone()
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
        reduce_op(self, stream, send, recv, op, root)?.run_alone()
    }

    /// Every rank's `send` side by side, in rank order, in every rank's
    /// `recv`, which holds `size()` times as many elements.
    pub fn all_gather<T, S, D>(&self, stream: &Stream, send: &S, recv: &mut D) -> Result<()>
    where
        T: NcclType,
        S: DeviceMemory<Elem = T>,
        D: DeviceMemoryMut<Elem = T>,
    {
        all_gather_op(self, stream, send, recv)?.run_alone()
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
        reduce_scatter_op(self, stream, send, recv, op)?.run_alone()
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
    /// ([`Error::PeerMismatch`]); a peer outside `0..size()` is
    /// [`Error::InvalidPeer`].
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
        send_op(self, stream, send, peer)?.run_alone()
    }

    /// Receive into `recv` what rank `peer` sends (`ncclRecv`); see
    /// [`Communicator::send`].
    pub fn recv<T, D>(&self, stream: &Stream, recv: &mut D, peer: usize) -> Result<()>
    where
        T: NcclType,
        D: DeviceMemoryMut<Elem = T>,
    {
        recv_op(self, stream, recv, peer)?.run_alone()
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
        crate::group::run_grouped(all_to_all_ops(self, stream, send, recv)?)
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
        crate::group::run_grouped(gather_ops(self, stream, send, recv, root)?)
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
        crate::group::run_grouped(scatter_ops(self, stream, send, recv, root)?)
    }
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
fn nonblocking_config() -> ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: sys::nccl::NCCL_VERSION_CODE,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Dropped or aborted: ranks waiting for this one's part give up.
        // The NCCL communicator goes with the last holder of its handle
        // (this, or a graph that captured its collectives).
        self.meeting.leave(self.rank);
    }
}

/// An NCCL communicator, destroyed when dropped: held by its
/// [`Communicator`] and by every graph that captured its collectives.
pub(crate) struct Handle {
    raw: ncclComm_t,
    nccl: &'static Nccl,
    ctx: Arc<Context>,
    rank: usize,
}

// SAFETY: nothing but `Drop` touches the raw communicator through a
// `Handle`, and `Drop` runs once, on one thread.
unsafe impl Send for Handle {}
// SAFETY: as above: a shared `Handle` offers no call on the communicator.
unsafe impl Sync for Handle {}

impl Handle {
    fn new(raw: ncclComm_t, nccl: &'static Nccl, ctx: &Arc<Context>, rank: usize) -> Arc<Self> {
        Arc::new(Self {
            raw,
            nccl,
            ctx: Arc::clone(ctx),
            rank,
        })
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        if let Err(err) = self.ctx.bind() {
            tracing::error!(rank = self.rank, "leaking an NCCL communicator: {err}");
            return;
        }
        // SAFETY: a live communicator, destroyed once: the last holder of
        // its handle is gone, so no call or replay can use it after.
        let code = unsafe { (self.nccl.ncclCommDestroy)(self.raw) };
        if let Err(err) = code.result() {
            tracing::error!(rank = self.rank, "ncclCommDestroy: {err}");
        }
        // NCCL may switch devices while it tears down.
        if let Err(err) = self.ctx.force_bind() {
            tracing::warn!(rank = self.rank, "rebinding after ncclCommDestroy: {err}");
        }
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.nranks)
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

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
            rank: comm.rank,
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
    let whole = count.saturating_mul(comm.nranks);
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
    let whole = count.saturating_mul(comm.nranks);
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
    if root < comm.nranks {
        Ok(())
    } else {
        Err(Error::InvalidRoot {
            root,
            nranks: comm.nranks,
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
    let n = comm.nranks;
    let len = send.device_len();
    if !len.is_multiple_of(n) {
        return Err(Error::CountMismatch {
            collective: "all_to_all",
            rank: comm.rank,
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
    for peer in 0..comm.nranks {
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
    let mut ops = Vec::with_capacity(comm.nranks + 1);
    if comm.rank == root {
        let whole = count.saturating_mul(comm.nranks);
        let Some(recv) = recv else {
            return Err(Error::MissingBuffer {
                operation: "gather",
                rank: comm.rank,
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
    let mut ops = Vec::with_capacity(comm.nranks + 1);
    if comm.rank == root {
        let whole = count.saturating_mul(comm.nranks);
        let Some(send) = send else {
            return Err(Error::MissingBuffer {
                operation: "scatter",
                rank: comm.rank,
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
