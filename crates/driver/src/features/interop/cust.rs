//! Interop with [cust](https://docs.rs/cust) 0.3 (feature `cust`).
//!
//! | from cust | to ours | how |
//! | --- | --- | --- |
//! | `Arc<cust::stream::Stream>` | `Arc<Stream>` | [`Stream::from_cust`]: borrowed (cust destroys it), kept alive by our `Stream`; it joins pools, coordinators and operation graphs like any stream |
//! | `&cust::memory::DeviceBuffer<T>` | [`DeviceMemory`] | [`CustBuffer`]: an argument to our checked launches and copies |
//! | `&mut cust::memory::DeviceBuffer<T>` | [`DeviceMemoryMut`] | [`CustBufferMut`] |
//! | `cust::stream::Stream`'s work | a wait | [`Stream::wait_cust_stream`] |
//!
//! | from ours | to cust | how |
//! | --- | --- | --- |
//! | `&DeviceBuffer<T>` | `&cust::memory::DeviceSlice<T>` | [`DeviceBuffer::with_cust`] (`unsafe`) |
//! | `&mut DeviceBuffer<T>` | `&mut cust::memory::DeviceSlice<T>` | [`DeviceBuffer::with_cust_mut`] (`unsafe`) |
//! | `Stream`, `Event` | waits | [`CustStreamExt::wait_our_stream`], [`CustStreamExt::wait_our_event`] |
//!
//! # Building it
//!
//! cust links `libcuda` at build time (its `cust_raw` build script prints
//! `cargo:rustc-link-lib=dylib=cuda`), unlike the rest of this crate, which
//! opens the driver at run time. `CUDA_LIBRARY_PATH` (or `/usr/local/cuda`,
//! `/opt/cuda`) must name a directory whose `lib64/` (or `lib64/stubs/`)
//! holds `libcuda.so`: a CUDA toolkit's, or on a machine without one the link
//! stub `cargo xtask cust-stub` builds from cust's own declarations
//! (`CUDA_LIBRARY_PATH=target/cuda-stub`). The binaries then need a
//! `libcuda.so.1` to start, and NVIDIA's driver to do anything through cust.
//! See `docs/architecture.md`, "cust".
//!
//! # The rules that keep it sound
//!
//! - **One context.** cust works in the thread's current context;
//!   `cust::quick_init()` and `cust::context::Context::new(device)` retain the
//!   device's primary context, which is what our [`Context`] is. Streams and
//!   buffers are checked (`cuStreamGetCtx`, `cuPointerGetAttribute`) and a
//!   mismatch is refused with [`Error::Interop`](crate::Error::Interop), as is the software driver
//!   (cust always talks to `libcuda`). Every conversion makes our context
//!   current first, so cust's later calls on this thread go to it. The other
//!   way round, cust making another context current (a context of another
//!   device, its context stack) does not mislead our later calls: with this
//!   feature on, [`Context::bind`] confirms the context it remembers for the
//!   thread with the driver before trusting it.
//! - **cust memory used by us.** cust frees a `DeviceBuffer` with `cuMemFree`
//!   when it is dropped, ordered after no stream, and its safe copies and
//!   memsets are synchronous calls on the legacy default stream, whose DMA may
//!   still be running when they return (pageable host-to-device copies).
//!   So before our work uses the buffer, our stream waits for the legacy
//!   default stream; after the work is enqueued, the host waits for our
//!   stream, so the buffer is free to be dropped or changed by cust as soon as
//!   the call returns. That is done at each use, not when the wrapper is
//!   dropped, so `mem::forget` cannot skip it. cust's `unsafe` async calls on
//!   the buffer are the caller's to order (with the waits below), as cust
//!   requires. For full speed, allocate with us and lend the buffer to cust
//!   instead.
//! - **Our memory used by cust.** cust's `DeviceSlice` is `Copy` and owns
//!   nothing, so a copy of it can outlive the buffer it points into, and cust's
//!   safe calls on it would touch freed memory: [`DeviceBuffer::with_cust`] is
//!   `unsafe` (no copy of the slice may be used after the closure returns,
//!   and through `&self` none may write).
//!   Around the closure: the legacy default stream first waits for the
//!   buffer's home stream (its allocation and our work there), and after it,
//!   even if the closure panics, the buffer's free waits for the legacy
//!   default stream: a stream-ordered buffer's home stream waits for it (the
//!   host does not), and for a plain buffer (freed by the host) the host
//!   waits for it. Work the closure enqueues on cust streams (cust's `unsafe`
//!   async calls) is the caller's to order, as cust requires.
//!
//! # Left out, and why
//!
//! - A cust `Event` as a wait of ours: cust 0.3 keeps an event's handle
//!   private (`Event::as_inner` is `pub(crate)`), so nothing outside cust can
//!   wait on it. Wait on the cust stream instead ([`Stream::wait_cust_stream`]),
//!   or record one of our events there with cust's help: our streams as
//!   cust's are left out too (next point), so the stream is the way.
//! - Our `Stream` or `Event` as cust's: cust 0.3 has no way to wrap a
//!   handle made elsewhere (no `from_raw`), and making one by hand would give
//!   cust ownership, so it would destroy our handle. Order cust's streams
//!   with [`CustStreamExt`] instead.
//! - cust's `DeviceSlice`, `DeviceBox` and unified memory as ours: a
//!   `DeviceSlice` is `Copy` and does not keep its memory alive, so borrowing
//!   one proves nothing; wrap the owning `DeviceBuffer`.
//!
//! # Example
//!
//! ```no_run
//! use cuda_streams_driver::interop::cust::{CustBuffer, CustBufferMut, CustStreamExt};
//! use cuda_streams_driver::{Context, DeviceBuffer, Stream};
//! use cust::memory::CopyDestination;
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let _cust = cust::quick_init()?; // the device's primary context, current
//! let ctx = Context::new(0)?; // the same context: interop needs a GPU
//!
//! // A cust stream as ours: pools, coordinators and graphs take it.
//! let cs = Arc::new(cust::stream::Stream::new(cust::stream::StreamFlags::NON_BLOCKING, None)?);
//! let ours = Stream::from_cust(&ctx, &cs)?;
//!
//! // A cust buffer as an argument to our copies and checked launches.
//! let mut buffer = cust::memory::DeviceBuffer::from_slice(&[0u32; 1024])?;
//! ours.memset_u32_async(&mut CustBufferMut::new(&ctx, &mut buffer)?, 7)?;
//! let mut host = vec![0u32; 1024];
//! ours.copy_to_host(&mut host, &CustBuffer::new(&ctx, &buffer)?)?;
//! assert!(host.iter().all(|&v| v == 7));
//!
//! // Our buffer as cust's DeviceSlice, inside a closure.
//! let mine = DeviceBuffer::from_slice(&ours, &[1.0f32; 256])?;
//! let mut back = vec![0.0f32; 256];
//! // SAFETY: the slice is not kept past the closure, and only read.
//! unsafe { mine.with_cust(|slice| slice.copy_to(&mut back[..]))?? };
//! assert_eq!(back, vec![1.0f32; 256]);
//!
//! // Events order work across the two: cust's stream waits for ours.
//! cs.wait_our_stream(&ours)?;
//! # Ok(())
//! # }
//! ```

