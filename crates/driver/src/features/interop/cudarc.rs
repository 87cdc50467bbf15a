//! Interop with [cudarc](https://docs.rs/cudarc) (feature `cudarc`).
//!
//! | from cudarc | to ours | how |
//! | --- | --- | --- |
//! | `Arc<CudaStream>` | `Arc<Stream>` | [`Stream::from_cudarc`]: borrowed (cudarc destroys it), kept alive by our `Stream`; it joins pools, coordinators and operation graphs like any stream |
//! | `&CudaSlice<T>`, `&CudaView<T>` | [`DeviceMemory`] | [`CudarcSlice`]: an argument to our checked launches and copies |
//! | `&mut CudaSlice<T>`, `&mut CudaViewMut<T>` | [`DeviceMemoryMut`] | [`CudarcSliceMut`] |
//! | `CudaEvent` | a wait | [`Stream::wait_cudarc_event`] |
//!
//! | from ours | to cudarc | how |
//! | --- | --- | --- |
//! | `&DeviceBuffer<T>` | `DevicePtr<T>` | [`CudarcBuffer`] ([`DeviceBuffer::as_cudarc`]): an argument to cudarc's copies, memsets and (through `device_ptr`) launches |
//! | `&mut DeviceBuffer<T>` | `DevicePtrMut<T>` | [`CudarcBufferMut`] ([`DeviceBuffer::as_cudarc_mut`]) |
//! | `Stream`, `Event` | waits | [`CudarcStreamExt::wait_stream`], [`CudarcStreamExt::wait_event`]; [`Stream::to_cudarc`] (`unsafe`) |
//!
//! # The rules that keep it sound
//!
//! - **One context.** Both sides must be the same CUDA context: our
//!   [`Context`] is the device's primary context, which is what
//!   `CudaContext::new(ordinal)` retains too. Every conversion compares the
//!   two handles and refuses a mismatch, the software driver (cudarc always
//!   talks to `libcuda.so.1`) and per-thread default streams (their handle
//!   means another stream on every thread) with [`Error::Interop`](crate::Error::Interop).
//! - **cudarc memory used by us.** cudarc frees a `CudaSlice` on the stream it
//!   was allocated on (its *home*). Before our work uses the slice, our stream
//!   waits for the home stream (the allocation and cudarc's work there) and
//!   for cudarc's last write (its event tracking); after the work is
//!   enqueued, the home stream waits for our stream, so cudarc's free, and
//!   all later cudarc work on the home stream, come after our use. That is
//!   done at each use, not when the wrapper is dropped, so `mem::forget`
//!   cannot skip it. A write of ours is also recorded as cudarc's last write.
//! - **Our memory used by cudarc.** cudarc's `DevicePtr` protocol gives a
//!   pointer and a `SyncOnDrop` guard to drop once the work is enqueued; it
//!   has no hook to record that work, so: on the buffer's home stream (a
//!   [`DeviceBuffer::new_async`] buffer, freed in stream order there) nothing
//!   more is needed and the guard does nothing; on any other stream, the
//!   stream first waits for the allocation and the guard then waits on the
//!   host for that stream (`SyncOnDrop::Sync`), so the buffer cannot be
//!   freed under the work. For full speed on a cudarc stream, make the buffer
//!   there: `DeviceBuffer::new_async(&Stream::from_cudarc(&ctx, &cs)?, n)`.
//!
//! # Left out, and why
//!
//! - `cudarc::driver::PushKernelArg` for our buffers: cudarc's `LaunchArgs`
//!   keeps its stream and its event lists private, so an outside type cannot
//!   order its free after the launch. Launch with the pointer from
//!   `DevicePtr::device_ptr` and drop the guard after the launch (cudarc's
//!   documented pattern for custom pointers), as the example below does.
//! - `Stream::to_cudarc` is `unsafe`: cudarc's `Arc<CudaStream>` can be cloned
//!   and kept past the life of our stream, which we cannot prevent.
//! - Unified memory (`UnifiedSlice`): cudarc lets the host read it while a
//!   kernel of ours might write it.
//!
//! With several devices, cudarc's calls make their own context current on the
//! calling thread. With this feature on, [`Context::bind`] confirms the
//! context it remembers for the thread with the driver, so cudarc's calls on
//! another device never send our later work there: nothing needs calling in
//! between.
//!
//! # Example
//!
//! ```no_run
//! use cuda_streams_driver::interop::cudarc::{CudarcSlice, CudarcSliceMut, CudarcStreamExt};
//! use cuda_streams_driver::{Context, DeviceBuffer, Stream};
//! use cudarc::driver::{CudaContext, DevicePtr};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::new(0)?; // NVIDIA's driver: interop needs a GPU
//! let cuda = CudaContext::new(0)?; // the same primary context
//! let cs = cuda.new_stream()?;
//!
//! // A cudarc stream as ours: pools, coordinators and graphs take it.
//! let ours = Stream::from_cudarc(&ctx, &cs)?;
//!
//! // A cudarc slice as an argument to our copies and checked launches.
//! let mut slice = cs.alloc_zeros::<u32>(1024)?;
//! ours.memset_u32_async(&mut CudarcSliceMut::new(&ctx, &mut slice)?, 7)?;
//! let back = CudarcSlice::new(&ctx, &slice)?;
//! let mut host = vec![0u32; 1024];
//! ours.copy_to_host(&mut host, &back)?;
//! assert!(host.iter().all(|&v| v == 7));
//!
//! // Our buffer as cudarc's DevicePtr: a copy on the buffer's home stream.
//! let buffer = DeviceBuffer::from_slice(&ours, &[1.0f32; 256])?;
//! assert_eq!(cs.clone_dtoh(&buffer.as_cudarc(&cs)?)?, vec![1.0f32; 256]);
//!
//! // Events order work across the two: cudarc's stream waits for ours.
//! let other = Stream::new(&ctx)?;
//! cs.wait_stream(&other)?;
//! # Ok(())
//! # }
//! ```

