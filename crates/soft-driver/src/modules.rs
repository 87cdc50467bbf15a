//! Kernel images and their CPU twins: the registry, modules, functions and
//! launches.
//!
//! The kernels crate registers, for each embedded image (cubin/fatbin/PTX), a
//! CPU implementation of each kernel in it. `cuModuleLoadData` finds the image
//! by its address (the same `&'static [u8]` the caller passes to the GPU), and
//! `cuLaunchKernel` runs the twin once, over the whole grid, on the stream's
//! worker.

use crate::context::require;
use crate::errors::{Status, clear_detail, code, fail, write_out};
use crate::handles::{Registry, lock};
use crate::launch_dims::LaunchDims;
use crate::ops::{Action, Launch, Template};
use crate::stream::resolve;
use crate::twin::Twin;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::{Arc, Mutex};
use sys::signature::{self, InvalidSignature, Param};
use sys::{CUfunction, CUmodule, CUresult, CUstream};

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
/// arguments are copied. A declared image carries the same descriptions into
/// the safe layer's `Module::load`, whose checked launches trust them; so
/// they are only ever registered or declared through an `unsafe fn`.
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
/// // SAFETY: `store` reads one u32 argument and touches no device memory.
/// unsafe {
///     register_image(&IMAGE, &[TwinSpec { name: "store", params: &[Param::Scalar(Scalar::U32)], run: store }])
/// }
/// .unwrap();
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
    twins: HashMap<&'static str, TwinSpec>,
}

static IMAGES: Mutex<Option<HashMap<usize, Image>>> = Mutex::new(None);

/// Why [`register_image`] refused a list of twins. Nothing of the list was
/// registered.
///
/// A kernel's parameters are what the software driver copies at each launch
/// and checks every pointer against, and what a checked launch in the safe
/// layer trusts, so they are checked when they are registered and never
/// change afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
// More reasons may come with typed kernel declarations.
#[non_exhaustive]
pub enum RegisterError {
    /// A pointer's extent names a parameter that does not exist or is not an
    /// integer scalar.
    InvalidSignature {
        /// The kernel.
        kernel: &'static str,
        /// What is wrong with which parameter.
        source: InvalidSignature,
    },
    /// The kernel is already registered for this image with other
    /// parameters (or twice in the list, differently).
    SignatureChanged {
        /// The kernel.
        kernel: &'static str,
        /// The image's address.
        image: usize,
        /// The parameters it keeps.
        registered: &'static [Param],
        /// The parameters refused.
        refused: &'static [Param],
    },
    /// [`define_kernel`] was given a handle that is no module of this driver.
    UnknownModule {
        /// The handle.
        module: usize,
    },
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidSignature { kernel, source } => {
                write!(f, "the signature of kernel `{kernel}` is invalid: {source}")
            }
            Self::SignatureChanged {
                kernel,
                image,
                registered,
                refused,
            } => write!(
                f,
                "kernel `{kernel}` of the image at {image:#x} is registered with parameters \
                 {registered:?}; a registered signature never changes, so {refused:?} is refused"
            ),
            Self::UnknownModule { module } => {
                write!(f, "{module:#x} is no module of the software driver")
            }
        }
    }
}

impl std::error::Error for RegisterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidSignature { source, .. } => Some(source),
            Self::SignatureChanged { .. } | Self::UnknownModule { .. } => None,
        }
    }
}