use super::shared::{PER_THREAD_STREAM, foreign_waits_for, interop, require_gpu, wait_for_foreign};
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::event::Event;
use crate::objects::memory::{DeviceBuffer, DeviceCopy, DeviceMemory, DeviceMemoryMut};
use crate::objects::stream::Stream;
use ::cust::memory::DeviceSlice as CustDeviceSlice;
use ::cust::memory::{DeviceBuffer as CustDeviceBuffer, DeviceCopy as CustCopy, DevicePointer};
use ::cust::sys as cu;
use std::sync::Arc;
use sys::{CUdeviceptr, CUstream};

/// The legacy default stream's handle, where cust's synchronous copies and
/// memsets run.
const LEGACY_STREAM: CUstream = std::ptr::null_mut();

/// `Ok` when `ctx` runs on NVIDIA's driver; it is then current on this
/// thread, for cust's calls.
fn check_gpu(ctx: &Context, what: &str) -> Result<()> {
    require_gpu(ctx, "cust", what)?;
    ctx.bind()
}

/// `Ok` when cust's `raw` context handle (from a query that returned
/// `code`) is `ctx`.
fn check_same(ctx: &Context, code: cu::CUresult, raw: cu::CUcontext, what: &str) -> Result<()> {
    if code != cu::cudaError_enum::CUDA_SUCCESS {
        return Err(interop(format!(
            "{what}: its CUDA context cannot be read ({code:?})"
        )));
    }
    if raw.cast::<()>() != ctx.as_raw().cast::<()>() {
        return Err(interop(format!(
            "{what} belongs to CUDA context {raw:p}, and ours (id {}) is {:p} (device {}): \
             use `cust::quick_init()` or `cust::context::Context::new(device)`, the device's \
             primary context",
            ctx.id(),
            ctx.as_raw(),
            ctx.info().ordinal
        )));
    }
    Ok(())
}

