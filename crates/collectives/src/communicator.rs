//! Communicators: one rank each, on one device's context.

use crate::error::{Error, Result};
use crate::meeting::Meeting;
use crate::one_process::explain_join_failure;
use crate::table::for_context;
use crate::types::UniqueId;
use driver::Context;
use std::fmt;
use std::sync::Arc;
use sys::nccl::{Nccl, Progress, ncclComm_t, ncclConfig_t, ncclResult_t, result};

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
        first.bind()?;
        let raw = result::comm_init_all(nccl, &ordinals);
        // NCCL switches devices while it initialises: resynchronise the cache.
        first.force_bind()?;
        let raw = raw?;
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
        ctx.bind()?;
        // Before the NCCL call, which returns once every rank has made it.
        let meeting = Meeting::join(id.to_bytes(), nranks, rank);
        let made = result::comm_init_rank(nccl, nranks as i32, id.0, rank as i32);
        let made = ctx
            .force_bind()
            .map_err(Error::from)
            .and_then(|()| made.map_err(Error::from));
        let raw = match made {
            Ok(raw) => raw,
            Err(err) => {
                meeting.unjoin(rank);
                return Err(explain_join_failure(ctx, id, rank, err));
            }
        };
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
        ctx.bind()?;
        let start = std::time::Instant::now();
        // Before the NCCL call, which completes once every rank has made it.
        let meeting = Meeting::join(id.to_bytes(), nranks, rank);
        // SAFETY: the config is initialised as NCCL_CONFIG_INITIALIZER does,
        // with null strings.
        let made = unsafe {
            result::comm_init_rank_config(nccl, nranks as i32, id.0, rank as i32, &mut config)
        };
        // In progress or done, the communicator is polled below.
        let made = ctx
            .force_bind()
            .map_err(Error::from)
            .and_then(|()| made.map(Progress::into_inner).map_err(Error::from));
        let raw = match made {
            Ok(raw) => raw,
            Err(err) => {
                meeting.unjoin(rank);
                return Err(explain_join_failure(ctx, id, rank, err));
            }
        };
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
            match comm.progress()? {
                Progress::Done(()) => {
                    comm.alone_here = comm.meeting.local_ranks() < 2;
                    return Ok(comm);
                }
                Progress::InProgress(()) if start.elapsed() < timeout => {
                    std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
                    pause = (pause * 2).min(std::time::Duration::from_millis(10));
                }
                Progress::InProgress(()) => {
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
            }
        }
    }

    /// `ncclCommGetAsyncError`'s answer.
    fn state(&self) -> Result<ncclResult_t> {
        // SAFETY: a live communicator: `raw` is null only once `abort` has
        // consumed `self`.
        Ok(unsafe { result::comm_get_async_error(self.nccl, self.raw) }?)
    }

    /// Whether the communicator's calls (its making, for a non-blocking
    /// one) have finished: an asynchronous error is [`Error::Async`].
    fn progress(&self) -> Result<Progress> {
        match self.state()? {
            ncclResult_t::ncclInProgress => Ok(Progress::InProgress(())),
            state => state
                .result()
                .map(Progress::Done)
                .map_err(|source| Error::Async {
                    rank: self.rank,
                    source,
                }),
        }
    }

    /// A call that a non-blocking communicator left in progress
    /// (`ncclInProgress`), waited for: its outcome, polled with
    /// `ncclCommGetAsyncError`, as NCCL asks. A blocking communicator's
    /// calls never answer in progress; for one, this returns at once.
    pub(crate) fn settle(&self) -> Result<()> {
        if self.blocking {
            return Ok(());
        }
        while self.progress()?.is_in_progress() {
            std::thread::yield_now();
        }
        Ok(())
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
        self.state()?.result().map_err(|source| Error::Async {
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
        Ok(unsafe { result::comm_abort(self.nccl, raw) }?)
    }

    /// What a graph holds to keep this rank's communicator alive.
    pub(crate) fn keep_alive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        let handle = self.handle.as_ref().unwrap_or_else(|| unreachable!());
        Arc::clone(handle) as Arc<dyn std::any::Any + Send + Sync>
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
        if let Err(err) = unsafe { result::comm_destroy(self.nccl, self.raw) } {
            tracing::error!(rank = self.rank, "{err}");
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
