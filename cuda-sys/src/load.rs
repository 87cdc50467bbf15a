//! Opening the libraries of the workspace at run time: libcuda, NCCL, CUPTI
//! and NVRTC, by one mechanism with one error.
//!
//! Each library is a [`Library`]: the names searched in order, an optional
//! setting naming the file to open, and the words its error uses to say what
//! was looked for and how to fix it. [`Library::load`] opens the first file
//! that opens, fills the library's function table from it (every missing
//! symbol is listed, none is skipped) and never unloads it. Nothing here
//! panics: a missing library or missing symbols are a [`LoadError`].

use crate::env::Setting;
use crate::{Driver, SYMBOLS};
use std::ffi::{OsString, c_void};

/// A library the workspace opens at run time, and what its [`LoadError`]s
/// say.
///
/// ```
/// use cuda_streams_sys::{LIBCUDA, nccl};
/// assert_eq!(LIBCUDA.name, "libcuda");
/// assert_eq!(LIBCUDA.search_paths(), ["libcuda.so.1", "libcuda.so"]);
/// assert_eq!(nccl::LIBRARY.setting.unwrap().name, "CUDA_STREAMS_NCCL_LIBRARY");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Library {
    /// The library's short name: `libcuda`, `NCCL`, `CUPTI` or `NVRTC`.
    pub name: &'static str,
    /// The setting naming a file to open, where the library has one.
    pub setting: Option<Setting>,
    /// Whether the file the setting names replaces the search or goes first.
    pub setting_use: SettingUse,
    /// The library as the error names it: "the NCCL library".
    pub(crate) described: &'static str,
    /// Its entry points as the error counts them: "NCCL entry point(s)".
    pub(crate) entry_points: &'static str,
    /// How to fix a library that is not found (one or more sentences).
    pub(crate) install: &'static str,
    /// How to fix a library that lacks entry points.
    pub(crate) update: &'static str,
    /// The names and paths searched, in order, besides the setting's.
    pub(crate) search: fn() -> Vec<String>,
}

/// How the file a [`Library`]'s setting names is used.
///
/// Not `#[non_exhaustive]`: a setting either replaces the search or precedes
/// it; there is no third way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingUse {
    /// Only that file is tried (CUPTI and NVRTC: the user named the build to
    /// profile or compile with, and another one would be a silent surprise).
    Instead,
    /// That file first, then the search (NCCL: the wheel's library named by
    /// a launcher, with the system's as the fallback).
    First,
}

/// libcuda, the NVIDIA driver's library: [`Driver::load`] opens it.
pub static LIBCUDA: Library = Library {
    name: "libcuda",
    setting: None,
    setting_use: SettingUse::Instead,
    described: "the CUDA driver library",
    entry_points: "driver entry point(s) the CUDA 13.0 headers select",
    install: "Install the NVIDIA driver, which provides libcuda.so.1, and make sure its \
              directory is on the loader path (ldconfig or LD_LIBRARY_PATH); on a machine \
              without a GPU, set CUDA_STREAMS_DRIVER=soft to use the software driver",
    update: "The installed NVIDIA driver is older than CUDA 13.0 needs (driver 580 or newer); \
             update it",
    search: || LIBCUDA_NAMES.map(String::from).to_vec(),
};

/// The versioned soname the NVIDIA driver installs, then the development
/// symlink.
const LIBCUDA_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Why a library could not be loaded.
///
/// The message says what was looked for and how to fix it, in the words of
/// the library that failed:
///
/// ```
/// use cuda_streams_sys::{Driver, LIBCUDA, LoadError};
/// let err = LoadError::MissingSymbols {
///     library: &LIBCUDA,
///     opened: "libcuda.so.1".into(),
///     missing: vec!["cuMemAlloc_v2", "cuEventElapsedTime_v2"],
/// };
/// let text = err.to_string();
/// assert!(text.starts_with("libcuda.so.1 lacks 2 driver entry point(s)"), "{text}");
/// assert!(text.contains("cuMemAlloc_v2, cuEventElapsedTime_v2"), "{text}");
/// assert!(text.contains("update it"), "{text}");
///
/// // Loading never panics; without an NVIDIA driver it says what to do instead.
/// match Driver::load() {
///     Ok(driver) => println!("loaded {driver:?}"),
///     Err(LoadError::LibraryNotFound { library, tried }) => {
///         assert_eq!(library.name, "libcuda");
///         assert_eq!(tried[0].0, "libcuda.so.1");
///     }
///     Err(other) => eprintln!("{other}"), // a driver older than CUDA 13.0
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No file of the library could be opened.
    #[error(
        "{} could not be opened (tried {}). {}",
        library.described,
        tried.iter().map(|(name, why)| format!("{name}: {why}")).collect::<Vec<_>>().join("; "),
        library.install
    )]
    LibraryNotFound {
        /// The library looked for.
        library: &'static Library,
        /// Each name or path tried, in order, and why opening it failed.
        tried: Vec<(String, String)>,
    },
    /// A file opened but lacks entry points the workspace needs.
    #[error(
        "{opened} lacks {} {}: {}. {}",
        missing.len(),
        library.entry_points,
        missing.join(", "),
        library.update
    )]
    MissingSymbols {
        /// The library looked for.
        library: &'static Library,
        /// The name or path that opened.
        opened: String,
        /// Every symbol looked for and not found.
        missing: Vec<&'static str>,
    },
}