/// `Ok` when the cust stream `stream` is a stream of `ctx` (and not a
/// per-thread default stream, whose handle names another stream on every
/// thread).
fn check_stream(ctx: &Context, stream: &::cust::stream::Stream, what: &str) -> Result<()> {
    check_gpu(ctx, what)?;
    let raw = stream.as_inner();
    if raw as usize == PER_THREAD_STREAM {
        return Err(interop(format!(
            "{what} is the per-thread default stream (CU_STREAM_PER_THREAD), which names another \
             stream on each thread"
        )));
    }
    let mut owner: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: `raw` is a live stream (cust's `Stream` is borrowed) and
    // `owner` is a valid place for one context handle.
    let code = unsafe { cu::cuStreamGetCtx(raw, &mut owner) };
    check_same(ctx, code, owner, what)
}

/// `Ok` when the device memory at `ptr` was allocated in `ctx`.
fn check_memory(ctx: &Context, ptr: CUdeviceptr, what: &str) -> Result<()> {
    check_gpu(ctx, what)?;
    let mut owner: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: the attribute is a context handle, written to a valid place of
    // that type; the driver checks `ptr` itself.
    let code = unsafe {
        cu::cuPointerGetAttribute(
            (&mut owner as *mut cu::CUcontext).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr,
        )
    };
    check_same(ctx, code, owner, what)
}

impl Stream {
    /// A cust stream as one of ours, so it can join pools, coordinators and
    /// operation graphs. The stream is borrowed: cust destroys it, and the
    /// returned `Stream` keeps a clone of `stream` so that cannot happen
    /// before it is dropped.
    ///
    /// Fails with [`Error::Interop`](crate::Error::Interop) when `stream` belongs to another context
    /// than `ctx`, when `ctx` runs on the software driver, or for the
    /// per-thread default stream.
    pub fn from_cust(
        ctx: &Arc<Context>,
        stream: &Arc<::cust::stream::Stream>,
    ) -> Result<Arc<Stream>> {
        check_stream(ctx, stream, "the cust stream")?;
        let raw = stream.as_inner() as CUstream;
        let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(Arc::clone(stream));
        // SAFETY: `raw` is a stream of `ctx` (checked above), not owned by
        // us, and valid while `owner` (a strong reference to cust's stream)
        // lives, which is as long as the returned Stream.
        Ok(unsafe { Stream::from_raw_with_owner(ctx, raw, false, Some(owner)) })
    }

    /// Make work enqueued on this stream from now on wait until the cust
    /// stream `stream` has finished the work enqueued on it so far (one
    /// pooled event); the host does not wait. (cust 0.3 keeps an event's
    /// handle private, so our streams cannot wait on a cust `Event` itself:
    /// wait on the stream it was recorded on.)
    pub fn wait_cust_stream(&self, stream: &::cust::stream::Stream) -> Result<()> {
        let ctx = self.context();
        check_stream(ctx, stream, "the cust stream")?;
        wait_for_foreign(
            self,
            stream.as_inner() as CUstream,
            "Stream::wait_cust_stream",
        )
    }
}

/// Ordering a cust stream after our work (named apart from cust's own
/// `Stream::wait_event`, which takes a cust `Event`).
pub trait CustStreamExt {
    /// Make work enqueued on this cust stream from now on wait until
    /// `stream` has finished the work enqueued on it so far (one pooled
    /// event); the host does not wait.
    fn wait_our_stream(&self, stream: &Stream) -> Result<()>;

    /// Make work enqueued on this cust stream from now on wait for `event`.
    fn wait_our_event(&self, event: &Event) -> Result<()>;
}

impl CustStreamExt for ::cust::stream::Stream {
    fn wait_our_stream(&self, stream: &Stream) -> Result<()> {
        let ctx = stream.context();
        check_stream(ctx, self, "the cust stream")?;
        foreign_waits_for(
            self.as_inner() as CUstream,
            stream,
            "CustStreamExt::wait_our_stream",
        )
    }

    fn wait_our_event(&self, event: &Event) -> Result<()> {
        let ctx = event.context();
        check_stream(ctx, self, "the cust stream")?;
        // Work on cust's stream, none on ours: the protocol has nothing to
        // guard (the event's record went through it).
        // SAFETY: both handles belong to the current context and are alive
        // for the call.
        ctx.check(unsafe {
            (ctx.driver().cuStreamWaitEvent)(self.as_inner() as CUstream, event.as_raw(), 0)
        })
    }
}

/// Before a use of cust memory on `stream`: `stream` waits for the legacy
/// default stream, where cust's synchronous copies may still be moving data.
fn before_cust_use(ctx: &Arc<Context>, stream: &Stream) -> Result<()> {
    stream.check_context_id("the cust buffer", ctx.id())?;
    wait_for_foreign(stream, LEGACY_STREAM, "using a cust buffer")
}

/// After a use of cust memory on `stream` was enqueued: the host waits for
/// it, since cust frees with `cuMemFree`, ordered after no stream.
fn after_cust_use(stream: &Stream) -> Result<()> {
    stream.synchronize()
}

/// A cust `DeviceBuffer`, read-only, as [`DeviceMemory`]: an argument to our
/// checked launches (a `const T*` parameter) and the source of our copies.
/// Each use ends with the host waiting for the stream (see the
/// [module](self)).
///
/// ```no_run
/// # use cuda_streams_driver::{Context, Stream, interop::cust::CustBuffer};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let _cust = cust::quick_init()?;
/// let ctx = Context::new(0)?;
/// let buffer = cust::memory::DeviceBuffer::from_slice(&[1u32, 2, 3])?;
/// let mut host = [0u32; 3];
/// Stream::new(&ctx)?.copy_to_host(&mut host, &CustBuffer::new(&ctx, &buffer)?)?;
/// assert_eq!(host, [1, 2, 3]);
/// # Ok(())
/// # }
/// ```
pub struct CustBuffer<'a, T: CustCopy> {
    buffer: &'a CustDeviceBuffer<T>,
    ctx: Arc<Context>,
}