/// Register the CPU twins of the kernels in `image`, keyed by the image's
/// address (`image.as_ptr()`), so that `cuModuleLoadData` on those bytes
/// finds them.
///
/// Every twin's parameters are validated first ([`sys::signature::validate`]),
/// and a kernel the image already has keeps the parameters it was first
/// registered with: registering it again with the same parameters changes
/// nothing (the first twin stays), with others is an error. Either error
/// registers nothing of the list.
///
/// Users of the safe layer rarely call this: `Module::load` of a declared
/// image (`cuda_streams_driver::ModuleImage::declared`, or the kernels crate's
/// images) registers the image's twins itself.
///
/// ```
/// use cuda_streams_soft_driver::{LaunchDims, RegisterError, TwinSpec, register_image};
/// use cuda_streams_soft_driver::sys::signature::{Access, Extent, Param, Scalar};
/// static IMAGE: [u8; 4] = *b"demo";
/// /// Twin of a kernel that takes nothing and does nothing.
/// unsafe fn nothing(_: &LaunchDims, _: *mut *mut std::ffi::c_void) {}
/// // SAFETY: `nothing` takes no arguments and touches no memory.
/// unsafe { register_image(&IMAGE, &[TwinSpec { name: "nothing", params: &[], run: nothing }]) }
///     .unwrap();
/// // A pointer counted by a parameter the kernel does not have is refused,
/// // as is a second signature for `nothing`.
/// const BAD: &[Param] = &[Param::Pointer { elem: Scalar::F32, access: Access::Write, extent: Extent::Arg(3) }];
/// // SAFETY: refused before anything is registered.
/// let err = unsafe { register_image(&IMAGE, &[TwinSpec { name: "bad", params: BAD, run: nothing }]) }
///     .unwrap_err();
/// assert!(err.to_string().contains("parameter 3"), "{err}");
/// // SAFETY: as above.
/// const ONE_U32: &[Param] = &[Param::Scalar(Scalar::U32)];
/// let err = unsafe { register_image(&IMAGE, &[TwinSpec { name: "nothing", params: ONE_U32, run: nothing }]) }
///     .unwrap_err();
/// assert!(matches!(err, RegisterError::SignatureChanged { kernel: "nothing", .. }), "{err}");
/// ```
///
/// # Safety
/// For each twin:
/// - `params` are the parameters of the kernel `name` in `image`, exactly:
///   their count, order and types; a pointer the kernel writes through is
///   [`Access::Write`](sys::signature::Access::Write), and the kernel touches
///   no element beyond a pointer's declared extent. The driver copies
///   arguments of these sizes at each launch, and checked launches in the
///   safe layer trust them;
/// - `run` may be called with a `kernelParams` array pointing at copies of
///   arguments of those types, for any grid and block shape, and touches no
///   memory but the declared extents of its pointer arguments (which the
///   driver checks are live and in bounds before it runs).
pub unsafe fn register_image(
    image: &'static [u8],
    twins: &[TwinSpec],
) -> Result<(), RegisterError> {
    for twin in twins {
        signature::validate(twin.params).map_err(|source| RegisterError::InvalidSignature {
            kernel: twin.name,
            source,
        })?;
    }
    let address = image.as_ptr() as usize;
    let mut images = lock(&IMAGES);
    let images = images.get_or_insert_with(HashMap::new);
    let known = images.get(&address);
    for (index, twin) in twins.iter().enumerate() {
        // Against the image as registered so far, then against the twins of
        // the same name earlier in this list.
        let first = known
            .and_then(|image| image.twins.get(twin.name))
            .or_else(|| twins[..index].iter().find(|other| other.name == twin.name));
        if let Some(first) = first
            && first.params != twin.params
        {
            return Err(RegisterError::SignatureChanged {
                kernel: twin.name,
                image: address,
                registered: first.params,
                refused: twin.params,
            });
        }
    }
    let entry = images.entry(address).or_insert_with(|| Image {
        twins: HashMap::new(),
    });
    for twin in twins {
        entry.twins.entry(twin.name).or_insert(*twin);
    }
    Ok(())
}

