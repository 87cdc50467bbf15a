//! Typed kernel arguments and launching on a stream (the configuration
//! is `launch_config`'s).

use crate::enqueue::protocol::{Use, Work};
use crate::features::graph::refuse_eager_conditions;
use crate::features::launch_config::LaunchConfig;
use crate::features::module::Kernel;
use crate::features::pdl_policy::Dependency;
use crate::ground::arg_kind::ArgKind;
use crate::ground::error::{Error, Result};
use crate::objects::memory::{DeviceCopy, DeviceMemory, DeviceMemoryMut, DeviceUse, device_bytes};
use crate::objects::stream::Stream;
use std::ffi::c_void;
use std::fmt;
use sys::CUdeviceptr;
use sys::signature::{Access, Extent, Param, Scalar};

/// An argument's value: what a launch passes for it. Captured launches
/// keep their scalars as these (`graph::GraphArg`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum ArgValue {
    U8(u8),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Pointer(CUdeviceptr),
    /// A graph's condition handle and the capture family that made it.
    Condition(u64, u64),
}

/// A buffer argument: the memory's use hooks and what a signature checks.
#[derive(Clone, Copy)]
struct BufferArg<'a> {
    memory: &'a dyn DeviceUse,
    writable: bool,
    elem: Option<Scalar>,
    bytes: usize,
}

/// One kernel argument: a scalar of an exact type, or a buffer (passed as
/// its device pointer).
///
/// Build them with `.into()` / `KernelArg::from`: `&buffer` lends any
/// [`DeviceMemory`] for reading, `&mut buffer` a [`DeviceMemoryMut`] for
/// writing. A buffer argument registers the launch as a use of the buffer on
/// the stream, so the buffer is neither freed nor handed to the host before
/// the kernel has run.
///
/// ```
/// use cuda_streams_driver::{ArgKind, Context, DeviceBuffer, KernelArg, Stream};
/// use cuda_streams_driver::sys::signature::Scalar;
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut buf = DeviceBuffer::<f32>::new_async(&stream, 16).unwrap();
/// let args = [KernelArg::from(&mut buf), 2.5f32.into(), 16u32.into()];
/// assert_eq!(args[1].kind(), ArgKind::Scalar(Scalar::F32));
/// assert_eq!(args[2].kind(), ArgKind::Scalar(Scalar::U32));
/// ```
pub struct KernelArg<'a> {
    value: ArgValue,
    buffer: Option<BufferArg<'a>>,
}

impl<'a> KernelArg<'a> {
    /// A scalar argument of `value` (a pointer one counts as a raw pointer).
    pub(crate) fn from_value(value: ArgValue) -> Self {
        Self {
            value,
            buffer: None,
        }
    }

    /// Its value, which a scalar's argument is entirely.
    pub(crate) fn value(&self) -> ArgValue {
        self.value
    }

    /// A buffer argument lent for reading, or for writing when `writable`
    /// (the caller has made sure nothing on the host can see the writes).
    pub(crate) fn lend<M: DeviceMemory>(memory: &'a M, writable: bool) -> Self {
        Self {
            value: ArgValue::Pointer(memory.device_ptr()),
            buffer: Some(BufferArg {
                memory,
                writable,
                elem: M::Elem::SCALAR,
                bytes: device_bytes(memory),
            }),
        }
    }

    /// A buffer argument of `bytes` bytes of `elem`s that is no
    /// [`DeviceMemory`] (a graph's own memory), lent as [`KernelArg::lend`]
    /// lends.
    pub(crate) fn lend_use(
        memory: &'a dyn DeviceUse,
        writable: bool,
        elem: Option<Scalar>,
        bytes: usize,
    ) -> Self {
        Self {
            value: ArgValue::Pointer(memory.use_bytes().0),
            buffer: Some(BufferArg {
                memory,
                writable,
                elem,
                bytes,
            }),
        }
    }
}

