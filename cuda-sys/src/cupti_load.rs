//! Filling the [`Cupti`] table from `libcupti.so.13` at run time.

use crate::cupti_bindings::CUptiResult;
use crate::{CUPTI_SYMBOLS, Cupti};
use std::ffi::{CStr, c_void};

/// The environment variable naming the CUPTI library to open instead of the
/// default search.
pub const CUPTI_LIBRARY_ENV: &str = "CUDA_STREAMS_CUPTI_LIBRARY";

/// The library names tried, in order, when [`CUPTI_LIBRARY_ENV`] is unset: the
/// versioned soname and the development symlink on the loader path, then the
/// places a CUDA 13 toolkit installs CUPTI (not on the loader path by default).
const LIBRARY_NAMES: [&str; 5] = [
    "libcupti.so.13",
    "libcupti.so",
    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
    "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13",
    "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcupti.so.13",
];

/// Why CUPTI could not be loaded.
///
/// ```
/// use cuda_streams_sys::{Cupti, CuptiLoadError};
/// // Loading never panics; without CUPTI it says what was tried.
/// match Cupti::load() {
///     Ok(cupti) => println!("loaded {cupti:?}"),
///     Err(err @ CuptiLoadError::LibraryNotFound { .. }) => {
///         assert!(err.to_string().contains("CUDA_STREAMS_CUPTI_LIBRARY"));
///     }
///     Err(other) => eprintln!("{other}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CuptiLoadError {
    /// No CUPTI library could be opened.
    #[error(
        "the CUPTI library could not be opened (tried {}). CUPTI ships with the CUDA toolkit \
         (extras/CUPTI/lib64 or targets/<arch>/lib) and in the nvidia-cuda-cupti wheel; \
         set CUDA_STREAMS_CUPTI_LIBRARY to the path of libcupti.so.13",
        tried.iter().map(|(name, why)| format!("{name}: {why}")).collect::<Vec<_>>().join("; ")
    )]
    LibraryNotFound {
        /// Each name tried and why opening it failed.
        tried: Vec<(String, String)>,
    },
    /// The library opened but lacks entry points the backend needs.
    #[error(
        "{library} lacks {} CUPTI entry point(s): {}; it is older than CUDA 13.0's CUPTI",
        missing.len(),
        missing.join(", ")
    )]
    MissingSymbols {
        /// The library that was opened.
        library: String,
        /// Every symbol that was looked for and not found.
        missing: Vec<&'static str>,
    },
}

impl Cupti {
    /// Open CUPTI and resolve every entry point: the library named by
    /// `CUDA_STREAMS_CUPTI_LIBRARY` if set, else `libcupti.so.13`,
    /// `libcupti.so`, then the CUDA toolkit's usual install paths.
    ///
    /// Never panics and never links CUPTI at build time: a missing library or
    /// missing symbols are a [`CuptiLoadError`] naming what was tried. The
    /// library stays loaded for the rest of the process (CUPTI's callbacks and
    /// threads must never outlive it), so the table is `'static`.
    pub fn load() -> Result<Cupti, CuptiLoadError> {
        match std::env::var(CUPTI_LIBRARY_ENV) {
            Ok(path) if !path.is_empty() => Self::from_library_names(&[path.as_str()]),
            _ => Self::from_library_names(&LIBRARY_NAMES),
        }
    }

    /// Open CUPTI from `path` (a path or a library name) only.
    pub fn load_from(path: &str) -> Result<Cupti, CuptiLoadError> {
        Self::from_library_names(&[path])
    }

    /// Open the first of `names` that opens and resolve every entry point.
    fn from_library_names(names: &[&str]) -> Result<Cupti, CuptiLoadError> {
        let mut tried = Vec::new();
        for &name in names {
            let name = name.to_string();
            // SAFETY: opening libcupti runs its initialisers, which are designed
            // to run in any process that links or dlopens it.
            match unsafe { libloading::Library::new(&name) } {
                Ok(library) => return Self::from_library(name, library),
                Err(err) => tried.push((name, err.to_string())),
            }
        }
        Err(CuptiLoadError::LibraryNotFound { tried })
    }

