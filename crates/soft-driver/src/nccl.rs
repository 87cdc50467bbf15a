//! A software NCCL over the software devices: communicators as cliques of
//! ranks in this process, collectives done by the streams' worker threads
//! over host memory.
//!
//! A collective is ordered work on its rank's stream. When a rank's worker
//! reaches its `n`-th collective it arrives at round `n` of the clique and
//! waits (holding its stream, as a NCCL kernel holds the GPU's) until every
//! rank has arrived; the last to arrive checks that the ranks agree (the same
//! collective, count, type, operation and root), moves the data for all of
//! them, and lets them go. Disagreement fails every rank's stream with
//! `CUDA_ERROR_LAUNCH_FAILED` (with a detail naming the ranks and values), and
//! the communicators' `ncclCommGetAsyncError` with `ncclInvalidUsage`, where
//! real NCCL would hang or compute garbage. A rank that never calls its part
//! leaves the others waiting, as on a GPU, until `ncclCommAbort`.
//!
//! The element types are those the safe layer offers: 8-, 32- and 64-bit
//! integers and `f32`/`f64`; 16-bit and 8-bit floats are refused with
//! `ncclInvalidArgument`. `ncclGetLastError` says why a call failed.

use crate::handles::{Registry, lock, mint};
use crate::ops::{Action, Fault, Template};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use sys::CUresult;
use sys::nccl::{
    Nccl, cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t,
    ncclUniqueId,
};

/// The NCCL version the software NCCL reports: 2.28.9, the headers'.
pub const NCCL_VERSION: c_int = 22809;

type R = ncclResult_t;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static GROUP_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Sends and receives of the open group, enqueued at its end.
    static GROUPED: RefCell<Vec<Grouped>> = const { RefCell::new(Vec::new()) };
}

/// Fail with `code`, leaving `why` for `ncclGetLastError`.
fn fail(code: R, why: impl Into<String>) -> R {
    let why = CString::new(why.into()).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = why);
    code
}

/// A collective's buffer of `len` bytes at `ptr` must be live device memory
/// that `device` may use; otherwise `ncclInvalidArgument` with the memory
/// check's explanation.
fn check_buffer(ptr: usize, len: usize, device: i32, what: &'static str) -> Result<(), R> {
    crate::memory::check_device_access(ptr, len, device, what)
        .map(drop)
        .map_err(|_| {
            fail(
                R::ncclInvalidArgument,
                crate::errors::last_error_detail().unwrap_or_default(),
            )
        })
}

fn code(result: Result<(), R>) -> R {
    match result {
        Ok(()) => R::ncclSuccess,
        Err(code) => code,
    }
}

/// What a collective is, as the ranks must agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    kind: Kind,
    /// Elements per rank as the call counts them.
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
}

#[derive(Clone, Copy)]
struct Arrival {
    shape: Shape,
    send: usize,
    recv: usize,
    device: i32,
    faulted: bool,
}

#[derive(Default)]
struct Round {
    arrivals: Vec<Option<Arrival>>,
    arrived: usize,
    /// Set by the last arrival: `Some(None)` done, `Some(Some(why))` failed.
    outcome: Option<Option<String>>,
    left: usize,
}

/// One side of a send/recv pair, as its rank's worker reaches it.
#[derive(Clone, Copy)]
struct Half {
    ptr: usize,
    count: usize,
    dtype: ncclDataType_t,
    bytes: usize,
    device: i32,
    faulted: bool,
}

/// The `seq`-th send from one rank to another and the `seq`-th receive of
/// the other from the one: NCCL matches them in order.
#[derive(Default)]
struct Pair {
    send: Option<Half>,
    recv: Option<Half>,
    /// Set by the later side: `Some(None)` done, `Some(Some(why))` failed.
    outcome: Option<Option<String>>,
    left: usize,
}

/// `(from, to, seq)`.
type PairKey = (usize, usize, u64);

/// A send or receive as its call made it.
#[derive(Clone, Copy)]
struct P2p {
    send: bool,
    peer: usize,
    half: Half,
}

/// A send or receive made inside a group, enqueued at the group's end
/// together with the others of its stream: a rank's sends and receives of
/// one group proceed together, as NCCL's do, so a ring of them cannot
/// deadlock.
struct Grouped {
    stream: Arc<crate::stream::Stream>,
    comm: Arc<Comm>,
    p2p: P2p,
}

/// The ranks of one communicator.
struct Clique {
    nranks: usize,
    state: Mutex<CliqueState>,
    changed: Condvar,
}

#[derive(Default)]
struct CliqueState {
    /// Ranks that joined (`ncclCommInitRank`), by rank.
    joined: Vec<bool>,
    rounds: HashMap<u64, Round>,
    pairs: HashMap<PairKey, Pair>,
    aborted: bool,
    /// The first disagreement between ranks, for `ncclCommGetAsyncError`.
    failed: bool,
}

