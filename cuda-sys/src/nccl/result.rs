//! NCCL's result layer, as the driver's (cudarc's `sys` → `result` → safe
//! types): one checked wrapper per entry point of [`Nccl`] that the
//! collectives call, named after the call (`ncclAllReduce` →
//! [`all_reduce`]). A failure is an [`NcclError`] that names the call and
//! carries `ncclGetLastError`'s detail; crates above call NCCL through these,
//! never through the table.
//!
//! `ncclInProgress` is no failure where a non-blocking communicator may
//! answer it (initialising one, the collectives, send and receive, a group's
//! end): those wrappers return a [`Progress`], and the caller polls
//! [`comm_get_async_error`] until the call has finished. Everywhere else it is
//! an error like any other code.
//!
//! A wrapper is `unsafe` where NCCL trusts an argument the wrapper cannot
//! check: a communicator that must be live, device buffers that must hold the
//! elements a collective touches, a stream of the communicator's device.
//!
//! ```
//! use cuda_streams_sys::nccl::{Progress, result};
//! # use soft_driver as cuda_streams_soft_driver;
//! # fn main() -> Result<(), cuda_streams_sys::nccl::NcclError> {
//! // Any table: libnccl's (`Nccl::load`) or, here, the software NCCL's.
//! let nccl = cuda_streams_soft_driver::nccl();
//! assert!(result::get_version(nccl)? >= 22800);
//! let id = result::get_unique_id(nccl)?; // for `comm_init_rank` on every rank
//! # let _ = id;
//! result::group_start(nccl)?;
//! assert_eq!(result::group_end(nccl)?, Progress::Done(()));
//! // A group's end without its start: the error names the call and says why.
//! let err = result::group_end(nccl).unwrap_err();
//! assert_eq!(err.call(), Some("ncclGroupEnd"));
//! assert_eq!(
//!     err.to_string(),
//!     "ncclGroupEnd failed: ncclInvalidUsage (5) (ncclGroupEnd without a matching ncclGroupStart)"
//! );
//! # Ok(())
//! # }
//! //! ```

use super::Nccl;
use super::bindings::{
    cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use std::ffi::{CStr, c_int, c_void};
use std::fmt;

/// An NCCL call that did not return `ncclSuccess`.
///
/// ```
/// use cuda_streams_sys::nccl::ncclResult_t;
/// let err = ncclResult_t::ncclInvalidUsage.result().unwrap_err();
/// assert_eq!(err.to_string(), "ncclInvalidUsage (5)");
/// assert_eq!(err.call(), None); // a bare code; the wrappers of `result` name their call
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NcclError {
    code: ncclResult_t,
    call: Option<&'static str>,
    detail: Option<String>,
}

impl NcclError {
    /// The raw `ncclResult_t`.
    pub const fn code(&self) -> ncclResult_t {
        self.code
    }

    /// The name `nccl.h` gives the code.
    pub fn name(&self) -> &'static str {
        match self.code {
            ncclResult_t::ncclSuccess => "ncclSuccess",
            ncclResult_t::ncclUnhandledCudaError => "ncclUnhandledCudaError",
            ncclResult_t::ncclSystemError => "ncclSystemError",
            ncclResult_t::ncclInternalError => "ncclInternalError",
            ncclResult_t::ncclInvalidArgument => "ncclInvalidArgument",
            ncclResult_t::ncclInvalidUsage => "ncclInvalidUsage",
            ncclResult_t::ncclRemoteError => "ncclRemoteError",
            ncclResult_t::ncclInProgress => "ncclInProgress",
            _ => "ncclUnknownResult",
        }
    }

    /// The NCCL function that failed, when the error came from a wrapper of
    /// this module.
    pub fn call(&self) -> Option<&'static str> {
        self.call
    }

    /// What `ncclGetLastError` said about the failure, when it said anything.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(call) = self.call {
            write!(f, "{call} failed: ")?;
        }
        write!(f, "{} ({})", self.name(), self.code.0)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for NcclError {}

impl ncclResult_t {
    /// `Ok(())` for `ncclSuccess`, otherwise the error with its name.
    pub fn result(self) -> Result<(), NcclError> {
        if self == ncclResult_t::ncclSuccess {
            Ok(())
        } else {
            Err(NcclError {
                code: self,
                call: None,
                detail: None,
            })
        }
    }
}

/// How a call that a non-blocking communicator may leave running came back:
/// finished, or still in progress (`ncclInProgress`) with its outcome to be
/// polled with [`comm_get_async_error`]. A blocking communicator's calls are
/// always `Done`.
///
/// Not `#[non_exhaustive]`: `ncclInProgress` is NCCL's one code for "not yet".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a call in progress has not finished: poll comm_get_async_error"]
pub enum Progress<T = ()> {
    /// The call finished.
    Done(T),
    /// The call goes on in the background (`ncclInProgress`).
    InProgress(T),
}

