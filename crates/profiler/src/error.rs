//! The profiler's error type.

/// Everything profiling can fail with.
///
/// ```
/// use cuda_streams_profiler::{Error, StreamProfiler};
/// use cuda_streams_profiler::driver::Context;
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// let mut too_small = [0u8; 16];
/// let err = profiler.export_chrome_trace(&mut &mut too_small[..]).unwrap_err();
/// assert!(matches!(err, Error::Io { .. }));
/// assert_eq!(err.to_string(), "writing the Chrome trace failed: failed to write whole buffer");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the safe driver layer failed.
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// A call into the allocator failed (in code that tracks its memory).
    #[error(transparent)]
    Allocator(#[from] allocator::Error),
    /// A stream from another context than the profiler's event pool.
    #[error(
        "stream {stream} belongs to context {found}, but the profiler's event pool belongs to context {expected}"
    )]
    ContextMismatch {
        /// The stream's id.
        stream: u64,
        /// The pool's context id.
        expected: u64,
        /// The stream's context id.
        found: u64,
    },
    /// A sampler asked to time one scope in 0.
    #[error("sampler {name:?}: one scope in 0 cannot be timed; every must be at least 1")]
    InvalidSampling {
        /// The sampler's name.
        name: String,
    },
    /// `CUDA_STREAMS_PROFILER_BACKEND` named no backend.
    #[error(
        "CUDA_STREAMS_PROFILER_BACKEND={value:?} is not a profiler backend; use \"events\" or \"cupti\""
    )]
    InvalidBackend {
        /// The variable's value.
        value: String,
    },
    /// A CUPTI call failed while collecting records.
    #[error("CUPTI: {0}")]
    Cupti(#[from] driver::sys::cupti::CuptiError),
    /// Writing a trace failed.
    #[error("writing the Chrome trace failed: {source}")]
    Io {
        /// The writer's error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of the profiler inside work that returns a driver `Result`
/// (the closure of an operation graph's operation): a driver failure comes
/// back as itself, anything else as [`driver::Error::Other`], which keeps
/// it whole.
impl From<Error> for driver::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Driver(error) => error,
            other => driver::Error::other(other),
        }
    }
}
