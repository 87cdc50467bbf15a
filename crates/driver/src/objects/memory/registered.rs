//! A user's own host memory, page-locked for as long as it is borrowed
//! (`cuMemHostRegister`), so copies from and to it run at pinned speed.

use super::DeviceCopy;
use super::sealed::{HostAccess, HostUse};
use super::tracker::UseTracker;
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use sys::CUresult;

/// A `&'a mut [T]` (a `Vec`'s contents, a memory-mapped file) registered
/// with the driver (`cuMemHostRegister`), usable as [`HostMemory`](crate::HostMemory)
/// by asynchronous copies until it is dropped; dropping it waits for those
/// copies, then unregisters.
///
/// The borrow keeps the memory alive and in place while copies use it: the
/// `Vec` cannot be read, written, grown or dropped until the registration
/// is gone. Made safely with [`HostRegistered::scope`], which drops the
/// registration (waiting for its copies) before it returns, even on a
/// panic; [`HostRegistered::new`] makes a free-standing one, and is
/// `unsafe` because leaking it (`std::mem::forget`) would end the borrow
/// without the wait.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, HostRegistered, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut batch: Vec<f32> = (0..1024).map(|i| i as f32).collect();
/// let mut device = DeviceBuffer::<f32>::new_async(&stream, batch.len())?;
/// HostRegistered::scope(&ctx, &mut batch, |registered| {
///     stream.copy_from_host_async(&mut device, registered)?;
///     // Writing waits for the copy that reads it.
///     registered.as_mut_slice()?.fill(0.0);
///     stream.copy_to_host_async(registered, &device)
/// })??; // the registration's error, then the closure's
/// // The scope waited for the copy back before it returned.
/// assert_eq!(batch[1023], 1023.0);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping it at once unregisters the memory"]
pub struct HostRegistered<'a, T: DeviceCopy> {
    ctx: Arc<Context>,
    ptr: NonNull<T>,
    len: usize,
    tracker: UseTracker,
    /// The user's memory, borrowed mutably for `'a`. Invariant in `'a`, so
    /// the registration of one scope cannot be swapped for another's.
    _borrow: PhantomData<(&'a mut [T], Invariant<'a>)>,
}

/// A marker invariant in `'a` (a function both taking and returning it).
type Invariant<'a> = fn(&'a ()) -> &'a ();

// SAFETY: the value holds the only borrow of the memory (`&'a mut [T]` is
// Send for `T: Send`), and the tracker is Send + Sync.
unsafe impl<T: DeviceCopy> Send for HostRegistered<'_, T> {}
// SAFETY: shared access only reads host memory after waiting for device
// writes; writes need `&mut self`.
unsafe impl<T: DeviceCopy> Sync for HostRegistered<'_, T> {}

impl<'a, T: DeviceCopy> HostRegistered<'a, T> {
    /// Register `data` for the time `f` runs, hand it to `f`, then wait for
    /// the copies that used it and unregister. The outer `Result` is the
    /// registration's ([`HostRegistered::new`]'s errors); `f`'s value comes
    /// back inside it.
    pub fn scope<R>(
        ctx: &Arc<Context>,
        data: &'a mut [T],
        f: impl for<'s> FnOnce(&mut HostRegistered<'s, T>) -> R,
    ) -> Result<R> {
        // SAFETY: the value stays in this frame and is dropped here, on
        // return or unwind; `f` gets only a `&mut` whose type's lifetime it
        // cannot name, so it can neither keep nor replace the value.
        let mut registered = unsafe { Self::new(ctx, data)? };
        Ok(f(&mut registered))
    }

    /// Register `data` (`cuMemHostRegister`, flags 0). Empty slices are
    /// refused ([`Error::ZeroSize`]); so is memory that is page-locked
    /// already ([`Error::HostRegister`]): registered, sharing a page with
    /// another registration, or from `cuMemHostAlloc` (a
    /// [`PinnedBuffer`](crate::PinnedBuffer) or a pool's block, which needs
    /// no registration: copy with it directly).
    ///
    /// # Safety
    /// The value must be dropped (not leaked with `std::mem::forget`, an
    /// `Rc` cycle or the like) before `'a` ends: its `Drop` is what waits
    /// for the copies still reading or writing `data`. Nor may it take the
    /// place of the registration a [`HostRegistered::scope`] lends
    /// (`std::mem::swap`, `std::mem::replace`): that one's `Drop` must run
    /// at the end of its scope.
    pub unsafe fn new(ctx: &Arc<Context>, data: &'a mut [T]) -> Result<Self> {
        let bytes = std::mem::size_of_val(data);
        if bytes == 0 {
            return Err(Error::ZeroSize {
                what: "HostRegistered",
                len: data.len(),
                elem_size: std::mem::size_of::<T>(),
            });
        }
        ctx.bind()?;
        let ptr = NonNull::from(data).cast::<T>();
        // SAFETY: `bytes` bytes at `ptr` are the borrowed slice; flags 0; the
        // context is current. Registration changes no byte of the memory.
        let code =
            unsafe { (ctx.driver().cuMemHostRegister)(ptr.as_ptr().cast::<c_void>(), bytes, 0) };
        ctx.check(code)
            .map_err(|err| refusal(err, ptr.as_ptr() as u64, bytes))?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            ptr,
            len: bytes / std::mem::size_of::<T>(),
            tracker: UseTracker::default(),
            _borrow: PhantomData,
        })
    }

    common_accessors!();

    /// The contents, after waiting for the enqueued uses that may write them.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.tracker.wait_host(&self.ctx, false)?;
        // SAFETY: the borrowed slice (valid `T`s, written since only by
        // finished copies of `DeviceCopy` values); no write is in flight.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The contents for writing, after waiting for every enqueued use.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.tracker.wait_host(&self.ctx, true)?;
        // SAFETY: as in `as_slice`, and no stream uses them (waited above).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }
}