/// One rank's communicator.
struct Comm {
    clique: Arc<Clique>,
    rank: usize,
    device: i32,
    /// The number of the next collective this rank enqueues.
    next: AtomicU64,
    /// The number of the next send to each peer, and receive from each.
    sends: Box<[AtomicU64]>,
    recvs: Box<[AtomicU64]>,
    aborted: AtomicBool,
}

static COMMS: Registry<Comm> = Registry::new();

/// Cliques being formed by `ncclCommInitRank`, by unique id.
fn forming() -> &'static Mutex<HashMap<[u8; 128], Arc<Clique>>> {
    static FORMING: OnceLock<Mutex<HashMap<[u8; 128], Arc<Clique>>>> = OnceLock::new();
    FORMING.get_or_init(Mutex::default)
}

fn comm(handle: ncclComm_t) -> Result<Arc<Comm>, R> {
    COMMS.get(handle as usize).map_err(|_| {
        fail(
            R::ncclInvalidArgument,
            format!("{:#x} is not a live communicator", handle as usize),
        )
    })
}

fn new_clique(nranks: usize) -> Arc<Clique> {
    Arc::new(Clique {
        nranks,
        state: Mutex::new(CliqueState {
            joined: vec![false; nranks],
            ..CliqueState::default()
        }),
        changed: Condvar::new(),
    })
}

fn register(clique: &Arc<Clique>, rank: usize, device: i32) -> ncclComm_t {
    COMMS.insert(Arc::new(Comm {
        clique: Arc::clone(clique),
        rank,
        device,
        next: AtomicU64::new(0),
        sends: (0..clique.nranks).map(|_| AtomicU64::new(0)).collect(),
        recvs: (0..clique.nranks).map(|_| AtomicU64::new(0)).collect(),
        aborted: AtomicBool::new(false),
    })) as ncclComm_t
}

/// The device of the context current on this thread.
fn current_device() -> Result<i32, R> {
    crate::context::require().map_err(|_| {
        fail(
            R::ncclUnhandledCudaError,
            "no CUDA context is current on this thread (cuCtxSetCurrent)",
        )
    })
}

unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> R {
    if version.is_null() {
        return fail(R::ncclInvalidArgument, "ncclGetVersion: version is null");
    }
    // SAFETY: non-null, writable per the API.
    unsafe { version.write(NCCL_VERSION) };
    R::ncclSuccess
}

/// What a software NCCL unique id starts with.
const ID_TAG: &[u8; 9] = b"soft-nccl";
/// Where a software NCCL unique id holds the process that made it (after
/// the tag and the id's number).
const ID_PID: std::ops::Range<usize> = 24..28;

/// The process that made `id` with the software NCCL's `ncclGetUniqueId`,
/// or `None` for bytes the software NCCL did not make.
///
/// The software NCCL spans the threads of one process: a rank that joins a
/// communicator with an id of another process is refused
/// (`ncclInvalidUsage`) instead of waiting forever for ranks it cannot
/// meet.
///
/// ```
/// use cuda_streams_soft_driver::{nccl, nccl_unique_id_process};
/// let mut id = Default::default();
/// // SAFETY: writes one id through a valid pointer.
/// let code = unsafe { (nccl().ncclGetUniqueId)(&mut id) };
/// assert_eq!(code.0, 0);
/// let bytes: [u8; 128] = id.internal.map(|c| c as u8);
/// assert_eq!(nccl_unique_id_process(&bytes), Some(std::process::id()));
/// assert_eq!(nccl_unique_id_process(&[7; 128]), None);
/// ```
pub fn nccl_unique_id_process(id: &[u8; 128]) -> Option<u32> {
    if !id.starts_with(ID_TAG) {
        return None;
    }
    let pid: [u8; 4] = id[ID_PID].try_into().ok()?;
    Some(u32::from_le_bytes(pid))
}