use super::shared::{PER_THREAD_STREAM, foreign_waits_for, interop, require_gpu, wait_for_foreign};
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::event::Event;
use crate::objects::memory::{DeviceBuffer, DeviceCopy, DeviceMemory, DeviceMemoryMut};
use crate::objects::stream::Stream;
use ::cudarc::driver::sys as cu;
use ::cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};
use sys::{CUdeviceptr, CUstream};

/// `Ok` when `cuda` is the very context `ctx` is, on NVIDIA's driver.
fn check_context(ctx: &Context, cuda: &CudaContext, what: &str) -> Result<()> {
    require_gpu(ctx, "cudarc", what)?;
    if cuda.cu_ctx().cast::<()>() != ctx.as_raw().cast::<()>() {
        return Err(interop(format!(
            "{what} belongs to CUDA context {:p} (device {}), and ours (id {}) is {:p} (device {}): \
             use `CudaContext::new(ordinal)`, the device's primary context",
            cuda.cu_ctx(),
            cuda.ordinal(),
            ctx.id(),
            ctx.as_raw(),
            ctx.info().ordinal
        )));
    }
    Ok(())
}

/// `Ok` unless `stream` is the per-thread default stream, whose handle names
/// a different stream on every thread.
fn check_not_per_thread(stream: &CudaStream, what: &str) -> Result<()> {
    if stream.cu_stream() as usize == PER_THREAD_STREAM {
        return Err(interop(format!(
            "{what} is the per-thread default stream (CU_STREAM_PER_THREAD), which names another \
             stream on each thread; use a stream from `CudaContext::new_stream`"
        )));
    }
    Ok(())
}

