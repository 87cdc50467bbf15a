//! The allocation handle: device memory that frees itself, in stream order, on drop.
//! Its typed views, and the memsets and copies it makes through them, are in
//! `view.rs`.

use crate::arena::Pins;
use crate::config::Backend;
use crate::error::{Error, Result};
use crate::shared::{Shared, Slot, SlotState};
use driver::Stream;
use driver::sys::CUdeviceptr;
use std::fmt;
use std::sync::Arc;

/// Device memory from a [`crate::StreamOrderedAllocator`], tied to the stream
/// it was allocated for (its *home stream*).
///
/// Dropping it frees the memory in stream order: the block is reusable at once
/// by later allocations on the home stream (whose work runs after everything
/// already queued there), and by other streams only once the home stream is
/// proven past the free. Uses on other streams must be declared with
/// [`Allocation::record_stream`]; the block then also waits for them.
///
/// After [`crate::StreamOrderedAllocator::free_for_stream`] the handle is
/// *dead*: its memory was freed, [`Allocation::device_ptr`] and the copy
/// methods return [`Error::DeadAllocation`], and dropping it does nothing
/// (never a double free, even if the address has been handed out again).
///
/// # Using it in kernels and copies
/// [`Allocation::as_device`] and [`Allocation::as_device_mut`] give typed
/// views that implement the driver layer's memory traits, so the memory is a
/// kernel argument (checked against the kernel's signature), a copy source
/// or destination and a memset target through the same safe calls as any
/// buffer, and every such enqueue is counted by the stream. Work on another
/// stream through a view is ordered after the allocation and declared like
/// [`Allocation::record_stream`] by itself. The methods below (memsets,
/// synchronous copies) go through views on the home stream.
///
/// ```
/// use cuda_streams_allocator::StreamOrderedAllocator;
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let (stream, reader) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// let data = allocator.allocate_for_stream(&stream, 1000)?;
/// assert_eq!((data.size(), data.block_size()), (1000, 1024));
/// assert_eq!(data.stream_id(), stream.id());
/// data.memset_u8_async(3)?;
/// let mut back = vec![0u8; 1000];
/// data.copy_to_host(&mut back)?; // on the home stream, so after the memset
/// assert!(back.iter().all(|&byte| byte == 3));
/// // Work on `reader` uses it too: its block waits for `reader` once freed.
/// data.record_stream(&reader)?;
/// assert!(data.is_live());
/// drop(data);
/// assert_eq!(allocator.stats().live_allocations, 0);
/// # Ok(())
/// # }
/// ```
#[must_use = "an allocation is freed (in stream order) when dropped"]
pub struct Allocation {
    /// The home stream's slot, which also holds the allocator's shared state.
    pub(crate) slot: Arc<Slot>,
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    pub(crate) block: usize,
    pub(crate) id: u64,
}

impl Allocation {
    #[inline]
    fn shared(&self) -> &Shared {
        &self.slot.shared
    }

    /// The device address, or [`Error::DeadAllocation`] after `free_for_stream`.
    pub fn device_ptr(&self) -> Result<CUdeviceptr> {
        if self.is_live() {
            Ok(self.ptr)
        } else {
            Err(self.dead())
        }
    }

    /// Whether the memory is still this handle's (not freed by `free_for_stream`).
    pub fn is_live(&self) -> bool {
        let mut st = self.slot.lock();
        self.record(&mut st).is_some_and(|(pins, _)| !pins.doomed)
    }

    /// The bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The bytes set aside for it (the request rounded to the size class).
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// The home stream.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.slot.stream
    }

    /// The home stream's id.
    pub fn stream_id(&self) -> u64 {
        self.slot.stream.id()
    }

    /// Declare a use on `stream` (work already enqueued there, or about to be):
    /// the block is not reused until an event recorded on `stream` when the
    /// allocation is freed has completed. Using the home stream is a no-op.
    ///
    /// Work enqueued through a view ([`Allocation::as_device`]) declares
    /// itself; this is for work the allocator cannot see (raw launches).
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.shared().check_stream(stream)?;
        stream.check_not_capturing("Allocation::record_stream")?;
        if stream.id() == self.stream_id() {
            return Ok(());
        }
        let mut st = self.slot.lock();
        let Some((pins, uses)) = self.record(&mut st) else {
            return Err(self.dead());
        };
        if pins.doomed {
            return Err(self.dead());
        }
        if !uses.iter().any(|s| s.id() == stream.id()) {
            uses.push(stream.to_arc());
        }
        Ok(())
    }

    /// This handle's record (its pins and other-stream uses), if the block
    /// is still this handle's.
    pub(crate) fn record<'s>(
        &self,
        st: &'s mut SlotState,
    ) -> Option<(&'s mut Pins, &'s mut Vec<Arc<Stream>>)> {
        match self.shared().backend {
            Backend::Caching => st
                .arena
                .live_mut(self.ptr, self.id)
                .map(|live| (&mut live.pins, &mut live.uses)),
            Backend::DriverPool { .. } => match st.pool_live.get_mut(&self.ptr) {
                Some(live) if live.id == self.id => Some((&mut live.pins, &mut live.uses)),
                _ => None,
            },
        }
    }

    /// Free the block now (the handle's drop, or the last view of a doomed one).
    pub(crate) fn free_now(&self, st: &mut SlotState) {
        let before = st.counts.allocated;
        match self.shared().backend {
            Backend::Caching => self.shared().caching_free(st, self.ptr, self.id),
            Backend::DriverPool { .. } => {
                self.shared().pool_free(&self.slot, st, self.ptr, self.id)
            }
        }
        self.shared().observe_free(&self.slot, st, self.ptr, before);
    }

    pub(crate) fn dead(&self) -> Error {
        Error::DeadAllocation {
            ptr: self.ptr,
            stream: self.stream_id(),
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // Captured, the stream-ordered free would become a node of the graph
        // (run at every replay). A snapshot: `cuMemFreeAsync` itself takes
        // the stream's gate.
        if self.slot.stream.is_capturing() {
            // So the block is leaked instead.
            tracing::warn!(
                "leaking allocation {:#x} ({} bytes): dropped while stream {} is being captured",
                self.ptr,
                self.size,
                self.stream_id()
            );
            return;
        }
        // No view can outlive the handle, so nothing pins the block now.
        let mut st = self.slot.lock();
        self.free_now(&mut st);
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("block", &self.block)
            .field("stream", &self.stream_id())
            .finish()
    }
}
