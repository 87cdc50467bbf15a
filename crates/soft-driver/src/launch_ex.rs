//! `cuLaunchKernelEx`: a launch with attributes, of which two are supported.
//!
//! A device-updatable kernel node
//! (`CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE`, graphs only): the
//! kernel node the capture records gets a device node handle, through which
//! kernels change its arguments (see `device_node`).
//!
//! Programmatic stream serialization (programmatic dependent launch, PDL)
//! lets a kernel start before the kernel ahead of it on the stream has
//! finished, up to the point where it calls `cudaGridDependencySynchronize`.
//! A stream of this driver is one worker running its work in order, so
//! every kernel starts after the one ahead has finished: exactly what the
//! kernel's synchronisation would wait for. The attribute is checked and the
//! launch is an ordinary `cuLaunchKernel`, in capture too (where CUDA would
//! record a programmatic edge, this driver records stream order, which is
//! stricter and gives the same results).

use crate::errors::{code, fail};
use crate::launch_dims::LaunchDims;
use crate::modules::launch;
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
    let mut device_updatable = false;
    for i in 0..config.numAttrs as usize {
        // SAFETY: `attrs` holds `numAttrs` attributes (the API's contract),
        // checked non-null above.
        let attr = unsafe { &*config.attrs.add(i) };
        match attr.id {
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION => {
                // SAFETY: the attribute's id says which member of the union is set.
                programmatic |= unsafe { attr.value.programmaticStreamSerializationAllowed } != 0;
            }
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE => {
                // SAFETY: as above.
                match unsafe { attr.value.deviceUpdatableKernelNode.deviceUpdatable } {
                    0 => {}
                    1 => device_updatable = true,
                    other => {
                        return fail(
                            CUresult::CUDA_ERROR_INVALID_VALUE,
                            format!(
                                "cuLaunchKernelEx: deviceUpdatable {other} (attrs[{i}]); it \
                                 may be 0 or 1"
                            ),
                        );
                    }
                }
            }
            other => {
                return fail(
                    CUresult::CUDA_ERROR_NOT_SUPPORTED,
                    format!(
                        "cuLaunchKernelEx: the software driver supports only the launch \
                         attributes CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION ({}) \
                         and CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE ({}), not \
                         attribute {} (attrs[{i}])",
                        CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                            .0,
                        CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE.0,
                        other.0
                    ),
                );
            }
        }
    }
    if device_updatable {
        match resolve(config.hStream) {
            Ok(stream) if stream.state().capture.is_some() => {}
            Ok(stream) => {
                return fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "cuLaunchKernelEx: CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE is \
                         graphs-only, and stream {:#x} is not capturing",
                        stream.handle
                    ),
                );
            }
            Err(code) => return code,
        }
    }
    let dims = LaunchDims {
        grid: (config.gridDimX, config.gridDimY, config.gridDimZ),
        block: (config.blockDimX, config.blockDimY, config.blockDimZ),
        shared_mem_bytes: config.sharedMemBytes,
    };
    // Minted now, registered when the capture records the node (a stream
    // that stopped capturing meanwhile runs the launch, which ignores it).
    let device_node = device_updatable.then(crate::handles::mint);
    // SAFETY: the caller's contract for cuLaunchKernelEx is cuLaunchKernel's
    // for the same function, stream, shape and arguments.
    let code = code(unsafe { launch(f, dims, config.hStream, kernelParams, extra, device_node) });
    if code == CUresult::CUDA_SUCCESS
        && programmatic
        && let Ok(stream) = resolve(config.hStream)
    {
        stream.state().programmatic_launches += 1;
    }
    code
}