impl KernelArg<'_> {
    /// The argument's kind.
    pub fn kind(&self) -> ArgKind {
        match (self.value, &self.buffer) {
            (_, Some(buffer)) => ArgKind::Buffer {
                elem: buffer.elem,
                writable: buffer.writable,
            },
            (ArgValue::Pointer(_), None) => ArgKind::RawPointer,
            (ArgValue::Condition(..), None) => ArgKind::Condition,
            (ArgValue::U8(_), None) => ArgKind::Scalar(Scalar::U8),
            (ArgValue::U32(_), None) => ArgKind::Scalar(Scalar::U32),
            (ArgValue::I32(_), None) => ArgKind::Scalar(Scalar::I32),
            (ArgValue::U64(_), None) => ArgKind::Scalar(Scalar::U64),
            (ArgValue::I64(_), None) => ArgKind::Scalar(Scalar::I64),
            (ArgValue::F32(_), None) => ArgKind::Scalar(Scalar::F32),
            (ArgValue::F64(_), None) => ArgKind::Scalar(Scalar::F64),
        }
    }

    /// A raw device pointer from memory this crate does not own, for
    /// [`Stream::launch_unchecked`] (a checked launch refuses it: its length
    /// is unknown). Memory from other crates is better passed through a
    /// [`DeviceMemory`] implementation, which checked launches accept.
    ///
    /// # Safety
    /// The memory must stay allocated until the kernel launched with this
    /// argument has finished, and hold what the kernel expects.
    pub unsafe fn raw_pointer(ptr: CUdeviceptr) -> KernelArg<'static> {
        KernelArg {
            value: ArgValue::Pointer(ptr),
            buffer: None,
        }
    }

    /// The scalar type of a scalar argument (`None` for a buffer or a raw
    /// pointer): what a scalar parameter is checked against.
    #[inline]
    fn scalar(&self) -> Option<Scalar> {
        if self.buffer.is_some() {
            return None;
        }
        Some(match self.value {
            ArgValue::U8(_) => Scalar::U8,
            ArgValue::U32(_) => Scalar::U32,
            ArgValue::I32(_) => Scalar::I32,
            ArgValue::U64(_) => Scalar::U64,
            ArgValue::I64(_) => Scalar::I64,
            ArgValue::F32(_) => Scalar::F32,
            ArgValue::F64(_) => Scalar::F64,
            ArgValue::Pointer(_) | ArgValue::Condition(..) => return None,
        })
    }

    /// The value as an element count, when it is an integer scalar.
    #[inline]
    fn count(&self) -> Option<u64> {
        match (self.value, &self.buffer) {
            (_, Some(_)) | (ArgValue::Pointer(_) | ArgValue::Condition(..), _) => None,
            (ArgValue::U8(v), _) => Some(u64::from(v)),
            (ArgValue::U32(v), _) => Some(u64::from(v)),
            (ArgValue::I32(v), _) => Some(v.max(0) as u64),
            (ArgValue::U64(v), _) => Some(v),
            (ArgValue::I64(v), _) => Some(v.max(0) as u64),
            (ArgValue::F32(_) | ArgValue::F64(_), _) => None,
        }
    }

    /// Where the value lives, as `cuLaunchKernel` wants it.
    fn param(&self) -> *mut c_void {
        let ptr: *const c_void = match &self.value {
            ArgValue::U8(v) => (v as *const u8).cast(),
            ArgValue::U32(v) => (v as *const u32).cast(),
            ArgValue::I32(v) => (v as *const i32).cast(),
            ArgValue::U64(v) => (v as *const u64).cast(),
            ArgValue::I64(v) => (v as *const i64).cast(),
            ArgValue::F32(v) => (v as *const f32).cast(),
            ArgValue::F64(v) => (v as *const f64).cast(),
            ArgValue::Pointer(v) => (v as *const CUdeviceptr).cast(),
            ArgValue::Condition(raw, _) => (raw as *const u64).cast(),
        };
        ptr.cast_mut()
    }
}

impl fmt::Debug for KernelArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.buffer {
            Some(buffer) => write!(
                f,
                "{:?} ({} bytes, writable: {})",
                self.value, buffer.bytes, buffer.writable
            ),
            None => write!(f, "{:?}", self.value),
        }
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $variant:ident),*) => { $(
        impl From<$t> for KernelArg<'_> {
            fn from(value: $t) -> Self {
                Self { value: ArgValue::$variant(value), buffer: None }
            }
        }
    )* };
}
scalar_arg!(u8 => U8, u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);

/// `usize` is a `u64` (`size_t`) on every platform CUDA supports.
impl From<usize> for KernelArg<'_> {
    fn from(value: usize) -> Self {
        Self {
            value: ArgValue::U64(value as u64),
            buffer: None,
        }
    }
}