impl<'a, T: DeviceCopy + CustCopy> CustBuffer<'a, T> {
    /// Wrap `buffer` for use with `ctx`'s streams. Fails with
    /// [`Error::Interop`](crate::Error::Interop) when it belongs to another context or `ctx` runs on
    /// the software driver.
    pub fn new(ctx: &Arc<Context>, buffer: &'a CustDeviceBuffer<T>) -> Result<Self> {
        if !buffer.is_empty() {
            check_memory(ctx, buffer.as_device_ptr().as_raw(), "the cust buffer")?;
        } else {
            check_gpu(ctx, "the cust buffer")?;
        }
        Ok(Self {
            buffer,
            ctx: Arc::clone(ctx),
        })
    }
}

// SAFETY: the pointer and length are cust's for a live buffer of `ctx`
// (checked), which the borrow keeps allocated; every use ends with the host
// waiting for it (enqueued at each use, so forgetting the wrapper changes
// nothing), so cust's `cuMemFree` comes after it. cust's memory is valid on
// every stream once `cuMemAlloc` returns; its synchronous copies are waited
// for by `before_device_use`. There is no host view of it. Address, length
// and context are fixed at construction.
unsafe impl<T: DeviceCopy + CustCopy> DeviceMemory for CustBuffer<'_, T> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.buffer.as_device_ptr().as_raw()
    }

    fn device_len(&self) -> usize {
        self.buffer.len()
    }

    fn context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        before_cust_use(&self.ctx, stream)
    }

    fn after_device_use(&self, stream: &Stream, _write: bool) -> Result<()> {
        after_cust_use(stream)
    }
}

/// A cust `DeviceBuffer`, borrowed mutably, as [`DeviceMemoryMut`]: the
/// destination of our copies and memsets, a `T*` parameter of our checked
/// launches. As [`CustBuffer`], each use ends with the host waiting for it.
pub struct CustBufferMut<'a, T: CustCopy> {
    buffer: &'a mut CustDeviceBuffer<T>,
    ctx: Arc<Context>,
}

impl<'a, T: DeviceCopy + CustCopy> CustBufferMut<'a, T> {
    /// Wrap `buffer` for use with `ctx`'s streams; fails as
    /// [`CustBuffer::new`] does.
    pub fn new(ctx: &Arc<Context>, buffer: &'a mut CustDeviceBuffer<T>) -> Result<Self> {
        CustBuffer::new(ctx, &*buffer)?;
        Ok(Self {
            buffer,
            ctx: Arc::clone(ctx),
        })
    }
}

// SAFETY: as for `CustBuffer`; the wrapper holds the buffer's only mutable
// borrow, so no other reference to it exists while the wrapper does.
unsafe impl<T: DeviceCopy + CustCopy> DeviceMemory for CustBufferMut<'_, T> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.buffer.as_device_ptr().as_raw()
    }

    fn device_len(&self) -> usize {
        self.buffer.len()
    }

    fn context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> Result<()> {
        before_cust_use(&self.ctx, stream)
    }

    fn after_device_use(&self, stream: &Stream, _write: bool) -> Result<()> {
        after_cust_use(stream)
    }
}