    fn from_library(name: String, library: libloading::Library) -> Result<Cupti, CuptiLoadError> {
        let resolve = |symbol: &'static str| -> *const c_void {
            // SAFETY: we only take the symbol's address; `from_resolver` gives it
            // a function type, under the contract the next comment upholds.
            match unsafe { library.get::<unsafe extern "C" fn()>(symbol.as_bytes()) } {
                Ok(function) => *function as *const c_void,
                Err(_) => std::ptr::null(),
            }
        };
        // SAFETY: each symbol is looked up by the name cupti.h declares, so its
        // type is the one the bindings give it; the library is leaked below, so
        // the addresses stay valid forever.
        match unsafe { Cupti::from_resolver(resolve) } {
            Ok(table) => {
                // CUPTI keeps threads and callbacks into this process: never unload it.
                std::mem::forget(library);
                Ok(table)
            }
            Err(missing) => Err(CuptiLoadError::MissingSymbols {
                library: name,
                missing,
            }),
        }
    }

    /// The number of entry points in the table.
    pub const fn entry_point_count() -> usize {
        CUPTI_SYMBOLS.len()
    }

    /// `status` as a `Result`, the error carrying CUPTI's own description.
    pub fn check(&self, status: CUptiResult) -> Result<(), CuptiError> {
        if status == CUptiResult::CUPTI_SUCCESS {
            return Ok(());
        }
        let mut text: *const std::os::raw::c_char = std::ptr::null();
        // SAFETY: cuptiGetResultString writes a pointer to a static string (or
        // nothing) into `text`, a valid out-pointer.
        let described = unsafe { (self.cuptiGetResultString)(status, &mut text) };
        let description = if described == CUptiResult::CUPTI_SUCCESS && !text.is_null() {
            // SAFETY: CUPTI returned a NUL-terminated string with static lifetime.
            Some(
                unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned(),
            )
        } else {
            None
        };
        Err(CuptiError {
            code: status.0,
            description,
        })
    }
}

/// A CUPTI call that did not return `CUPTI_SUCCESS`.
///
/// ```
/// use cuda_streams_sys::CuptiError;
/// let err = CuptiError::new(1, None);
/// assert_eq!(err.code(), 1);
/// assert_eq!(err.to_string(), "CUPTI error 1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuptiError {
    code: u32,
    description: Option<String>,
}

impl CuptiError {
    /// An error for the raw `CUptiResult` value `code`.
    pub fn new(code: u32, description: Option<String>) -> Self {
        Self { code, description }
    }

    /// The raw `CUptiResult` value.
    pub fn code(&self) -> u32 {
        self.code
    }
}

impl std::fmt::Display for CuptiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.description {
            Some(text) => write!(f, "{text} (CUPTI error {})", self.code),
            None => write!(f, "CUPTI error {}", self.code),
        }
    }
}

impl std::error::Error for CuptiError {}

impl std::fmt::Debug for Cupti {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cupti")
            .field("entry_points", &CUPTI_SYMBOLS.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolver_that_finds_nothing_names_every_symbol() {
        // SAFETY: the resolver returns only null, so no address is ever used.
        let missing = unsafe { Cupti::from_resolver(|_| std::ptr::null()) }.unwrap_err();
        let expected: Vec<&str> = CUPTI_SYMBOLS.iter().map(|(_, s)| *s).collect();
        assert_eq!(missing, expected);
        assert!(expected.contains(&"cuptiActivityGetNextRecord"));
    }

    #[test]
    fn a_library_that_is_not_there_is_an_error_naming_it() {
        let err = Cupti::from_library_names(&["/nonexistent/libcupti.so.13"]).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, CuptiLoadError::LibraryNotFound { .. }),
            "{text}"
        );
        assert!(text.contains("/nonexistent/libcupti.so.13"), "{text}");
        assert!(text.contains(CUPTI_LIBRARY_ENV), "{text}");
    }

    #[test]
    fn record_layouts_match_cupti_13_0() {
        use crate::cupti_bindings::*;
        use std::mem::{offset_of, size_of};
        // Offsets from cupti_activity.h (13.0): what the backend reads.
        assert_eq!(offset_of!(CUpti_ActivityKernel10, start), 16);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, streamId), 48);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, correlationId), 92);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, bytes), 8);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, streamId), 40);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, correlationId), 44);
        assert_eq!(offset_of!(CUpti_ActivityAPI, start), 8);
        assert_eq!(offset_of!(CUpti_ActivityAPI, correlationId), 32);
        assert_eq!(offset_of!(CUpti_ActivityMemset4, bytes), 8);
        assert_eq!(offset_of!(CUpti_ActivityMemset4, streamId), 40);
        assert_eq!(offset_of!(CUpti_ActivityMemset4, correlationId), 44);
        assert_eq!(size_of::<CUpti_ActivityKernel10>(), 216);
        assert_eq!(size_of::<CUpti_ActivityMemcpy6>(), 96);
        assert_eq!(size_of::<CUpti_ActivityMemset4>(), 88);
        assert_eq!(size_of::<CUpti_ActivityAPI>(), 40);
    }
}
