//! The driver layer's error type.

use sys::{DriverError, LoadError};

/// Everything the safe driver layer can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// `CUDA_STREAMS_DRIVER=cuda` (or an explicit request for the GPU) and the
    /// CUDA driver could not be loaded.
    #[error("the CUDA driver was requested but could not be loaded: {0}")]
    Load(#[from] LoadError),
    /// The CUDA driver loaded but reports no usable device.
    #[error("the CUDA driver was requested but found no usable device: {0}")]
    NoDevice(DriverError),
    /// `CUDA_STREAMS_DRIVER` holds something other than `cuda`, `soft` or `auto`.
    #[error("CUDA_STREAMS_DRIVER={value:?} is not one of `cuda`, `soft`, `auto`")]
    InvalidDriverChoice {
        /// The value found in the environment.
        value: String,
    },
    /// Selecting the driver failed earlier in this process (the message of that failure).
    #[error("driver selection failed: {0}")]
    Selection(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