/// `&memory`: lent for reading.
impl<'a, M: DeviceMemory> From<&'a M> for KernelArg<'a> {
    fn from(memory: &'a M) -> Self {
        Self {
            value: ArgValue::Pointer(memory.device_ptr()),
            buffer: Some(BufferArg {
                memory,
                writable: false,
                elem: M::Elem::SCALAR,
                bytes: device_bytes(memory),
            }),
        }
    }
}

/// `&mut memory`: lent for writing.
impl<'a, M: DeviceMemoryMut> From<&'a mut M> for KernelArg<'a> {
    fn from(memory: &'a mut M) -> Self {
        let memory = &*memory;
        Self {
            value: ArgValue::Pointer(memory.device_ptr()),
            buffer: Some(BufferArg {
                memory,
                writable: true,
                elem: M::Elem::SCALAR,
                bytes: device_bytes(memory),
            }),
        }
    }
}

/// Arguments up to this many are laid out on the stack.
const INLINE_ARGS: usize = 16;

impl Stream {
    /// Launch `kernel` with `config` and `args`, asynchronously, after
    /// checking every argument against the kernel's signature.
    ///
    /// The kernel must have a signature: a kernel of an image that declares
    /// it ([`ModuleImage`](crate::ModuleImage), as the kernels crate's images
    /// do) gets it when looked up
    /// ([`Module::function`](crate::Module::function)); others are declared
    /// with the `unsafe` [`Kernel::with_signature`], or launched with
    /// [`Stream::launch_unchecked`]. Checked before the driver sees anything:
    /// the configuration ([`LaunchConfig::validate`]); the argument count;
    /// each scalar's exact type (an `f64` is no `f32`, a `u32` no `u64`); each
    /// pointer parameter gets a buffer (never a raw pointer) of its element
    /// type, lent `&mut` when the kernel writes it, and holding at least the
    /// elements the kernel is told to touch; every buffer belongs to this
    /// stream's context. Then each buffer is registered as used on this
    /// stream, so none is freed, or handed to the host, before the kernel has
    /// run.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, LaunchConfig, Module, Stream};
    /// use kernels::ELEMENTWISE;
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// // fill_f32(u64 n, f32 value, f32* out): its signature comes with it.
    /// let fill = Module::load(&ctx, &ELEMENTWISE).unwrap().function("fill_f32").unwrap();
    /// let mut out = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    /// let cfg = LaunchConfig::for_num_elems(4);
    /// stream.launch(&fill, cfg, &[4u64.into(), 2.5f32.into(), (&mut out).into()]).unwrap();
    /// assert_eq!(out.to_vec(&stream).unwrap(), [2.5; 4]);
    /// // Each of these is refused before the driver sees it:
    /// let refused = |args: &[cuda_streams_driver::KernelArg<'_>], says: &str| {
    ///     let err = stream.launch(&fill, cfg, args).unwrap_err();
    ///     assert!(err.to_string().contains(says), "{err}");
    /// };
    /// refused(&[4u32.into(), 2.5f32.into(), (&mut out).into()], "expected u64");
    /// refused(&[4u64.into(), 2.5.into(), (&mut out).into()], "expected f32");
    /// refused(&[5u64.into(), 2.5f32.into(), (&mut out).into()], "holds 4 element(s)");
    /// refused(&[4u64.into(), 2.5f32.into(), (&out).into()], "lent as &");
    /// ```
    pub fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        self.launch_checked(kernel, config, args, Dependency::Stream)
    }

    /// [`Stream::launch`], ordered after the work before it as `dependency`
    /// says (plainly, or as a programmatic dependent launch).
    #[inline]
    pub(crate) fn launch_checked(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        dependency: Dependency,
    ) -> Result<()> {
        let Some(signature) = kernel.signature() else {
            return Err(kernel.unchecked_error());
        };
        // SAFETY: it is the kernel's signature.
        unsafe { self.launch_against(kernel, signature, config, args, dependency) }
    }

    /// [`Stream::launch`] with the kernel's signature given: a declared
    /// kernel's typed launcher passes its declaration's constant, so that,
    /// inlined there, the check folds against the arguments' known types.
    ///
    /// `dependency` says whether it was asked to be a programmatic
    /// dependent launch (`features/dependent_launch.rs`).
    ///
    /// # Safety
    /// `signature` is `kernel`'s signature.
    #[inline(always)]
    pub(crate) unsafe fn launch_against(
        &self,
        kernel: &Kernel,
        signature: &[Param],
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        dependency: Dependency,
    ) -> Result<()> {
        let mut extents = Extents::new();
        kernel.check_params(signature, args, &mut extents)?;
        // SAFETY: every argument matches the kernel's declared parameters
        // (checked above against its signature, the caller's promise): exact
        // scalar types, and buffers of the declared element type that hold
        // every element the kernel touches, lent mutably where it writes. The
        // declaration is the contract of the `unsafe` `with_signature`, or of
        // the image's.
        unsafe { self.launch_with(kernel, config, args, Some(&extents), dependency) }
    }

    /// Launch `kernel` without checking `args` against a signature (one is
    /// not needed); the configuration, the buffers' contexts and their use
    /// tracking are still handled as by [`Stream::launch`].
    ///
    /// # Safety
    /// The arguments must be what the kernel's parameters are, in count,
    /// order and type, and every pointer must address memory that holds what
    /// the kernel reads and writes through it, for as long as the kernel
    /// runs (buffers passed as [`KernelArg`]s stay allocated by themselves;
    /// raw pointers are the caller's to keep alive). The kernel must not
    /// write through a buffer lent as `&` (a shared borrow: the host may be
    /// reading it).
    pub unsafe fn launch_unchecked(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        // SAFETY: the caller's contract, as above.
        unsafe { self.launch_with(kernel, config, args, None, Dependency::Stream) }
    }

    /// The launch itself. With `extents` (a checked launch: one per buffer
    /// argument, in order), the stream-order tracker sees each buffer over
    /// the bytes the signature says the kernel touches, read or written as
    /// declared; without, over the whole buffer, written when lent mutably.
    /// A programmatic launch takes the same step as a plain one: its kernel
    /// touches nothing before `cudaGridDependencySynchronize`
    /// (`features/dependent_launch.rs` says why that is enough).
    ///
    /// # Safety
    /// As for [`Stream::launch_unchecked`]; `extents` are what
    /// [`Kernel::checked_extents`] returned for these `args`.
    unsafe fn launch_with(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        extents: Option<&[BufferExtent]>,
        dependency: Dependency,
    ) -> Result<()> {
        config.validate()?;
        refuse_eager_conditions(kernel, args)?;
        self.check_context("the kernel", kernel.context())?;
        let programmatic = dependency.resolve(kernel, self.context().info())?;
        let uses = args
            .iter()
            .filter_map(|arg| arg.buffer)
            .enumerate()
            .map(move |(i, buffer)| match extents.and_then(|e| e.get(i)) {
                Some(extent) => {
                    Use::Extent(buffer.memory, buffer.writable, extent.bytes, extent.writes)
                }
                None => Use::Device(buffer.memory, buffer.writable),
            });
        let function = self.function_for(kernel)?;
        self.enqueue_tracked(uses, Work::KernelLaunch, |driver, stream| {
            // SAFETY: buffer arguments stay allocated until the stream passes
            // the launch (tracked); the function is the kernel's for this
            // stream, alive while the kernel and the stream are; what the
            // arguments mean to the kernel is the caller's contract.
            unsafe {
                launch_raw(
                    driver,
                    stream,
                    function,
                    config,
                    args,
                    LaunchAttrs::programmatic(programmatic),
                )
            }
        })
        .map_err(|err| name_the_racing_argument(err, kernel, args))
    }

    /// The handle `cuLaunchKernel` takes for `kernel` on this stream: the
    /// kernel's own, or on a partition's stream on a GPU, the same kernel
    /// loaded for the partition (`Kernel::function_in`), because a
    /// module's function runs only in the context it was loaded in.
    /// Inlined: on a stream of no partition it is one downcast per launch.
    #[inline]
    pub(crate) fn function_for(&self, kernel: &Kernel) -> Result<sys::CUfunction> {
        match self.partition() {
            Some(partition) if !self.context().loaded_driver().runs_twins() => {
                kernel.function_in(partition)
            }
            _ => Ok(kernel.as_raw()),
        }
    }
}