impl Stream {
    /// A cudarc stream as one of ours, so it can join pools, coordinators and
    /// operation graphs. The stream is borrowed: cudarc destroys it, and the
    /// returned `Stream` keeps a clone of `stream` so that cannot happen
    /// before it is dropped.
    ///
    /// Fails with [`Error::Interop`](crate::Error::Interop) when `stream` belongs to another context
    /// than `ctx`, when `ctx` runs on the software driver, or for the
    /// per-thread default stream.
    pub fn from_cudarc(ctx: &Arc<Context>, stream: &Arc<CudaStream>) -> Result<Arc<Stream>> {
        check_context(ctx, stream.context(), "the cudarc stream")?;
        check_not_per_thread(stream, "the cudarc stream")?;
        let raw = stream.cu_stream() as CUstream;
        let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(Arc::clone(stream));
        // SAFETY: `raw` is a stream of `ctx` (checked above; null is the
        // legacy default stream), not owned by us, and valid while `owner`
        // (a strong reference to cudarc's stream) lives, which is as long as
        // the returned Stream.
        Ok(unsafe { Stream::from_raw_with_owner(ctx, raw, false, Some(owner)) })
    }

    /// This stream as a cudarc stream, for cudarc's copies and launches.
    /// cudarc will not destroy it.
    ///
    /// # Safety
    /// The returned `Arc<CudaStream>` and every clone of it must be dropped
    /// before this `Stream` is (cudarc keeps no reference to it).
    pub unsafe fn to_cudarc(&self, cuda: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
        check_context(self.context(), cuda, "the cudarc context")?;
        // cudarc's work on it passes no gate of ours: no mark may cover it.
        self.lent_out();
        // SAFETY: the handle is a stream of `cuda`'s context (checked); the
        // caller keeps it alive for as long as cudarc uses it.
        Ok(unsafe { cuda.wrap_borrowed_stream(self.as_raw() as cu::CUstream) })
    }

    /// Make work enqueued on this stream from now on wait for a cudarc event
    /// (`cuStreamWaitEvent`); the host does not wait.
    ///
    /// Refused with [`Error::StreamCapturing`](crate::Error::StreamCapturing)
    /// while this stream captures: cudarc's event is outside the capture.
    pub fn wait_cudarc_event(&self, event: &CudaEvent) -> Result<()> {
        check_context(self.context(), event.context(), "the cudarc event")?;
        let raw_event = event.cu_event() as sys::CUevent;
        self.enqueue_raw("Stream::wait_cudarc_event", |driver, ours| {
            // SAFETY: both handles belong to the current context (bound by
            // the protocol) and are alive for the call (`self` and `event`
            // are borrowed).
            unsafe { (driver.cuStreamWaitEvent)(ours, raw_event, 0) }
        })
    }
}

/// Ordering a cudarc stream after our work.
pub trait CudarcStreamExt {
    /// Make work enqueued on this cudarc stream from now on wait until
    /// `stream` has finished the work enqueued on it so far (one pooled
    /// event); the host does not wait.
    fn wait_stream(&self, stream: &Stream) -> Result<()>;

    /// Make work enqueued on this cudarc stream from now on wait for `event`.
    fn wait_event(&self, event: &Event) -> Result<()>;
}

impl CudarcStreamExt for CudaStream {
    fn wait_stream(&self, stream: &Stream) -> Result<()> {
        let ctx = stream.context();
        check_context(ctx, self.context(), "the cudarc stream")?;
        check_not_per_thread(self, "the cudarc stream")?;
        foreign_waits_for(
            self.cu_stream() as CUstream,
            stream,
            "CudarcStreamExt::wait_stream",
        )
    }

    fn wait_event(&self, event: &Event) -> Result<()> {
        let ctx = event.context();
        check_context(ctx, self.context(), "the cudarc stream")?;
        check_not_per_thread(self, "the cudarc stream")?;
        ctx.bind()?;
        // Work on cudarc's stream, none on ours: the protocol has nothing to
        // guard (the event's record went through it).
        // SAFETY: both handles belong to the current context and are alive
        // for the call.
        ctx.check(unsafe {
            (ctx.driver().cuStreamWaitEvent)(self.cu_stream() as CUstream, event.as_raw(), 0)
        })
    }
}