unsafe extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> R {
    if uniqueId.is_null() {
        return fail(R::ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
    }
    let mut id = ncclUniqueId::default();
    for (slot, byte) in id.internal.iter_mut().zip(ID_TAG) {
        *slot = *byte as c_char;
    }
    let number = (mint() as u64).to_le_bytes();
    let pid = std::process::id().to_le_bytes();
    for (slot, byte) in id.internal[16..].iter_mut().zip(number.iter().chain(&pid)) {
        *slot = *byte as c_char;
    }
    // SAFETY: non-null, writable per the API.
    unsafe { uniqueId.write(id) };
    R::ncclSuccess
}

unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> R {
    // SAFETY: the caller's contract is ncclCommInitRank's, which join takes.
    code(unsafe { join(comm, nranks, commId, rank, true) })
}

unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> R {
    // A config's `blocking` of 0 asks for a non-blocking communicator; null
    // or anything else (NCCL_CONFIG_UNDEF_INT included) for a blocking one.
    let blocking = if config.is_null() {
        true
    } else {
        // SAFETY: non-null, a ncclConfig_t per the API.
        let config = unsafe { config.read() };
        if config.magic != 0xcafe_beef || config.size != std::mem::size_of::<ncclConfig_t>() {
            return fail(
                R::ncclInvalidArgument,
                "ncclCommInitRankConfig: the config was not made by NCCL_CONFIG_INITIALIZER",
            );
        }
        config.blocking != 0
    };
    // SAFETY: as for ncclCommInitRank.
    code(unsafe { join(comm, nranks, commId, rank, blocking) })
}

/// Join rank `rank` to the communicator named by `id`. Blocking: wait, as
/// NCCL does, until every rank has joined. Non-blocking: return at once;
/// `ncclCommGetAsyncError` answers `ncclInProgress` until every rank has.
///
/// # Safety
/// `comm` is null or writable.
unsafe fn join(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    blocking: bool,
) -> Result<(), R> {
    if comm.is_null() {
        return Err(fail(
            R::ncclInvalidArgument,
            "ncclCommInitRank: comm is null",
        ));
    }
    if nranks < 1 || rank < 0 || rank >= nranks {
        return Err(fail(
            R::ncclInvalidArgument,
            format!("ncclCommInitRank: rank {rank} is not in 0..{nranks}"),
        ));
    }
    let device = current_device()?;
    let key: [u8; 128] = id.internal.map(|c| c as u8);
    // Ranks of another process can never join this process's cliques:
    // refuse at once rather than wait for them forever.
    if let Some(maker) = nccl_unique_id_process(&key)
        && maker != std::process::id()
    {
        return Err(fail(
            R::ncclInvalidUsage,
            format!(
                "ncclCommInitRank: this unique id was made by process {maker}, but the \
                 software NCCL spans the threads of one process (this is process {})",
                std::process::id()
            ),
        ));
    }
    let mut forming = lock(forming());
    let clique = forming
        .entry(key)
        .or_insert_with(|| new_clique(nranks as usize));
    if clique.nranks != nranks as usize {
        return Err(fail(
            R::ncclInvalidUsage,
            format!(
                "ncclCommInitRank: {nranks} ranks, but this unique id's communicator was begun \
                 with {}",
                clique.nranks
            ),
        ));
    }
    let clique = Arc::clone(clique);
    let mut state = lock(&clique.state);
    if std::mem::replace(&mut state.joined[rank as usize], true) {
        return Err(fail(
            R::ncclInvalidUsage,
            format!("ncclCommInitRank: rank {rank} joined this communicator twice"),
        ));
    }
    if state.joined.iter().all(|&j| j) {
        // Complete: a later id with the same bytes starts a new one.
        forming.remove(&key);
        clique.changed.notify_all();
    }
    drop(forming);
    if blocking {
        while !state.joined.iter().all(|&j| j) && !state.aborted {
            state = clique
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        if state.aborted {
            return Err(fail(
                R::ncclRemoteError,
                "ncclCommInitRank: the communicator was aborted before every rank joined",
            ));
        }
    }
    drop(state);
    // SAFETY: checked non-null; writable per the caller's contract.
    unsafe { comm.write(register(&clique, rank as usize, device)) };
    Ok(())
}

unsafe extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> R {
    code((|| {
        if comm.is_null() || ndev < 1 {
            return Err(fail(
                R::ncclInvalidArgument,
                format!("ncclCommInitAll: {ndev} devices, comm {comm:p}"),
            ));
        }
        let devices: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: devlist holds ndev ints per the API.
            unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec()
        };
        for &dev in &devices {
            crate::context::check_device(dev).map_err(|_| {
                fail(
                    R::ncclInvalidArgument,
                    format!(
                        "ncclCommInitAll: device {dev} does not exist (the software driver has {})",
                        crate::device::device_count()
                    ),
                )
            })?;
        }
        let clique = new_clique(devices.len());
        lock(&clique.state).joined.fill(true);
        for (rank, &dev) in devices.iter().enumerate() {
            // SAFETY: comm holds ndev communicators per the API.
            unsafe { comm.add(rank).write(register(&clique, rank, dev)) };
        }
        Ok(())
    })())
}

unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> R {
    code(COMMS.remove(comm as usize).map(drop).map_err(|_| {
        fail(
            R::ncclInvalidArgument,
            "ncclCommDestroy: not a live communicator",
        )
    }))
}

unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> R {
    code((|| {
        let comm = COMMS.remove(comm as usize).map_err(|_| {
            fail(
                R::ncclInvalidArgument,
                "ncclCommAbort: not a live communicator",
            )
        })?;
        comm.aborted.store(true, Ordering::Release);
        // Every rank waiting in a collective or in the init gives up.
        let mut state = lock(&comm.clique.state);
        state.aborted = true;
        comm.clique.changed.notify_all();
        Ok(())
    })())
}

unsafe extern "C" fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut R) -> R {
    code((|| {
        let comm = self::comm(comm)?;
        if asyncError.is_null() {
            return Err(fail(R::ncclInvalidArgument, "asyncError is null"));
        }
        let state = lock(&comm.clique.state);
        let error = if state.failed {
            R::ncclInvalidUsage
        } else if state.aborted {
            R::ncclRemoteError
        } else if !state.joined.iter().all(|&j| j) {
            R::ncclInProgress
        } else {
            R::ncclSuccess
        };
        // SAFETY: checked non-null; writable per the API.
        unsafe { asyncError.write(error) };
        Ok(())
    })())
}

