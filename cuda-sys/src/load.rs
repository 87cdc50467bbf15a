//! Filling the [`Driver`] table from `libcuda.so.1` at run time.

use crate::{Driver, SYMBOLS};
use std::ffi::c_void;

/// The library names tried, in order: the versioned soname the NVIDIA driver
/// installs, then the development symlink.
pub(crate) const LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Why the CUDA driver could not be loaded.
///
/// The message says what was looked for and how to fix it:
///
/// ```
/// use cuda_streams_sys::{Driver, LoadError};
/// let err = LoadError::MissingSymbols {
///     library: "libcuda.so.1",
///     missing: vec!["cuMemAlloc_v2", "cuEventElapsedTime_v2"],
/// };
/// let text = err.to_string();
/// assert!(text.starts_with("libcuda.so.1 lacks 2 driver entry point(s)"), "{text}");
/// assert!(text.contains("cuMemAlloc_v2, cuEventElapsedTime_v2"), "{text}");
///
/// // Loading never panics; without an NVIDIA driver it says what to do instead.
/// match Driver::load() {
///     Ok(driver) => println!("loaded {driver:?}"),
///     Err(LoadError::LibraryNotFound { tried }) => assert_eq!(tried[0].0, "libcuda.so.1"),
///     Err(other) => eprintln!("{other}"), // a driver older than CUDA 13.0
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No CUDA driver library could be opened.
    #[error(
        "the CUDA driver library could not be opened (tried {}). \
         Install the NVIDIA driver, which provides libcuda.so.1, and make sure its directory \
         is on the loader path (ldconfig or LD_LIBRARY_PATH); on a machine without a GPU, \
         set CUDA_STREAMS_DRIVER=soft to use the software driver",
        tried.iter().map(|(name, why)| format!("{name}: {why}")).collect::<Vec<_>>().join("; ")
    )]
    LibraryNotFound {
        /// Each name tried and why opening it failed.
        tried: Vec<(&'static str, String)>,
    },
    /// The library opened but lacks entry points this workspace needs.
    #[error(
        "{library} lacks {} driver entry point(s) the CUDA 13.0 headers select: {}. \
         The installed NVIDIA driver is older than CUDA 13.0 needs (driver 580 or newer); \
         update it",
        missing.len(),
        missing.join(", ")
    )]
    MissingSymbols {
        /// The library that was opened.
        library: &'static str,
        /// Every symbol that was looked for and not found.
        missing: Vec<&'static str>,
    },
}

impl Driver {
    /// Open `libcuda.so.1` (then `libcuda.so`) and resolve every entry point.
    ///
    /// Never panics: a missing library or missing symbols are a [`LoadError`]
    /// naming what was searched for. The library stays loaded for the rest of
    /// the process, as the CUDA runtime does, so the table is `'static`.
    pub fn load() -> Result<Driver, LoadError> {
        // SAFETY: opening libcuda runs its initialisers, which are designed to
        // run in any process that links or dlopens it.
        let (name, library) = unsafe { open_first(LIBRARY_NAMES) }
            .map_err(|tried| LoadError::LibraryNotFound { tried })?;
        // SAFETY: each symbol is looked up by the exact versioned name the CUDA
        // 13.0 headers select, so its type is the one the bindings declare; the
        // library is leaked below, so the addresses stay valid forever.
        let table = unsafe { Driver::from_resolver(|symbol| symbol_address(&library, symbol)) }
            .map_err(|missing| LoadError::MissingSymbols {
                library: name,
                missing,
            })?;
        // Unloading libcuda while handles exist is unsound, and the CUDA
        // runtime never unloads it either.
        std::mem::forget(library);
        Ok(table)
    }

    /// The number of entry points in the table.
    pub const fn entry_point_count() -> usize {
        SYMBOLS.len()
    }
}

/// The first of `names` that opens, or each name tried with why it did not:
/// how every library of the workspace (libcuda, NCCL, CUPTI, NVRTC) is found.
///
/// # Safety
/// Opening a library runs its initialisers: each name must be a library
/// made to be loaded into any process.
pub(crate) unsafe fn open_first<N: AsRef<std::ffi::OsStr>>(
    names: impl IntoIterator<Item = N>,
) -> Result<(N, libloading::Library), Vec<(N, String)>> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: the caller's contract.
        match unsafe { libloading::Library::new(name.as_ref()) } {
            Ok(library) => return Ok((name, library)),
            Err(err) => tried.push((name, err.to_string())),
        }
    }
    Err(tried)
}

