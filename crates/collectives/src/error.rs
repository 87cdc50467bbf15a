//! The collectives' error type.

use sys::nccl::NcclError;

/// Everything the collectives can fail with; messages name the values.
///
/// ```
/// use cuda_streams_collectives::{Communicator, Error};
/// let err = Communicator::all_devices(&[]).unwrap_err();
/// assert!(matches!(err, Error::NoDevices));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the driver layer failed (a buffer of another device, say).
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// The operation graph refused the collectives' operations.
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// NCCL could not be loaded.
    #[error("{0}")]
    Load(String),
    /// An NCCL call failed: the error names the call
    /// ([`NcclError::call`]), its result and what `ncclGetLastError` said
    /// ([`NcclError::detail`]).
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// A communicator over no devices.
    #[error("a communicator needs at least one device")]
    NoDevices,
    /// A device given twice to [`crate::Communicator::all_devices`].
    #[error("device {ordinal} is given twice: each rank needs a device of its own")]
    DuplicateDevice {
        /// The repeated ordinal.
        ordinal: i32,
    },
    /// Contexts of different drivers in one communicator.
    #[error("the contexts run on different drivers (software and CUDA)")]
    MixedDrivers,
    /// A collective on a stream of another device than its rank's.
    #[error(
        "rank {rank}'s communicator is on device {comm_device}, but the stream is on device \
         {stream_device}"
    )]
    WrongStream {
        /// The rank.
        rank: usize,
        /// The communicator's device.
        comm_device: i32,
        /// The stream's device.
        stream_device: i32,
    },
    /// A buffer whose length does not fit the collective.
    #[error(
        "{collective} on rank {rank}: the {buffer} holds {actual} element(s), but {expected} are \
         needed"
    )]
    CountMismatch {
        /// The collective, e.g. `all_gather`.
        collective: &'static str,
        /// The rank.
        rank: usize,
        /// `send buffer` or `receive buffer`.
        buffer: &'static str,
        /// The length needed.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// Ranks of one communicator whose calls disagree: in a group, or
    /// (ranks in this process) collectives each rank made alone. Nothing
    /// was issued to NCCL.
    #[error("the ranks' collective {index} of this call disagrees: {what}; none reached NCCL")]
    RanksDisagree {
        /// Which of the rank's collectives in the call (from 0; a collective
        /// made alone is 0).
        index: usize,
        /// What differs, naming both ranks and values.
        what: String,
    },
    /// Ranks of one communicator that issue different numbers of
    /// collectives together: a group that leaves out a rank of a
    /// [`crate::Communicator::all_devices`] communicator, or ranks in this
    /// process that group their collectives differently. Nothing was issued
    /// to NCCL.
    #[error(
        "rank {rank} issues {calls_here} collective(s) together but rank {other_rank} of the \
         same communicator issues {calls_there}: every rank must take part in each, alone or \
         grouped alike; none reached NCCL"
    )]
    MissingRank {
        /// A rank with calls.
        rank: usize,
        /// Its number of calls.
        calls_here: usize,
        /// A rank with a different number.
        other_rank: usize,
        /// That rank's number of calls (0: it never joined).
        calls_there: usize,
    },
    /// A collective on a stream that is being captured into a graph: the
    /// graph would keep neither buffer alive for its replays. Nothing was
    /// issued to NCCL; the capture and the communicator stay usable.
    #[error(
        "{collective} on rank {rank}: stream {stream} is being captured into a graph, which \
         would keep none of the collective's buffers alive for its replays; capture it \
         through the capture (Communicator::captured) or end the capture first (nothing \
         reached NCCL, the capture and the communicator stay usable)"
    )]
    StreamCapturing {
        /// The collective, e.g. `all_reduce`.
        collective: &'static str,
        /// The rank.
        rank: usize,
        /// The stream's id.
        stream: u64,
    },
    /// A rank in this process waited for another rank's part of a
    /// collective, but that rank's communicator was dropped or aborted.
    #[error(
        "rank {rank} cannot meet rank {gone} for its collective: rank {gone}'s communicator \
         (in this process) was dropped or aborted; nothing reached NCCL"
    )]
    RankGone {
        /// The rank that waited.
        rank: usize,
        /// The rank whose communicator is gone.
        gone: usize,
    },
    /// [`crate::Communicator::abort`] while graphs hold collectives captured
    /// on the rank: their replays need the communicator, so it is destroyed
    /// with the last of them instead.
    #[error(
        "rank {rank}: cannot abort the communicator while {holders} captured graph(s) (with their instances) hold \
         collectives captured on it; it is destroyed when the last of them is dropped"
    )]
    CommunicatorInGraph {
        /// The rank asked to abort.
        rank: usize,
        /// Graphs and instances that hold it.
        holders: usize,
    },
    /// Not every rank joined in time
    /// ([`crate::Communicator::init_rank_within`]); the communicator was
    /// aborted.
    #[error(
        "rank {rank} of {nranks}: not every rank joined the communicator within {waited:?}; \
         it was aborted (ncclCommAbort)"
    )]
    JoinTimeout {
        /// The rank that waited.
        rank: usize,
        /// The communicator's size.
        nranks: usize,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A root that is not a rank.
    #[error("root {root} is not a rank of this {nranks}-rank communicator")]
    InvalidRoot {
        /// The root asked for.
        root: usize,
        /// The communicator's size.
        nranks: usize,
    },
    /// A send or receive whose peer is not a rank of the communicator.
    #[error(
        "{operation} on rank {rank}: peer {peer} is not a rank of this {nranks}-rank communicator"
    )]
    InvalidPeer {
        /// `send` or `recv` (or the operation built from them).
        operation: &'static str,
        /// The rank that called.
        rank: usize,
        /// The peer asked for.
        peer: usize,
        /// The communicator's size.
        nranks: usize,
    },
    /// A send and the receive it meets (ranks in this process) differ in
    /// count or element type. Neither reached NCCL.
    #[error(
        "rank {from} sends {sent} but rank {to} posts {received}: a send and its receive must \
         agree on count and element type; neither reached NCCL"
    )]
    PeerMismatch {
        /// The sending rank.
        from: usize,
        /// The receiving rank.
        to: usize,
        /// The send, e.g. "send of 4 element(s) of f32 to rank 1".
        sent: String,
        /// The receive.
        received: String,
    },
    /// One call (a group) drives both ranks of a send/receive pair but not
    /// both sides equally often: the missing side could only come from the
    /// call itself. Nothing reached NCCL.
    #[error(
        "this call sends {sends} time(s) from rank {from} to rank {to} but receives {recvs} \
         time(s) on rank {to} from rank {from}: a group that drives both ranks must hold both \
         sides of each pair; none reached NCCL"
    )]
    UnmatchedPeer {
        /// The sending rank.
        from: usize,
        /// The receiving rank.
        to: usize,
        /// Sends from `from` to `to` in the call.
        sends: usize,
        /// Receives on `to` from `from` in the call.
        recvs: usize,
    },
    /// The root of a gather or scatter passed no buffer for the whole.
    #[error("{operation} on rank {rank}, the root: the {buffer} is missing (the root passes Some)")]
    MissingBuffer {
        /// `gather` or `scatter`.
        operation: &'static str,
        /// The rank.
        rank: usize,
        /// `send buffer` or `receive buffer`.
        buffer: &'static str,
    },
    /// A launch variable that is missing or invalid
    /// ([`crate::Rendezvous::from_env`]).
    #[error(transparent)]
    Env(#[from] sys::env::EnvError),
    /// The TCP store that hands out the unique id failed.
    #[error("rank {rank}: could not {what} at the launch store {addr}: {source}")]
    Store {
        /// The rank.
        rank: usize,
        /// The store's address.
        addr: String,
        /// What failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ranks did not all meet at the store in time.
    #[error(
        "rank {rank}: {missing} rank(s) did not come to the launch store at {addr} within \
         {waited:?}; is every rank running, with the same MASTER_ADDR, MASTER_PORT and \
         WORLD_SIZE (and rank 0 reachable from this host)?"
    )]
    StoreTimeout {
        /// The rank that waited.
        rank: usize,
        /// The store's address.
        addr: String,
        /// How long it waited.
        waited: std::time::Duration,
        /// Ranks still missing (for rank 0), or 1 (rank 0 itself).
        missing: usize,
    },
    /// The other end of a launch store connection did not prove that it
    /// holds this job's launch secret: another job's store, a stranger, or
    /// a rank with another `CUDA_STREAMS_LAUNCH_TOKEN`. Nothing secret was
    /// sent to it.
    #[error(
        "rank {rank}: the launch store at {addr} {why}; it is not this job's rank 0 (another \
         job's store, or something else on the port) or the ranks hold different secrets: give \
         every rank the same CUDA_STREAMS_LAUNCH_TOKEN (this rank's secret comes from {secret})"
    )]
    StoreAuth {
        /// The rank.
        rank: usize,
        /// The store's address.
        addr: String,
        /// What the other end did, e.g. "answered with a proof that does not match".
        why: String,
        /// Where this rank's secret came from (a variable's name).
        secret: String,
    },
    /// Another process has claimed this rank at rank 0's store already.
    #[error(
        "rank {rank}: another process has claimed rank {rank} at the launch store {addr} \
         already; each rank must be launched once (check RANK in every process)"
    )]
    RankClaimed {
        /// The rank claimed twice.
        rank: usize,
        /// The store's address.
        addr: String,
    },
    /// Ranks in different processes on the software driver: the software
    /// NCCL spans the threads of one process, so they can never meet.
    #[error(
        "rank {rank}: the software NCCL spans the threads of one process, but this \
         communicator's ranks are in processes {here} and {other}; on the software driver run \
         the ranks as threads of one process (Rendezvous::from_vars), or run on GPUs"
    )]
    SoftNcclAcrossProcesses {
        /// The rank that found out.
        rank: usize,
        /// This process.
        here: u32,
        /// The other rank's process (for an id, the process that made it).
        other: u32,
    },
    /// Rank 0's world size differs from this rank's.
    #[error("rank {rank} was launched with WORLD_SIZE={ours}, but rank 0 with {rank0}")]
    WorldSizeMismatch {
        /// The rank.
        rank: usize,
        /// Its world size.
        ours: usize,
        /// Rank 0's.
        rank0: usize,
    },
    /// A rank outside `0..nranks`, or zero ranks.
    #[error("rank {rank} is not in 0..{nranks}")]
    InvalidRank {
        /// The rank asked for.
        rank: usize,
        /// The communicator's size.
        nranks: usize,
    },
    /// Bytes that are not a unique id.
    #[error("a unique id is 128 bytes, not {len}")]
    InvalidUniqueId {
        /// The length given.
        len: usize,
    },
    /// A collective that failed after it was enqueued
    /// (`ncclCommGetAsyncError`).
    #[error("rank {rank}'s communicator reports an asynchronous error: {source}")]
    Async {
        /// The rank.
        rank: usize,
        /// The error.
        #[source]
        source: NcclError,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of the collectives inside work that returns a driver `Result`
/// (the closure of an operation graph's operation): a driver failure comes
/// back as itself, anything else as [`driver::Error::Other`], which keeps
/// it whole.
impl From<Error> for driver::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Driver(error) => error,
            other => driver::Error::other(other),
        }
    }
}
