//! The one seam between the two drivers: the questions whose answers differ
//! between NVIDIA's driver and the software driver, asked of a
//! [`LoadedDriver`] (or, where only its kind is known, as in an error, of
//! its [`DriverKind`]) by name instead of by matching on the kind wherever
//! they come up.
//!
//! Everything else runs the same on both: the software driver implements
//! the same function table. What it does not have is a GPU's binary
//! format: its kernels are CPU twins, defined from their declarations. And
//! its streams are worker threads on host memory, so a race between two of
//! them is a data race: it accepts only the order policies that stop one.

use crate::ground::error::{Error, Result};
use crate::ground::loaded_driver::{DriverKind, LoadedDriver};
use crate::ground::order_policy::OrderPolicy;
use sys::CUresult;

impl LoadedDriver {
    /// Whether kernels run as CPU twins defined from their declarations
    /// (the software driver) rather than from a binary the driver loads:
    /// a module is then built from its declarations, a kernel is found by
    /// its declared name, and a declaration without a twin cannot run.
    pub(crate) fn runs_twins(&self) -> bool {
        match self.kind {
            DriverKind::Soft => true,
            DriverKind::Cuda => false,
        }
    }

    /// What the driver can say about its last failure on this thread beyond
    /// the `CUresult` (the software driver names the check that failed;
    /// NVIDIA's driver says nothing more).
    pub(crate) fn last_error_detail(&self) -> Option<String> {
        match self.kind {
            DriverKind::Soft => soft_driver::last_error_detail(),
            DriverKind::Cuda => None,
        }
    }

    /// `CUresult` to this crate's `Result`, with the driver's description,
    /// and for a failure of the work itself (a launch that failed, an illegal
    /// address) what the driver can say about it: on the software driver the
    /// CPU twin that panicked and the panic's message, so the returned error
    /// says what the GPU's `CUDA_ERROR_LAUNCH_FAILED` cannot.
    ///
    /// Success is decided inline, at every driver call of every enqueue; the
    /// error's description and detail are built out of line.
    #[inline]
    pub(crate) fn check(&self, code: CUresult) -> Result<()> {
        if code == CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        self.failure(code)
    }

    /// [`LoadedDriver::check`] for a code that is not success.
    #[cold]
    #[inline(never)]
    fn failure(&self, code: CUresult) -> Result<()> {
        let Err(source) = self.table.check(code) else {
            return Ok(());
        };
        let work_failed = matches!(
            source.code(),
            CUresult::CUDA_ERROR_LAUNCH_FAILED | CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        match self.last_error_detail() {
            Some(detail) if work_failed => Err(Error::WorkFailed { source, detail }),
            _ => Err(Error::Driver(source)),
        }
    }

    /// The entry points of SM partitions (green contexts): the software
    /// driver's own, or libcuda's where it has every one (CUDA 12.4 and
    /// later); otherwise the error names the driver's version and what it
    /// lacks. Never a fallback to a context without partitions. The safe
    /// API is [`Context::partition`](crate::Context::partition); this is for
    /// raw calls (benches, interop).
    ///
    /// ```
    /// let driver = cuda_streams_driver::driver().unwrap();
    /// match driver.green_contexts() {
    ///     Ok(green) => println!("partitions: {:p}", green.cuGreenCtxCreate),
    ///     Err(err) => println!("no partitions here: {err}"),
    /// }
    /// ```
    pub fn green_contexts(&self) -> crate::Result<&'static sys::GreenContexts> {
        match self.kind {
            DriverKind::Soft => Ok(soft_driver::green_contexts()),
            DriverKind::Cuda => sys::optional::green_contexts().map_err(|missing| {
                let mut driver_version = 0;
                // SAFETY: writes one int through a valid pointer.
                unsafe { (self.table.cuDriverGetVersion)(&mut driver_version) };
                crate::Error::PartitionsUnsupported {
                    driver_version,
                    missing: missing.to_vec(),
                }
            }),
        }
    }