/// Write `value` through `out` for a communicator query.
fn query(comm: ncclComm_t, out: *mut c_int, value: impl FnOnce(&Comm) -> c_int) -> R {
    code((|| {
        let comm = self::comm(comm)?;
        if out.is_null() {
            return Err(fail(R::ncclInvalidArgument, "the output pointer is null"));
        }
        // SAFETY: checked non-null; writable per the API.
        unsafe { out.write(value(&comm)) };
        Ok(())
    })())
}

unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> R {
    query(comm, count, |c| c.clique.nranks as c_int)
}

unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> R {
    query(comm, device, |c| c.device)
}

unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> R {
    query(comm, rank, |c| c.rank as c_int)
}

unsafe extern "C" fn ncclGetErrorString(result: R) -> *const c_char {
    let text: &'static std::ffi::CStr = match result {
        R::ncclSuccess => c"no error",
        R::ncclUnhandledCudaError => c"unhandled cuda error",
        R::ncclSystemError => c"unhandled system error",
        R::ncclInternalError => c"internal error",
        R::ncclInvalidArgument => c"invalid argument",
        R::ncclInvalidUsage => c"invalid usage",
        R::ncclRemoteError => c"remote process exited or there was a network error",
        R::ncclInProgress => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

unsafe extern "C" fn ncclGetLastError(_comm: ncclComm_t) -> *const c_char {
    // The string lives in this thread's slot until its next failure, as
    // NCCL's does until the next call.
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

unsafe extern "C" fn ncclGroupStart() -> R {
    GROUP_DEPTH.with(|depth| depth.set(depth.get() + 1));
    R::ncclSuccess
}

unsafe extern "C" fn ncclGroupEnd() -> R {
    GROUP_DEPTH.with(|depth| match depth.get() {
        0 => fail(
            R::ncclInvalidUsage,
            "ncclGroupEnd without a matching ncclGroupStart",
        ),
        n => {
            depth.set(n - 1);
            if n == 1 {
                let grouped = GROUPED.with(|g| std::mem::take(&mut *g.borrow_mut()));
                return code(enqueue_grouped(grouped));
            }
            R::ncclSuccess
        }
    })
}

/// The group's sends and receives, one piece of work per stream and
/// communicator.
fn enqueue_grouped(mut grouped: Vec<Grouped>) -> Result<(), R> {
    let mut result = Ok(());
    while let Some(first) = grouped.first() {
        let (stream, comm) = (Arc::clone(&first.stream), Arc::clone(&first.comm));
        let (mine, rest): (Vec<_>, Vec<_>) = grouped.into_iter().partition(|g| {
            Arc::ptr_eq(&g.stream, &stream) && Arc::ptr_eq(&g.comm.clique, &comm.clique)
        });
        grouped = rest;
        let ops: Vec<(Arc<Comm>, P2p)> = mine.into_iter().map(|g| (g.comm, g.p2p)).collect();
        result = result.and(submit(&stream, exchange_maker(ops)));
    }
    result
}

/// Work that numbers `ops` when enqueued and exchanges them when the
/// worker reaches it.
fn exchange_maker(ops: Vec<(Arc<Comm>, P2p)>) -> Arc<dyn Fn() -> Action + Send + Sync> {
    Arc::new(move || {
        let Some(clique) = ops.first().map(|(comm, _)| Arc::clone(&comm.clique)) else {
            return Action::Nop;
        };
        let halves: Vec<(bool, PairKey, Half)> = ops
            .iter()
            .map(|(comm, op)| {
                let key = if op.send {
                    let seq = comm.sends[op.peer].fetch_add(1, Ordering::AcqRel);
                    (comm.rank, op.peer, seq)
                } else {
                    let seq = comm.recvs[op.peer].fetch_add(1, Ordering::AcqRel);
                    (op.peer, comm.rank, seq)
                };
                (op.send, key, op.half)
            })
            .collect();
        Action::Call(Arc::new(move |_device: i32, faulted: bool| {
            exchange(&clique, &halves, faulted)
        }))
    })
}

/// A rank's worker reached its sends and receives: post each side, do the
/// pairs whose other side is there, and wait until every pair is done.
fn exchange(clique: &Clique, halves: &[(bool, PairKey, Half)], faulted: bool) -> Option<Fault> {
    let mut state = lock(&clique.state);
    for &(send, key, half) in halves {
        let pair = state.pairs.entry(key).or_default();
        let half = Half { faulted, ..half };
        if send {
            pair.send = Some(half);
        } else {
            pair.recv = Some(half);
        }
        if let (Some(s), Some(r)) = (pair.send, pair.recv) {
            let failure = transfer(key, s, r).err();
            let failed = failure.is_some();
            pair.outcome = Some(failure);
            state.failed |= failed;
            clique.changed.notify_all();
        }
    }
    loop {
        let done = halves
            .iter()
            .all(|(_, key, _)| state.pairs.get(key).is_some_and(|p| p.outcome.is_some()));
        if done {
            let mut fault = None;
            for (_, key, _) in halves {
                let Some(pair) = state.pairs.get_mut(key) else {
                    continue;
                };
                if let Some(Some(why)) = &pair.outcome {
                    fault.get_or_insert_with(|| Fault {
                        code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                        detail: format!("software NCCL send/recv: {why}"),
                    });
                }
                pair.left += 1;
                if pair.left == 2 {
                    state.pairs.remove(key);
                }
            }
            return fault;
        }
        if state.aborted {
            return Some(Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: "software NCCL send/recv: the communicator was aborted while a rank \
                         waited for its peer"
                    .to_string(),
            });
        }
        state = clique
            .changed
            .wait(state)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Both sides of a pair are here: check they agree, then copy.
fn transfer((from, to, seq): PairKey, send: Half, recv: Half) -> Result<(), String> {
    for (rank, half) in [(from, send), (to, recv)] {
        if half.faulted {
            return Err(format!("rank {rank}'s stream has a sticky error"));
        }
    }
    if send.count != recv.count || send.dtype != recv.dtype {
        return Err(format!(
            "send {seq} from rank {from} to rank {to} is {} element(s) of NCCL type {}, but \
             rank {to} receives {} element(s) of NCCL type {}",
            send.count, send.dtype.0, recv.count, recv.dtype.0
        ));
    }
    if send.bytes == 0 {
        return Ok(());
    }
    crate::memory::check_access(send.ptr, send.bytes, send.device)
        .map_err(|why| format!("rank {from}'s send buffer: {why}"))?;
    crate::memory::check_access(recv.ptr, recv.bytes, recv.device)
        .map_err(|why| format!("rank {to}'s receive buffer: {why}"))?;
    // SAFETY: both ranges were checked live just now; both workers are held
    // in this exchange, so nothing else on their streams touches them.
    // `copy` (memmove): a send to oneself may overlap.
    unsafe { std::ptr::copy(send.ptr as *const u8, recv.ptr as *mut u8, send.bytes) };
    Ok(())
}

/// A send (`send`) or receive of `count` elements at `ptr` with `peer`:
/// the checks NCCL makes at the call, then the work, at once or at the
/// group's end.
fn enqueue_p2p(
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: bool,
    ptr: usize,
    count: usize,
    dtype: ncclDataType_t,
    peer: c_int,
) -> R {
    let call = if send { "ncclSend" } else { "ncclRecv" };
    code((|| {
        let comm = self::comm(comm)?;
        if !lock(&comm.clique.state).joined.iter().all(|&j| j) {
            return Err(fail(
                R::ncclInvalidUsage,
                format!("{call}: the communicator is still being made: not every rank has joined"),
            ));
        }
        let size = elem_size(dtype)?;
        let nranks = comm.clique.nranks;
        if !(0..nranks as c_int).contains(&peer) {
            return Err(fail(
                R::ncclInvalidArgument,
                format!("{call}: peer {peer} is not a rank of this {nranks}-rank communicator"),
            ));
        }
        let stream = crate::stream::resolve(stream)
            .map_err(|_| fail(R::ncclInvalidArgument, "the stream is not a live stream"))?;
        if stream.device != comm.device {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "{call}: rank {} of the communicator is on device {}, but the stream on \
                     device {}",
                    comm.rank, comm.device, stream.device
                ),
            ));
        }
        let bytes = count.checked_mul(size).ok_or_else(|| {
            fail(
                R::ncclInvalidArgument,
                format!("{call}: {count} elements overflow"),
            )
        })?;
        if bytes > 0 {
            let what = if send {
                "send buffer"
            } else {
                "receive buffer"
            };
            check_buffer(ptr, bytes, comm.device, what)?;
        }
        let p2p = P2p {
            send,
            peer: peer as usize,
            half: Half {
                ptr,
                count,
                dtype,
                bytes,
                device: comm.device,
                faulted: false,
            },
        };
        if GROUP_DEPTH.with(Cell::get) > 0 {
            GROUPED.with(|g| g.borrow_mut().push(Grouped { stream, comm, p2p }));
            return Ok(());
        }
        submit(&stream, exchange_maker(vec![(comm, p2p)]))
    })())
}

unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    enqueue_p2p(comm, stream, true, sendbuff as usize, count, datatype, peer)
}

unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    enqueue_p2p(
        comm,
        stream,
        false,
        recvbuff as usize,
        count,
        datatype,
        peer,
    )
}

/// The size of one element, or why the software NCCL does not take the type.
fn elem_size(dtype: ncclDataType_t) -> Result<usize, R> {
    Ok(match dtype {
        ncclDataType_t::ncclInt8 | ncclDataType_t::ncclUint8 => 1,
        ncclDataType_t::ncclInt32 | ncclDataType_t::ncclUint32 | ncclDataType_t::ncclFloat32 => 4,
        ncclDataType_t::ncclInt64 | ncclDataType_t::ncclUint64 | ncclDataType_t::ncclFloat64 => 8,
        other => {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "data type {} is not supported by the software NCCL (8/32/64-bit integers, \
                     f32 and f64 are)",
                    other.0
                ),
            ));
        }
    })
}

/// Enqueue `shape` for `comm` on `stream`: the checks NCCL makes at the call,
/// then the ordered work.
fn enqueue(
    comm: ncclComm_t,
    stream: cudaStream_t,
    shape: Shape,
    send: *const c_void,
    recv: *mut c_void,
) -> R {
    code((|| {
        let comm = self::comm(comm)?;
        if !lock(&comm.clique.state).joined.iter().all(|&j| j) {
            return Err(fail(
                R::ncclInvalidUsage,
                "the communicator is still being made (ncclCommGetAsyncError says \
                 ncclInProgress): not every rank has joined",
            ));
        }
        let size = elem_size(shape.dtype)?;
        if shape.op.0 >= ncclRedOp_t::ncclNumOps.0 {
            return Err(fail(
                R::ncclInvalidArgument,
                format!("reduction operation {} is not one NCCL defines", shape.op.0),
            ));
        }
        let nranks = comm.clique.nranks;
        if matches!(shape.kind, Kind::Broadcast | Kind::Reduce)
            && !(0..nranks as c_int).contains(&shape.root)
        {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "root {} is not a rank of this {nranks}-rank communicator",
                    shape.root
                ),
            ));
        }
        let stream = crate::stream::resolve(stream)
            .map_err(|_| fail(R::ncclInvalidArgument, "the stream is not a live stream"))?;
        if stream.device != comm.device {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "rank {} of the communicator is on device {}, but the stream on device {}",
                    comm.rank, comm.device, stream.device
                ),
            ));
        }
        let bytes = shape.count.checked_mul(size).ok_or_else(|| {
            fail(
                R::ncclInvalidArgument,
                format!("{} elements overflow", shape.count),
            )
        })?;
        let whole = bytes.saturating_mul(nranks);
        let (send_len, recv_len) = match shape.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce => (bytes, bytes),
            Kind::AllGather => (bytes, whole),
            Kind::ReduceScatter => (whole, bytes),
        };
        let is_root = shape.root as usize == comm.rank;
        let needs_send = !matches!(shape.kind, Kind::Broadcast) || is_root;
        let needs_recv = !matches!(shape.kind, Kind::Reduce) || is_root;
        for (needed, ptr, len, what) in [
            (needs_send, send as usize, send_len, "send buffer"),
            (needs_recv, recv as usize, recv_len, "receive buffer"),
        ] {
            if needed && len > 0 {
                check_buffer(ptr, len, comm.device, what)?;
            }
        }
        let arrival = Arrival {
            shape,
            send: send as usize,
            recv: recv as usize,
            device: comm.device,
            faulted: false,
        };
        // Numbered when enqueued: eagerly now, captured at each launch of
        // the graph (a replay is a new collective of the communicator).
        let make = move || {
            let seq = comm.next.fetch_add(1, Ordering::AcqRel);
            let (clique, rank) = (Arc::clone(&comm.clique), comm.rank);
            let call = move |_device: i32, faulted: bool| {
                arrive(&clique, seq, rank, Arrival { faulted, ..arrival })
            };
            Action::Call(Arc::new(call))
        };
        submit(&stream, Arc::new(make))
    })())
}

