//! Launch configuration, typed kernel arguments, and launching on a stream.

use crate::enqueue::{Use, Work};
use crate::error::{Error, Result};
use crate::memory::sealed::DeviceUse;
use crate::memory::{DeviceBuffer, DeviceCopy, UnifiedBuffer};
use crate::module::Kernel;
use crate::stream::Stream;
use std::ffi::c_void;
use std::fmt;
use sys::CUdeviceptr;

/// Grid and block shape of a launch, with dynamic shared memory.
///
/// ```
/// use cuda_streams_driver::LaunchConfig;
/// let cfg = LaunchConfig::for_num_elems(1000);
/// assert_eq!((cfg.grid_dim, cfg.block_dim), ((4, 1, 1), (256, 1, 1)));
/// assert!(cfg.validate().is_ok());
/// let too_big = LaunchConfig { block_dim: (64, 32, 1), ..cfg };
/// assert!(too_big.validate().unwrap_err().to_string().contains("2048"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in the grid (x, y, z).
    pub grid_dim: (u32, u32, u32),
    /// Threads in a block (x, y, z); at most 1024 in all.
    pub block_dim: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// The most threads a block may have on every supported GPU.
    pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
    /// The block size `for_num_elems` uses.
    pub const DEFAULT_BLOCK: u32 = 256;

    /// One thread per element in blocks of 256 (at least one block, so the
    /// kernel must check its bounds).
    pub fn for_num_elems(n: u32) -> Self {
        Self {
            grid_dim: (n.div_ceil(Self::DEFAULT_BLOCK).max(1), 1, 1),
            block_dim: (Self::DEFAULT_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Reject zero dimensions, blocks over 1024 threads, and grids beyond the
    /// hardware's limits (x < 2^31, y and z <= 65535), naming the value.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidLaunchConfig { reason });
        let (bx, by, bz) = self.block_dim;
        let (gx, gy, gz) = self.grid_dim;
        if bx == 0 || by == 0 || bz == 0 {
            return invalid(format!(
                "block_dim {:?} has a zero dimension",
                self.block_dim
            ));
        }
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if threads > u64::from(Self::MAX_THREADS_PER_BLOCK) {
            return invalid(format!(
                "block_dim {:?} has {threads} threads; a block may have at most {}",
                self.block_dim,
                Self::MAX_THREADS_PER_BLOCK
            ));
        }
        if gx == 0 || gy == 0 || gz == 0 {
            return invalid(format!("grid_dim {:?} has a zero dimension", self.grid_dim));
        }
        if gx > i32::MAX as u32 || gy > 65_535 || gz > 65_535 {
            return invalid(format!(
                "grid_dim {:?} exceeds the limits (2^31 - 1, 65535, 65535)",
                self.grid_dim
            ));
        }
        Ok(())
    }
}

/// The kind of a kernel parameter, for signature checks.
///
/// ```
/// use cuda_streams_driver::ArgKind;
/// assert_eq!(ArgKind::Pointer.size(), 8);
/// assert!(ArgKind::Bytes(4).accepts(ArgKind::F32));
/// assert!(!ArgKind::F32.accepts(ArgKind::U32), "same size, different kind");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgKind {
    /// `unsigned int`.
    U32,
    /// `int`.
    I32,
    /// `unsigned long long` / `size_t`.
    U64,
    /// `long long`.
    I64,
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// A device pointer (`T*`).
    Pointer,
    /// Any value of this many bytes (when only sizes are known).
    Bytes(usize),
}

impl ArgKind {
    /// The parameter's size in bytes.
    pub fn size(self) -> usize {
        match self {
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::Pointer => 8,
            Self::Bytes(n) => n,
        }
    }

    /// Whether an argument of kind `actual` may be passed for this parameter.
    pub fn accepts(self, actual: ArgKind) -> bool {
        match self {
            Self::Bytes(n) => actual.size() == n,
            expected => expected == actual,
        }
    }
}

impl fmt::Display for ArgKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::U32 => f.write_str("u32"),
            Self::I32 => f.write_str("i32"),
            Self::U64 => f.write_str("u64"),
            Self::I64 => f.write_str("i64"),
            Self::F32 => f.write_str("f32"),
            Self::F64 => f.write_str("f64"),
            Self::Pointer => f.write_str("a device pointer"),
            Self::Bytes(n) => write!(f, "a {n}-byte value"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ArgValue {
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Pointer(CUdeviceptr),
}

/// One kernel argument: a scalar, or a buffer (passed as its device pointer).
///
/// Build them with `.into()` / `KernelArg::from`: `&buffer` passes a buffer
/// the kernel reads, `&mut buffer` one it writes. A buffer argument registers
/// the launch as a use of the buffer on the stream, so the buffer is not freed
/// before the kernel has run.
///
/// ```
/// use cuda_streams_driver::{ArgKind, Context, DeviceBuffer, KernelArg, Stream};
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut buf = DeviceBuffer::<f32>::new_async(&stream, 16).unwrap();
/// let args = [KernelArg::from(&mut buf), 2.5f32.into(), 16u32.into()];
/// assert_eq!(args.map(|a| a.kind()), [ArgKind::Pointer, ArgKind::F32, ArgKind::U32]);
/// ```
pub struct KernelArg<'a> {
    value: ArgValue,
    buffer: Option<(&'a dyn DeviceUse, bool)>,
}

impl KernelArg<'_> {
    /// The argument's kind.
    pub fn kind(&self) -> ArgKind {
        match self.value {
            ArgValue::U32(_) => ArgKind::U32,
            ArgValue::I32(_) => ArgKind::I32,
            ArgValue::U64(_) => ArgKind::U64,
            ArgValue::I64(_) => ArgKind::I64,
            ArgValue::F32(_) => ArgKind::F32,
            ArgValue::F64(_) => ArgKind::F64,
            ArgValue::Pointer(_) => ArgKind::Pointer,
        }
    }

    /// A raw device pointer from memory this crate does not own (another
    /// allocator, cudarc, cust).
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

    /// Where the value lives, as `cuLaunchKernel` wants it.
    fn param(&self) -> *mut c_void {
        let ptr: *const c_void = match &self.value {
            ArgValue::U32(v) => (v as *const u32).cast(),
            ArgValue::I32(v) => (v as *const i32).cast(),
            ArgValue::U64(v) => (v as *const u64).cast(),
            ArgValue::I64(v) => (v as *const i64).cast(),
            ArgValue::F32(v) => (v as *const f32).cast(),
            ArgValue::F64(v) => (v as *const f64).cast(),
            ArgValue::Pointer(v) => (v as *const CUdeviceptr).cast(),
        };
        ptr.cast_mut()
    }
}

