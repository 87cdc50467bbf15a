//! Error names and descriptions (`cuGetErrorName`, `cuGetErrorString`) and the
//! per-thread detail that says *which* image, function or pointer a failed
//! call was about.

use crate::handles::lock;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::sync::Mutex;
use sys::CUresult;

/// A call's outcome inside the driver: `Err` carries the code to return.
pub(crate) type Status = Result<(), CUresult>;

thread_local! {
    static LAST_DETAIL: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A human explanation of the last error this thread got from the software
/// driver that has more to say than its code: the kernel image without a twin,
/// the missing function name, the out-of-bounds copy, the reason a stream
/// faulted. `None` when the last such error had no detail.
///
/// ```
/// // Before any failing call there is no detail.
/// assert!(cuda_streams_soft_driver::last_error_detail().is_none());
/// ```
pub fn last_error_detail() -> Option<String> {
    LAST_DETAIL.with(|detail| detail.borrow().clone())
}

/// Fail with `code`, leaving `detail` for [`last_error_detail`].
pub(crate) fn fail(code: CUresult, detail: impl Into<String>) -> CUresult {
    let detail = detail.into();
    LAST_DETAIL.with(|slot| *slot.borrow_mut() = Some(detail));
    code
}

/// Forget this thread's detail, so that a later success is not mistaken for
/// the cause of an earlier failure.
pub(crate) fn clear_detail() {
    LAST_DETAIL.with(|slot| *slot.borrow_mut() = None);
}

/// Turn an internal result into the code an entry point returns.
pub(crate) fn code(status: Status) -> CUresult {
    match status {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(code) => code,
    }
}

/// Write `value` through an out-pointer the caller gave, or fail with
/// `CUDA_ERROR_INVALID_VALUE` when it is null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) -> Status {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes per the caller's contract (the
    // CUDA API's: out-parameters point at caller-owned storage).
    unsafe { out.write(value) };
    Ok(())
}

/// A short description for the codes upper layers meet; the rest are derived
/// from the name.
fn description(code: CUresult) -> Option<&'static str> {
    Some(match code {
        CUresult::CUDA_SUCCESS => "no error",
        CUresult::CUDA_ERROR_INVALID_VALUE => "invalid argument",
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
        CUresult::CUDA_ERROR_NOT_INITIALIZED => "initialization error",
        CUresult::CUDA_ERROR_DEINITIALIZED => "driver shutting down",
        CUresult::CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
        CUresult::CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
        CUresult::CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
        CUresult::CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
        CUresult::CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
        CUresult::CUDA_ERROR_NOT_FOUND => "named symbol not found",
        CUresult::CUDA_ERROR_NOT_READY => "device not ready",
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
        CUresult::CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
        CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "too many resources requested for launch",
        CUresult::CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
        CUresult::CUDA_ERROR_ILLEGAL_STATE => {
            "the operation cannot be performed in the present state"
        }
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            "operation not permitted when stream is capturing"
        }
        CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
            "operation failed due to a previous error during capture"
        }
        CUresult::CUDA_ERROR_UNKNOWN => "unknown error",
        _ => return None,
    })
}

/// Process-lifetime C strings, made once per code on first use.
fn interned(key: (u32, bool), make: impl FnOnce() -> String) -> *const c_char {
    static STRINGS: Mutex<Option<HashMap<(u32, bool), &'static CStr>>> = Mutex::new(None);
    let mut strings = lock(&STRINGS);
    let strings = strings.get_or_insert_with(HashMap::new);
    let text = strings.entry(key).or_insert_with(|| {
        let owned = CString::new(make()).unwrap_or_default();
        Box::leak(owned.into_boxed_c_str())
    });
    text.as_ptr()
}

/// Write the text for `error` (made by `make` from its name, once per code and
/// kind) to `*pStr`; for a code without a name, NULL and `INVALID_VALUE`.
///
/// # Safety
/// `pStr` is null or valid for a write (the CUDA API's contract).
unsafe fn write_error_text(
    error: CUresult,
    pStr: *mut *const c_char,
    description: bool,
    make: impl FnOnce(&'static str) -> String,
) -> CUresult {
    let Some(name) = sys::error_name(error) else {
        // SAFETY: CUDA leaves NULL in *pStr for an unknown code; pStr is null
        // or writable per the caller's contract.
        let _ = unsafe { write_out(pStr, std::ptr::null()) };
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    let text = interned((error.0, description), || make(name));
    // SAFETY: pStr is null or writable per the caller's contract.
    code(unsafe { write_out(pStr, text) })
}

pub(crate) unsafe extern "C" fn cuGetErrorName(
    error: CUresult,
    pStr: *mut *const c_char,
) -> CUresult {
    // SAFETY: pStr is null or writable per the API.
    unsafe { write_error_text(error, pStr, false, str::to_string) }
}

pub(crate) unsafe extern "C" fn cuGetErrorString(
    error: CUresult,
    pStr: *mut *const c_char,
) -> CUresult {
    let describe = |name: &str| match description(error) {
        Some(text) => text.to_string(),
        None => name
            .trim_start_matches("CUDA_ERROR_")
            .trim_start_matches("CUDA_")
            .replace('_', " ")
            .to_lowercase(),
    };
    // SAFETY: pStr is null or writable per the API.
    unsafe { write_error_text(error, pStr, true, describe) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(
        f: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
        c: CUresult,
    ) -> String {
        let mut out = std::ptr::null();
        // SAFETY: out is a valid local.
        assert_eq!(unsafe { f(c, &mut out) }, CUresult::CUDA_SUCCESS);
        // SAFETY: the driver hands out static NUL-terminated strings.
        unsafe { CStr::from_ptr(out) }.to_str().unwrap().to_string()
    }

    #[test]
    fn every_named_code_has_a_name_and_a_description() {
        for value in 0..1000 {
            let c = CUresult(value);
            if sys::error_name(c).is_some() {
                assert_eq!(text(cuGetErrorName, c), sys::error_name(c).unwrap());
                assert!(!text(cuGetErrorString, c).is_empty());
            }
        }
        assert_eq!(
            text(cuGetErrorString, CUresult::CUDA_ERROR_NOT_READY),
            "device not ready"
        );
        let mut out = std::ptr::null();
        // SAFETY: out is a valid local.
        let status = unsafe { cuGetErrorName(CUresult(123_456), &mut out) };
        assert_eq!(status, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(out.is_null());
    }
}
