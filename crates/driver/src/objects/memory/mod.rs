//! Buffers: device, page-locked host, and unified memory, with the use tracking
//! that keeps asynchronous work from outliving the memory it touches.

/// The accessors every buffer type shares, expanded inside its `impl` block
/// (each buffer has `ctx: Arc<Context>` and `len: usize`).
macro_rules! common_accessors {
    () => {
        /// The number of elements (never 0).
        pub fn len(&self) -> usize {
            self.len
        }

        /// Always `false`: zero-length buffers are rejected at allocation.
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// The size in bytes.
        pub fn size_in_bytes(&self) -> usize {
            self.len * std::mem::size_of::<T>()
        }

        /// The context the memory belongs to.
        pub fn context(&self) -> &Arc<Context> {
            &self.ctx
        }
    };
}
// For the buffers built on these objects elsewhere (`SharedDeviceBuffer`).
pub(crate) use common_accessors;

/// Host access for the buffers with a host side ([`PinnedBuffer`],
/// [`UnifiedBuffer`]): the contents, once the stream uses that may touch them
/// have finished, and the registration of copies that use them. Each buffer
/// has `ctx`, `len` and `tracker: UseTracker`, and implements
/// [`sealed::HostAccess`] for the address.
macro_rules! host_side {
    ($buffer:ident) => {
        impl<T: DeviceCopy> $buffer<T> {
            /// Allocate and fill with a copy of `data`.
            pub fn from_slice(ctx: &Arc<Context>, data: &[T]) -> Result<Self> {
                let mut buffer = Self::new(ctx, data.len())?;
                buffer.as_mut_slice()?.copy_from_slice(data);
                Ok(buffer)
            }

            /// The contents, after waiting for the enqueued uses that may write them.
            pub fn as_slice(&self) -> Result<&[T]> {
                self.tracker.wait_host(&self.ctx, false)?;
                // SAFETY: `len` initialized values (zeroed at allocation, then
                // written only by finished uses) at a host-accessible address;
                // no write is in flight (waited above; new writes need `&mut self`).
                Ok(unsafe { std::slice::from_raw_parts(self.host_ptr(), self.len) })
            }

            /// The contents for writing, after waiting for every enqueued use.
            pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
                self.tracker.wait_host(&self.ctx, true)?;
                // SAFETY: as in `as_slice`, and no stream uses them (waited above).
                Ok(unsafe { std::slice::from_raw_parts_mut(self.host_ptr(), self.len) })
            }

            /// The contents copied into a `Vec`.
            pub fn to_vec(&self) -> Result<Vec<T>> {
                Ok(self.as_slice()?.to_vec())
            }
        }

        impl<T: DeviceCopy> HostUse for $buffer<T> {
            fn host_context_id(&self) -> u64 {
                self.ctx.id()
            }

            fn host_bytes(&self) -> (u64, usize) {
                (self.host_ptr() as u64, self.len * std::mem::size_of::<T>())
            }

            fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()> {
                self.tracker.record_use(stream, write)
            }

            fn as_host_use(&self) -> &dyn HostUse {
                self
            }
        }
    };
}

mod device;
mod host_mem_pool;
mod host_span;
mod pinned;
mod pinned_region;
mod pool;
mod registered;
mod slice;
mod tracker;
mod unified;

pub use device::DeviceBuffer;
/// For buffers defined by features (the shared buffers of `features/ipc`).
pub(crate) use device::device_to_vec;
pub use host_mem_pool::HostMemPool;
pub use pinned::PinnedBuffer;
pub use pinned_region::{PinnedRegion, RegionOwner, ReturnedRegion, StreamUse, region_bytes};
pub use pool::MemPool;
pub use registered::HostRegistered;
pub use slice::{DeviceSlice, DeviceSliceMut, DeviceView, SharedDeviceSlice};
pub(crate) use tracker::UseTracker;
pub use unified::UnifiedBuffer;

use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use sys::CUdeviceptr;
use sys::signature::Scalar;