impl<T> Progress<T> {
    /// `code` with what the call gave back: `None` when it is a failure.
    fn of(code: ncclResult_t, value: T) -> Option<Self> {
        match code {
            ncclResult_t::ncclSuccess => Some(Progress::Done(value)),
            ncclResult_t::ncclInProgress => Some(Progress::InProgress(value)),
            _ => None,
        }
    }

    /// Whether the call is still in progress.
    pub fn is_in_progress(&self) -> bool {
        matches!(self, Progress::InProgress(_))
    }

    /// What the call gave back, finished or not.
    pub fn into_inner(self) -> T {
        match self {
            Progress::Done(value) | Progress::InProgress(value) => value,
        }
    }
}

/// The error of `call`, which answered `code`, with `ncclGetLastError`'s
/// detail for `comm`.
///
/// # Safety
/// `comm` is null or a live communicator of `nccl`.
unsafe fn failed(
    nccl: &Nccl,
    call: &'static str,
    comm: ncclComm_t,
    code: ncclResult_t,
) -> NcclError {
    NcclError {
        code,
        call: Some(call),
        // SAFETY: the caller's contract.
        detail: unsafe { get_last_error(nccl, comm) },
    }
}

/// `Ok` for `ncclSuccess`, otherwise the error of `call`.
///
/// # Safety
/// As for [`failed`].
unsafe fn check(
    nccl: &Nccl,
    call: &'static str,
    comm: ncclComm_t,
    code: ncclResult_t,
) -> Result<(), NcclError> {
    match code {
        ncclResult_t::ncclSuccess => Ok(()),
        // SAFETY: the caller's contract.
        _ => Err(unsafe { failed(nccl, call, comm, code) }),
    }
}

/// [`check`] for a call that may be left running: `ncclInProgress` is
/// [`Progress::InProgress`].
///
/// # Safety
/// As for [`failed`].
unsafe fn progress<T>(
    nccl: &Nccl,
    call: &'static str,
    comm: ncclComm_t,
    code: ncclResult_t,
    value: T,
) -> Result<Progress<T>, NcclError> {
    match Progress::of(code, value) {
        Some(progress) => Ok(progress),
        // SAFETY: the caller's contract.
        None => Err(unsafe { failed(nccl, call, comm, code) }),
    }
}

/// `ncclGetLastError`: NCCL's text about the last failure on `comm` (null:
/// any), `None` when it is empty.
///
/// # Safety
/// `comm` is null or a live communicator of `nccl`.
pub unsafe fn get_last_error(nccl: &Nccl, comm: ncclComm_t) -> Option<String> {
    // SAFETY: the caller's contract; NCCL returns a NUL-terminated string it
    // owns, or null.
    let text = unsafe { (nccl.ncclGetLastError)(comm) };
    if text.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, valid until NCCL's next call on
    // this thread: copied now.
    let text = unsafe { CStr::from_ptr(text) };
    Some(text.to_string_lossy().into_owned()).filter(|text| !text.is_empty())
}

/// `ncclGetVersion`: `10000 * major + 100 * minor + patch`.
pub fn get_version(nccl: &Nccl) -> Result<c_int, NcclError> {
    let mut version = 0;
    // SAFETY: writes one int through a valid pointer.
    let code = unsafe { (nccl.ncclGetVersion)(&mut version) };
    // SAFETY: null asks about any communicator.
    unsafe { check(nccl, "ncclGetVersion", std::ptr::null_mut(), code) }?;
    Ok(version)
}

/// `ncclGetUniqueId`: a fresh id for [`comm_init_rank`], to send to every rank.
pub fn get_unique_id(nccl: &Nccl) -> Result<ncclUniqueId, NcclError> {
    let mut id = ncclUniqueId::default();
    // SAFETY: writes one ncclUniqueId through a valid pointer.
    let code = unsafe { (nccl.ncclGetUniqueId)(&mut id) };
    // SAFETY: null asks about any communicator.
    unsafe { check(nccl, "ncclGetUniqueId", std::ptr::null_mut(), code) }?;
    Ok(id)
}

/// `ncclCommInitAll`: one communicator per device of `devices` (ordinals),
/// made together by this thread; rank `i` is `devices[i]`'s. NCCL may leave
/// another device current.
pub fn comm_init_all(nccl: &Nccl, devices: &[c_int]) -> Result<Vec<ncclComm_t>, NcclError> {
    let mut comms = vec![std::ptr::null_mut(); devices.len()];
    let ndev = c_int::try_from(devices.len()).unwrap_or(c_int::MAX);
    // SAFETY: `comms` has a slot per device and `devices` an ordinal per
    // device, as ncclCommInitAll writes and reads them (NCCL refuses an
    // ordinal it does not know).
    let code = unsafe { (nccl.ncclCommInitAll)(comms.as_mut_ptr(), ndev, devices.as_ptr()) };
    // SAFETY: null asks about any communicator.
    unsafe { check(nccl, "ncclCommInitAll", std::ptr::null_mut(), code) }?;
    Ok(comms)
}

