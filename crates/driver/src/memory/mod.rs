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

            fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()> {
                self.tracker.record_use(&self.ctx, stream, write)
            }

            fn as_host_use(&self) -> &dyn HostUse {
                self
            }
        }
    };
}

mod device;
mod pinned;
mod tracker;
mod unified;

pub use device::DeviceBuffer;
pub use pinned::PinnedBuffer;
pub use unified::UnifiedBuffer;

use crate::error::{Error, Result};

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
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: every bit pattern is valid, no pointers.
        unsafe impl DeviceCopy for $t {}
    )* };
}
device_copy!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);
// SAFETY: an array of valid-for-any-bits elements is itself valid for any bits.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// Memory the GPU can read or write in stream order: [`DeviceBuffer`] and
/// [`UnifiedBuffer`]. Sealed: the buffers' use tracking depends on it.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, DeviceMemory, Result, Stream, UnifiedBuffer};
/// // Works for either kind of device memory.
/// fn zero<D: DeviceMemory<u32>>(stream: &Stream, memory: &mut D) -> Result<()> {
///     stream.memset_u32_async(memory, 0)
/// }
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// zero(&stream, &mut DeviceBuffer::<u32>::new_async(&stream, 8).unwrap()).unwrap();
/// zero(&stream, &mut UnifiedBuffer::<u32>::new(&ctx, 8).unwrap()).unwrap();
/// ```
pub trait DeviceMemory<T: DeviceCopy>: sealed::DeviceAccess<T> {}

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
pub trait HostMemory<T: DeviceCopy>: sealed::HostAccess<T> {}

impl<T: DeviceCopy, M: sealed::DeviceAccess<T>> DeviceMemory<T> for M {}
impl<T: DeviceCopy, M: sealed::HostAccess<T>> HostMemory<T> for M {}

#[allow(
    unreachable_pub,
    reason = "sealed-trait pattern: public so they can bound public traits, unnameable outside"
)]
pub(crate) mod sealed {
    use crate::error::Result;
    use crate::stream::Stream;
    use sys::CUdeviceptr;

    /// How an operation on a stream registers its use of a buffer.
    pub trait DeviceUse {
        /// The buffer's context id.
        fn context_id(&self) -> u64;
        /// Before enqueueing on `stream`: order the use after the allocation.
        fn before_device_use(&self, stream: &Stream) -> Result<()>;
        /// After enqueueing on `stream`: remember the use so the free waits for it.
        fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()>;
        /// Itself as a trait object, so operations can list the buffers they
        /// use whatever their types (generic callers may hold `?Sized` ones).
        fn as_device_use(&self) -> &dyn DeviceUse;
    }

    /// A device-side region.
    pub trait DeviceAccess<T>: DeviceUse {
        /// Its device address.
        fn device_ptr(&self) -> CUdeviceptr;
        /// Its length in elements.
        fn device_len(&self) -> usize;
    }

    /// How an operation on a stream registers its use of a host region.
    pub trait HostUse {
        /// The buffer's context id.
        fn host_context_id(&self) -> u64;
        /// After enqueueing on `stream`: remember the use so host access and
        /// the free wait for it.
        fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()>;
        /// Itself as a trait object (see [`DeviceUse::as_device_use`]).
        fn as_host_use(&self) -> &dyn HostUse;
    }

    /// A host-side region for asynchronous copies.
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
        assert!(zero.to_string().contains("0 bytes"), "{zero}");
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
