//! Kernel images and their CPU twins: the registry, modules, functions and
//! launches.
//!
//! The kernels crate registers, for each embedded image (cubin/fatbin/PTX), a
//! CPU implementation of each kernel in it. `cuModuleLoadData` finds the image
//! by its address (the same `&'static [u8]` the caller passes to the GPU), and
//! `cuLaunchKernel` runs the twin once, over the whole grid, on the stream's
//! worker.

use crate::context::require;
use crate::errors::{clear_detail, code, fail, write_out};
use crate::handles::{Registry, lock};
use crate::ops::{Action, Launch, Template};
use crate::stream::resolve;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::{Arc, Mutex};
use sys::signature::Param;
use sys::{CUfunction, CUmodule, CUresult, CUstream};

/// The launch configuration a twin runs under: `cuLaunchKernel`'s grid,
/// block and shared-memory arguments.
///
/// ```
/// use cuda_streams_soft_driver::LaunchDims;
/// use std::ffi::c_void;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// static THREADS: AtomicU64 = AtomicU64::new(0);
/// // A twin that covers exactly the threads launched (no grid-stride loop).
/// unsafe fn count_threads(dims: &LaunchDims, _params: *mut *mut c_void) {
///     let ((gx, gy, gz), (bx, by, bz)) = (dims.grid, dims.block);
///     THREADS.store(u64::from(gx * gy * gz) * u64::from(bx * by * bz), Ordering::Relaxed);
/// }
/// let dims = LaunchDims { grid: (4, 2, 1), block: (128, 1, 1), shared_mem_bytes: 0 };
/// // SAFETY: the twin reads no arguments.
/// unsafe { count_threads(&dims, std::ptr::null_mut()) };
/// assert_eq!(THREADS.load(Ordering::Relaxed), 1024);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    /// Blocks in the grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

/// A kernel's CPU twin. `params` is the `kernelParams` array of the launch:
/// `params[i]` points at (a copy of) argument `i`. The twin covers the whole
/// grid in one call.
pub type KernelTwin = unsafe fn(dims: &LaunchDims, params: *mut *mut c_void);

/// One kernel of an image: its name (as `cuModuleGetFunction` is asked for
/// it, i.e. the `extern "C"` or mangled symbol), its parameters in order
/// ([`sys::signature::Param`]: exact scalar types, and pointers with their
/// element type, access and extent), and its twin.
///
/// The parameters' sizes let `cuLaunchKernel` copy the arguments at launch
/// time, as CUDA does (the caller may free its `kernelParams` array and the
/// values it points at as soon as the call returns); exactly `params.len()`
/// arguments are copied. The safe layer reads the same description to check
/// launches (`Module::function` attaches it to the kernel).
///
/// ```
/// use cuda_streams_soft_driver::{self as soft, LaunchDims, TwinSpec, register_image};
/// use cuda_streams_soft_driver::sys::signature::{Param, Scalar};
/// use std::ffi::c_void;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// static IMAGE: [u8; 6] = *b"store\0"; // stands in for a cubin or PTX image
/// static STORED: AtomicU32 = AtomicU32::new(0);
/// /// Twin of `store(u32 value)`.
/// unsafe fn store(_: &LaunchDims, params: *mut *mut c_void) {
///     // SAFETY: params[0] points at a copy of the one 4-byte argument.
///     STORED.store(unsafe { *(*params).cast::<u32>() }, Ordering::Relaxed);
/// }
/// # fn main() -> Result<(), sys::DriverError> {
/// register_image(&IMAGE, &[TwinSpec { name: "store", params: &[Param::Scalar(Scalar::U32)], run: store }]);
/// # let table = soft::driver();
/// # let (mut dev, mut ctx) = (0, std::ptr::null_mut());
/// # // SAFETY: valid out-pointers.
/// # unsafe {
/// #     (table.cuDeviceGet)(&mut dev, 0).result()?;
/// #     (table.cuDevicePrimaryCtxRetain)(&mut ctx, dev).result()?;
/// #     (table.cuCtxSetCurrent)(ctx).result()?;
/// # }
/// let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
/// let mut value = 7u32;
/// let mut params = [(&raw mut value).cast::<c_void>()];
/// // SAFETY: valid out-pointers, a registered image, one u32 argument.
/// unsafe {
///     (table.cuModuleLoadData)(&mut module, IMAGE.as_ptr().cast()).result()?;
///     (table.cuModuleGetFunction)(&mut function, module, c"store".as_ptr()).result()?;
///     let (stream, extra) = (std::ptr::null_mut(), std::ptr::null_mut());
///     (table.cuLaunchKernel)(function, 1, 1, 1, 1, 1, 1, 0, stream, params.as_mut_ptr(), extra)
///         .result()?;
///     (table.cuCtxSynchronize)().result()?;
/// }
/// assert_eq!(STORED.load(Ordering::Relaxed), 7);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TwinSpec {
    /// The kernel's symbol name.
    pub name: &'static str,
    /// The parameters, in order.
    pub params: &'static [Param],
    /// The CPU implementation.
    pub run: KernelTwin,
}