/// Enqueue work the software NCCL makes anew at each enqueue (see
/// [`Action::Instance`]).
fn submit(
    stream: &Arc<crate::stream::Stream>,
    make: Arc<dyn Fn() -> Action + Send + Sync>,
) -> Result<(), R> {
    stream
        .submit(&[Template::Act(Action::Instance(make))])
        .map_err(|code: CUresult| {
            fail(
                R::ncclUnhandledCudaError,
                format!("enqueueing on the stream failed: {}", code.0),
            )
        })
}

/// A rank's worker reached collective `seq`: wait for every rank, and the
/// last to arrive does the work for all.
fn arrive(clique: &Clique, seq: u64, rank: usize, arrival: Arrival) -> Option<Fault> {
    let mut state = lock(&clique.state);
    let nranks = clique.nranks;
    let round = state.rounds.entry(seq).or_insert_with(|| Round {
        arrivals: vec![None; nranks],
        ..Round::default()
    });
    round.arrivals[rank] = Some(arrival);
    round.arrived += 1;
    if round.arrived == nranks {
        let arrivals: Vec<Arrival> = round.arrivals.iter().flatten().copied().collect();
        let failure = run(&arrivals).err();
        let failed = failure.is_some();
        round.outcome = Some(failure);
        state.failed |= failed;
        clique.changed.notify_all();
    }
    loop {
        let aborted = state.aborted;
        let round = state.rounds.get_mut(&seq)?;
        if let Some(outcome) = round.outcome.clone() {
            round.left += 1;
            if round.left == nranks {
                state.rounds.remove(&seq);
            }
            return outcome.map(|why| Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: format!("software NCCL collective {seq}: {why}"),
            });
        }
        if aborted {
            return Some(Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: format!(
                    "software NCCL collective {seq}: the communicator was aborted while rank \
                     {rank} waited for the others"
                ),
            });
        }
        state = clique
            .changed
            .wait(state)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Every rank has arrived: check they agree, then move the data.
