//! Typed views of an allocation: the driver layer's memory traits, so an
//! allocation is a kernel argument, a copy source or destination and a memset
//! target through the same safe calls as any buffer. The allocation's own
//! memsets and copies are here too: they go through views.

use crate::allocation::Allocation;
use crate::error::{Error, Result};
use driver::sys::CUdeviceptr;
use driver::{DeviceCopy, DeviceMemory, DeviceMemoryMut, Stream};
use std::fmt;
use std::marker::PhantomData;

/// An [`Allocation`] seen as `size / size_of::<T>()` values of `T`, for
/// reading ([`Allocation::as_device`]).
///
/// While it exists the block is *pinned*: the handle cannot be dropped (the
/// view borrows it) and `free_for_stream` leaves the block in place until the
/// last view goes. Work enqueued through it on another stream than the home
/// stream first waits for the home stream's work up to that point (once per
/// stream), and is declared so the block's free waits for it.
///
/// ```
/// use cuda_streams_allocator::StreamOrderedAllocator;
/// use cuda_streams_allocator::driver::{Context, LaunchConfig, Module, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// let mut data = allocator.allocate_for_stream(&stream, 1024 * 4)?;
/// // fill_u32(u64 n, u32 value, u32* out): checked against its signature.
/// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
/// let mut words = data.as_device_mut::<u32>()?;
/// stream.launch(&fill, LaunchConfig::for_num_elems(1024), &[1024u64.into(), 7u32.into(), (&mut words).into()])?;
/// drop(words);
/// let mut back = vec![0u32; 1024];
/// data.copy_to_host(&mut back)?;
/// assert!(back.iter().all(|&w| w == 7));
/// assert_eq!(stream.metrics().kernel_launches, 1);
/// # Ok(())
/// # }
/// ```
pub struct AllocationView<'a, T: DeviceCopy> {
    allocation: &'a Allocation,
    len: usize,
    _elem: PhantomData<T>,
}

/// An [`AllocationView`] for writing too ([`Allocation::as_device_mut`]).
pub struct AllocationViewMut<'a, T: DeviceCopy>(pub(crate) AllocationView<'a, T>);

impl<'a, T: DeviceCopy> AllocationView<'a, T> {
    /// Pin `allocation` and view it as `T`s.
    pub(crate) fn pin(allocation: &'a Allocation) -> Result<Self> {
        let elem = std::mem::size_of::<T>();
        let size = allocation.size();
        if elem == 0 || !size.is_multiple_of(elem) {
            return Err(Error::SizeMismatch {
                operation: "a typed view (the size must be a whole number of elements)",
                expected: size,
                actual: size / elem.max(1) * elem,
            });
        }
        let mut st = allocation.slot.lock();
        match allocation.record(&mut st) {
            Some((pins, _)) if !pins.doomed => pins.views += 1,
            _ => return Err(allocation.dead()),
        }
        Ok(Self {
            allocation,
            len: size / elem,
            _elem: PhantomData,
        })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: allocations are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation it views.
    pub fn allocation(&self) -> &Allocation {
        self.allocation
    }
}

impl<T: DeviceCopy> Drop for AllocationView<'_, T> {
    fn drop(&mut self) {
        let allocation = self.allocation;
        let mut st = allocation.slot.lock();
        let doomed = match allocation.record(&mut st) {
            Some((pins, _)) => {
                pins.views = pins.views.saturating_sub(1);
                pins.views == 0 && pins.doomed
            }
            None => false,
        };
        if doomed {
            // free_for_stream freed it while this view held it: free now,
            // in stream order after everything the views enqueued.
            allocation.free_now(&mut st);
        }
    }
}

// SAFETY: `len * size_of::<T>()` bytes from the block's address lie inside
// the live allocation of the allocator's context (checked at `pin`), and the
// block cannot be freed while the view exists (the handle is borrowed, and a
// pinned block's `free_for_stream` waits for the last view). Once freed, the
// block is reused only in stream order: by later work on the home stream,
// or, for the streams `after_device_use` declared, after an event recorded on
// each at free time has completed. `before_device_use` orders a first use on
// another stream after the home stream's work so far. There is no host view
// of this memory.
unsafe impl<T: DeviceCopy> DeviceMemory for AllocationView<'_, T> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.allocation.ptr
    }

    fn device_len(&self) -> usize {
        self.len
    }

    fn context_id(&self) -> u64 {
        self.allocation.slot.shared.ctx.id()
    }

    fn before_device_use(&self, stream: &Stream) -> driver::Result<()> {
        let allocation = self.allocation;
        if stream.id() == allocation.stream_id() {
            return Ok(());
        }
        let known = {
            let mut st = allocation.slot.lock();
            allocation
                .record(&mut st)
                .is_some_and(|(_, uses)| uses.iter().any(|s| s.id() == stream.id()))
        };
        if known {
            return Ok(());
        }
        // First use there: wait for the home stream's work so far (the
        // block's previous owner may still be using it there).
        stream
            .wait_for_home(
                &allocation.slot.stream,
                "a first use elsewhere of an allocation whose home stream",
                |home| allocation.slot.shared.record_on(home).map_err(into_driver),
            )
            .map(drop)
    }

    fn after_device_use(&self, stream: &Stream, _write: bool) -> driver::Result<()> {
        let allocation = self.allocation;
        if stream.id() == allocation.stream_id() {
            return Ok(());
        }
        let mut st = allocation.slot.lock();
        if let Some((_, uses)) = allocation.record(&mut st)
            && !uses.iter().any(|s| s.id() == stream.id())
        {
            // The record keeps the stream alive until the block's free has
            // recorded its fence there.
            uses.push(stream.to_arc());
        }
        Ok(())
    }
}