/// `ncclCommInitRank`: rank `rank` of the `nranks`-rank communicator named
/// by `id`, on the current device. Returns once every rank has joined.
pub fn comm_init_rank(
    nccl: &Nccl,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> Result<ncclComm_t, NcclError> {
    let mut comm = std::ptr::null_mut();
    // SAFETY: writes one communicator through a valid pointer; the id is
    // passed by value as nccl.h declares.
    let code = unsafe { (nccl.ncclCommInitRank)(&mut comm, nranks, id, rank) };
    // SAFETY: null asks about any communicator.
    unsafe { check(nccl, "ncclCommInitRank", std::ptr::null_mut(), code) }?;
    Ok(comm)
}

/// `ncclCommInitRankConfig`: [`comm_init_rank`] with `config`. A
/// non-blocking configuration may answer [`Progress::InProgress`] with the
/// communicator: poll [`comm_get_async_error`] on it until it is ready.
///
/// # Safety
/// `config` is initialised as `NCCL_CONFIG_INITIALIZER` does (size, magic,
/// version), and its pointers (`netName`, `commName`) are null or
/// NUL-terminated strings that outlive the call.
pub unsafe fn comm_init_rank_config(
    nccl: &Nccl,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: &mut ncclConfig_t,
) -> Result<Progress<ncclComm_t>, NcclError> {
    let mut comm = std::ptr::null_mut();
    // SAFETY: the caller's contract for `config`; writes one communicator
    // through a valid pointer.
    let code = unsafe { (nccl.ncclCommInitRankConfig)(&mut comm, nranks, id, rank, config) };
    // SAFETY: null asks about any communicator.
    unsafe {
        progress(
            nccl,
            "ncclCommInitRankConfig",
            std::ptr::null_mut(),
            code,
            comm,
        )
    }
}

/// `ncclCommDestroy`: free `comm` once its work has finished.
///
/// # Safety
/// `comm` is a live communicator of `nccl`, destroyed or aborted once, and
/// nothing (no graph either) calls it afterwards.
pub unsafe fn comm_destroy(nccl: &Nccl, comm: ncclComm_t) -> Result<(), NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclCommDestroy)(comm) };
    // SAFETY: the communicator is gone: ask about any.
    unsafe { check(nccl, "ncclCommDestroy", std::ptr::null_mut(), code) }
}

/// `ncclCommAbort`: give up `comm`'s pending work and free it.
///
/// # Safety
/// As for [`comm_destroy`].
pub unsafe fn comm_abort(nccl: &Nccl, comm: ncclComm_t) -> Result<(), NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclCommAbort)(comm) };
    // SAFETY: the communicator is gone: ask about any.
    unsafe { check(nccl, "ncclCommAbort", std::ptr::null_mut(), code) }
}

/// `ncclCommGetAsyncError`: `comm`'s state, a raw code: `ncclSuccess`,
/// `ncclInProgress` while a non-blocking call goes on, or the error a call
/// met after it returned. The `Err` is the query's own failure.
///
/// # Safety
/// `comm` is a live communicator of `nccl`.
pub unsafe fn comm_get_async_error(
    nccl: &Nccl,
    comm: ncclComm_t,
) -> Result<ncclResult_t, NcclError> {
    let mut state = ncclResult_t::ncclSuccess;
    // SAFETY: the caller's contract; writes one result.
    let code = unsafe { (nccl.ncclCommGetAsyncError)(comm, &mut state) };
    // SAFETY: the caller's contract.
    unsafe { check(nccl, "ncclCommGetAsyncError", comm, code) }?;
    Ok(state)
}

/// `ncclGroupStart`: the calls until [`group_end`] on this thread are one
/// group.
pub fn group_start(nccl: &Nccl) -> Result<(), NcclError> {
    // SAFETY: no arguments.
    let code = unsafe { (nccl.ncclGroupStart)() };
    // SAFETY: null asks about any communicator.
    unsafe { check(nccl, "ncclGroupStart", std::ptr::null_mut(), code) }
}

/// `ncclGroupEnd`: launch the group opened by [`group_start`]. With
/// non-blocking communicators it may be [`Progress::InProgress`]: poll each
/// communicator of the group.
pub fn group_end(nccl: &Nccl) -> Result<Progress, NcclError> {
    // SAFETY: no arguments; the calls it launches were made under their
    // wrappers' contracts.
    let code = unsafe { (nccl.ncclGroupEnd)() };
    // SAFETY: null asks about any communicator.
    unsafe { progress(nccl, "ncclGroupEnd", std::ptr::null_mut(), code, ()) }
}