    /// The entry points that share device memory and events between
    /// processes: the software driver's own, or libcuda's where it has every
    /// one; otherwise the error names what it lacks. The safe API is
    /// [`SharedDeviceBuffer`](crate::SharedDeviceBuffer) and
    /// [`SharedEvent`](crate::SharedEvent); this is for raw calls.
    ///
    /// ```
    /// let driver = cuda_streams_driver::driver().unwrap();
    /// match driver.ipc() {
    ///     Ok(ipc) => println!("IPC: {:p}", ipc.cuMemCreate),
    ///     Err(err) => println!("no IPC here: {err}"),
    /// }
    /// ```
    pub fn ipc(&self) -> crate::Result<&'static sys::Ipc> {
        match self.kind {
            DriverKind::Soft => Ok(soft_driver::ipc()),
            DriverKind::Cuda => sys::optional::ipc().map_err(|missing| {
                let mut driver_version = 0;
                // SAFETY: writes one int through a valid pointer.
                unsafe { (self.table.cuDriverGetVersion)(&mut driver_version) };
                crate::Error::IpcUnsupported {
                    driver_version,
                    missing: missing.to_vec(),
                }
            }),
        }
    }

    /// The entry points that make memory pools of one's own, for pools of
    /// page-locked host memory: the software driver's own, or libcuda's
    /// where it has every one and is CUDA 12.2 or later
    /// ([`sys::optional::HOST_POOLS_SINCE`]); otherwise the error names the
    /// driver's version and what it lacks. The safe API is
    /// [`HostMemPool`](crate::HostMemPool); this is for raw calls.
    ///
    /// ```
    /// let driver = cuda_streams_driver::driver().unwrap();
    /// match driver.host_pools() {
    ///     Ok(pools) => println!("host pools: {:p}", pools.cuMemPoolCreate),
    ///     Err(err) => println!("no host pools here: {err}"),
    /// }
    /// ```
    pub fn host_pools(&self) -> crate::Result<&'static sys::HostPools> {
        match self.kind {
            DriverKind::Soft => Ok(soft_driver::host_pools()),
            DriverKind::Cuda => {
                let mut driver_version = 0;
                // SAFETY: writes one int through a valid pointer.
                unsafe { (self.table.cuDriverGetVersion)(&mut driver_version) };
                host_pools_of(sys::optional::host_pools(), driver_version)
            }
        }
    }
}

/// libcuda's table of [`LoadedDriver::host_pools`], `found` as loaded, for
/// a driver of version `driver_version`: it exports the entry points since
/// CUDA 11.2, but makes pools of host memory only since 12.2.
fn host_pools_of(
    found: std::result::Result<&'static sys::HostPools, &'static [&'static str]>,
    driver_version: i32,
) -> crate::Result<&'static sys::HostPools> {
    let missing = match found {
        Ok(table) if driver_version >= sys::optional::HOST_POOLS_SINCE => return Ok(table),
        Ok(_) => vec!["pools with a CU_MEM_LOCATION_TYPE_HOST location"],
        Err(missing) => missing.to_vec(),
    };
    Err(Error::HostPoolsUnsupported {
        driver_version,
        missing,
    })
}

impl DriverKind {
    /// Whether this driver accepts `policy`: a GPU every one (an unordered
    /// pair gives a wrong result there, not undefined behaviour in the host
    /// program), the software driver only those that keep an unordered
    /// conflicting pair from running (`Check`, `Auto`), since its streams
    /// are threads on host memory.
    pub(crate) fn accepts_order_policy(self, policy: OrderPolicy) -> bool {
        match self {
            DriverKind::Cuda => true,
            DriverKind::Soft => matches!(policy, OrderPolicy::Check | OrderPolicy::Auto),
        }
    }

    /// The policy a context on this driver starts under when
    /// `CUDA_STREAMS_ORDERING` does not say: `Check` on the software driver,
    /// which is sound by default; `Off` on a GPU, which costs nothing.
    pub(crate) fn default_order_policy(self) -> OrderPolicy {
        match self {
            DriverKind::Soft => OrderPolicy::Check,
            DriverKind::Cuda => OrderPolicy::Off,
        }
    }

    /// How a message names this driver: "the software driver".
    pub(crate) fn in_messages(self) -> &'static str {
        match self {
            DriverKind::Soft => "the software driver",
            DriverKind::Cuda => "the CUDA driver",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_before_12_2_is_refused_naming_the_version_needed() {
        let table = soft_driver::host_pools();
        let Err(err) = host_pools_of(Ok(table), 12010) else {
            panic!("a 12.1 driver makes no pools of host memory");
        };
        let text = err.to_string();
        assert!(text.contains("CUDA 12.2"), "{text}");
        assert!(text.contains("version 12010"), "{text}");
        assert!(text.contains("CU_MEM_LOCATION_TYPE_HOST"), "{text}");
        let Err(err) = host_pools_of(Err(&["cuMemPoolCreate"]), 11000) else {
            panic!("a driver without cuMemPoolCreate makes no pools");
        };
        assert!(err.to_string().contains("lacks cuMemPoolCreate"), "{err}");
        assert!(host_pools_of(Ok(table), 12020).is_ok());
    }
}