/// The address of `symbol` in `library`, null when it has none: the
/// resolver every table's `from_resolver` takes.
pub(crate) fn symbol_address(library: &libloading::Library, symbol: &str) -> *const c_void {
    // SAFETY: only the symbol's address is taken; `from_resolver` gives it a
    // function type, under the contract its caller upholds.
    match unsafe { library.get::<unsafe extern "C" fn()>(symbol.as_bytes()) } {
        Ok(function) => *function as *const c_void,
        Err(_) => std::ptr::null(),
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("entry_points", &SYMBOLS.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
    use std::os::raw::{c_int, c_uint};

    /// Compile-time check of a few table signatures against the bindings' types:
    /// this function does not build if a field's type drifts.
    #[allow(dead_code)]
    fn signatures_match_the_bindings(driver: &Driver) {
        let _: unsafe extern "C" fn(c_uint) -> CUresult = driver.cuInit;
        let _: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult = driver.cuMemAlloc;
        let _: unsafe extern "C" fn(*mut CUstream, c_uint, c_int) -> CUresult =
            driver.cuStreamCreateWithPriority;
        let _: unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult =
            driver.cuEventElapsedTime;
        let _: unsafe extern "C" fn(CUstream, CUhostFn, *mut c_void) -> CUresult =
            driver.cuLaunchHostFunc;
        let _: unsafe extern "C" fn(
            CUdeviceptr,
            usize,
            CUmemLocation,
            c_uint,
            CUstream,
        ) -> CUresult = driver.cuMemPrefetchAsync;
    }

    #[test]
    fn versioned_symbols_follow_the_headers() {
        let symbol = |name: &str| SYMBOLS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s);
        assert_eq!(symbol("cuMemAlloc"), Some("cuMemAlloc_v2"));
        assert_eq!(symbol("cuStreamDestroy"), Some("cuStreamDestroy_v2"));
        assert_eq!(symbol("cuMemcpyHtoDAsync"), Some("cuMemcpyHtoDAsync_v2"));
        assert_eq!(symbol("cuMemPrefetchAsync"), Some("cuMemPrefetchAsync_v2"));
        assert_eq!(
            symbol("cuGraphInstantiate"),
            Some("cuGraphInstantiateWithFlags")
        );
        assert_eq!(symbol("cuStreamQuery"), Some("cuStreamQuery"));
        assert_eq!(symbol("cuEventElapsedTime"), Some("cuEventElapsedTime_v2"));
    }

    #[test]
    fn a_resolver_that_finds_nothing_names_every_symbol() {
        // SAFETY: the resolver returns only null, so no address is ever used.
        let missing = unsafe { Driver::from_resolver(|_| std::ptr::null()) }.unwrap_err();
        let expected: Vec<&str> = SYMBOLS.iter().map(|(_, s)| *s).collect();
        assert_eq!(missing, expected);
    }

    #[test]
    fn load_error_without_libcuda_says_what_to_do() {
        // This development machine and CI have no NVIDIA driver; on a GPU
        // machine the load must succeed instead.
        match Driver::load() {
            Ok(driver) => {
                let mut version = 0;
                // SAFETY: the table came from libcuda; cuDriverGetVersion writes one int.
                let status = unsafe { (driver.cuDriverGetVersion)(&mut version) };
                assert_eq!(status, CUresult::CUDA_SUCCESS);
                assert!(version >= 13000, "driver version {version}");
            }
            Err(err) => {
                let text = err.to_string();
                assert!(matches!(err, LoadError::LibraryNotFound { .. }), "{text}");
                assert!(text.contains("libcuda.so.1"), "{text}");
                assert!(text.contains("libcuda.so:"), "{text}");
                assert!(text.contains("CUDA_STREAMS_DRIVER=soft"), "{text}");
            }
        }
    }
}