/// `ncclAllReduce`: every rank's `count` elements at `send` combined by `op`
/// into every rank's `recv`, in stream order on `stream`.
///
/// # Safety
/// `comm` is a live communicator of `nccl`; `stream` a live stream of its
/// device; `send` and `recv` device memory of that device holding `count`
/// elements of `dtype` each (the same or disjoint), alive and untouched by
/// other work until `stream` has passed the call (or the graph capturing
/// `stream` keeps them for all its replays).
#[allow(clippy::too_many_arguments, reason = "ncclAllReduce's own parameters")]
pub unsafe fn all_reduce(
    nccl: &Nccl,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclAllReduce)(send, recv, count, dtype, op, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclAllReduce", comm, code, ()) }
}

/// `ncclBroadcast`: rank `root`'s `count` elements at `send` into every
/// rank's `recv` (`send` is read on `root` only).
///
/// # Safety
/// As for [`all_reduce`].
#[allow(clippy::too_many_arguments, reason = "ncclBroadcast's own parameters")]
pub unsafe fn broadcast(
    nccl: &Nccl,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclBroadcast)(send, recv, count, dtype, root, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclBroadcast", comm, code, ()) }
}

/// `ncclReduce`: every rank's `count` elements at `send` combined by `op`
/// into rank `root`'s `recv` (written on `root` only).
///
/// # Safety
/// As for [`all_reduce`].
#[allow(clippy::too_many_arguments, reason = "ncclReduce's own parameters")]
pub unsafe fn reduce(
    nccl: &Nccl,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclReduce)(send, recv, count, dtype, op, root, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclReduce", comm, code, ()) }
}

/// `ncclAllGather`: every rank's `send_count` elements at `send`, rank by
/// rank, into every rank's `recv` (`send_count * ranks` elements).
///
/// # Safety
/// As for [`all_reduce`], with `recv` holding `send_count * ranks` elements.
pub unsafe fn all_gather(
    nccl: &Nccl,
    send: *const c_void,
    recv: *mut c_void,
    send_count: usize,
    dtype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclAllGather)(send, recv, send_count, dtype, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclAllGather", comm, code, ()) }
}

/// `ncclReduceScatter`: every rank's `recv_count * ranks` elements at `send`
/// combined by `op`; rank `r` gets block `r` in `recv` (`recv_count`).
///
/// # Safety
/// As for [`all_reduce`], with `send` holding `recv_count * ranks` elements.
#[allow(
    clippy::too_many_arguments,
    reason = "ncclReduceScatter's own parameters"
)]
pub unsafe fn reduce_scatter(
    nccl: &Nccl,
    send: *const c_void,
    recv: *mut c_void,
    recv_count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclReduceScatter)(send, recv, recv_count, dtype, op, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclReduceScatter", comm, code, ()) }
}

/// `ncclSend`: `count` elements at `send` to rank `peer`, which calls
/// [`recv`] for them.
///
/// # Safety
/// As for [`all_reduce`], for `send` alone.
pub unsafe fn send(
    nccl: &Nccl,
    send: *const c_void,
    count: usize,
    dtype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclSend)(send, count, dtype, peer, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclSend", comm, code, ()) }
}

/// `ncclRecv`: `count` elements from rank `peer` (its [`send`]) into `recv`.
///
/// # Safety
/// As for [`all_reduce`], for `recv` alone.
pub unsafe fn recv(
    nccl: &Nccl,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<Progress, NcclError> {
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.ncclRecv)(recv, count, dtype, peer, comm, stream) };
    // SAFETY: the caller's contract.
    unsafe { progress(nccl, "ncclRecv", comm, code, ()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_success_and_in_progress_are_progress() {
        assert_eq!(
            Progress::of(ncclResult_t::ncclSuccess, 3),
            Some(Progress::Done(3))
        );
        let running = Progress::of(ncclResult_t::ncclInProgress, 3).unwrap();
        assert!(running.is_in_progress());
        assert_eq!(running.into_inner(), 3);
        for failure in [
            ncclResult_t::ncclInvalidArgument,
            ncclResult_t::ncclRemoteError,
            ncclResult_t::ncclInternalError,
        ] {
            assert_eq!(Progress::of(failure, 3), None, "{failure:?}");
        }
    }

    #[test]
    fn a_bare_code_has_no_call_and_keeps_its_old_text() {
        let err = ncclResult_t::ncclRemoteError.result().unwrap_err();
        assert_eq!((err.call(), err.detail()), (None, None));
        assert_eq!(err.to_string(), "ncclRemoteError (6)");
    }
}
