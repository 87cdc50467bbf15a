//! A user's own host memory, page-locked for as long as it is borrowed
//! (`cuMemHostRegister`), so copies from and to it run at pinned speed.

use super::DeviceCopy;
use super::host_span::{HostSpan, span_host_memory};
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
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
    span: HostSpan<T>,
    /// The user's memory, borrowed mutably for `'a`. Invariant in `'a`, so
    /// the registration of one scope cannot be swapped for another's.
    _borrow: PhantomData<(&'a mut [T], Invariant<'a>)>,
}

/// A marker invariant in `'a` (a function both taking and returning it).
type Invariant<'a> = fn(&'a ()) -> &'a ();

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
            // SAFETY: the borrowed slice, page-locked just above, holding
            // `bytes / size_of::<T>()` valid `T`s; the borrow keeps everything
            // else away from it while the value lives.
            span: unsafe { HostSpan::new(Arc::clone(ctx), ptr, bytes / std::mem::size_of::<T>()) },
            _borrow: PhantomData,
        })
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

span_host_memory!(['a, T: DeviceCopy] HostRegistered<'a, T>);

impl<T: DeviceCopy> Drop for HostRegistered<'_, T> {
    fn drop(&mut self) {
        let span = &self.span;
        match span.tracker.wait_host(&span.ctx, true) {
            Ok(()) => {}
            Err(Error::InsideCallback { .. }) => {
                // The borrow ends when this returns, and a copy may still be
                // reading or writing the memory: nothing sound is left to do.
                tracing::error!(
                    "HostRegistered {:p} dropped inside a stream callback, which cannot wait for its copies; aborting",
                    span.ptr()
                );
                std::process::abort();
            }
            Err(err) => {
                // The context failed: it runs no more work, so no copy of
                // this memory is left to run.
                tracing::warn!(
                    "waiting for the copies of HostRegistered {:p}: {err}",
                    span.ptr()
                );
            }
        }
        let ptr = span.ptr().as_ptr();
        crate::enqueue::order::forget(&span.ctx, ptr as u64, span.size_in_bytes());
        // SAFETY: registered by `new` at this address; every copy using it is done.
        let code = unsafe { (span.ctx.driver().cuMemHostUnregister)(ptr.cast()) };
        if let Err(err) = span.ctx.check(code) {
            tracing::warn!("unregistering host memory {ptr:p}: {err}");
        }
        span.tracker.release_events();
    }
}

impl<T: DeviceCopy> fmt::Debug for HostRegistered<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegistered")
            .field("ptr", &self.span.ptr())
            .field("len", &self.span.len())
            .finish()
    }
}