struct Image {
    len: usize,
    twins: HashMap<&'static str, TwinSpec>,
}

static IMAGES: Mutex<Option<HashMap<usize, Image>>> = Mutex::new(None);

/// Register the CPU twins of the kernels in `image`, keyed by the image's
/// address (`image.as_ptr()`). Idempotent: registering again adds or replaces
/// twins by name.
///
/// ```
/// use cuda_streams_soft_driver::{LaunchDims, TwinSpec, register_image};
/// static IMAGE: [u8; 4] = *b"demo";
/// unsafe fn nothing(_: &LaunchDims, _: *mut *mut std::ffi::c_void) {}
/// register_image(&IMAGE, &[TwinSpec { name: "nothing", params: &[], run: nothing }]);
/// ```
pub fn register_image(image: &'static [u8], twins: &[TwinSpec]) {
    let mut images = lock(&IMAGES);
    let entry = images
        .get_or_insert_with(HashMap::new)
        .entry(image.as_ptr() as usize)
        .or_insert_with(|| Image {
            len: image.len(),
            twins: HashMap::new(),
        });
    for twin in twins {
        entry.twins.insert(twin.name, *twin);
    }
}

/// The parameters registered for `name` in the image at `image` (its
/// address, as passed to `cuModuleLoadData`), if twins were registered for it.
///
/// The safe layer asks this for every kernel it looks up, on either driver:
/// an image of the kernels crate declares its kernels' signatures once, with
/// their twins.
///
/// ```
/// use cuda_streams_soft_driver::{LaunchDims, TwinSpec, register_image, registered_signature};
/// use cuda_streams_soft_driver::sys::signature::{Param, Scalar};
/// static IMAGE: [u8; 4] = *b"sigs";
/// unsafe fn nothing(_: &LaunchDims, _: *mut *mut std::ffi::c_void) {}
/// const PARAMS: &[Param] = &[Param::Scalar(Scalar::F32)];
/// register_image(&IMAGE, &[TwinSpec { name: "f", params: PARAMS, run: nothing }]);
/// assert_eq!(registered_signature(IMAGE.as_ptr() as usize, "f"), Some(PARAMS));
/// assert_eq!(registered_signature(IMAGE.as_ptr() as usize, "g"), None);
/// ```
pub fn registered_signature(image: usize, name: &str) -> Option<&'static [Param]> {
    lock(&IMAGES)
        .as_ref()?
        .get(&image)?
        .twins
        .get(name)
        .map(|spec| spec.params)
}

struct Module {
    image: usize,
    functions: Mutex<HashMap<&'static str, usize>>,
}

struct Function {
    module: usize,
    spec: TwinSpec,
}

static MODULES: Registry<Module> = Registry::new();
static FUNCTIONS: Registry<Function> = Registry::new();

pub(crate) unsafe extern "C" fn cuModuleLoadData(
    module: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    code((|| {
        clear_detail();
        require()?;
        if module.is_null() || image.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let address = image as usize;
        let known = lock(&IMAGES)
            .as_ref()
            .is_some_and(|images| images.contains_key(&address));
        if !known {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_IMAGE,
                format!(
                    "no CPU twins are registered for the kernel image at {address:#x}; the \
                     software driver runs kernels as CPU twins registered with \
                     cuda_streams_soft_driver::register_image"
                ),
            ));
        }
        let handle = MODULES.insert(Arc::new(Module {
            image: address,
            functions: Mutex::new(HashMap::new()),
        }));
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(module, handle as CUmodule) }
    })())
}