/// A race found for a launch names the kernel, and the argument whose
/// buffer starts where the racing bytes' buffer does: the tracker knows
/// addresses, the launch knows what they were passed as.
#[cold]
fn name_the_racing_argument(err: Error, kernel: &Kernel, args: &[KernelArg<'_>]) -> Error {
    let Error::UnorderedAccess(mut race) = err else {
        return err;
    };
    race.later.kernel = Some(kernel.name().to_string());
    race.later.argument = args.iter().position(|arg| {
        arg.buffer
            .is_some_and(|buffer| buffer.memory.use_bytes().0 == race.buffer)
    });
    Error::UnorderedAccess(race)
}

/// `cuLaunchKernel` of `function` with `args` laid out as `kernelParams`;
/// `cuLaunchKernelEx` when `attrs` asks for launch attributes.
///
/// # Safety
/// `stream` is a live stream of the kernel's context, current on this thread;
/// `function` is the kernel's handle for that stream
/// ([`Stream::function_for`]), alive for the call; the arguments are what
/// the kernel's parameters are, and the memory they point at stays
/// allocated for as long as the launch may run.
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
    let mut inline = [std::ptr::null_mut::<c_void>(); INLINE_ARGS];
    let mut spilled = Vec::new();
    let params: &mut [*mut c_void] = if args.len() <= INLINE_ARGS {
        for (slot, arg) in inline.iter_mut().zip(args) {
            *slot = arg.param();
        }
        &mut inline[..args.len()]
    } else {
        spilled.extend(args.iter().map(KernelArg::param));
        &mut spilled
    };
    let params_ptr = if params.is_empty() {
        std::ptr::null_mut()
    } else {
        params.as_mut_ptr()
    };
    call(params_ptr)
}

