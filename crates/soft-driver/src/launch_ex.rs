//! `cuLaunchKernelEx`: a launch with attributes. The one attribute the
//! workspace sets is programmatic stream serialization (programmatic
//! dependent launch, PDL), which lets a kernel start before the kernel ahead
//! of it on the stream has finished, up to the point where it calls
//! `cudaGridDependencySynchronize`. A stream of this driver is one worker
//! running its work in order, so every kernel starts after the one ahead has
//! finished: exactly what the kernel's synchronisation would wait for. The
//! attribute is checked and the launch is an ordinary `cuLaunchKernel`, in
//! capture too (where CUDA would record a programmatic edge, this driver
//! records stream order, which is stricter and gives the same results).

use crate::errors::fail;
use crate::modules::cuLaunchKernel;
use crate::stream::resolve;
use std::ffi::c_void;
use sys::{CUfunction, CUlaunchAttributeID, CUlaunchConfig, CUresult, CUstream, DriverError};

/// How many launches on `stream` asked for programmatic stream
/// serialization (`cuLaunchKernelEx` with
/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` set to a nonzero
/// value) and were accepted: how a test on this driver, where such a launch
/// runs in ordinary stream order, sees that a launch was programmatic.
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// // Not a stream of this driver.
/// assert!(soft::programmatic_launches(0x7777_0000 as soft::sys::CUstream).is_err());
/// ```
pub fn programmatic_launches(stream: CUstream) -> Result<u64, DriverError> {
    let stream = resolve(stream).map_err(|code| code.result().unwrap_err())?;
    Ok(stream.state().programmatic_launches)
}

pub(crate) unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "cuLaunchKernelEx without a launch configuration (config is null)",
        );
    }
    // SAFETY: non-null, and points at a configuration per the API.
    let config = unsafe { &*config };
    if config.numAttrs > 0 && config.attrs.is_null() {
        return fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!(
                "cuLaunchKernelEx with numAttrs {} and a null attrs",
                config.numAttrs
            ),
        );
    }
    let mut programmatic = false;
    for i in 0..config.numAttrs as usize {
        // SAFETY: `attrs` holds `numAttrs` attributes (the API's contract),
        // checked non-null above.
        let attr = unsafe { &*config.attrs.add(i) };
        if attr.id != CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION {
            return fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                format!(
                    "cuLaunchKernelEx: the software driver supports only the launch attribute \
                     CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION ({}), not attribute \
                     {} (attrs[{i}])",
                    CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.0,
                    attr.id.0
                ),
            );
        }
        // SAFETY: the attribute's id says which member of the union is set.
        programmatic |= unsafe { attr.value.programmaticStreamSerializationAllowed } != 0;
    }
    // SAFETY: the caller's contract for cuLaunchKernelEx is cuLaunchKernel's
    // for the same function, stream, shape and arguments.
    let code = unsafe {
        cuLaunchKernel(
            f,
            config.gridDimX,
            config.gridDimY,
            config.gridDimZ,
            config.blockDimX,
            config.blockDimY,
            config.blockDimZ,
            config.sharedMemBytes,
            config.hStream,
            kernelParams,
            extra,
        )
    };
    if code == CUresult::CUDA_SUCCESS
        && programmatic
        && let Ok(stream) = resolve(config.hStream)
    {
        stream.state().programmatic_launches += 1;
    }
    code
}