/// Types that may be copied to and from the GPU as raw bytes.
///
/// ```
/// use cuda_streams_driver::DeviceCopy;
/// #[derive(Clone, Copy)]
/// #[repr(C)]
/// struct Pair { a: f32, b: u32 }
/// // SAFETY: plain numbers, no padding, every bit pattern is a valid `Pair`.
/// unsafe impl DeviceCopy for Pair {}
/// ```
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value (the
/// GPU can write anything into a buffer, and freshly allocated device memory
/// holds whatever was there), and the type must hold no pointers or references
/// into host memory.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {
    /// The C scalar type this is, for kernel signatures: a buffer of `f32`
    /// passes for a `float*` parameter, a buffer of a user type for none
    /// (those go through [`crate::Stream::launch_unchecked`]).
    const SCALAR: Option<Scalar> = None;
}

macro_rules! device_copy {
    ($($t:ty => $scalar:expr),*) => { $(
        // SAFETY: a primitive number: every bit pattern is valid, no pointers.
        unsafe impl DeviceCopy for $t {
            const SCALAR: Option<Scalar> = $scalar;
        }
    )* };
}
device_copy!(
    u8 => Some(Scalar::U8), u16 => None, u32 => Some(Scalar::U32), u64 => Some(Scalar::U64),
    u128 => None, usize => None, i8 => None, i16 => None, i32 => Some(Scalar::I32),
    i64 => Some(Scalar::I64), i128 => None, isize => None, f32 => Some(Scalar::F32),
    f64 => Some(Scalar::F64)
);
// SAFETY: an array of valid-for-any-bits elements is itself valid for any bits.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// Memory the GPU can use in stream order: the one memory model every launch,
/// copy and memset of this crate takes, open to other crates' buffers (the
/// idea of cudarc's `DevicePtr`).
///
/// [`DeviceBuffer`], [`UnifiedBuffer`] and the allocator's views implement it.
/// A shared borrow lets the GPU *read* the memory; writing it (a copy's
/// destination, a memset, a kernel parameter declared [`Access::Write`](sys::signature::Access::Write)) takes
/// `&mut` of a [`DeviceMemoryMut`].
///
/// The two hooks let the memory follow its uses: the driver layer calls
/// [`before_device_use`](Self::before_device_use) before enqueueing work that
/// uses it on a stream, and [`after_device_use`](Self::after_device_use) once
/// the work is enqueued (also when a later step of the same call failed), so
/// the memory can delay its free, or its host access, until that work is done.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Result, Stream};
/// use cuda_streams_driver::sys::CUdeviceptr;
///
/// /// A window onto the second half of a buffer, borrowed from it.
/// struct SecondHalf<'a>(&'a mut DeviceBuffer<u32>);
///
/// // SAFETY: the window lies inside the buffer, which outlives the borrow and
/// // keeps tracking its uses (the hooks forward to it); `&mut self` holds the
/// // buffer's only mutable borrow.
/// unsafe impl DeviceMemory for SecondHalf<'_> {
///     type Elem = u32;
///     fn device_ptr(&self) -> CUdeviceptr {
///         self.0.device_ptr() + (self.device_len() * 4) as CUdeviceptr
///     }
///     fn device_len(&self) -> usize { self.0.len() / 2 }
///     fn context_id(&self) -> u64 { self.0.context().id() }
///     fn before_device_use(&self, stream: &Stream) -> Result<()> { self.0.before_device_use(stream) }
///     fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
///         self.0.after_device_use(stream, write)
///     }
/// }
/// // SAFETY: as above.
/// unsafe impl DeviceMemoryMut for SecondHalf<'_> {}
///
/// # fn main() -> Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut buffer = DeviceBuffer::from_slice(&stream, &[1u32; 8])?;
/// stream.memset_u32_async(&mut SecondHalf(&mut buffer), 7)?;
/// assert_eq!(buffer.to_vec(&stream)?, [1, 1, 1, 1, 7, 7, 7, 7]);
/// # Ok(())
/// # }
/// ```
///
/// # Safety
/// For as long as the value exists, an implementor promises that:
/// - `device_len() * size_of::<Elem>()` bytes from `device_ptr()` are memory
///   the GPU of the context [`Context::id`](crate::Context::id)` == context_id()`
///   may read and write (device, managed, or mapped pinned memory), holding
///   valid `Elem`s;
/// - that memory stays allocated until every use reported to
///   `after_device_use` has completed on its stream (a free ordered after
///   those streams, or after the host has waited for them);
/// - when `before_device_use(stream)` returns `Ok`, work enqueued next on
///   `stream` runs after the memory became valid (a stream-ordered
///   allocation on another stream must be waited for);
/// - no live host reference (`&[Elem]`, `&mut [Elem]`) sees the memory while
///   a use reported as a write may still run, and none sees it mutably while
///   any use may still run;
/// - `device_ptr`, `device_len`, `context_id` and `home_stream_id` return
///   the same values for the life of the value;
/// - when `home_stream_id()` is `Some(id)`, both hooks on the stream whose
///   [`Stream::id`] is `id` return `Ok` and do nothing, so that the driver
///   layer may skip them there.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not device memory",
    label = "pass a `DeviceBuffer`, a slice of one (`buffer.slice(..)`), or a `UnifiedBuffer` here",
    note = "host data goes to the device first: `DeviceBuffer::from_slice(&stream, &data)`, or `Stream::copy_from_host_async` from a `PinnedBuffer`"
)]
pub unsafe trait DeviceMemory {
    /// The element type.
    type Elem: DeviceCopy;