fn run(arrivals: &[Arrival]) -> Result<(), String> {
    let first = arrivals[0].shape;
    for (rank, arrival) in arrivals.iter().enumerate() {
        if arrival.faulted {
            return Err(format!("rank {rank}'s stream has a sticky error"));
        }
        if arrival.shape != first {
            return Err(format!(
                "the ranks disagree: rank 0 called {:?} of {} element(s) of type {} (op {}, \
                 root {}), rank {rank} {:?} of {} of type {} (op {}, root {})",
                first.kind,
                first.count,
                first.dtype.0,
                first.op.0,
                first.root,
                arrival.shape.kind,
                arrival.shape.count,
                arrival.shape.dtype.0,
                arrival.shape.op.0,
                arrival.shape.root,
            ));
        }
    }
    let size = elem_size(first.dtype).map_err(|_| "unsupported type".to_string())?;
    let nranks = arrivals.len();
    let bytes = first.count * size;
    let root = first.root as usize;
    // What each rank reads and writes, checked as memcheck would now that
    // the work runs.
    let check = |ptr: usize, len: usize, device: i32, what: &str| {
        if len == 0 {
            return Ok(());
        }
        crate::memory::check_access(ptr, len, device)
            .map(drop)
            .map_err(|why| format!("{what}: {why}"))
    };
    let read = |ptr: usize, len: usize| -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: `[ptr, ptr + len)` was checked live just before; every
        // rank's worker is held in this collective, so nothing else writes it.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), len) };
        out
    };
    let write = |ptr: usize, data: &[u8]| {
        // SAFETY: as for `read`; the destination was checked for `data.len()`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
    };
    match first.kind {
        Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter => {
            let in_len = if first.kind == Kind::ReduceScatter {
                bytes * nranks
            } else {
                bytes
            };
            for (rank, a) in arrivals.iter().enumerate() {
                check(
                    a.send,
                    in_len,
                    a.device,
                    &format!("rank {rank}'s send buffer"),
                )?;
                let writes = first.kind != Kind::Reduce || rank == root;
                if writes {
                    check(
                        a.recv,
                        bytes,
                        a.device,
                        &format!("rank {rank}'s receive buffer"),
                    )?;
                }
            }
            let inputs: Vec<Vec<u8>> = arrivals.iter().map(|a| read(a.send, in_len)).collect();
            let result = reduce(first.dtype, first.op, &inputs)?;
            for (rank, a) in arrivals.iter().enumerate() {
                match first.kind {
                    Kind::AllReduce => write(a.recv, &result),
                    Kind::Reduce if rank == root => write(a.recv, &result),
                    Kind::ReduceScatter => write(a.recv, &result[rank * bytes..(rank + 1) * bytes]),
                    _ => {}
                }
            }
        }
        Kind::Broadcast => {
            let source = &arrivals[root];
            check(source.send, bytes, source.device, "the root's send buffer")?;
            for (rank, a) in arrivals.iter().enumerate() {
                check(
                    a.recv,
                    bytes,
                    a.device,
                    &format!("rank {rank}'s receive buffer"),
                )?;
            }
            let data = read(source.send, bytes);
            for a in arrivals {
                write(a.recv, &data);
            }
        }
        Kind::AllGather => {
            for (rank, a) in arrivals.iter().enumerate() {
                check(
                    a.send,
                    bytes,
                    a.device,
                    &format!("rank {rank}'s send buffer"),
                )?;
                check(
                    a.recv,
                    bytes * nranks,
                    a.device,
                    &format!("rank {rank}'s receive buffer"),
                )?;
            }
            let gathered: Vec<u8> = arrivals.iter().flat_map(|a| read(a.send, bytes)).collect();
            for a in arrivals {
                write(a.recv, &gathered);
            }
        }
    }
    Ok(())
}