/// The address of a cudarc slice, without touching cudarc's use tracking:
/// `device_ptr` may make `home` wait for the slice's last write (harmless),
/// and its guard would record a read on `home`, overwriting the record of a
/// read on another stream that cudarc's free must still wait for: forgotten.
fn address<T, S: DevicePtr<T> + ?Sized>(slice: &S, home: &CudaStream) -> CUdeviceptr {
    let (ptr, guard) = slice.device_ptr(home);
    std::mem::forget(guard);
    ptr
}

/// Checks shared by the two slice wrappers; the slice's home stream.
fn check_slice<T, S: DeviceSlice<T> + ?Sized>(ctx: &Context, slice: &S) -> Result<()> {
    let home = slice.stream();
    check_context(ctx, home.context(), "the cudarc slice")?;
    check_not_per_thread(home, "the cudarc slice's stream")
}

/// Before a use of a cudarc slice on `stream`: `stream` waits for the
/// slice's home stream (its allocation, cudarc's work there) and for
/// cudarc's last write of it.
fn before_slice_use<T, S: DevicePtr<T> + ?Sized>(
    ctx: &Arc<Context>,
    slice: &S,
    stream: &Stream,
) -> Result<()> {
    stream.check_context_id("the cudarc slice", ctx.id())?;
    let home = slice.stream();
    wait_for_foreign(stream, home.cu_stream() as CUstream, "using a cudarc slice")?;
    // SAFETY: `stream` is a stream of the slice's context (checked above and
    // at construction); the wrapper is dropped at the end of this function,
    // while `stream` is borrowed.
    let borrowed = unsafe {
        home.context()
            .wrap_borrowed_stream(stream.as_raw() as cu::CUstream)
    };
    // cudarc waits for its last write here; its guard would record a read
    // over the record of another stream's read (see `address`): forgotten.
    let (_, guard) = slice.device_ptr(&borrowed);
    std::mem::forget(guard);
    // cudarc's waits, enqueued on `stream` above outside the protocol (this
    // runs inside the protocol's enqueue of the use, which ends the mark
    // too): the latest mark no longer covers the end.
    stream.enqueued();
    Ok(())
}

/// After a use of a cudarc slice on `stream` was enqueued: the slice's home
/// stream waits for it, so cudarc's free (on the home stream, after waiting
/// for its own events) comes after the use. When that wait cannot be
/// enqueued, the host waits for `stream` before the error is returned:
/// nothing untracked is left in flight.
fn after_slice_use(home: &CudaStream, stream: &Stream) -> Result<()> {
    let ordered = foreign_waits_for(home.cu_stream() as CUstream, stream, "using a cudarc slice");
    if let Err(err) = ordered {
        tracing::warn!(
            "ordering a cudarc slice's free after stream {}: {err}",
            stream.id()
        );
        stream.synchronize()?;
        return Err(err);
    }
    Ok(())
}

/// A cudarc slice or view, read-only, as [`DeviceMemory`]: an argument to
/// our checked launches (a `const T*` parameter) and the source of our copies.
///
/// ```no_run
/// # use cuda_streams_driver::{Context, Stream, interop::cudarc::CudarcSlice};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let cs = cudarc::driver::CudaContext::new(0)?.new_stream()?;
/// let slice = cs.clone_htod(&[1u32, 2, 3])?;
/// let stream = Stream::new(&ctx)?;
/// let mut host = [0u32; 3];
/// stream.copy_to_host(&mut host, &CudarcSlice::new(&ctx, &slice)?)?;
/// assert_eq!(host, [1, 2, 3]);
/// # Ok(())
/// # }
/// ```
pub struct CudarcSlice<'a, T, S: DevicePtr<T> + ?Sized = CudaSlice<T>> {
    slice: &'a S,
    ptr: CUdeviceptr,
    ctx: Arc<Context>,
    _elem: PhantomData<fn() -> T>,
}