    /// Its device address.
    fn device_ptr(&self) -> CUdeviceptr;

    /// Its length in elements.
    fn device_len(&self) -> usize;

    /// The [`Context::id`](crate::Context::id) of the context it belongs to.
    fn context_id(&self) -> u64;

    /// Before enqueueing work on `stream` that uses the memory: order `stream`
    /// after whatever made the memory valid. The default does nothing (memory
    /// that is valid on every stream once allocated).
    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// After enqueueing work on `stream` that uses the memory (`write`: the
    /// work may write it): remember the use so the free, and host access,
    /// wait for it. The default does nothing (memory freed only after the
    /// host has waited for every stream that may use it).
    fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
        let _ = (stream, write);
        Ok(())
    }

    /// The [`Stream::id`] of the one stream on which both hooks do nothing,
    /// if there is one: a stream-ordered buffer's home stream, which itself
    /// orders its work after the allocation and before the free. A launch
    /// there skips the hooks (two calls through a vtable each time). The
    /// default, `None`, has them called for every use.
    fn home_stream_id(&self) -> Option<u64> {
        None
    }
}

/// [`DeviceMemory`] the GPU may write: while `&mut self` is borrowed no host
/// reference sees the memory, so no `&[T]` can watch the GPU write it.
///
/// Ordering the *contents* between streams (a write on one stream and a
/// read on another) stays the caller's job, as in CUDA.
///
/// # Safety
/// While `&mut self` is borrowed, no host reference (`&[Elem]`, `&mut
/// [Elem]`) into the memory is alive, and none can be made through another
/// value.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not device memory the GPU may write",
    label = "pass `&mut` to a `DeviceBuffer`, a `slice_mut(..)` of one, or a `UnifiedBuffer` here",
    note = "a shared borrow or a read-only slice lends memory for reading only; written memory is lent by `&mut`"
)]
pub unsafe trait DeviceMemoryMut: DeviceMemory {}

/// Host memory that asynchronous copies may use: [`PinnedBuffer`] and
/// [`UnifiedBuffer`], which keep their host side untouched until the streams
/// that use them have passed those uses. Sealed.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, HostMemory, PinnedBuffer, Result, Stream};
/// fn upload<H: HostMemory<f32>>(stream: &Stream, dst: &mut DeviceBuffer<f32>, src: &H) -> Result<()> {
///     stream.copy_from_host_async(dst, src)
/// }
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut dst = DeviceBuffer::<f32>::new_async(&stream, 2).unwrap();
/// upload(&stream, &mut dst, &PinnedBuffer::from_slice(&ctx, &[1.0, 2.0]).unwrap()).unwrap();
/// assert_eq!(dst.to_vec(&stream).unwrap(), [1.0, 2.0]);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not host memory an asynchronous copy can use",
    label = "pass a `PinnedBuffer<{T}>` (or `UnifiedBuffer<{T}>`) here",
    note = "an asynchronous copy touches host memory after the call returns, so it takes only page-locked memory that waits for the copy before it is freed or touched: `PinnedBuffer::from_slice(&ctx, &data)`",
    note = "for a `Vec` or a slice without a pinned buffer, `DeviceBuffer::from_slice(&stream, &data)` uploads and `DeviceBuffer::to_vec(&stream)` downloads, both blocking"
)]
pub trait HostMemory<T: DeviceCopy>: sealed::HostAccess<T> {}

impl<T: DeviceCopy, M: sealed::HostAccess<T>> HostMemory<T> for M {}