impl Kernel {
    /// Launch on `stream`; the same as [`Stream::launch`].
    pub fn launch(
        &self,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        stream.launch(self, config, args)
    }

    /// Check `args` against the signature, as [`Stream::launch`] does.
    pub fn check_args(&self, args: &[KernelArg<'_>]) -> Result<()> {
        self.check_into(args, &mut Extents::new())
    }

    /// [`Kernel::check_args`], pushing what the kernel touches through each
    /// buffer argument, in order, onto `extents` (the caller's, on its
    /// stack: nothing is returned by value or allocated for up to eight
    /// buffers). The loop is the only work on the success path; every error
    /// is built out of line.
    #[inline]
    pub(crate) fn check_into(&self, args: &[KernelArg<'_>], extents: &mut Extents) -> Result<()> {
        let Some(signature) = self.signature() else {
            return Err(self.unchecked_error());
        };
        self.check_params(signature, args, extents)
    }

    /// [`Kernel::check_into`] against `signature`, which callers take from
    /// the kernel: inlined everywhere, so that where the signature is a
    /// constant (a declared kernel's) and the arguments were just built from
    /// typed values, the loop folds down to the length comparisons.
    #[inline(always)]
    fn check_params(
        &self,
        signature: &[Param],
        args: &[KernelArg<'_>],
        extents: &mut Extents,
    ) -> Result<()> {
        if signature.len() != args.len() {
            return Err(self.count_error(signature.len(), args.len()));
        }
        for (index, (param, arg)) in signature.iter().zip(args).enumerate() {
            match *param {
                Param::Scalar(scalar) => {
                    if arg.scalar() != Some(scalar) {
                        return Err(self.mismatch(index, *param, arg));
                    }
                }
                Param::Condition => {
                    if arg.kind() != ArgKind::Condition {
                        return Err(self.mismatch(index, *param, arg));
                    }
                }
                Param::Pointer {
                    elem,
                    access,
                    extent,
                } => {
                    let Some(buffer) = &arg.buffer else {
                        return Err(self.mismatch(index, *param, arg));
                    };
                    let writes = access == Access::Write;
                    if buffer.elem != Some(elem) || (writes && !buffer.writable) {
                        return Err(self.mismatch(index, *param, arg));
                    }
                    let count = match extent {
                        Extent::Elements(count) => count,
                        // The signature was validated: the index is an integer scalar,
                        // whose argument was checked above or is checked below.
                        Extent::Arg(at) => match args.get(at).and_then(KernelArg::count) {
                            Some(count) => count,
                            None => return Err(self.mismatch(at, signature[at], &args[at])),
                        },
                    };
                    match count.checked_mul(elem.size() as u64) {
                        Some(needed) if needed <= buffer.bytes as u64 => {
                            extents.push(BufferExtent {
                                bytes: needed as usize,
                                writes,
                            });
                        }
                        _ => return Err(self.too_short(index, count, elem, buffer.bytes)),
                    }
                }
            }
        }
        Ok(())
    }

    #[cold]
    pub(crate) fn unchecked_error(&self) -> Error {
        Error::UncheckedKernel {
            kernel: self.name().to_string(),
        }
    }

    #[cold]
    fn count_error(&self, expected: usize, actual: usize) -> Error {
        Error::ArgumentCount {
            kernel: self.name().to_string(),
            expected,
            actual,
        }
    }

    #[cold]
    fn mismatch(&self, index: usize, expected: Param, arg: &KernelArg<'_>) -> Error {
        Error::ArgumentMismatch {
            kernel: self.name().to_string(),
            index,
            expected,
            actual: arg.kind(),
        }
    }

    #[cold]
    fn too_short(&self, index: usize, elements: u64, elem: Scalar, bytes: usize) -> Error {
        Error::ArgumentTooShort {
            kernel: self.name().to_string(),
            index,
            elements,
            elem,
            bytes,
        }
    }
}

/// What a checked launch touches through its buffer arguments, in order;
/// on the stack for up to eight buffers.
pub(crate) type Extents = smallvec::SmallVec<[BufferExtent; 8]>;

/// What a checked launch touches through one buffer argument: its first
/// `bytes` bytes, written when `writes` (the signature's extent and access).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BufferExtent {
    bytes: usize,
    writes: bool,
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
    let mut list: [sys::CUlaunchAttribute; 2] = Default::default();
    let mut count = 0;
    if attrs.programmatic {
        list[count].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        list[count].value.programmaticStreamSerializationAllowed = 1;
        count += 1;
    }
    if attrs.device_updatable {
        list[count].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE;
        list[count].value.deviceUpdatableKernelNode.deviceUpdatable = 1;
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
        attrs: list.as_mut_ptr(),
        numAttrs: count as u32,
    };
    // SAFETY: `launch` and `list` live for the call (the driver copies
    // them); the rest is the caller's contract.
    unsafe { (driver.cuLaunchKernelEx)(&launch, function, params, std::ptr::null_mut()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DeviceBuffer, Module};

    #[test]
    fn a_kernel_without_a_signature_launches_only_unchecked() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        crate::kernel! {
            struct FillU32: fn fill_u32(n: u64, value: u32, out: &mut [u32; n]);
            twin = per_grid(|_, _n, value, out| out.fill(value));
        }
        use crate::DeclaredKernel;
        static DECLS: &[crate::KernelDecl] = &[FillU32::DECL];
        // SAFETY: fill_u32(u64 n, u32 value, u32* out) writes out[0..n].
        let image = unsafe { crate::ModuleImage::declared(kernels::ELEMENTWISE.fatbin(), DECLS) };
        let module = Module::load(&ctx, image).unwrap();
        let mut fill = module.function("fill_u32").unwrap();
        // As a kernel of an image nobody declared would be.
        fill.signature = None;
        let mut out = DeviceBuffer::<u32>::new_async(&stream, 8).unwrap();
        let cfg = LaunchConfig::for_num_elems(8);
        // A declared type around it refuses too: its fast path needs the
        // kernel's signature to be the declaration, the checked path one.
        let err = FillU32::from_kernel(fill.clone())
            .launch(&stream, cfg, 8, 3, &mut out)
            .unwrap_err();
        assert!(matches!(err, Error::UncheckedKernel { .. }), "{err:?}");
        assert_eq!(stream.metrics().kernel_launches, 0);
        let args = [KernelArg::from(8u64), 3u32.into(), (&mut out).into()];
        let err = stream.launch(&fill, cfg, &args).unwrap_err();
        assert!(matches!(err, Error::UncheckedKernel { .. }), "{err:?}");
        assert!(err.to_string().contains("fill_u32"), "{err}");
        // SAFETY: fill_u32(u64 n, u32 value, u32* out) over a buffer of n u32s.
        unsafe { stream.launch_unchecked(&fill, cfg, &args) }.unwrap();
        assert_eq!(out.to_vec(&stream).unwrap(), [3; 8]);
    }
}
