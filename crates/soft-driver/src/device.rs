//! The software devices: how many, their identity and attributes, and which
//! pairs may access each other's memory.

use crate::errors::{Status, code, fail, write_out};
use std::ffi::{c_char, c_int, c_uint};
use std::sync::OnceLock;
use sys::env::{EnvError, Setting};
use sys::{CUdevice, CUdevice_attribute, CUresult};

/// The name `cuDeviceGetName` reports.
pub const DEVICE_NAME: &str = "cuda-streams software device";

/// The version `cuDriverGetVersion` reports: CUDA 13.0, the headers' version.
pub const DRIVER_VERSION: c_int = 13000;

/// Environment variable that sets how many devices the software driver has,
/// read once at first use (1 to [`MAX_DEVICES`]).
pub const DEVICES_ENV: &str = "CUDA_STREAMS_SOFT_DEVICES";

/// The number of devices without `CUDA_STREAMS_SOFT_DEVICES`: two, so that
/// every test sees peers, cross-device waits and collectives.
pub const DEFAULT_DEVICES: c_int = 2;

/// The most devices the software driver models.
pub const MAX_DEVICES: c_int = 64;

/// `CUDA_STREAMS_SOFT_DEVICES` as a setting (see [`check_env`](crate::check_env)).
pub const DEVICES_SETTING: Setting = Setting {
    name: DEVICES_ENV,
    aliases: &[],
    default: "2",
    about: "how many devices the software driver has (1 to 64)",
};

/// The device count from the environment, parsed once.
pub(crate) fn devices_from_env() -> &'static Result<c_int, EnvError> {
    static FROM_ENV: OnceLock<Result<c_int, EnvError>> = OnceLock::new();
    FROM_ENV.get_or_init(|| match DEVICES_SETTING.from_env()? {
        Some(found) => found.parse_int(1..=MAX_DEVICES),
        None => Ok(DEFAULT_DEVICES),
    })
}

/// How many devices the software driver has (`cuDeviceGetCount`):
/// `CUDA_STREAMS_SOFT_DEVICES` when set, else [`DEFAULT_DEVICES`]. Fixed for
/// the process at first use. A value that is not a number from 1 to
/// [`MAX_DEVICES`] makes `cuInit` fail, naming it (and
/// [`check_env`](crate::check_env) return the error); the count is then
/// [`DEFAULT_DEVICES`].
///
/// ```
/// let n = cuda_streams_soft_driver::device_count();
/// assert!((1..=cuda_streams_soft_driver::MAX_DEVICES).contains(&n));
/// ```
pub fn device_count() -> c_int {
    match devices_from_env() {
        Ok(n) => *n,
        Err(_) => DEFAULT_DEVICES,
    }
}

/// `CUDA_ERROR_INVALID_DEVICE` unless `dev` is a device ordinal.
pub(crate) fn check_device(dev: CUdevice) -> Status {
    if (0..device_count()).contains(&dev) {
        Ok(())
    } else {
        Err(fail(
            CUresult::CUDA_ERROR_INVALID_DEVICE,
            format!(
                "device {dev} does not exist: the software driver has {} device(s) (set {})",
                device_count(),
                DEVICES_ENV
            ),
        ))
    }
}

pub(crate) unsafe extern "C" fn cuInit(Flags: c_uint) -> CUresult {
    if Flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // A bad setting is refused here, where CUDA reports a bad install.
    match crate::check_env() {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(err) => fail(CUresult::CUDA_ERROR_INVALID_VALUE, err.to_string()),
    }
}

pub(crate) unsafe extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult {
    // SAFETY: null or writable per the API.
    code(unsafe { write_out(driverVersion, DRIVER_VERSION) })
}

pub(crate) unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: null or writable per the API.
    code(unsafe { write_out(count, device_count()) })
}

pub(crate) unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    if let Err(code) = check_device(ordinal) {
        return code;
    }
    // The device handle is its ordinal, as on NVIDIA's driver.
    // SAFETY: null or writable per the API.
    code(unsafe { write_out(device, ordinal) })
}

pub(crate) unsafe extern "C" fn cuDeviceGetName(
    name: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    if let Err(code) = check_device(dev) {
        return code;
    }
    if name.is_null() || len <= 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // Like CUDA: truncate to the buffer, always NUL-terminated.
    let bytes = DEVICE_NAME.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: name is writable for len bytes per the API and n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), name, n);
        name.add(n).write(0);
    }
    CUresult::CUDA_SUCCESS
}

/// CPU threads the device may use: its "multiprocessors".
fn parallelism() -> c_int {
    std::thread::available_parallelism()
        .map(|n| n.get() as c_int)
        .unwrap_or(1)
}

/// The attribute's value, or `None` for a value outside CUDA 13.0's enum.
fn attribute(attrib: CUdevice_attribute) -> Option<c_int> {
    type A = CUdevice_attribute;
    Some(match attrib {
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 48 * 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 * 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 * 1024,
        A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 64 * 1024,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK
        | A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => parallelism(),
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        // 9.0, the H200's: the software device stands in for it (as its
        // priority range does), so capability checks in upper layers take the
        // path they take on the GPU the suite targets.
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 2,
        A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS
        | A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
        | A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        | A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS
        | A::CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
        | A::CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_INTEGRATED => 1,
        A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 32 * 1024 * 1024,
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE | A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 1_000_000,
        A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 64,
        // Every other attribute of the 13.0 enum: a feature the software device
        // does not have.
        other if other.0 < A::CU_DEVICE_ATTRIBUTE_MAX.0 => 0,
        _ => return None,
    })
}

pub(crate) unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    if let Err(code) = check_device(dev) {
        return code;
    }
    let Some(value) = attribute(attrib) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: null or writable per the API.
    code(unsafe { write_out(pi, value) })
}

pub(crate) unsafe extern "C" fn cuDeviceCanAccessPeer(
    canAccessPeer: *mut c_int,
    dev: CUdevice,
    peerDev: CUdevice,
) -> CUresult {
    if let Err(code) = check_device(dev).and(check_device(peerDev)) {
        return code;
    }
    // Every pair of distinct software devices can be peers (they share the
    // host's memory, as GPUs joined by NVLink share a fabric); CUDA answers 0
    // for a device and itself.
    // SAFETY: null or writable per the API.
    code(unsafe { write_out(canAccessPeer, c_int::from(dev != peerDev)) })
}
