//! Typed kernel arguments ([`KernelArg`]): a scalar of an exact type, or a
//! buffer lent for reading or writing, as a launch passes and tracks it.

use crate::enqueue::protocol::Lent;
use crate::ground::arg_kind::ArgKind;
use crate::objects::memory::{DeviceCopy, DeviceMemory, DeviceMemoryMut, DeviceUse, device_bytes};
use std::ffi::c_void;
use std::fmt;
use sys::CUdeviceptr;
use sys::signature::Scalar;

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

/// A buffer argument: the memory as lent (its use hooks) and what a
/// signature checks.
#[derive(Clone, Copy)]
pub(crate) struct BufferArg<'a> {
    pub(crate) lent: Lent<'a>,
    pub(crate) elem: Option<Scalar>,
    pub(crate) bytes: usize,
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
    pub(crate) value: ArgValue,
    pub(crate) buffer: Option<BufferArg<'a>>,
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
    #[inline]
    pub(crate) fn lend<M: DeviceMemory>(memory: &'a M, writable: bool) -> Self {
        Self {
            value: ArgValue::Pointer(memory.device_ptr()),
            buffer: Some(BufferArg {
                lent: Lent::of(memory, writable),
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
                lent: Lent::of_use(memory, writable),
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
                writable: buffer.lent.writable,
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
    /// [`Stream::launch_unchecked`](crate::Stream::launch_unchecked) (a checked launch refuses it: its length
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
    pub(crate) fn scalar(&self) -> Option<Scalar> {
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
    pub(crate) fn count(&self) -> Option<u64> {
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
    pub(crate) fn param(&self) -> *mut c_void {
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
                self.value, buffer.bytes, buffer.lent.writable
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
        Self::lend(memory, false)
    }
}

/// `&mut memory`: lent for writing.
impl<'a, M: DeviceMemoryMut> From<&'a mut M> for KernelArg<'a> {
    fn from(memory: &'a mut M) -> Self {
        // Writable: the `&mut` keeps every host reference away meanwhile.
        Self::lend(&*memory, true)
    }
}