/// The parameters registered for `name` in the image at `image` (its
/// address, as passed to `cuModuleLoadData`), if twins were registered for it:
/// what the software driver copies and checks at each launch of the kernel.
///
/// The safe layer does not look here: a checked launch trusts the
/// signatures its image carried into `Module::load`, on either driver.
///
/// ```
/// use cuda_streams_soft_driver::{LaunchDims, TwinSpec, register_image, registered_signature};
/// use cuda_streams_soft_driver::sys::signature::{Param, Scalar};
/// static IMAGE: [u8; 4] = *b"sigs";
/// unsafe fn nothing(_: &LaunchDims, _: *mut *mut std::ffi::c_void) {}
/// const PARAMS: &[Param] = &[Param::Scalar(Scalar::F32)];
/// // SAFETY: `nothing` reads none of its one f32 argument and touches no memory.
/// unsafe { register_image(&IMAGE, &[TwinSpec { name: "f", params: PARAMS, run: nothing }]) }
///     .unwrap();
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

/// How a kernel runs here: a raw twin of [`register_image`], or a safe
/// [`Twin`] of a declaration ([`define_kernel`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Run {
    Raw(KernelTwin),
    Safe(Twin),
}

/// A kernel as a module knows it.
#[derive(Clone, Copy, Debug)]
struct Declared {
    name: &'static str,
    params: &'static [Param],
    run: Run,
}

struct Module {
    /// The image's address, or 0 for a module made from declarations.
    image: usize,
    /// Kernels defined with their safe twins ([`define_kernel`]).
    declared: Mutex<HashMap<&'static str, Declared>>,
    functions: Mutex<HashMap<&'static str, usize>>,
}

struct Function {
    module: usize,
    spec: Declared,
}

/// A module with no image, whose kernels are the declarations given to
/// [`define_kernel`], for the current context: what the safe layer loads on
/// the software driver for an image or a CUDA source whose kernels are
/// declared with their safe twins. It unloads with `cuModuleUnload`.
///
/// ```
/// use cuda_streams_soft_driver::{self as soft, LaunchDims, TwinArgs, define_kernel, module_from_declarations};
/// use cuda_streams_soft_driver::sys::signature::{Access, Extent, Param, Scalar};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let table = soft::driver();
/// # let (mut dev, mut ctx) = (0, std::ptr::null_mut());
/// # // SAFETY: valid out-pointers.
/// # unsafe {
/// #     (table.cuDeviceGet)(&mut dev, 0).result()?;
/// #     (table.cuDevicePrimaryCtxRetain)(&mut ctx, dev).result()?;
/// #     (table.cuCtxSetCurrent)(ctx).result()?;
/// # }
/// fn zero(_: &LaunchDims, args: &mut TwinArgs<'_>) {
///     args.slice_mut::<u32>().fill(0);
/// }
/// const ZERO: &[Param] =
///     &[Param::Pointer { elem: Scalar::U32, access: Access::Write, extent: Extent::Elements(4) }];
/// let module = module_from_declarations()?;
/// define_kernel(module, "zero", ZERO, zero)?;
/// let mut function = std::ptr::null_mut();
/// // SAFETY: valid out-pointer, a live module, a NUL-terminated name.
/// unsafe { (table.cuModuleGetFunction)(&mut function, module, c"zero".as_ptr()).result()? };
/// # Ok(())
/// # }
/// ```
pub fn module_from_declarations() -> Result<CUmodule, sys::DriverError> {
    if let Err(code) = require() {
        code.result()?;
    }
    let handle = MODULES.insert(Arc::new(Module {
        image: 0,
        declared: Mutex::new(HashMap::new()),
        functions: Mutex::new(HashMap::new()),
    }));
    Ok(handle as CUmodule)
}