impl LoadError {
    /// The library that could not be loaded.
    pub fn library(&self) -> &'static Library {
        match self {
            LoadError::LibraryNotFound { library, .. }
            | LoadError::MissingSymbols { library, .. } => library,
        }
    }
}

impl Library {
    /// The names and paths searched, in order, when the setting is unset (or
    /// after its file, for [`SettingUse::First`]).
    pub fn search_paths(&self) -> Vec<String> {
        (self.search)()
    }

    /// What loading the library tries, in order: the setting's file (when set
    /// and not empty) instead of or before the search.
    pub fn candidates(&self) -> Vec<OsString> {
        self.candidates_with(|var| std::env::var_os(var))
    }

    /// [`candidates`](Self::candidates) with the setting read through
    /// `lookup` (the file need not be named in UTF-8).
    fn candidates_with(&self, lookup: impl FnOnce(&str) -> Option<OsString>) -> Vec<OsString> {
        let explicit = self
            .setting
            .and_then(|setting| lookup(setting.name))
            .filter(|path| !path.is_empty());
        match (explicit, self.setting_use) {
            (Some(path), SettingUse::Instead) => vec![path],
            (explicit, _) => explicit
                .into_iter()
                .chain(self.search_paths().into_iter().map(OsString::from))
                .collect(),
        }
    }

