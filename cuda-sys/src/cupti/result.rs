//! CUPTI's result layer, as the driver's (cudarc's `sys` → `result` → safe
//! types): one checked wrapper per entry point of [`Cupti`], named after the
//! call (`cuptiActivityEnable` → [`activity_enable`]). Each turns the
//! `CUptiResult` into a [`CuptiError`] that names the call and carries
//! CUPTI's description of the code. Crates above call CUPTI through these,
//! never through the table.
//!
//! A wrapper is `unsafe` where CUPTI trusts an argument the wrapper cannot
//! check: a context or stream handle that must be live, a buffer of records,
//! callbacks that CUPTI will run on its own threads.

use super::Cupti;
use super::bindings::{
    CUcontext, CUpti_Activity, CUpti_ActivityFlag, CUpti_ActivityKind,
    CUpti_BuffersCallbackCompleteFunc, CUpti_BuffersCallbackRequestFunc, CUptiResult, CUstream,
};
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;

/// A CUPTI call that did not return `CUPTI_SUCCESS`.
///
/// ```
/// use cuda_streams_sys::cupti::CuptiError;
/// let err = CuptiError::new(1, None);
/// assert_eq!(err.code(), 1);
/// assert_eq!(err.to_string(), "CUPTI error 1");
/// let err = err.in_call("cuptiActivityEnable");
/// assert_eq!(err.call(), Some("cuptiActivityEnable"));
/// assert_eq!(err.to_string(), "cuptiActivityEnable failed: CUPTI error 1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuptiError {
    code: u32,
    description: Option<String>,
    call: Option<&'static str>,
}

impl CuptiError {
    /// An error for the raw `CUptiResult` value `code`.
    pub fn new(code: u32, description: Option<String>) -> Self {
        Self {
            code,
            description,
            call: None,
        }
    }

    /// The same error, as the outcome of the CUPTI function `call`.
    pub fn in_call(self, call: &'static str) -> Self {
        Self {
            call: Some(call),
            ..self
        }
    }

    /// The raw `CUptiResult` value.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// CUPTI's description of the code (`cuptiGetResultString`), if it gave one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The CUPTI function that failed, when the error came from a wrapper of
    /// this module.
    pub fn call(&self) -> Option<&'static str> {
        self.call
    }
}

impl fmt::Display for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(call) = self.call {
            write!(f, "{call} failed: ")?;
        }
        match &self.description {
            Some(text) => write!(f, "{text} (CUPTI error {})", self.code),
            None => write!(f, "CUPTI error {}", self.code),
        }
    }
}

impl std::error::Error for CuptiError {}

