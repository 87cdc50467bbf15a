//! `CUresult` to `Result`: the error carries the code, its name and, when the
//! driver gives one, its description.

use crate::{CUresult, Driver, error_name};
use std::ffi::CStr;
use std::fmt;

/// A driver call that did not return `CUDA_SUCCESS`.
///
/// ```
/// use cuda_streams_sys::{CUresult, DriverError};
/// let err: DriverError = CUresult::CUDA_ERROR_OUT_OF_MEMORY.result().unwrap_err();
/// assert_eq!(err.code(), CUresult::CUDA_ERROR_OUT_OF_MEMORY);
/// assert_eq!(err.name(), "CUDA_ERROR_OUT_OF_MEMORY");
/// assert_eq!(err.to_string(), "CUDA_ERROR_OUT_OF_MEMORY (2)");
/// // `Driver::check` adds the driver's description; `result` has none.
/// assert_eq!(err.description(), None);
/// assert!(!err.is_not_ready());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverError {
    code: CUresult,
    description: Option<&'static str>,
}

impl DriverError {
    /// An error for `code`, without the driver's description.
    pub const fn new(code: CUresult) -> Self {
        Self {
            code,
            description: None,
        }
    }

    /// The raw `CUresult`.
    pub const fn code(&self) -> CUresult {
        self.code
    }

    /// The name `cuda.h` gives the code, e.g. `CUDA_ERROR_OUT_OF_MEMORY`, or
    /// `CUDA_ERROR_UNKNOWN_CODE` for a value the 13.0 headers do not define.
    pub fn name(&self) -> &'static str {
        error_name(self.code).unwrap_or("CUDA_ERROR_UNKNOWN_CODE")
    }

    /// The driver's description of the code (`cuGetErrorString`), when known.
    pub const fn description(&self) -> Option<&'static str> {
        self.description
    }

    /// Whether this is `CUDA_ERROR_NOT_READY`, which queries use to say "not yet".
    pub fn is_not_ready(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_NOT_READY
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code.0)?;
        if let Some(description) = self.description {
            write!(f, ": {description}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for DriverError {}

impl CUresult {
    /// `Ok(())` for `CUDA_SUCCESS`, otherwise the error with its name.
    pub fn result(self) -> Result<(), DriverError> {
        if self == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(DriverError::new(self))
        }
    }
}

impl Driver {
    /// Like [`CUresult::result`], with the driver's description of the error.
    pub fn check(&self, code: CUresult) -> Result<(), DriverError> {
        code.result().map_err(|mut err| {
            err.description = self.describe(code);
            err
        })
    }

    /// `cuGetErrorString` for `code`, or `None` when the driver does not know it.
    pub fn describe(&self, code: CUresult) -> Option<&'static str> {
        let mut text = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static, NUL-terminated
        // string owned by the driver (or leaves it null on an unknown code).
        let status = unsafe { (self.cuGetErrorString)(code, &mut text) };
        if status != CUresult::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated per the driver's contract; the
        // string is static for the life of the process.
        let text: &'static CStr = unsafe { CStr::from_ptr(text) };
        text.to_str().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_ok() {
        assert_eq!(CUresult::CUDA_SUCCESS.result(), Ok(()));
    }

    #[test]
    fn errors_keep_code_and_name() {
        let cases = [
            (
                CUresult::CUDA_ERROR_INVALID_VALUE,
                1,
                "CUDA_ERROR_INVALID_VALUE",
            ),
            (
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                2,
                "CUDA_ERROR_OUT_OF_MEMORY",
            ),
            (
                CUresult::CUDA_ERROR_NOT_INITIALIZED,
                3,
                "CUDA_ERROR_NOT_INITIALIZED",
            ),
            (CUresult::CUDA_ERROR_NO_DEVICE, 100, "CUDA_ERROR_NO_DEVICE"),
            (
                CUresult::CUDA_ERROR_INVALID_HANDLE,
                400,
                "CUDA_ERROR_INVALID_HANDLE",
            ),
            (CUresult::CUDA_ERROR_NOT_FOUND, 500, "CUDA_ERROR_NOT_FOUND"),
            (CUresult::CUDA_ERROR_NOT_READY, 600, "CUDA_ERROR_NOT_READY"),
            (
                CUresult::CUDA_ERROR_LAUNCH_FAILED,
                719,
                "CUDA_ERROR_LAUNCH_FAILED",
            ),
            (CUresult::CUDA_ERROR_UNKNOWN, 999, "CUDA_ERROR_UNKNOWN"),
        ];
        for (code, value, name) in cases {
            assert_eq!(code.0, value, "{name} has the value cuda.h gives it");
            let err = code.result().unwrap_err();
            assert_eq!(err.code(), code);
            assert_eq!(err.name(), name);
            assert_eq!(err.to_string(), format!("{name} ({value})"));
        }
    }

    #[test]
    fn not_ready_is_recognised() {
        assert!(
            CUresult::CUDA_ERROR_NOT_READY
                .result()
                .unwrap_err()
                .is_not_ready()
        );
        assert!(
            !CUresult::CUDA_ERROR_UNKNOWN
                .result()
                .unwrap_err()
                .is_not_ready()
        );
    }

    #[test]
    fn unknown_codes_are_named_as_unknown() {
        let err = CUresult(123_456).result().unwrap_err();
        assert_eq!(err.name(), "CUDA_ERROR_UNKNOWN_CODE");
        assert_eq!(err.to_string(), "CUDA_ERROR_UNKNOWN_CODE (123456)");
    }
}
