//! A software NCCL over the software devices: communicators as cliques of
//! ranks in this process, collectives done by the streams' worker threads
//! over host memory.
//!
//! A collective is ordered work on its rank's stream. When a rank's worker
//! reaches its `n`-th collective it arrives at round `n` of the clique and
//! waits (holding its stream, as a NCCL kernel holds the GPU's) until every
//! rank has arrived; the last to arrive moves the data for all of them, as
//! rank 0's call describes it, and lets them go. Whether the ranks agree
//! (the same collective, count, type, operation and root) is the
//! collectives crate's check, made once before any rank reaches NCCL on
//! either driver; here only what keeps this driver's memory accesses in
//! bounds is checked: every buffer live for the bytes moved, and a send and
//! its receive of the same size. Such a failure fails every rank's stream
//! with `CUDA_ERROR_LAUNCH_FAILED` (with a detail naming the rank and the
//! buffer), and the communicators' `ncclCommGetAsyncError` with
//! `ncclInvalidUsage`. A rank that never calls its part leaves the others
//! waiting, as on a GPU, until `ncclCommAbort`.
//!
//! The element types are those the safe layer offers: 8-, 32- and 64-bit
//! integers and `f32`/`f64`; 16-bit and 8-bit floats are refused with
//! `ncclInvalidArgument`. `ncclGetLastError` says why a call failed.

use crate::handles::{Registry, lock, mint};
use crate::ops::{Action, Template};
use crate::sticky_errors::Fault;
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

mod collective;
mod p2p;
mod reduce;

use collective::Round;
use collective::{ncclAllGather, ncclAllReduce, ncclBroadcast, ncclReduce, ncclReduceScatter};
use p2p::{Grouped, Pair, PairKey, enqueue_grouped, ncclRecv, ncclSend};

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
    /// Whether a collective or a send/receive failed, for
    /// `ncclCommGetAsyncError`.
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
            crate::device::check_device(dev).map_err(|_| {
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
