//! A loaded function table and which implementation filled it: plain
//! values that every layer passes around, apart from how a driver is chosen
//! (`select`), so that the error type can name a driver's kind.

use sys::Driver;

/// Which implementation fills the function table.
///
/// ```
/// use cuda_streams_driver::{DriverKind, driver};
/// let loaded = driver().unwrap();
/// // The same tests run on either; code that must know asks.
/// match loaded.kind {
///     DriverKind::Cuda => assert!(loaded.is_gpu()),
///     DriverKind::Soft => assert_eq!(loaded.name(), "software"),
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DriverKind {
    /// NVIDIA's `libcuda.so.1`: a real GPU.
    Cuda,
    /// `cuda-streams-soft-driver`: CUDA's semantics on CPU threads.
    Soft,
}

/// A driver table together with what it is.
///
/// ```
/// use cuda_streams_driver::{driver, sys::CUresult};
/// let loaded = driver().unwrap();
/// // Raw calls go through the table, for interop or what the safe layer lacks.
/// let mut version = 0;
/// // SAFETY: `version` is a valid place for the driver to write an int.
/// let code = unsafe { (loaded.table.cuDriverGetVersion)(&mut version) };
/// assert_eq!(code, CUresult::CUDA_SUCCESS);
/// assert!(version >= 13000, "{} driver reports {version}", loaded.name());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LoadedDriver {
    /// The function table every call goes through.
    pub table: &'static Driver,
    /// Which implementation it is.
    pub kind: DriverKind,
}

impl LoadedDriver {
    /// Whether this is the real GPU.
    pub fn is_gpu(&self) -> bool {
        self.kind == DriverKind::Cuda
    }

    /// A short human name: `CUDA` or `software`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            DriverKind::Cuda => "CUDA",
            DriverKind::Soft => "software",
        }
    }
}
