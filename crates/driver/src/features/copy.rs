//! Copies, memsets and prefetches enqueued on a stream.
//!
//! Lengths are checked on every copy. Host memory used by an asynchronous copy
//! is a [`HostMemory`] buffer, which tracks the copy; plain slices get a
//! synchronous form (enqueue, then wait for that copy) and an `unsafe`
//! asynchronous form whose contract is written beside it.

use crate::enqueue::protocol::{Use, Work};
use crate::ground::error::{Error, Result};
use crate::objects::event::Event;
use crate::objects::memory::{
    DeviceCopy, DeviceMemory, DeviceMemoryMut, HostMemory, UnifiedBuffer, device_bytes,
};
use crate::objects::stream::Stream;
use std::ffi::c_void;
use sys::{CUmemLocation, CUmemLocationType};

/// `Ok` when two lengths match, else [`Error::SizeMismatch`] naming both:
/// the check every copy makes, for wrappers that take several buffers.
///
/// ```
/// let err = cuda_streams_driver::check_len("saxpy", 4, 3).unwrap_err();
/// assert!(err.to_string().contains("holds 4 element(s) but the source holds 3"));
/// ```
pub fn check_len(operation: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::SizeMismatch {
            operation,
            expected,
            actual,
        })
    }
}

impl Stream {
    /// Copy `src` (host) into `dst` (device) asynchronously.
    ///
    /// `src` stays readable meanwhile; writing it (`as_mut_slice`) or dropping
    /// it waits for this copy. Lengths must match.
    pub fn copy_from_host_async<T, D, H>(&self, dst: &mut D, src: &H) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
        H: HostMemory<T> + ?Sized,
    {
        self.copy_from_host_async_then(dst, src, || Ok(()))
    }

