//! Page-locked host memory lent out by an owner (a pool), which gets it back,
//! with the streams that may still be using it, when the region is dropped.
//!
//! A [`PinnedBuffer`](crate::PinnedBuffer) waits on the host for its copies
//! when dropped, then frees. A pool cannot afford that wait on every free:
//! a [`PinnedRegion`] instead hands its owner the event of each stream whose
//! recorded uses may still run (the same per-stream events the buffers
//! track), and the owner reuses the memory once they have completed.

use super::host_span::{HostSpan, span_host_memory};
use super::{DeviceCopy, byte_size};
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::event_pool::PooledEvent;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

/// Who gets a [`PinnedRegion`]'s memory back when the region is dropped.
pub trait RegionOwner: Send + Sync {
    /// Take the memory back. It may be reused (or freed) only once every
    /// event in [`ReturnedRegion::uses`] has completed. Called from `Drop`:
    /// it must not panic.
    fn give_back(&self, region: ReturnedRegion);
}

/// What a dropped [`PinnedRegion`] hands its owner.
#[derive(Debug)]
#[non_exhaustive] // an owner may later be told more (e.g. which uses wrote)
pub struct ReturnedRegion {
    /// The host address the region was made with.
    pub address: u64,
    /// Its size in bytes.
    pub bytes: usize,
    /// The owner's tag, given at [`PinnedRegion::from_raw_parts`].
    pub token: u64,
    /// One entry per stream whose uses of the region may still be running.
    pub uses: Vec<StreamUse>,
    /// The region's reference to its context, handed over rather than
    /// dropped: an owner that makes many regions (a pool on its hit path)
    /// can give it to the next region instead of counting a new reference
    /// up and this one down, two atomic read-modify-writes, each costing
    /// several nanoseconds on a server CPU.
    pub context: Arc<Context>,
}

/// A stream's last recorded use of a region: the memory is free of that
/// stream once `event` has completed.
#[derive(Debug)]
pub struct StreamUse {
    /// The stream's [`Stream::id`](crate::Stream::id).
    pub stream_id: u64,
    /// Recorded on that stream after its last use.
    pub event: PooledEvent,
}

/// `len` values of `T` in page-locked host memory that an owner lends out:
/// a copy source or destination like a [`PinnedBuffer`](crate::PinnedBuffer)
/// (it is [`HostMemory`](crate::HostMemory), host access waits for the copies
/// that may touch it), except that dropping it does not wait: the owner gets
/// the memory back with each using stream's event ([`RegionOwner`]).
///
/// ```
/// use cuda_streams_driver::{
///     Context, DeviceBuffer, PinnedBuffer, PinnedRegion, RegionOwner, ReturnedRegion, Stream,
/// };
/// use std::sync::{Arc, Mutex};
///
/// /// Keeps what comes back.
/// #[derive(Default)]
/// struct Shelf(Mutex<Vec<ReturnedRegion>>);
/// impl RegionOwner for Shelf {
///     fn give_back(&self, region: ReturnedRegion) {
///         self.0.lock().unwrap().push(region);
///     }
/// }
///
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut backing = PinnedBuffer::<u32>::new(&ctx, 4)?;
/// let address = backing.as_mut_slice()?.as_mut_ptr();
/// let shelf = Arc::new(Shelf::default());
/// // SAFETY: `backing` is pinned memory of `ctx` holding 4 `u32`s; it is not
/// // touched while lent, and outlives every use: the events handed back are
/// // waited for below, before `backing` is dropped.
/// let mut region =
///     unsafe { PinnedRegion::from_raw_parts(Arc::clone(&ctx), address, 4, shelf.clone(), 7) };
/// region.as_mut_slice()?.copy_from_slice(&[1, 2, 3, 4]);
/// let mut device = DeviceBuffer::<u32>::new_async(&stream, 4)?;
/// stream.copy_from_host_async(&mut device, &region)?;
/// drop(region); // no wait: the shelf gets the memory and the stream's event
///
/// let returned = shelf.0.lock().unwrap().pop().unwrap();
/// assert_eq!((returned.token, returned.bytes), (7, 16));
/// assert_eq!(returned.uses[0].stream_id, stream.id());
/// returned.uses[0].event.synchronize()?;
/// assert!(Arc::ptr_eq(&returned.context, &ctx)); // the region's reference, handed back
/// assert_eq!(device.to_vec(&stream)?, [1, 2, 3, 4]);
/// # Ok(())
/// # }
/// ```
pub struct PinnedRegion<T: DeviceCopy> {
    /// Taken apart in `drop`, which hands its context to the owner.
    span: ManuallyDrop<HostSpan<T>>,
    owner: Arc<dyn RegionOwner>,
    token: u64,
}