pub(crate) unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    code((|| {
        let module = MODULES.remove(hmod as usize)?;
        for (_, function) in lock(&module.functions).drain() {
            let _ = FUNCTIONS.remove(function);
        }
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    code((|| {
        clear_detail();
        let module = MODULES.get(hmod as usize)?;
        if hfunc.is_null() || name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and NUL-terminated per the API.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let images = lock(&IMAGES);
        let image = images
            .as_ref()
            .and_then(|images| images.get(&module.image))
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let Some(spec) = image.twins.get(name.as_ref()).copied() else {
            let mut known: Vec<_> = image.twins.keys().copied().collect();
            known.sort_unstable();
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_FOUND,
                format!(
                    "the kernel image at {:#x} ({} bytes) has no CPU twin named `{name}` \
                     (its twins: {})",
                    module.image,
                    image.len,
                    known.join(", ")
                ),
            ));
        };
        drop(images);
        let mut functions = lock(&module.functions);
        // The same name gives the same handle, as on CUDA.
        let handle = *functions.entry(spec.name).or_insert_with(|| {
            FUNCTIONS.insert(Arc::new(Function {
                module: hmod as usize,
                spec,
            }))
        });
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(hfunc, handle as CUfunction) }
    })())
}

#[allow(clippy::too_many_arguments, reason = "cuLaunchKernel's signature")]
pub(crate) unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    code((|| {
        clear_detail();
        require()?;
        let function = FUNCTIONS.get(f as usize)?;
        // Unloading the module invalidates its functions, as on CUDA.
        MODULES.get(function.module)?;
        let stream = resolve(hStream)?;
        let spec = function.spec;
        let dims = LaunchDims {
            grid: (gridDimX, gridDimY, gridDimZ),
            block: (blockDimX, blockDimY, blockDimZ),
            shared_mem_bytes: sharedMemBytes,
        };
        let threads = u64::from(blockDimX) * u64::from(blockDimY) * u64::from(blockDimZ);
        if [gridDimX, gridDimY, gridDimZ].contains(&0) || threads == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "launch of `{}` with an empty grid or block: {dims:?}",
                    spec.name
                ),
            ));
        }
        if threads > 1024 || blockDimZ > 64 || gridDimY > 65535 || gridDimZ > 65535 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "launch of `{}` exceeds the device's limits: {dims:?}",
                    spec.name
                ),
            ));
        }
        if !extra.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                "the software driver takes kernel arguments through kernelParams, not `extra`",
            ));
        }
        if kernelParams.is_null() && !spec.params.is_empty() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "launch of `{}` without kernelParams; it takes {} arguments",
                    spec.name,
                    spec.params.len()
                ),
            ));
        }
        let mut args = Vec::with_capacity(spec.params.len());
        for (i, size) in spec.params.iter().map(Param::size).enumerate() {
            // SAFETY: kernelParams has one entry per kernel argument (the CUDA
            // contract), and the twin's spec says how many there are.
            let source = unsafe { *kernelParams.add(i) };
            if source.is_null() && size > 0 {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("launch of `{}`: kernelParams[{i}] is null", spec.name),
                ));
            }
            let mut copy = vec![0u128; size.div_ceil(16).max(1)].into_boxed_slice();
            // SAFETY: source points at argument i, which is `size` bytes (the
            // registered size); the copy has room for at least `size` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(source.cast::<u8>(), copy.as_mut_ptr().cast(), size)
            };
            args.push(copy);
        }
        let inject = std::mem::take(&mut stream.state().inject_launch_fault);
        let action = if inject {
            Action::InjectedFault(spec.name)
        } else {
            Action::Kernel(Arc::new(Launch {
                name: spec.name,
                twin: spec.run,
                params: spec.params,
                dims,
                args,
            }))
        };
        stream.submit(&[Template::Act(action)])
    })())
}