impl<'a, T: DeviceCopy, S: DevicePtr<T> + ?Sized> CudarcSlice<'a, T, S> {
    /// Wrap `slice` for use with `ctx`'s streams. Fails with
    /// [`Error::Interop`](crate::Error::Interop) when it belongs to another context, `ctx` runs on
    /// the software driver, or the slice lives on the per-thread stream.
    pub fn new(ctx: &Arc<Context>, slice: &'a S) -> Result<Self> {
        check_slice(ctx, slice)?;
        Ok(Self {
            ptr: address(slice, slice.stream()),
            slice,
            ctx: Arc::clone(ctx),
            _elem: PhantomData,
        })
    }
}

// SAFETY: the pointer and length are cudarc's for a live slice of `ctx`'s
// context (checked), which the borrow keeps allocated; cudarc frees it on its
// home stream, which waits for every use reported to `after_device_use`
// (enqueued at each use, so forgetting the wrapper changes nothing) or, when
// that wait fails, the host has waited for the use. `before_device_use`
// orders the stream after the home stream, hence after the allocation. cudarc
// device memory has no host references. Address, length and context are
// fixed at construction.
unsafe impl<T: DeviceCopy, S: DevicePtr<T> + ?Sized> DeviceMemory for CudarcSlice<'_, T, S> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    fn device_len(&self) -> usize {
        self.slice.len()
    }

    fn context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        before_slice_use(&self.ctx, self.slice, stream)
    }

    fn after_device_use(&self, stream: &Stream, _write: bool) -> Result<()> {
        after_slice_use(self.slice.stream(), stream)
    }
}

/// A cudarc slice or view, borrowed mutably, as [`DeviceMemoryMut`]: the
/// destination of our copies and memsets, a `T*` parameter of our checked
/// launches. A write of ours is recorded as cudarc's last write, so cudarc's
/// later uses on any stream wait for it.
///
/// ```no_run
/// # use cuda_streams_driver::{Context, Stream, interop::cudarc::CudarcSliceMut};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let cs = cudarc::driver::CudaContext::new(0)?.new_stream()?;
/// let mut slice = cs.alloc_zeros::<u32>(4)?;
/// Stream::new(&ctx)?.memset_u32_async(&mut CudarcSliceMut::new(&ctx, &mut slice)?, 9)?;
/// assert_eq!(cs.clone_dtoh(&slice)?, [9; 4]); // cudarc waits for our write
/// # Ok(())
/// # }
/// ```
pub struct CudarcSliceMut<'a, T, S: DevicePtrMut<T> + DevicePtr<T> + ?Sized = CudaSlice<T>> {
    slice: Mutex<&'a mut S>,
    home: Arc<CudaStream>,
    ptr: CUdeviceptr,
    len: usize,
    ctx: Arc<Context>,
    _elem: PhantomData<fn() -> T>,
}

impl<'a, T: DeviceCopy, S: DevicePtrMut<T> + DevicePtr<T> + ?Sized> CudarcSliceMut<'a, T, S> {
    /// Wrap `slice` for use with `ctx`'s streams; fails as
    /// [`CudarcSlice::new`] does.
    pub fn new(ctx: &Arc<Context>, slice: &'a mut S) -> Result<Self> {
        check_slice(ctx, &*slice)?;
        let home = Arc::clone(slice.stream());
        Ok(Self {
            ptr: address(&*slice, &home),
            len: slice.len(),
            home,
            slice: Mutex::new(slice),
            ctx: Arc::clone(ctx),
            _elem: PhantomData,
        })
    }

    fn slice(&self) -> MutexGuard<'_, &'a mut S> {
        self.slice.lock().unwrap_or_else(|p| p.into_inner())
    }
}

