//! Named NVTX ranges, so that profiler scopes, engine operations and
//! pipeline stages show in Nsight Systems by name.
//!
//! With the `nvtx` feature (off by default) a range is a process-wide NVTX
//! range (start/end, so it may end on another thread) in the `cuda-streams`
//! domain, made with the [`nvtx`](https://crates.io/crates/nvtx) crate. A
//! tool is attached when the process starts with `NVTX_INJECTION64_PATH` set
//! (Nsight Systems and Nsight Compute set it); without one a range costs one
//! load of a cached flag, and no string is converted. Without the feature a
//! range is an empty value.
//!
//! ```
//! use cuda_streams_driver::nvtx;
//! {
//!     let _range = nvtx::range("decode");
//!     // ... work enqueued here shows under "decode" in Nsight Systems
//! }
//! // Without a tool attached (or without the feature) nothing is recorded.
//! if !nvtx::is_attached() {
//!     assert!(!nvtx::range("unseen").is_recording());
//! }
//! ```

/// An open NVTX range; it ends when dropped.
#[must_use = "the range ends when this is dropped; bind it: `let _range = ...`"]
pub struct Range {
    #[cfg(feature = "nvtx")]
    inner: Option<nvtx::domain::Range<'static>>,
}

impl Range {
    /// Whether a tool is recording this range.
    pub fn is_recording(&self) -> bool {
        #[cfg(feature = "nvtx")]
        return self.inner.is_some();
        #[cfg(not(feature = "nvtx"))]
        false
    }
}

impl std::fmt::Debug for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range")
            .field("recording", &self.is_recording())
            .finish()
    }
}

/// Whether an NVTX tool is attached to this process (and the `nvtx` feature
/// is on).
pub fn is_attached() -> bool {
    #[cfg(feature = "nvtx")]
    return imp::attached();
    #[cfg(not(feature = "nvtx"))]
    false
}

/// Start a range named `name`; it ends when the returned value is dropped.
#[inline]
pub fn range(name: &str) -> Range {
    #[cfg(feature = "nvtx")]
    return Range {
        inner: imp::attached().then(|| imp::start(name)),
    };
    #[cfg(not(feature = "nvtx"))]
    {
        let _ = name;
        Range {}
    }
}

#[cfg(feature = "nvtx")]
mod imp {
    use std::sync::OnceLock;

    /// The variables NVTX reads to find a tool's injection library.
    const INJECTION: [&str; 2] = ["NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH"];

    pub(super) fn attached() -> bool {
        static ATTACHED: OnceLock<bool> = OnceLock::new();
        *ATTACHED.get_or_init(|| INJECTION.iter().any(|v| std::env::var_os(v).is_some()))
    }

    fn domain() -> &'static nvtx::Domain {
        static DOMAIN: OnceLock<nvtx::Domain> = OnceLock::new();
        DOMAIN.get_or_init(|| nvtx::Domain::new(c"cuda-streams"))
    }

    #[cold]
    pub(super) fn start(name: &str) -> nvtx::domain::Range<'static> {
        domain().range(nvtx::Str::from_str_lossy(name))
    }
}

/// Ranges travel with the guards that hold them (a profiler scope may end on
/// another thread).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Range>();
};