// SAFETY: while `&mut self` is borrowed the wrapper's mutable borrow of the
// buffer is the only reference to it, and cust's buffers have no host view.
unsafe impl<T: DeviceCopy + CustCopy> DeviceMemoryMut for CustBufferMut<'_, T> {}

/// Runs after the closure of [`DeviceBuffer::with_cust`], on return or
/// unwind: the buffer's free waits for cust's work on the legacy default
/// stream (a pageable host-to-device copy may still be moving data when
/// cust's call returns).
struct AfterCust<'a, T: DeviceCopy> {
    buffer: &'a DeviceBuffer<T>,
}

impl<T: DeviceCopy> Drop for AfterCust<'_, T> {
    fn drop(&mut self) {
        let ctx = self.buffer.context();
        // A stream-ordered buffer is freed on its home stream: that stream
        // waits for the legacy default stream, and the host does not.
        if let Some(home) = self.buffer.home_stream() {
            let ordered = wait_for_foreign(home, LEGACY_STREAM, "DeviceBuffer::with_cust");
            match ordered {
                Ok(()) => return,
                Err(err) => tracing::warn!(
                    "ordering home stream {} after cust's work on the legacy default stream: \
                     {err}; waiting on the host",
                    home.id()
                ),
            }
        }
        // A plain buffer is freed by the host (`cuMemFree`), after waiting
        // only for the streams it recorded: the host waits for the legacy
        // default stream here.
        if let Err(err) = ctx.bind() {
            tracing::error!("waiting for the legacy default stream: {err}");
            return;
        }
        // SAFETY: the legacy default stream of the current context.
        let code = unsafe { (ctx.driver().cuStreamSynchronize)(LEGACY_STREAM) };
        if let Err(err) = ctx.check(code) {
            tracing::error!("waiting for the legacy default stream: {err}");
        }
    }
}

impl<T: DeviceCopy + CustCopy> DeviceBuffer<T> {
    /// Run `f` with this buffer as cust's `DeviceSlice`, for cust's copies,
    /// memsets and launches. Our context is current while `f` runs. Before
    /// `f`, the legacy default stream (where cust's synchronous calls run)
    /// waits for the buffer's home stream; after it, even on a panic, the
    /// buffer's free waits for the legacy default stream. Work `f` enqueues
    /// on other cust streams (cust's `unsafe` async calls) is ordered by the
    /// caller, as cust requires.
    ///
    /// Fails with [`Error::Interop`](crate::Error::Interop) on the software driver.
    ///
    /// # Safety
    /// cust's `DeviceSlice` is `Copy`: no copy of the slice may be used after
    /// `f` returns (the buffer may be freed by then). And since a copy is
    /// writable (`DeviceSlice::index` returns one from `&self`), `f` must not
    /// write the memory: other threads may be reading it through `&self`.
    pub unsafe fn with_cust<R>(&self, f: impl FnOnce(&CustDeviceSlice<T>) -> R) -> Result<R> {
        let slice = self.prepare_cust()?;
        let _after = AfterCust { buffer: self };
        Ok(f(&slice))
    }

    /// [`DeviceBuffer::with_cust`], writable.
    ///
    /// # Safety
    /// No copy of the slice may be used after `f` returns (the buffer may be
    /// freed by then).
    pub unsafe fn with_cust_mut<R>(
        &mut self,
        f: impl FnOnce(&mut CustDeviceSlice<T>) -> R,
    ) -> Result<R> {
        let mut slice = self.prepare_cust()?;
        let _after = AfterCust { buffer: self };
        Ok(f(&mut slice))
    }

    /// The checks and ordering before cust uses the buffer; the slice.
    fn prepare_cust(&self) -> Result<CustDeviceSlice<T>> {
        let ctx = self.context();
        check_gpu(ctx, "the buffer given to cust")?;
        if let Some(home) = self.home_stream() {
            foreign_waits_for(LEGACY_STREAM, home, "DeviceBuffer::with_cust")?;
        }
        // SAFETY: `len` values at the pointer belong to this buffer, which
        // outlives the closure the slice is lent to; the caller of the
        // `unsafe` entry points keeps copies of it no longer.
        Ok(unsafe {
            CustDeviceSlice::from_raw_parts(
                DevicePointer::from_raw(self.as_device_ptr()),
                self.len(),
            )
        })
    }
}