// SAFETY: as for `CudarcSlice`; the wrapper holds the slice's only mutable
// borrow, so no other reference to it exists while the wrapper does.
unsafe impl<T: DeviceCopy, S: DevicePtrMut<T> + DevicePtr<T> + ?Sized> DeviceMemory
    for CudarcSliceMut<'_, T, S>
{
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    fn device_len(&self) -> usize {
        self.len
    }

    fn context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        before_slice_use(&self.ctx, &**self.slice(), stream)
    }

    fn after_device_use(&self, stream: &Stream, write: bool) -> Result<()> {
        after_slice_use(&self.home, stream)?;
        if write {
            // cudarc's write event, recorded on `stream` after the write
            // (the guard's drop), for cudarc's later uses to wait on.
            // SAFETY: as in `before_slice_use`: a stream of the slice's
            // context, borrowed for the length of this block.
            let borrowed = unsafe {
                self.home
                    .context()
                    .wrap_borrowed_stream(stream.as_raw() as cu::CUstream)
            };
            let mut slice = self.slice();
            let (_, guard) = slice.device_ptr_mut(&borrowed);
            drop(guard);
        }
        Ok(())
    }
}

// SAFETY: while `&mut self` is borrowed the wrapper's mutable borrow of the
// slice is the only reference to it.
unsafe impl<T: DeviceCopy, S: DevicePtrMut<T> + DevicePtr<T> + ?Sized> DeviceMemoryMut
    for CudarcSliceMut<'_, T, S>
{
}

/// One of our [`DeviceBuffer`]s as cudarc's `DevicePtr` (read-only), from
/// [`DeviceBuffer::as_cudarc`].
///
/// # Panics
/// `device_ptr` panics when given a stream of another context than the
/// buffer's (cudarc's trait cannot return an error; cudarc's own calls pass
/// the stream the wrapper was made with, or one of the same context).
pub struct CudarcBuffer<'a, T: DeviceCopy> {
    buffer: &'a DeviceBuffer<T>,
    stream: Arc<CudaStream>,
}

/// One of our [`DeviceBuffer`]s as cudarc's `DevicePtrMut`, from
/// [`DeviceBuffer::as_cudarc_mut`]. Panics as [`CudarcBuffer`] does.
pub struct CudarcBufferMut<'a, T: DeviceCopy> {
    buffer: &'a mut DeviceBuffer<T>,
    stream: Arc<CudaStream>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// This buffer as cudarc's `DevicePtr<T>`, for cudarc's copies and
    /// launches. `stream` is the cudarc stream the wrapper reports as its own
    /// (`DeviceSlice::stream`); any stream of the buffer's context may use it.
    /// On the buffer's home stream a use costs nothing more; on another, the
    /// host waits for that stream after the use (see the [module](self)).
    pub fn as_cudarc(&self, stream: &Arc<CudaStream>) -> Result<CudarcBuffer<'_, T>> {
        check_context(self.context(), stream.context(), "the cudarc stream")?;
        check_not_per_thread(stream, "the cudarc stream")?;
        Ok(CudarcBuffer {
            buffer: self,
            stream: Arc::clone(stream),
        })
    }

    /// This buffer as cudarc's `DevicePtrMut<T>`; as [`DeviceBuffer::as_cudarc`].
    pub fn as_cudarc_mut(&mut self, stream: &Arc<CudaStream>) -> Result<CudarcBufferMut<'_, T>> {
        check_context(self.context(), stream.context(), "the cudarc stream")?;
        check_not_per_thread(stream, "the cudarc stream")?;
        Ok(CudarcBufferMut {
            buffer: self,
            stream: Arc::clone(stream),
        })
    }
}