impl Cupti {
    /// `status` as a `Result`, the error carrying CUPTI's own description.
    pub fn check(&self, status: CUptiResult) -> Result<(), CuptiError> {
        if status == CUptiResult::CUPTI_SUCCESS {
            return Ok(());
        }
        let mut text: *const std::os::raw::c_char = std::ptr::null();
        // SAFETY: cuptiGetResultString writes a pointer to a static string (or
        // nothing) into `text`, a valid out-pointer.
        let described = unsafe { (self.cuptiGetResultString)(status, &mut text) };
        let description = (described == CUptiResult::CUPTI_SUCCESS && !text.is_null()).then(|| {
            // SAFETY: CUPTI returned a NUL-terminated string with static lifetime.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        });
        Err(CuptiError::new(status.0, description))
    }
}

/// `status` of the call `call` as a `Result`.
fn check(cupti: &Cupti, call: &'static str, status: CUptiResult) -> Result<(), CuptiError> {
    cupti.check(status).map_err(|err| err.in_call(call))
}

/// `cuptiActivityRegisterCallbacks`: CUPTI asks `requested` for empty
/// buffers and hands full ones to `completed`, on any thread.
///
/// # Safety
/// Both callbacks follow CUPTI's contract for them for as long as the process
/// runs: `requested` writes a buffer of at least the size it reports, 8-byte
/// aligned, that stays valid until `completed` gets it back; neither unwinds
/// into CUPTI; neither calls the driver or CUPTI in ways CUPTI forbids there.
pub unsafe fn activity_register_callbacks(
    cupti: &Cupti,
    requested: CUpti_BuffersCallbackRequestFunc,
    completed: CUpti_BuffersCallbackCompleteFunc,
) -> Result<(), CuptiError> {
    // SAFETY: the caller's contract.
    let status = unsafe { (cupti.cuptiActivityRegisterCallbacks)(requested, completed) };
    check(cupti, "cuptiActivityRegisterCallbacks", status)
}

/// `cuptiActivityEnable`: CUPTI records activity of `kind` from now on.
pub fn activity_enable(cupti: &Cupti, kind: CUpti_ActivityKind) -> Result<(), CuptiError> {
    // SAFETY: takes a kind by value; CUPTI refuses a kind it does not know.
    let status = unsafe { (cupti.cuptiActivityEnable)(kind) };
    check(cupti, "cuptiActivityEnable", status)
}

/// `cuptiActivityDisable`: CUPTI stops recording activity of `kind`.
pub fn activity_disable(cupti: &Cupti, kind: CUpti_ActivityKind) -> Result<(), CuptiError> {
    // SAFETY: takes a kind by value; CUPTI refuses a kind it does not know.
    let status = unsafe { (cupti.cuptiActivityDisable)(kind) };
    check(cupti, "cuptiActivityDisable", status)
}

/// `cuptiActivityFlushAll`: CUPTI hands every buffer holding records to the
/// completion callback (before returning, with `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`).
/// Hold no lock the callback takes.
pub fn activity_flush_all(cupti: &Cupti, flag: CUpti_ActivityFlag) -> Result<(), CuptiError> {
    // SAFETY: takes a flag by value; the callbacks it runs were registered
    // under `activity_register_callbacks`'s contract.
    let status = unsafe { (cupti.cuptiActivityFlushAll)(flag.0) };
    check(cupti, "cuptiActivityFlushAll", status)
}

/// `cuptiActivityGetNextRecord`: the record after `previous` (null: the
/// first) in `buffer`, or `None` past the last one
/// (`CUPTI_ERROR_MAX_LIMIT_REACHED`).
///
/// # Safety
/// `buffer` holds `valid` bytes of activity records CUPTI wrote (a buffer it
/// handed to the completion callback), and `previous` is null or a record
/// this function returned for the same buffer.
pub unsafe fn activity_get_next_record(
    cupti: &Cupti,
    buffer: *mut u8,
    valid: usize,
    previous: *mut CUpti_Activity,
) -> Result<Option<NonNull<CUpti_Activity>>, CuptiError> {
    let mut record = previous;
    // SAFETY: the caller's contract; `record` is a valid in/out pointer.
    let status = unsafe { (cupti.cuptiActivityGetNextRecord)(buffer, valid, &mut record) };
    if status == CUptiResult::CUPTI_ERROR_MAX_LIMIT_REACHED {
        return Ok(None);
    }
    check(cupti, "cuptiActivityGetNextRecord", status)?;
    Ok(NonNull::new(record))
}

/// `cuptiGetTimestamp`: CUPTI's clock, in ns (the clock of its records).
pub fn get_timestamp(cupti: &Cupti) -> Result<u64, CuptiError> {
    let mut ts = 0u64;
    // SAFETY: writes one u64 through a valid pointer.
    let status = unsafe { (cupti.cuptiGetTimestamp)(&mut ts) };
    check(cupti, "cuptiGetTimestamp", status)?;
    Ok(ts)
}

/// `cuptiGetContextId`: the id CUPTI's records give `context`.
///
/// # Safety
/// `context` is a live context of the driver CUPTI observes (libcuda's).
pub unsafe fn get_context_id(cupti: &Cupti, context: CUcontext) -> Result<u32, CuptiError> {
    let mut id = 0u32;
    // SAFETY: the caller's contract; one u32 out-pointer.
    let status = unsafe { (cupti.cuptiGetContextId)(context, &mut id) };
    check(cupti, "cuptiGetContextId", status)?;
    Ok(id)
}

/// `cuptiGetStreamIdEx`: the id CUPTI's records give `stream` of `context`
/// (a stream created as such, not the per-thread default stream).
///
/// # Safety
/// `context` is a live context of the driver CUPTI observes (libcuda's) and
/// `stream` a live stream of it.
pub unsafe fn get_stream_id_ex(
    cupti: &Cupti,
    context: CUcontext,
    stream: CUstream,
) -> Result<u32, CuptiError> {
    let mut id = 0u32;
    // SAFETY: the caller's contract; one u32 out-pointer; 0: not the
    // per-thread default stream.
    let status = unsafe { (cupti.cuptiGetStreamIdEx)(context, stream, 0, &mut id) };
    check(cupti, "cuptiGetStreamIdEx", status)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::raw::c_char;

    // A table of stand-ins with CUPTI's signatures: each call's outcome is
    // fixed, so the wrappers' handling of it is what the tests see.
    unsafe extern "C" fn enable(kind: CUpti_ActivityKind) -> CUptiResult {
        if kind == CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY {
            CUptiResult::CUPTI_SUCCESS
        } else {
            CUptiResult::CUPTI_ERROR_INVALID_KIND
        }
    }
    unsafe extern "C" fn register(
        _: CUpti_BuffersCallbackRequestFunc,
        _: CUpti_BuffersCallbackCompleteFunc,
    ) -> CUptiResult {
        CUptiResult::CUPTI_ERROR_NOT_INITIALIZED
    }
    unsafe extern "C" fn flush(_: u32) -> CUptiResult {
        CUptiResult::CUPTI_SUCCESS
    }
    /// Two records, `buffer` and `buffer + 8`, then the end.
    unsafe extern "C" fn next(
        buffer: *mut u8,
        valid: usize,
        record: *mut *mut CUpti_Activity,
    ) -> CUptiResult {
        // SAFETY: the wrapper passes a valid in/out pointer.
        let previous = unsafe { *record } as *mut u8;
        let next = if previous.is_null() {
            buffer
        } else {
            previous.wrapping_add(8)
        };
        if next as usize >= buffer as usize + valid {
            return CUptiResult::CUPTI_ERROR_MAX_LIMIT_REACHED;
        }
        // SAFETY: as above.
        unsafe { *record = next as *mut CUpti_Activity };
        CUptiResult::CUPTI_SUCCESS
    }
    unsafe extern "C" fn timestamp(ts: *mut u64) -> CUptiResult {
        // SAFETY: the wrapper passes a valid out-pointer.
        unsafe { *ts = 1234 };
        CUptiResult::CUPTI_SUCCESS
    }
    unsafe extern "C" fn result_string(
        result: CUptiResult,
        text: *mut *const c_char,
    ) -> CUptiResult {
        if result != CUptiResult::CUPTI_ERROR_INVALID_KIND {
            return CUptiResult::CUPTI_ERROR_INVALID_PARAMETER;
        }
        // SAFETY: the wrapper passes a valid out-pointer; the string is static.
        unsafe { *text = c"CUPTI_ERROR_INVALID_KIND".as_ptr() };
        CUptiResult::CUPTI_SUCCESS
    }
    unsafe extern "C" fn stream_id(_: CUcontext, _: CUstream, _: u8, id: *mut u32) -> CUptiResult {
        // SAFETY: the wrapper passes a valid out-pointer.
        unsafe { *id = 7 };
        CUptiResult::CUPTI_SUCCESS
    }
    unsafe extern "C" fn context_id(_: CUcontext, _: *mut u32) -> CUptiResult {
        CUptiResult::CUPTI_ERROR_INVALID_CONTEXT
    }

    const TABLE: Cupti = Cupti {
        cuptiActivityEnable: enable,
        cuptiActivityDisable: enable,
        cuptiActivityRegisterCallbacks: register,
        cuptiActivityFlushAll: flush,
        cuptiActivityGetNextRecord: next,
        cuptiGetTimestamp: timestamp,
        cuptiGetResultString: result_string,
        cuptiGetStreamIdEx: stream_id,
        cuptiGetContextId: context_id,
    };

    #[test]
    fn a_failure_names_the_call_and_carries_cuptis_description() {
        let memcpy = CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY;
        assert_eq!(activity_enable(&TABLE, memcpy), Ok(()));
        let err =
            activity_disable(&TABLE, CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL).unwrap_err();
        assert_eq!(err.call(), Some("cuptiActivityDisable"));
        assert_eq!(err.code(), CUptiResult::CUPTI_ERROR_INVALID_KIND.0);
        assert_eq!(err.description(), Some("CUPTI_ERROR_INVALID_KIND"));
        assert_eq!(
            err.to_string(),
            "cuptiActivityDisable failed: CUPTI_ERROR_INVALID_KIND (CUPTI error 21)"
        );
        // SAFETY: the stand-in ignores its arguments.
        let err = unsafe { get_context_id(&TABLE, std::ptr::null_mut()) }.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cuptiGetContextId failed: CUPTI error {}",
                CUptiResult::CUPTI_ERROR_INVALID_CONTEXT.0
            )
        );
        // SAFETY: the stand-in ignores its arguments.
        let err = unsafe { activity_register_callbacks(&TABLE, None, None) }.unwrap_err();
        assert_eq!(err.call(), Some("cuptiActivityRegisterCallbacks"));
    }

    #[test]
    fn values_come_back_through_the_out_pointers() {
        assert_eq!(get_timestamp(&TABLE), Ok(1234));
        // SAFETY: the stand-in ignores the handles.
        let id = unsafe { get_stream_id_ex(&TABLE, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(id, Ok(7));
        let forced = CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED;
        assert_eq!(activity_flush_all(&TABLE, forced), Ok(()));
    }

    #[test]
    fn records_are_walked_until_cupti_says_there_are_no_more() {
        let mut buffer = [0u64; 2];
        let start = buffer.as_mut_ptr() as *mut u8;
        let mut seen = Vec::new();
        let mut record = std::ptr::null_mut();
        loop {
            // SAFETY: the stand-in only computes addresses inside `buffer`.
            let next = unsafe { activity_get_next_record(&TABLE, start, 16, record) };
            let Some(next) = next.unwrap() else { break };
            seen.push(next.as_ptr() as usize - start as usize);
            record = next.as_ptr();
        }
        assert_eq!(seen, [0, 8]);
    }
}