// SAFETY: as for `AllocationView`; `&mut self` adds nothing the host could
// see (device memory has no host view).
unsafe impl<T: DeviceCopy> DeviceMemory for AllocationViewMut<'_, T> {
    type Elem = T;

    fn device_ptr(&self) -> CUdeviceptr {
        self.0.device_ptr()
    }

    fn device_len(&self) -> usize {
        self.0.device_len()
    }

    fn context_id(&self) -> u64 {
        self.0.context_id()
    }

    fn before_device_use(&self, stream: &Stream) -> driver::Result<()> {
        self.0.before_device_use(stream)
    }

    fn after_device_use(&self, stream: &Stream, write: bool) -> driver::Result<()> {
        self.0.after_device_use(stream, write)
    }
}

// SAFETY: no host reference to device memory exists at all.
unsafe impl<T: DeviceCopy> DeviceMemoryMut for AllocationViewMut<'_, T> {}

impl<T: DeviceCopy> AllocationViewMut<'_, T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Always `false`: allocations are never empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
}

// The allocation's methods that make views: here, beside the views, so the
// handle (`allocation.rs`) need not know them.
impl Allocation {
    /// A view of the memory as `size / size_of::<T>()` values of `T`, for
    /// reading: a kernel argument lent `&`, a copy's source. It implements
    /// the driver layer's [`DeviceMemory`](driver::DeviceMemory), so every
    /// launch, copy and memset takes it, and work on other streams than the
    /// home stream is ordered after the allocation and declared by itself.
    /// While a view exists the memory is not freed, even by
    /// [`crate::StreamOrderedAllocator::free_for_stream`] (which then frees
    /// it when the last view goes).
    ///
    /// Fails when the size is not a whole number of `T`s, or the handle is dead.
    pub fn as_device<T: DeviceCopy>(&self) -> Result<AllocationView<'_, T>> {
        AllocationView::pin(self)
    }

    /// A view for writing (and reading): a copy's destination, a memset, a
    /// kernel argument lent `&mut`. See [`Allocation::as_device`].
    pub fn as_device_mut<T: DeviceCopy>(&mut self) -> Result<AllocationViewMut<'_, T>> {
        AllocationView::pin(self).map(AllocationViewMut)
    }

    /// Set every byte to `value`, asynchronously on the home stream.
    pub fn memset_u8_async(&self, value: u8) -> Result<()> {
        let mut view = AllocationViewMut(AllocationView::<u8>::pin(self)?);
        Ok(self.slot.stream.memset_u8_async(&mut view, value)?)
    }

    /// Set every 4-byte word to `value`, asynchronously on the home stream.
    /// The size must be a multiple of 4.
    pub fn memset_u32_async(&self, value: u32) -> Result<()> {
        if !self.size.is_multiple_of(4) {
            return Err(Error::SizeMismatch {
                operation: "memset_u32_async (whole 4-byte words)",
                expected: self.size,
                actual: self.size / 4 * 4,
            });
        }
        let mut view = AllocationViewMut(AllocationView::<u32>::pin(self)?);
        Ok(self.slot.stream.memset_u32_async(&mut view, value)?)
    }

    /// Copy `src` into the allocation on the home stream and wait for that
    /// copy. `src` must fill it exactly.
    pub fn copy_from_host<T: DeviceCopy>(&self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", std::mem::size_of_val(src))?;
        let mut view = AllocationViewMut(AllocationView::<T>::pin(self)?);
        // The driver layer waits for the copy (or, if it cannot record an
        // event for that, for the whole stream) before returning.
        Ok(self.slot.stream.copy_from_host(&mut view, src)?)
    }

    /// Copy the allocation into `dst` on the home stream and wait for that
    /// copy. `dst` must match it exactly.
    pub fn copy_to_host<T: DeviceCopy>(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", std::mem::size_of_val(dst))?;
        let view = AllocationView::<T>::pin(self)?;
        Ok(self.slot.stream.copy_to_host(dst, &view)?)
    }

    fn check_len(&self, operation: &'static str, bytes: usize) -> Result<()> {
        if bytes == self.size {
            Ok(())
        } else {
            Err(Error::SizeMismatch {
                operation,
                expected: self.size,
                actual: bytes,
            })
        }
    }
}

impl<T: DeviceCopy> fmt::Debug for AllocationView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocationView")
            .field("allocation", self.allocation)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: DeviceCopy> fmt::Debug for AllocationViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AllocationViewMut").field(&self.0).finish()
    }
}

fn into_driver(err: Error) -> driver::Error {
    match err {
        Error::Driver(err) => err,
        other => driver::Error::MemoryHook {
            reason: other.to_string(),
        },
    }
}