/// What the driver layer needs of any [`DeviceMemory`], as a trait object, so
/// an operation can list the buffers it uses whatever their element types.
pub(crate) trait DeviceUse {
    fn use_context_id(&self) -> u64;
    fn use_home_stream_id(&self) -> Option<u64>;
    /// Its address and size in bytes.
    fn use_bytes(&self) -> (u64, usize);
    fn before_use(&self, stream: &Stream) -> Result<()>;
    fn after_use(&self, stream: &Stream, write: bool) -> Result<()>;
}

impl<M: DeviceMemory> DeviceUse for M {
    fn use_context_id(&self) -> u64 {
        self.context_id()
    }
    fn use_home_stream_id(&self) -> Option<u64> {
        self.home_stream_id()
    }
    fn use_bytes(&self) -> (u64, usize) {
        (self.device_ptr(), device_bytes(self))
    }
    fn before_use(&self, stream: &Stream) -> Result<()> {
        self.before_device_use(stream)
    }
    fn after_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.after_device_use(stream, write)
    }
}

/// The bytes a [`DeviceMemory`] spans (lengths are checked at allocation, so
/// this cannot overflow for this crate's buffers; others saturate, and the
/// driver rejects what they do not own).
pub(crate) fn device_bytes<M: DeviceMemory>(memory: &M) -> usize {
    memory
        .device_len()
        .saturating_mul(std::mem::size_of::<M::Elem>())
}

#[allow(
    unreachable_pub,
    reason = "sealed-trait pattern: public so they can bound public traits, unnameable outside"
)]
pub(crate) mod sealed {
    use crate::ground::error::Result;
    use crate::objects::stream::Stream;

    /// How an operation on a stream registers its use of a host region.
    pub trait HostUse {
        /// The buffer's context id.
        fn host_context_id(&self) -> u64;
        /// The host side's address and size in bytes.
        fn host_bytes(&self) -> (u64, usize);
        /// After enqueueing on `stream`: remember the use so host access and
        /// the free wait for it.
        fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()>;
        /// Itself as a trait object (generic callers may hold `?Sized` ones).
        fn as_host_use(&self) -> &dyn HostUse;
    }

    /// A host-side region for asynchronous copies. Where a bound on
    /// [`HostMemory`](super::HostMemory) fails the compiler names this
    /// trait, so it carries the same hint.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not host memory an asynchronous copy can use",
        label = "pass a `PinnedBuffer<{T}>` (or `UnifiedBuffer<{T}>`) here",
        note = "an asynchronous copy touches host memory after the call returns, so it takes only page-locked memory that waits for the copy before it is freed or touched: `PinnedBuffer::from_slice(&ctx, &data)`",
        note = "for a `Vec` or a slice without a pinned buffer, `DeviceBuffer::from_slice(&stream, &data)` uploads and `DeviceBuffer::to_vec(&stream)` downloads, both blocking"
    )]
    pub trait HostAccess<T>: HostUse {
        /// Its host address.
        fn host_ptr(&self) -> *mut T;
        /// Its length in elements.
        fn host_len(&self) -> usize;
    }
}

/// `len * size_of::<T>()`, rejecting zero and overflow with the values named.
pub(crate) fn byte_size<T>(what: &'static str, len: usize) -> Result<usize> {
    let elem_size = std::mem::size_of::<T>();
    let bytes = len
        .checked_mul(elem_size)
        .filter(|bytes| *bytes <= isize::MAX as usize)
        .ok_or(Error::SizeOverflow {
            what,
            len,
            elem_size,
        })?;
    if bytes == 0 {
        return Err(Error::ZeroSize {
            what,
            len,
            elem_size,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert_eq!(byte_size::<u32>("DeviceBuffer", 10).unwrap(), 40);
        let zero = byte_size::<u32>("DeviceBuffer", 0).unwrap_err();
        assert!(
            zero.to_string()
                .starts_with("a DeviceBuffer of 0 element(s) would be empty"),
            "{zero}"
        );
        let huge = byte_size::<u64>("PinnedBuffer", usize::MAX / 2).unwrap_err();
        assert!(
            huge.to_string().contains(&(usize::MAX / 2).to_string()),
            "{huge}"
        );
        assert!(matches!(
            byte_size::<[u8; 0]>("UnifiedBuffer", 5),
            Err(Error::ZeroSize { .. })
        ));
    }
}