/// Define kernel `name` of `module` (a module of this driver) as taking
/// `params` and running as `twin`, so `cuModuleGetFunction` finds it and
/// `cuLaunchKernel` runs the twin over checked views of its arguments
/// ([`TwinArgs`](crate::TwinArgs)).
///
/// Safe: the twin sees only the views, and the driver checks every pointer
/// against the parameters before the twin runs, so no declaration can make
/// it touch memory it was not given. A kernel the module has already keeps
/// its parameters and twin: the same parameters again change nothing,
/// others are [`RegisterError::SignatureChanged`]; invalid parameters are
/// [`RegisterError::InvalidSignature`].
pub fn define_kernel(
    module: CUmodule,
    name: &'static str,
    params: &'static [Param],
    twin: Twin,
) -> Result<(), RegisterError> {
    signature::validate(params).map_err(|source| RegisterError::InvalidSignature {
        kernel: name,
        source,
    })?;
    let found = MODULES
        .get(module as usize)
        .map_err(|_| RegisterError::UnknownModule {
            module: module as usize,
        })?;
    let mut declared = lock(&found.declared);
    let registered = declared.get(name).map(|d| d.params).or_else(|| {
        (found.image != 0)
            .then(|| registered_signature(found.image, name))
            .flatten()
    });
    match registered {
        Some(registered) if registered != params => Err(RegisterError::SignatureChanged {
            kernel: name,
            image: found.image,
            registered,
            refused: params,
        }),
        Some(_) => Ok(()),
        None => {
            declared.insert(
                name,
                Declared {
                    name,
                    params,
                    run: Run::Safe(twin),
                },
            );
            Ok(())
        }
    }
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
                     software driver runs kernels as the CPU twins of their declarations: load \
                     a declared image (ModuleImage::declared) or compile the source (Program), \
                     with the kernels declared by kernel! with a twin"
                ),
            ));
        }
        let handle = MODULES.insert(Arc::new(Module {
            image: address,
            declared: Mutex::new(HashMap::new()),
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
        let own = lock(&module.declared).get(name.as_ref()).copied();
        let spec = match own {
            Some(spec) => spec,
            None => {
                let images = lock(&IMAGES);
                let image = images.as_ref().and_then(|images| images.get(&module.image));
                let found = image.and_then(|image| image.twins.get(name.as_ref()));
                match found {
                    Some(twin) => Declared {
                        name: twin.name,
                        params: twin.params,
                        run: Run::Raw(twin.run),
                    },
                    None => {
                        let mut known: Vec<&str> = lock(&module.declared).keys().copied().collect();
                        known.extend(image.iter().flat_map(|image| image.twins.keys().copied()));
                        known.sort_unstable();
                        return Err(fail(
                            CUresult::CUDA_ERROR_NOT_FOUND,
                            format!(
                                "module {:#x} has no function named `{name}`; its functions: {}",
                                hmod as usize,
                                if known.is_empty() {
                                    "none".to_string()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        ));
                    }
                }
            }
        };
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
    let dims = LaunchDims {
        grid: (gridDimX, gridDimY, gridDimZ),
        block: (blockDimX, blockDimY, blockDimZ),
        shared_mem_bytes: sharedMemBytes,
    };
    // SAFETY: the caller's contract for cuLaunchKernel.
    code(unsafe { launch(f, dims, hStream, kernelParams, extra, None) })
}

/// `cuLaunchKernel`, and `cuLaunchKernelEx` with the device node handle
/// the launch gets when it is captured as a device-updatable node.
///
/// # Safety
/// As for `kernel_launch`.
pub(crate) unsafe fn launch(
    f: CUfunction,
    dims: LaunchDims,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
    device_node: Option<usize>,
) -> Status {
    clear_detail();
    require()?;
    // SAFETY: the caller's contract.
    let mut launch = unsafe { kernel_launch(f, dims, kernelParams, extra) }?;
    launch.device_node = device_node;
    let stream = resolve(hStream)?;
    let inject = std::mem::take(&mut stream.state().inject_launch_fault);
    let action = if inject {
        Action::InjectedFault(launch.name)
    } else {
        Action::Kernel(Arc::new(launch))
    };
    stream.submit(&[Template::Act(action)])
}

/// The launch of `f` over `dims` with the arguments `kernelParams` points
/// at, copied now, as `cuLaunchKernel` and `cuGraphExecKernelNodeSetParams`
/// take them; refused for a function of an unloaded module, an empty or
/// too large grid, `extra`, or missing arguments.
///
/// # Safety
/// `kernelParams` holds one readable pointer per parameter of `f`, each at
/// a value of that parameter's size (CUDA's contract for a launch).
pub(crate) unsafe fn kernel_launch(
    f: CUfunction,
    dims: LaunchDims,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<Launch, CUresult> {
    let function = FUNCTIONS.get(f as usize)?;
    // Unloading the module invalidates its functions, as on CUDA.
    MODULES.get(function.module)?;
    let spec = function.spec;
    let (gridDimX, gridDimY, gridDimZ) = dims.grid;
    let (blockDimX, blockDimY, blockDimZ) = dims.block;
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
    Ok(Launch {
        name: spec.name,
        twin: spec.run,
        params: spec.params,
        dims,
        args,
        device_node: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::signature::{Access, Extent, Scalar};

    unsafe fn nothing(_: &LaunchDims, _: *mut *mut c_void) {}

    const ONE: &[Param] = &[Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Elements(1),
    }];
    const TWO: &[Param] = &[Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Elements(2),
    }];

    fn spec(name: &'static str, params: &'static [Param]) -> TwinSpec {
        TwinSpec {
            name,
            params,
            run: nothing,
        }
    }

    #[test]
    fn a_registered_signature_never_changes() {
        static IMAGE: [u8; 4] = *b"keep";
        let address = IMAGE.as_ptr() as usize;
        // SAFETY: `nothing` touches none of the elements it may write.
        unsafe { register_image(&IMAGE, &[spec("k", ONE)]) }.unwrap();
        // The same parameters again: nothing changes, no error.
        // SAFETY: as above.
        unsafe { register_image(&IMAGE, &[spec("k", ONE)]) }.unwrap();
        // Others: refused, and the list's other twins are not added either.
        // SAFETY: as above.
        let err =
            unsafe { register_image(&IMAGE, &[spec("new", ONE), spec("k", TWO)]) }.unwrap_err();
        assert_eq!(
            err,
            RegisterError::SignatureChanged {
                kernel: "k",
                image: address,
                registered: ONE,
                refused: TWO,
            }
        );
        assert!(err.to_string().contains("`k`"), "{err}");
        assert_eq!(registered_signature(address, "k"), Some(ONE));
        assert_eq!(registered_signature(address, "new"), None);
    }

    #[test]
    fn one_list_cannot_declare_a_kernel_twice_differently() {
        static IMAGE: [u8; 4] = *b"twic";
        // SAFETY: as above.
        let err = unsafe { register_image(&IMAGE, &[spec("k", ONE), spec("k", TWO)]) }.unwrap_err();
        assert!(
            matches!(
                err,
                RegisterError::SignatureChanged {
                    kernel: "k",
                    registered: ONE,
                    refused: TWO,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(registered_signature(IMAGE.as_ptr() as usize, "k"), None);
    }

    #[test]
    fn an_invalid_signature_registers_nothing_of_the_list() {
        static IMAGE: [u8; 4] = *b"inva";
        const BAD: &[Param] = &[Param::Pointer {
            elem: Scalar::U32,
            access: Access::Write,
            extent: Extent::Arg(1),
        }];
        // SAFETY: as above.
        let err =
            unsafe { register_image(&IMAGE, &[spec("good", ONE), spec("bad", BAD)]) }.unwrap_err();
        let RegisterError::InvalidSignature { kernel, source } = &err else {
            panic!("{err:?}");
        };
        assert_eq!((*kernel, source.param), ("bad", 0));
        assert!(
            err.to_string()
                .contains("its element count is parameter 1, but the kernel has 1 parameter(s)"),
            "{err}"
        );
        assert_eq!(registered_signature(IMAGE.as_ptr() as usize, "good"), None);
    }
}