/// Prepare a use of `buffer` on the cudarc stream `on`: the guard to hand
/// back. On the home stream: nothing to do. Elsewhere: `on` waits for the
/// allocation (the buffer's own hook, through a borrowed `Stream` for `on`),
/// and the guard makes the host wait for `on` once the work is enqueued.
fn prepare_buffer_use<'a, T: DeviceCopy>(
    buffer: &DeviceBuffer<T>,
    on: &'a CudaStream,
) -> SyncOnDrop<'a> {
    let ctx = buffer.context();
    if let Err(err) = check_context(ctx, on.context(), "the cudarc stream")
        .and_then(|()| check_not_per_thread(on, "the cudarc stream"))
    {
        panic!("a cuda-streams buffer given to cudarc: {err}");
    }
    let raw = on.cu_stream() as CUstream;
    if buffer
        .home_stream()
        .is_some_and(|home| home.as_raw() == raw)
    {
        return SyncOnDrop::Sync(None);
    }
    // SAFETY: `raw` is a stream of the buffer's context (checked above),
    // valid while `on` is borrowed, which outlasts this temporary.
    let borrowed = unsafe { Stream::from_raw(ctx, raw, false) };
    if let Err(err) = buffer.before_device_use(&borrowed) {
        // The allocation must be complete before `on` uses the memory: wait
        // for the home stream on the host instead.
        tracing::warn!("ordering a cudarc stream after a buffer's allocation: {err}");
        if let Some(home) = buffer.home_stream()
            && let Err(err) = home.synchronize()
        {
            panic!(
                "a cuda-streams buffer given to cudarc: its allocation cannot be waited for: {err}"
            );
        }
    }
    SyncOnDrop::sync_stream(on)
}

macro_rules! cudarc_buffer {
    ($wrapper:ident) => {
        impl<T: DeviceCopy> DeviceSlice<T> for $wrapper<'_, T> {
            fn len(&self) -> usize {
                self.buffer.len()
            }
            fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }
        }

        impl<T: DeviceCopy> DevicePtr<T> for $wrapper<'_, T> {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a CudaStream,
            ) -> (cu::CUdeviceptr, SyncOnDrop<'a>) {
                let guard = prepare_buffer_use(self.buffer, stream);
                (self.buffer.as_device_ptr(), guard)
            }
        }
    };
}

cudarc_buffer!(CudarcBuffer);
cudarc_buffer!(CudarcBufferMut);

impl<T: DeviceCopy> DevicePtrMut<T> for CudarcBufferMut<'_, T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (cu::CUdeviceptr, SyncOnDrop<'a>) {
        let guard = prepare_buffer_use(self.buffer, stream);
        (self.buffer.as_device_ptr(), guard)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Context, Stream};
    use std::sync::Arc;

    /// What `Stream::from_cudarc` relies on, on the software driver (cudarc
    /// itself needs `libcuda.so.1`): a borrowed handle's owner lives exactly
    /// as long as the `Stream` made from it, and the stream works meanwhile.
    #[test]
    fn a_borrowed_stream_keeps_its_owner_until_it_is_dropped() {
        let ctx = Context::new(0).unwrap();
        let owner_stream = Stream::new(&ctx).unwrap();
        let owner = Arc::new(Arc::clone(&owner_stream));
        // SAFETY: the handle is a stream of `ctx`, kept valid by `owner`.
        let borrowed = unsafe {
            Stream::from_raw_with_owner(
                &ctx,
                owner_stream.as_raw(),
                false,
                Some(Box::new(Arc::clone(&owner))),
            )
        };
        drop(owner_stream);
        assert_eq!(Arc::strong_count(&owner), 2, "the Stream holds the owner");
        let mark = borrowed.mark().unwrap();
        let other = Stream::new(&ctx).unwrap();
        other.wait_stream(&borrowed).unwrap();
        other.synchronize().unwrap();
        assert!(mark.query().unwrap());
        drop(mark);
        drop(borrowed);
        assert_eq!(Arc::strong_count(&owner), 1, "dropped with the Stream");
    }
}
