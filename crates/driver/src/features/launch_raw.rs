//! The driver calls that launch a kernel, written once: `cuLaunchKernel`,
//! or `cuLaunchKernelEx` with the attributes a launch asks for
//! ([`LaunchAttrs`]), the arguments laid out as `kernelParams` without an
//! allocation for the usual few. Eager launches, captured launches and the
//! device-side scalar sets all come here.

use crate::features::kernel_arg::KernelArg;
use crate::features::launch_config::LaunchConfig;
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// Arguments up to this many are laid out on the stack.
const INLINE_ARGS: usize = 16;

/// `cuLaunchKernel` of `function` with `args` laid out as `kernelParams`;
/// `cuLaunchKernelEx` when `attrs` asks for launch attributes.
///
/// # Safety
/// `stream` is a live stream of the kernel's context, current on this thread;
/// `function` is the kernel's handle for that stream
/// (`Stream::function_for`), alive for the call; the arguments are what
/// the kernel's parameters are, and the memory they point at stays
/// allocated for as long as the launch may run.
#[inline]
pub(crate) unsafe fn launch_raw(
    driver: &sys::Driver,
    stream: sys::CUstream,
    function: sys::CUfunction,
    config: LaunchConfig,
    args: &[KernelArg<'_>],
    attrs: LaunchAttrs,
) -> sys::CUresult {
    with_kernel_params(args, |params_ptr| {
        if attrs.any() {
            // SAFETY: as below, the arguments laid out the same way.
            return unsafe { launch_raw_ex(driver, stream, function, config, params_ptr, attrs) };
        }
        let (gx, gy, gz) = config.grid_dim;
        let (bx, by, bz) = config.block_dim;
        // SAFETY: `params_ptr[i]` points at argument i's value inside `args`,
        // alive for this call (the driver copies them); the function is
        // alive (the caller's contract); the rest is the caller's contract
        // too.
        unsafe {
            (driver.cuLaunchKernel)(
                function,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_mem_bytes,
                stream,
                params_ptr,
                std::ptr::null_mut(),
            )
        }
    })
}

/// `args` as the driver's `kernelParams` (a pointer to each argument's value
/// inside `args`; null for none), handed to `call`: on the stack for up to
/// [`INLINE_ARGS`] arguments, so a launch allocates nothing.
#[inline]
pub(crate) fn with_kernel_params<R>(
    args: &[KernelArg<'_>],
    call: impl FnOnce(*mut *mut c_void) -> R,
) -> R {
    if args.len() > INLINE_ARGS {
        let mut spilled: Vec<*mut c_void> = args.iter().map(KernelArg::param).collect();
        return call(spilled.as_mut_ptr());
    }
    if args.is_empty() {
        return call(std::ptr::null_mut());
    }
    // Only the slots of `args` are written, and only they are read (the
    // driver reads as many as the kernel has parameters, which is the
    // caller's contract): zeroing all sixteen first cost a launch more
    // than writing the few it has.
    let mut inline = [MaybeUninit::<*mut c_void>::uninit(); INLINE_ARGS];
    for (slot, arg) in inline.iter_mut().zip(args) {
        slot.write(arg.param());
    }
    call(inline.as_mut_ptr().cast())
}

/// What a launch asks of the driver beyond its shape and arguments: the
/// launch attributes `cuLaunchKernelEx` takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LaunchAttrs {
    /// Programmatic stream serialization (`features/dependent_launch.rs`).
    pub(crate) programmatic: bool,
    /// In a capture: a device-updatable kernel node
    /// (`features/graph/device_update.rs`).
    pub(crate) device_updatable: bool,
}

impl LaunchAttrs {
    /// Plain, or programmatic when `programmatic`.
    pub(crate) const fn programmatic(programmatic: bool) -> Self {
        Self {
            programmatic,
            device_updatable: false,
        }
    }

    /// Whether it asks for any attribute (`cuLaunchKernelEx`), or none
    /// (`cuLaunchKernel`).
    fn any(self) -> bool {
        self.programmatic || self.device_updatable
    }
}

/// `cuLaunchKernelEx` of `function` with the attributes `attrs` asks for,
/// `params` as `kernelParams`.
///
/// # Safety
/// As for `launch_raw` (`features/launch.rs`), whose argument layout
/// `params` is.
unsafe fn launch_raw_ex(
    driver: &sys::Driver,
    stream: sys::CUstream,
    function: sys::CUfunction,
    config: LaunchConfig,
    params: *mut *mut c_void,
    attrs: LaunchAttrs,
) -> sys::CUresult {
    // Only the attributes asked for are written, whole; the driver reads
    // `numAttrs` of them.
    let mut list = [MaybeUninit::<sys::CUlaunchAttribute>::uninit(); 2];
    let mut count = 0;
    if attrs.programmatic {
        list[count].write(sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        });
        count += 1;
    }
    if attrs.device_updatable {
        let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
        value.deviceUpdatableKernelNode.deviceUpdatable = 1;
        list[count].write(sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
            pad: [0; 4],
            value,
        });
        count += 1;
    }
    let (gx, gy, gz) = config.grid_dim;
    let (bx, by, bz) = config.block_dim;
    let launch = sys::CUlaunchConfig {
        gridDimX: gx,
        gridDimY: gy,
        gridDimZ: gz,
        blockDimX: bx,
        blockDimY: by,
        blockDimZ: bz,
        sharedMemBytes: config.shared_mem_bytes,
        hStream: stream,
        attrs: list.as_mut_ptr().cast(),
        numAttrs: count as u32,
    };
    // SAFETY: `launch` and `list` live for the call (the driver copies
    // them), and the first `count` entries of `list`, all the driver reads,
    // are written; the rest is the caller's contract.
    unsafe { (driver.cuLaunchKernelEx)(&launch, function, params, std::ptr::null_mut()) }
}