    /// Open the first of [`candidates`](Self::candidates) that opens and fill
    /// a table from it with `fill`, which is handed the symbol resolver (a
    /// generated `from_resolver`).
    ///
    /// # Safety
    /// Opening a file runs its initialisers: every candidate must be a build
    /// of this library, made to be loaded into any process. `fill` must give
    /// each address it resolves the type that symbol has in this library's
    /// headers (as the generated `from_resolver`s do).
    pub(crate) unsafe fn load<T>(
        &'static self,
        fill: impl FnOnce(&mut dyn FnMut(&'static str) -> *const c_void) -> Result<T, Vec<&'static str>>,
    ) -> Result<T, LoadError> {
        // SAFETY: the caller's contract.
        unsafe { self.load_from(self.candidates(), fill) }
    }

    /// [`Library::load`] over `names` instead of the candidates.
    ///
    /// # Safety
    /// As for [`Library::load`], for each of `names`.
    pub(crate) unsafe fn load_from<T>(
        &'static self,
        names: impl IntoIterator<Item = OsString>,
        fill: impl FnOnce(&mut dyn FnMut(&'static str) -> *const c_void) -> Result<T, Vec<&'static str>>,
    ) -> Result<T, LoadError> {
        // SAFETY: the caller's contract.
        let (opened, library) = unsafe { self.open(names) }?;
        let table = fill(&mut |symbol| symbol_address(&library, symbol)).map_err(|missing| {
            LoadError::MissingSymbols {
                library: self,
                opened: opened.to_string_lossy().into_owned(),
                missing,
            }
        })?;
        // Unloading a library while anything of it is in use is unsound: a
        // table's addresses, callbacks and threads it started (CUPTI), objects
        // it handed out. Neither the CUDA runtime nor NCCL's users unload
        // them either, so the table is `'static`.
        std::mem::forget(library);
        Ok(table)
    }

    /// The first of `names` that opens, with the name that opened it.
    ///
    /// # Safety
    /// As for [`Library::load`]: opening a library runs its initialisers.
    pub(crate) unsafe fn open(
        &'static self,
        names: impl IntoIterator<Item = OsString>,
    ) -> Result<(OsString, libloading::Library), LoadError> {
        let mut tried = Vec::new();
        for name in names {
            // SAFETY: the caller's contract.
            match unsafe { libloading::Library::new(&name) } {
                Ok(library) => return Ok((name, library)),
                Err(err) => tried.push((name.to_string_lossy().into_owned(), err.to_string())),
            }
        }
        Err(LoadError::LibraryNotFound {
            library: self,
            tried,
        })
    }
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

impl Driver {
    /// Open `libcuda.so.1` (then `libcuda.so`) and resolve every entry point.
    ///
    /// Never panics: a missing library or missing symbols are a [`LoadError`]
    /// naming what was searched for. The library stays loaded for the rest of
    /// the process, as the CUDA runtime does, so the table is `'static`.
    pub fn load() -> Result<Driver, LoadError> {
        // SAFETY: opening libcuda runs its initialisers, which are designed to
        // run in any process that links or dlopens it. Each symbol is looked
        // up by the exact versioned name the CUDA 13.0 headers select, so its
        // type is the one the bindings declare.
        unsafe { LIBCUDA.load(|resolve| Driver::from_resolver(resolve)) }
    }

    /// The number of entry points in the table.
    pub const fn entry_point_count() -> usize {
        SYMBOLS.len()
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

    /// A library for the tests below: searched as `names`, with a setting.
    fn library(setting_use: SettingUse) -> &'static Library {
        Box::leak(Box::new(Library {
            name: "test",
            setting: Some(Setting {
                name: "CUDA_STREAMS_TEST_LOAD_LIBRARY",
                aliases: &[],
                default: "libtest.so (search)",
                about: "a library for load's tests",
            }),
            setting_use,
            described: "the test library",
            entry_points: "test entry point(s)",
            install: "Install the test library",
            update: "Update the test library",
            search: || vec!["/nonexistent/libtest.so.1".into(), "libtest.so".into()],
        }))
    }

    #[test]
    fn every_name_tried_is_in_the_error_with_why_and_the_fix() {
        let lib = library(SettingUse::Instead);
        // SAFETY: the names do not exist, so nothing is opened or resolved.
        let err =
            unsafe { lib.load_from(lib.search_paths().into_iter().map(Into::into), |_| Ok(())) }
                .unwrap_err();
        let text = err.to_string();
        assert!(std::ptr::eq(err.library(), lib));
        let LoadError::LibraryNotFound { tried, .. } = &err else {
            panic!("{text}")
        };
        let names: Vec<&str> = tried.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["/nonexistent/libtest.so.1", "libtest.so"]);
        assert!(tried.iter().all(|(_, why)| !why.is_empty()), "{tried:?}");
        assert!(
            text.starts_with(
                "the test library could not be opened (tried /nonexistent/libtest.so.1: "
            ),
            "{text}"
        );
        assert!(text.ends_with(". Install the test library"), "{text}");
    }

    #[test]
    fn a_file_without_the_symbols_names_every_missing_one() {
        let lib = library(SettingUse::Instead);
        // libc is on every Linux machine and has none of the symbols asked for.
        // SAFETY: libc is loaded into this process already; only addresses are
        // looked up, and none is found.
        let err = unsafe {
            lib.load_from([OsString::from("libc.so.6")], |resolve| {
                let missing: Vec<&'static str> = ["cuptiNothing", "ncclNothing"]
                    .into_iter()
                    .filter(|symbol| resolve(symbol).is_null())
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(missing)
                }
            })
        }
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "libc.so.6 lacks 2 test entry point(s): cuptiNothing, ncclNothing. Update the test library"
        );
    }

    #[test]
    fn the_setting_replaces_or_precedes_the_search() {
        let instead = library(SettingUse::Instead);
        let first = library(SettingUse::First);
        let search = ["/nonexistent/libtest.so.1", "libtest.so"].map(OsString::from);
        let set = |value: &'static str| {
            move |var: &str| {
                assert_eq!(var, "CUDA_STREAMS_TEST_LOAD_LIBRARY");
                Some(OsString::from(value))
            }
        };
        assert_eq!(instead.candidates_with(|_| None), search);
        assert_eq!(instead.candidates_with(set("")), search, "empty is unset");
        assert_eq!(
            instead.candidates_with(set("/opt/mine/libtest.so")),
            ["/opt/mine/libtest.so"].map(OsString::from)
        );
        let mut expected = vec![OsString::from("/opt/mine/libtest.so")];
        expected.extend(search.clone());
        assert_eq!(first.candidates_with(set("/opt/mine/libtest.so")), expected);
        assert_eq!(first.candidates_with(|_| None), search);
    }
}