impl<T: DeviceCopy> PinnedRegion<T> {
    /// A region over `len` values at `ptr`, going back to `owner` (tagged
    /// `token`) when dropped. It checks nothing but the pointer (null
    /// panics): owners size their memory with [`region_bytes`]. The region
    /// holds `ctx` and hands it back in [`ReturnedRegion::context`].
    ///
    /// # Safety
    /// - `ptr` is page-locked host memory usable by `ctx`'s device
    ///   (`cuMemHostAlloc`, `cuMemHostRegister`, or a [`HostMemPool`](crate::HostMemPool)
    ///   allocation its stream has passed), aligned for `T`, holding
    ///   `len` initialised values of `T` in `len * size_of::<T>()` bytes
    ///   (`len > 0`, no overflow);
    /// - every earlier use of that memory by a stream has completed;
    /// - nothing else reads or writes the memory until `owner.give_back`
    ///   is called, and the owner neither frees nor reuses it until every
    ///   event it is handed then has completed.
    pub unsafe fn from_raw_parts(
        ctx: Arc<Context>,
        ptr: *mut T,
        len: usize,
        owner: Arc<dyn RegionOwner>,
        token: u64,
    ) -> Self {
        let ptr = NonNull::new(ptr).expect("PinnedRegion::from_raw_parts: null pointer");
        // Earlier uses have completed (the contract): the stream-order
        // checker starts afresh on this memory.
        crate::enqueue::order::forget(
            &ctx,
            ptr.as_ptr() as u64,
            len.saturating_mul(std::mem::size_of::<T>()),
        );
        Self {
            // SAFETY: the caller's contract, which is the span's.
            span: ManuallyDrop::new(unsafe { HostSpan::new(ctx, ptr, len) }),
            owner,
            token,
        }
    }

    /// The owner's tag.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The host address, for raw calls. Reading or writing through it while a
    /// copy is in flight is a data race; prefer `as_slice`.
    pub fn as_ptr(&self) -> *const T {
        self.span.ptr().as_ptr()
    }

    /// The contents copied into a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }
}

/// `len * size_of::<T>()` as [`PinnedRegion`]'s owners must check it: zero
/// and overflow refused, naming the values.
///
/// ```
/// let err = cuda_streams_driver::region_bytes::<u64>(0).unwrap_err();
/// assert!(err.to_string().contains("0 element(s)"), "{err}");
/// assert_eq!(cuda_streams_driver::region_bytes::<u64>(3).unwrap(), 24);
/// ```
pub fn region_bytes<T>(len: usize) -> Result<usize> {
    byte_size::<T>("PinnedRegion", len)
}

span_host_memory!([T: DeviceCopy] PinnedRegion<T>);

impl<T: DeviceCopy> Drop for PinnedRegion<T> {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and nothing reads `span` after this.
        let mut span = unsafe { ManuallyDrop::take(&mut self.span) };
        let uses = span
            .tracker
            .take_pending(|(stream_id, event)| StreamUse { stream_id, event });
        let address = span.ptr().as_ptr() as u64;
        let bytes = span.size_in_bytes();
        self.owner.give_back(ReturnedRegion {
            address,
            bytes,
            token: self.token,
            uses,
            context: span.into_context(),
        });
    }
}

impl<T: DeviceCopy> fmt::Debug for PinnedRegion<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedRegion")
            .field("ptr", &self.span.ptr())
            .field("len", &self.span.len())
            .field("token", &self.token)
            .finish()
    }
}