/// The element-wise reduction NCCL's operations define.
trait Num: Copy {
    fn sum(self, other: Self) -> Self;
    fn prod(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn div(self, n: usize) -> Self;
}

macro_rules! num_int {
    ($($t:ty),*) => { $(
        impl Num for $t {
            fn sum(self, o: Self) -> Self { self.wrapping_add(o) }
            fn prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn max(self, o: Self) -> Self { Ord::max(self, o) }
            fn min(self, o: Self) -> Self { Ord::min(self, o) }
            fn div(self, n: usize) -> Self { self / (n as $t) }
        }
    )* };
}
num_int!(i8, u8, i32, u32, i64, u64);

macro_rules! num_float {
    ($($t:ty),*) => { $(
        impl Num for $t {
            fn sum(self, o: Self) -> Self { self + o }
            fn prod(self, o: Self) -> Self { self * o }
            fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            fn div(self, n: usize) -> Self { self / (n as $t) }
        }
    )* };
}
num_float!(f32, f64);

fn reduce_as<T: Num>(op: ncclRedOp_t, inputs: &[Vec<u8>]) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let elem = |bytes: &[u8], i: usize| -> T {
        // SAFETY: `i * size + size <= bytes.len()` (i < len / size); T is a
        // plain number, valid for any bits; read_unaligned needs no alignment.
        unsafe { bytes.as_ptr().add(i * size).cast::<T>().read_unaligned() }
    };
    let n = inputs[0].len() / size;
    let mut out = vec![0u8; n * size];
    for i in 0..n {
        let mut acc = elem(&inputs[0], i);
        for input in &inputs[1..] {
            let x = elem(input, i);
            acc = match op {
                ncclRedOp_t::ncclProd => acc.prod(x),
                ncclRedOp_t::ncclMax => acc.max(x),
                ncclRedOp_t::ncclMin => acc.min(x),
                _ => acc.sum(x),
            };
        }
        if op == ncclRedOp_t::ncclAvg {
            acc = acc.div(inputs.len());
        }
        // SAFETY: as for `elem`, into `out`, which holds n elements.
        unsafe {
            out.as_mut_ptr()
                .add(i * size)
                .cast::<T>()
                .write_unaligned(acc)
        };
    }
    out
}

fn reduce(dtype: ncclDataType_t, op: ncclRedOp_t, inputs: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    type D = ncclDataType_t;
    Ok(match dtype {
        D::ncclInt8 => reduce_as::<i8>(op, inputs),
        D::ncclUint8 => reduce_as::<u8>(op, inputs),
        D::ncclInt32 => reduce_as::<i32>(op, inputs),
        D::ncclUint32 => reduce_as::<u32>(op, inputs),
        D::ncclInt64 => reduce_as::<i64>(op, inputs),
        D::ncclUint64 => reduce_as::<u64>(op, inputs),
        D::ncclFloat32 => reduce_as::<f32>(op, inputs),
        D::ncclFloat64 => reduce_as::<f64>(op, inputs),
        other => return Err(format!("data type {} is not supported", other.0)),
    })
}

unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::AllReduce,
        count,
        dtype: datatype,
        op,
        root: 0,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::Broadcast,
        count,
        dtype: datatype,
        op: ncclRedOp_t::ncclSum,
        root,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::Reduce,
        count,
        dtype: datatype,
        op,
        root,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::AllGather,
        count: sendcount,
        dtype: datatype,
        op: ncclRedOp_t::ncclSum,
        root: 0,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::ReduceScatter,
        count: recvcount,
        dtype: datatype,
        op,
        root: 0,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

/// The software NCCL's table: every entry point of [`sys::nccl::Nccl`],
/// with collectives done by the software driver's stream workers over its
/// devices' memory. Communicators, streams and buffers must come from the
/// software driver ([`crate::driver`]).
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// let nccl = soft::nccl();
/// let mut version = 0;
/// // SAFETY: a valid out-pointer.
/// unsafe { (nccl.ncclGetVersion)(&mut version) }.result().unwrap();
/// assert_eq!(version, soft::NCCL_VERSION);
/// ```
pub fn nccl() -> &'static Nccl {
    static TABLE: Nccl = Nccl {
        ncclGetVersion,
        ncclGetUniqueId,
        ncclCommInitRank,
        ncclCommInitAll,
        ncclCommInitRankConfig,
        ncclCommDestroy,
        ncclCommAbort,
        ncclCommGetAsyncError,
        ncclCommCount,
        ncclCommCuDevice,
        ncclCommUserRank,
        ncclGetErrorString,
        ncclGetLastError,
        ncclAllReduce,
        ncclBroadcast,
        ncclReduce,
        ncclAllGather,
        ncclReduceScatter,
        ncclGroupStart,
        ncclGroupEnd,
        ncclSend,
        ncclRecv,
    };
    &TABLE
}