    /// [`Stream::copy_from_host_async`], then `then` in the same enqueue
    /// ([`Stream::enqueue_then`]): before the stream may begin a capture.
    pub(crate) fn copy_from_host_async_then<T, D, H, R>(
        &self,
        dst: &mut D,
        src: &H,
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
        H: HostMemory<T> + ?Sized,
    {
        check_len("copy_from_host_async", dst.device_len(), src.host_len())?;
        self.check_context_id("the host buffer", src.host_context_id())?;
        let bytes = device_bytes(&*dst);
        let uses = [
            Use::Device(&*dst, true),
            Use::Host(src.as_host_use(), false),
        ];
        let copy = |driver: &sys::Driver, stream| {
            // SAFETY: both regions hold `bytes` bytes and are tracked: they stay
            // allocated (and the host side unwritten) until the stream passes the copy.
            unsafe {
                (driver.cuMemcpyHtoDAsync)(
                    dst.device_ptr(),
                    src.host_ptr().cast::<c_void>(),
                    bytes,
                    stream,
                )
            }
        };
        self.enqueue_then(uses, Work::Transfer(bytes), copy, then)
    }

    /// Copy `src` (device) into `dst` (host) asynchronously. Reading or
    /// writing `dst` on the host, or dropping it, waits for this copy.
    pub fn copy_to_host_async<T, H, D>(&self, dst: &mut H, src: &D) -> Result<()>
    where
        T: DeviceCopy,
        H: HostMemory<T> + ?Sized,
        D: DeviceMemory<Elem = T>,
    {
        self.copy_to_host_async_then(dst, src, || Ok(()))
    }

    /// [`Stream::copy_to_host_async`], then `then` in the same enqueue
    /// ([`Stream::enqueue_then`]): before the stream may begin a capture.
    pub(crate) fn copy_to_host_async_then<T, H, D, R>(
        &self,
        dst: &mut H,
        src: &D,
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R>
    where
        T: DeviceCopy,
        H: HostMemory<T> + ?Sized,
        D: DeviceMemory<Elem = T>,
    {
        check_len("copy_to_host_async", dst.host_len(), src.device_len())?;
        self.check_context_id("the host buffer", dst.host_context_id())?;
        let bytes = device_bytes(src);
        let uses = [Use::Device(src, false), Use::Host(dst.as_host_use(), true)];
        let copy = |driver: &sys::Driver, stream| {
            // SAFETY: both regions hold `bytes` bytes and are tracked: host access
            // to `dst` waits for this copy, and `src` is freed only after it.
            unsafe {
                (driver.cuMemcpyDtoHAsync)(
                    dst.host_ptr().cast::<c_void>(),
                    src.device_ptr(),
                    bytes,
                    stream,
                )
            }
        };
        self.enqueue_then(uses, Work::Transfer(bytes), copy, then)
    }

    /// Copy `src` into `dst`, both device memory, asynchronously.
    pub fn copy_device_to_device_async<T, D, S>(&self, dst: &mut D, src: &S) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
        S: DeviceMemory<Elem = T>,
    {
        check_len(
            "copy_device_to_device_async",
            dst.device_len(),
            src.device_len(),
        )?;
        let bytes = device_bytes(&*dst);
        let uses = [Use::Device(&*dst, true), Use::Device(src, false)];
        self.enqueue_tracked(uses, Work::Transfer(bytes), |driver, stream| {
            // SAFETY: both regions hold `bytes` bytes and are freed only after the
            // stream passes this copy (tracked).
            unsafe { (driver.cuMemcpyDtoDAsync)(dst.device_ptr(), src.device_ptr(), bytes, stream) }
        })
    }

    /// Copy `src` into `dst`, device memory of any two devices (or the same
    /// one), asynchronously in this stream's order (`cuMemcpyPeerAsync`).
    ///
    /// The stream may belong to either device, or to a third. Where the two
    /// devices can be peers, peer access is enabled between them on first
    /// use (both ways, [`crate::Context::enable_peer_access`]) so the copy
    /// goes directly over the link; otherwise the driver stages it through
    /// the host. Both buffers are tracked on this stream: neither is freed
    /// before the copy has run. Ordering the *contents* is the caller's job,
    /// as for every copy: a producer on another stream needs a wait first
    /// ([`Stream::wait_stream`], [`Stream::wait_event`]; they may cross
    /// devices).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let last = Context::device_count()? - 1; // device 1 when there are two
    /// let (gpu0, gpu1) = (Context::new(0)?, Context::new(last)?);
    /// let (s0, s1) = (Stream::new(&gpu0)?, Stream::new(&gpu1)?);
    /// let src = DeviceBuffer::from_slice(&s0, &[1u32, 2, 3, 4])?;
    /// let mut dst = DeviceBuffer::<u32>::new_async(&s1, 4)?;
    /// s1.wait_stream(&s0)?; // src is written on s0
    /// s1.copy_peer_async(&mut dst, &src)?;
    /// assert_eq!(dst.to_vec(&s1)?, [1, 2, 3, 4]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn copy_peer_async<T, D, S>(&self, dst: &mut D, src: &S) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
        S: DeviceMemory<Elem = T>,
    {
        check_len("copy_peer_async", dst.device_len(), src.device_len())?;
        let dst_ctx = self.peer_side("the destination", dst.context_id())?;
        let src_ctx = self.peer_side("the source", src.context_id())?;
        if dst_ctx.id() != src_ctx.id() {
            for (from, to) in [(&dst_ctx, &src_ctx), (&src_ctx, &dst_ctx)] {
                if !from.has_peer_access(to) && from.can_access_peer(to)? {
                    from.enable_peer_access(to)?;
                }
            }
        }
        let bytes = device_bytes(&*dst);
        let uses = [Use::Peer(&*dst, true), Use::Peer(src, false)];
        self.enqueue_tracked(uses, Work::Transfer(bytes), |driver, stream| {
            // SAFETY: both regions hold `bytes` bytes of their contexts' devices
            // (the DeviceMemory contract), both contexts are alive (held here),
            // and both buffers are tracked on this stream, so neither is freed
            // before the copy has run.
            unsafe {
                (driver.cuMemcpyPeerAsync)(
                    dst.device_ptr(),
                    dst_ctx.as_raw(),
                    src.device_ptr(),
                    src_ctx.as_raw(),
                    bytes,
                    stream,
                )
            }
        })
    }

    /// The live context of one side of a peer copy, which must run on this
    /// stream's driver.
    fn peer_side(
        &self,
        what: &'static str,
        id: u64,
    ) -> Result<std::sync::Arc<crate::objects::context::Context>> {
        match crate::objects::context::by_id(id) {
            Some(ctx) => {
                self.check_driver(what, &ctx)?;
                Ok(ctx)
            }
            None => Err(Error::ContextMismatch {
                what,
                expected: self.context().id(),
                found: id,
            }),
        }
    }

    /// Copy a plain host slice into `dst` and wait for that copy (not for
    /// the rest of the stream). For overlap, use a [`crate::PinnedBuffer`]
    /// with [`Stream::copy_from_host_async`].
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let mut buf = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    /// stream.copy_from_host(&mut buf, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    /// let err = stream.copy_from_host(&mut buf, &[1.0, 2.0]).unwrap_err();
    /// assert!(err.to_string().contains("holds 4 element(s) but the source holds 2"), "{err}");
    /// let mut out = [0f32; 4];
    /// stream.copy_to_host(&mut out, &buf).unwrap();
    /// assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    /// ```
    pub fn copy_from_host<T, D>(&self, dst: &mut D, src: &[T]) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
    {
        // Named as this call while the stream captures (a snapshot; the
        // enqueue's gate is what holds captures off).
        self.refuse_if_capturing("Stream::copy_from_host")?;
        // The wait is the same enqueue's follow-up: a capture beginning in
        // between would refuse it and leave the copy reading `src` later.
        // SAFETY: `src` outlives the copy: it is waited for before this
        // returns. The only error after enqueueing (an untracked use) has
        // already waited for the stream.
        unsafe { self.copy_from_host_unchecked_then(dst, src, || self.wait_for_enqueued()) }
    }

    /// Copy `src` into a plain host slice and wait for that copy.
    pub fn copy_to_host<T, D>(&self, dst: &mut [T], src: &D) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemory<Elem = T>,
    {
        // SAFETY: `dst` is valid for `dst.len()` writes and exclusively ours
        // until this returns.
        unsafe { self.copy_to_host_raw(dst.as_mut_ptr(), dst.len(), src) }
    }

    /// Copy into `dst_len` values at `dst` and wait for that copy.
    ///
    /// # Safety
    /// `dst` must be valid for `dst_len` writes of `T`, not accessed elsewhere
    /// until this returns.
    pub(crate) unsafe fn copy_to_host_raw<T, D>(
        &self,
        dst: *mut T,
        dst_len: usize,
        src: &D,
    ) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemory<Elem = T>,
    {
        // Named as this call while the stream captures (a snapshot; the
        // enqueue's gate is what holds captures off).
        self.refuse_if_capturing("Stream::copy_to_host")?;
        // The wait is the same enqueue's follow-up: a capture beginning in
        // between would refuse it, and the copy would write `dst` after return.
        // SAFETY: the caller's contract, and the copy is waited for before
        // this returns.
        unsafe { self.copy_to_host_raw_then(dst, dst_len, src, || self.wait_for_enqueued()) }
    }

    /// Enqueue a copy of a plain host slice into `dst` without waiting.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the stream has passed this
    /// copy (e.g. until an event recorded after it completes, or the stream is
    /// synchronized). Dropping or writing it earlier is a data race with the
    /// copy engine. On pageable memory the driver may also copy synchronously.
    pub unsafe fn copy_from_host_async_unchecked<T, D>(&self, dst: &mut D, src: &[T]) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
    {
        // SAFETY: forwarded: the caller's contract covers `src`.
        unsafe { self.copy_from_host_unchecked_then(dst, src, || Ok(())) }
    }

    /// # Safety
    /// As `copy_from_host_async_unchecked`; `then` runs in the same enqueue
    /// ([`Stream::enqueue_then`]).
    unsafe fn copy_from_host_unchecked_then<T, D, R>(
        &self,
        dst: &mut D,
        src: &[T],
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
    {
        check_len("copy_from_host", dst.device_len(), src.len())?;
        let bytes = std::mem::size_of_val(src);
        let uses = [Use::Device(&*dst, true)];
        let copy = |driver: &sys::Driver, stream| {
            // SAFETY: `dst` holds `bytes` bytes and is tracked; `src` is the
            // caller's contract.
            unsafe {
                (driver.cuMemcpyHtoDAsync)(
                    dst.device_ptr(),
                    src.as_ptr().cast::<c_void>(),
                    bytes,
                    stream,
                )
            }
        };
        self.enqueue_then(uses, Work::Transfer(bytes), copy, then)
    }

    /// Enqueue a copy from `src` into a plain host slice without waiting.
    ///
    /// # Safety
    /// `dst` must stay alive, and must be neither read nor written by the host,
    /// until the stream has passed this copy.
    pub unsafe fn copy_to_host_async_unchecked<T, D>(&self, dst: &mut [T], src: &D) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemory<Elem = T>,
    {
        // SAFETY: forwarded: the caller's contract covers `dst`.
        unsafe { self.copy_to_host_raw_then(dst.as_mut_ptr(), dst.len(), src, || Ok(())) }
    }

    /// # Safety
    /// As `copy_to_host_async_unchecked`, for `dst_len` values at `dst`;
    /// `then` runs in the same enqueue ([`Stream::enqueue_then`]).
    unsafe fn copy_to_host_raw_then<T, D, R>(
        &self,
        dst: *mut T,
        dst_len: usize,
        src: &D,
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R>
    where
        T: DeviceCopy,
        D: DeviceMemory<Elem = T>,
    {
        check_len("copy_to_host", dst_len, src.device_len())?;
        let bytes = dst_len * std::mem::size_of::<T>();
        let uses = [Use::Device(src, false)];
        let copy = |driver: &sys::Driver, stream| {
            // SAFETY: `src` holds `bytes` bytes and is tracked; `dst` is the caller's contract.
            unsafe {
                (driver.cuMemcpyDtoHAsync)(dst.cast::<c_void>(), src.device_ptr(), bytes, stream)
            }
        };
        self.enqueue_then(uses, Work::Transfer(bytes), copy, then)
    }

    /// Set every byte of `dst` to `value`, asynchronously.
    pub fn memset_u8_async<T, D>(&self, dst: &mut D, value: u8) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
    {
        let bytes = device_bytes(&*dst);
        let uses = [Use::Device(&*dst, true)];
        self.enqueue_tracked(uses, Work::Operation, |driver, stream| {
            // SAFETY: `dst` holds `bytes` bytes and is tracked.
            unsafe { (driver.cuMemsetD8Async)(dst.device_ptr(), value, bytes, stream) }
        })
    }

    /// Set every 32-bit word of `dst` to `value`, asynchronously. The size in
    /// bytes must be a multiple of 4.
    pub fn memset_u32_async<T, D>(&self, dst: &mut D, value: u32) -> Result<()>
    where
        T: DeviceCopy,
        D: DeviceMemoryMut<Elem = T>,
    {
        let bytes = device_bytes(&*dst);
        if !bytes.is_multiple_of(4) {
            return Err(Error::MisalignedMemset { bytes });
        }
        let uses = [Use::Device(&*dst, true)];
        self.enqueue_tracked(uses, Work::Operation, |driver, stream| {
            // SAFETY: `dst` holds `bytes / 4` words and is tracked.
            unsafe { (driver.cuMemsetD32Async)(dst.device_ptr(), value, bytes / 4, stream) }
        })
    }

    /// Migrate a unified buffer's pages to this stream's device ahead of use.
    pub fn prefetch_to_device_async<T: DeviceCopy>(&self, buffer: &UnifiedBuffer<T>) -> Result<()> {
        let location = CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.context().ordinal(),
        };
        self.prefetch(buffer, location)
    }

    /// Migrate a unified buffer's pages to host memory ahead of host use.
    pub fn prefetch_to_host_async<T: DeviceCopy>(&self, buffer: &UnifiedBuffer<T>) -> Result<()> {
        let location = CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        self.prefetch(buffer, location)
    }

    fn prefetch<T: DeviceCopy>(
        &self,
        buffer: &UnifiedBuffer<T>,
        location: CUmemLocation,
    ) -> Result<()> {
        let bytes = buffer.size_in_bytes();
        let uses = [Use::Device(buffer, false)];
        self.enqueue_tracked(uses, Work::Transfer(bytes), |driver, stream| {
            // SAFETY: the range is the whole managed allocation, tracked so it is
            // freed only after the prefetch.
            unsafe {
                (driver.cuMemPrefetchAsync)(buffer.as_device_ptr(), bytes, location, 0, stream)
            }
        })
    }

    /// Wait on the host for the work enqueued on this stream so far, with an
    /// event rather than `cuStreamSynchronize`, so work other threads enqueue
    /// later is not waited for. Falls back to synchronizing the stream.
    fn wait_for_enqueued(&self) -> Result<()> {
        let waited = Event::plain(self.context()).and_then(|event| {
            event.record(self)?;
            event.synchronize()
        });
        match waited {
            Ok(()) => Ok(()),
            Err(_) => self.synchronize(),
        }
    }
}