/// The error for a refused registration of `bytes` bytes at `address`: the
/// two codes a GPU driver gives memory that is page-locked already become
/// [`Error::HostRegister`], saying so; any other stays the driver's.
fn refusal(err: Error, address: u64, bytes: usize) -> Error {
    let Error::Driver(source) = err else {
        return err;
    };
    let reason = match source.code() {
        // What a GPU driver answers for memory from cuMemHostAlloc (an H100,
        // CUDA 13.0), and for memory that is not host memory.
        CUresult::CUDA_ERROR_INVALID_VALUE => {
            "CUDA refuses memory that is page-locked already, such as that of a PinnedBuffer \
             or a host pool's block (from cuMemHostAlloc), which needs no registration: copy \
             with it directly; it also refuses memory that is not host memory"
        }
        CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => {
            "the memory, or a page it shares with other memory, is registered already \
             (another HostRegistered?); registered memory needs no second registration"
        }
        _ => return Error::Driver(source),
    };
    Error::HostRegister {
        address,
        bytes,
        source,
        reason,
    }
}

impl<T: DeviceCopy> HostUse for HostRegistered<'_, T> {
    fn host_context_id(&self) -> u64 {
        self.ctx.id()
    }

    fn host_bytes(&self) -> (u64, usize) {
        (self.ptr.as_ptr() as u64, self.size_in_bytes())
    }

    fn after_host_use(&self, stream: &Stream, write: bool) -> Result<()> {
        self.tracker.record_use(stream, write)
    }

    fn as_host_use(&self) -> &dyn HostUse {
        self
    }
}

impl<T: DeviceCopy> HostAccess<T> for HostRegistered<'_, T> {
    fn host_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    fn host_len(&self) -> usize {
        self.len
    }
}

impl<T: DeviceCopy> Drop for HostRegistered<'_, T> {
    fn drop(&mut self) {
        match self.tracker.wait_host(&self.ctx, true) {
            Ok(()) => {}
            Err(Error::InsideCallback { .. }) => {
                // The borrow ends when this returns, and a copy may still be
                // reading or writing the memory: nothing sound is left to do.
                tracing::error!(
                    "HostRegistered {:p} dropped inside a stream callback, which cannot wait for its copies; aborting",
                    self.ptr
                );
                std::process::abort();
            }
            Err(err) => {
                // The context failed: it runs no more work, so no copy of
                // this memory is left to run.
                tracing::warn!(
                    "waiting for the copies of HostRegistered {:p}: {err}",
                    self.ptr
                );
            }
        }
        crate::enqueue::order::forget(&self.ctx, self.ptr.as_ptr() as u64, self.size_in_bytes());
        // SAFETY: registered by `new` at this address; every copy using it is done.
        let code = unsafe { (self.ctx.driver().cuMemHostUnregister)(self.ptr.as_ptr().cast()) };
        if let Err(err) = self.ctx.check(code) {
            tracing::warn!("unregistering host memory {:p}: {err}", self.ptr);
        }
        self.tracker.release_events();
    }
}

impl<T: DeviceCopy> fmt::Debug for HostRegistered<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegistered")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}
