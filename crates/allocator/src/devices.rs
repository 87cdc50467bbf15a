//! One allocator per device, behind one handle that picks the device.

use crate::allocation::Allocation;
use crate::allocator::StreamOrderedAllocator;
use crate::config::Backend;
use crate::error::Result;
use driver::{Context, PerDevice, Stream};
use std::sync::Arc;

/// A [`StreamOrderedAllocator`] for every device, each caching only its own
/// device's memory. [`allocate_for_stream`](Self::allocate_for_stream) takes
/// the allocator of the stream's device, so memory always lands on the
/// device that will use it; an allocator given a stream of another device
/// refuses it ([`crate::Error::ContextMismatch`]) instead of handing out memory the
/// stream cannot order.
///
/// ```
/// use cuda_streams_allocator::DeviceAllocators;
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let allocators = DeviceAllocators::new()?; // every device of the driver
/// let last = (allocators.len() - 1) as i32; // device 1 where there are two
/// let stream = Stream::new(&Context::new(last)?)?;
/// let block = allocators.allocate_for_stream(&stream, 1 << 20)?;
/// assert_eq!(block.size(), 1 << 20);
/// assert_eq!(allocators.for_device(last)?.stats().allocated_bytes, 1 << 20);
/// assert!(allocators.for_device(last + 1).is_err());
/// # Ok(())
/// # }
/// ```
pub struct DeviceAllocators {
    allocators: PerDevice<StreamOrderedAllocator>,
}

impl DeviceAllocators {
    /// A caching allocator for every device of the selected driver
    /// ([`Context::all`]).
    pub fn new() -> Result<Self> {
        Self::with_backend(&Context::all()?, Backend::Caching)
    }

    /// An allocator with `backend` for each of `contexts`, which must be
    /// devices 0, 1, ... in order (so that `for_device` indexes them).
    pub fn with_backend(contexts: &[Arc<Context>], backend: Backend) -> Result<Self> {
        let allocators = PerDevice::try_new(contexts, |ctx| {
            StreamOrderedAllocator::with_backend(ctx, backend)
        })?;
        Ok(Self { allocators })
    }

    /// The allocator of device `ordinal`, or [`crate::Error::UnknownDevice`].
    pub fn for_device(&self, ordinal: i32) -> Result<&StreamOrderedAllocator> {
        Ok(self.allocators.get(ordinal)?)
    }

    /// The allocator of `stream`'s device.
    pub fn for_stream(&self, stream: &Stream) -> Result<&StreamOrderedAllocator> {
        self.for_device(stream.context().ordinal())
    }

    /// `bytes` of `stream`'s device memory, ordered on `stream`
    /// ([`StreamOrderedAllocator::allocate_for_stream`]).
    pub fn allocate_for_stream(&self, stream: &Stream, bytes: usize) -> Result<Allocation> {
        self.for_stream(stream)?.allocate_for_stream(stream, bytes)
    }

    /// How many devices have an allocator.
    pub fn len(&self) -> usize {
        self.allocators.len()
    }

    /// Whether there are none (a driver with no device).
    pub fn is_empty(&self) -> bool {
        self.allocators.is_empty()
    }

    /// The allocators, device 0 first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &StreamOrderedAllocator> + '_ {
        self.allocators.iter()
    }
}

impl std::fmt::Debug for DeviceAllocators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAllocators")
            .field("devices", &self.allocators.len())
            .finish()
    }
}