impl fmt::Debug for KernelArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.buffer {
            Some((_, write)) => write!(f, "{:?} (buffer, write: {write})", self.value),
            None => write!(f, "{:?}", self.value),
        }
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $variant:ident),*) => { $(
        impl From<$t> for KernelArg<'_> {
            fn from(value: $t) -> Self {
                Self { value: ArgValue::$variant(value.into()), buffer: None }
            }
        }
    )* };
}
scalar_arg!(u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);

impl From<usize> for KernelArg<'_> {
    fn from(value: usize) -> Self {
        Self {
            value: ArgValue::U64(value as u64),
            buffer: None,
        }
    }
}

/// `&buffer` / `&mut buffer` as an argument. `$shared_write` says whether a
/// shared borrow still counts as a write: for unified memory it does, since the
/// host can see that memory and a kernel may write whatever it is given.
macro_rules! buffer_arg {
    ($($buffer:ident => $shared_write:expr),*) => { $(
        impl<'a, T: DeviceCopy> From<&'a $buffer<T>> for KernelArg<'a> {
            fn from(buffer: &'a $buffer<T>) -> Self {
                Self {
                    value: ArgValue::Pointer(buffer.as_device_ptr()),
                    buffer: Some((buffer, $shared_write)),
                }
            }
        }
        impl<'a, T: DeviceCopy> From<&'a mut $buffer<T>> for KernelArg<'a> {
            fn from(buffer: &'a mut $buffer<T>) -> Self {
                Self {
                    value: ArgValue::Pointer(buffer.as_device_ptr()),
                    buffer: Some((&*buffer, true)),
                }
            }
        }
    )* };
}
buffer_arg!(DeviceBuffer => false, UnifiedBuffer => true);

impl Stream {
    /// Launch `kernel` with `config` and `args`, asynchronously.
    ///
    /// Checks the configuration ([`LaunchConfig::validate`]), the argument
    /// count and kinds when the kernel has a signature
    /// ([`Kernel::with_signature`]), and that every buffer belongs to this
    /// stream's context; then registers each buffer argument as used on this
    /// stream, so no buffer is freed (or, for unified memory, handed to the
    /// host) before the kernel has run.
    ///
    /// Kernels are trusted code: what a kernel does with the pointers it is
    /// given (out-of-bounds accesses, writes through a `&buffer`) is beyond
    /// any host-side check, as with every CUDA binding. The images this
    /// workspace ships are tested against CPU references.
    pub fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        config.validate()?;
        self.check_context("the kernel", kernel.context())?;
        kernel.check_args(args)?;
        let uses = args
            .iter()
            .filter_map(|arg| arg.buffer)
            .map(|(buffer, write)| Use::Device(buffer, write));
        let mut params: Vec<*mut c_void> = args.iter().map(KernelArg::param).collect();
        let params_ptr = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        let (gx, gy, gz) = config.grid_dim;
        let (bx, by, bz) = config.block_dim;
        self.enqueue_tracked(uses, Work::KernelLaunch, |driver, stream| {
            // SAFETY: `params[i]` points at argument i's value inside `args`, alive
            // for this call (the driver copies them); buffer arguments stay
            // allocated until the stream passes the launch (tracked); the
            // kernel's handle is kept alive by `kernel`.
            unsafe {
                (driver.cuLaunchKernel)(
                    kernel.as_raw(),
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

    /// Check `args` against the signature, when there is one.
    pub fn check_args(&self, args: &[KernelArg<'_>]) -> Result<()> {
        let Some(signature) = self.signature() else {
            return Ok(());
        };
        if signature.len() != args.len() {
            return Err(Error::ArgumentCount {
                kernel: self.name().to_string(),
                expected: signature.len(),
                actual: args.len(),
            });
        }
        for (index, (expected, arg)) in signature.iter().zip(args).enumerate() {
            let actual = arg.kind();
            if !expected.accepts(actual) {
                return Err(Error::ArgumentMismatch {
                    kernel: self.name().to_string(),
                    index,
                    expected: *expected,
                    expected_size: expected.size(),
                    actual,
                    actual_size: actual.size(),
                });
            }
        }
        Ok(())
    }
}
