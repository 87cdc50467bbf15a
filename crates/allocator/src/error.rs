//! The allocator's error type.

/// Everything the allocator can fail with.
///
/// Each message names the stream and the sizes involved:
///
/// ```
/// use cuda_streams_allocator::{Error, StreamOrderedAllocator};
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let allocator = StreamOrderedAllocator::new(&ctx)?;
/// let err = allocator.allocate_for_stream(&stream, 0).unwrap_err();
/// assert!(matches!(err, Error::ZeroSize { stream: id } if id == stream.id()));
/// let err = allocator.allocate_for_stream(&stream, usize::MAX).unwrap_err();
/// assert!(matches!(err, Error::TooLarge { requested: usize::MAX, .. }));
/// assert!(err.to_string().contains(&format!("{} bytes", usize::MAX)), "{err}");
/// assert_eq!(allocator.stats().live_allocations, 0); // nothing changed
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call into the safe driver layer (or a raw driver call) failed.
    #[error(transparent)]
    Driver(#[from] driver::Error),
    /// A request for zero bytes. Nothing was allocated and nothing changed.
    #[error(
        "an allocation of 0 bytes on stream {stream} would be empty: zero-length buffers are refused (docs/architecture.md#empty-buffers)"
    )]
    ZeroSize {
        /// The stream's id.
        stream: u64,
    },
    /// A request larger than the device's memory, or whose rounding overflows.
    /// Nothing was allocated and nothing changed.
    #[error(
        "allocation of {requested} bytes on stream {stream} can never succeed: the device has {total} bytes in all"
    )]
    TooLarge {
        /// The bytes asked for.
        requested: usize,
        /// The device's total memory.
        total: usize,
        /// The stream's id.
        stream: u64,
    },
    /// The driver ran out of memory even after the allocator gave back every
    /// cached block it could (waiting for the streams that still used them)
    /// and retried. The allocator stays usable.
    #[error(
        "out of memory: allocation of {requested} bytes failed after releasing the cache; \
         the allocator holds {reserved} bytes and the device reports {free} bytes free"
    )]
    OutOfMemory {
        /// The bytes asked for.
        requested: usize,
        /// Bytes the allocator still holds from the driver (live allocations).
        reserved: usize,
        /// Free device memory as `cuMemGetInfo` reports it after the retry.
        free: usize,
    },
    /// An allocation handle whose memory was already freed by
    /// [`crate::StreamOrderedAllocator::free_for_stream`].
    #[error(
        "allocation {ptr:#x} on stream {stream} was freed by free_for_stream; the handle is dead"
    )]
    DeadAllocation {
        /// The device address it had.
        ptr: u64,
        /// Its stream's id.
        stream: u64,
    },
    /// A stream (or allocation) from another context or another allocator.
    #[error("{what} belongs to context {found}, but the allocator belongs to context {expected}")]
    ContextMismatch {
        /// What does not match.
        what: &'static str,
        /// The allocator's context id.
        expected: u64,
        /// The object's context id.
        found: u64,
    },
    /// An allocation handed to an allocator that did not make it.
    #[error("allocation {ptr:#x} was made by another allocator")]
    ForeignAllocation {
        /// The allocation's device address.
        ptr: u64,
    },
    /// `Backend::DriverPool` on a device without memory pools.
    #[error("the device does not support memory pools (cuMemAllocAsync); use Backend::Caching")]
    PoolsUnsupported,
    /// A copy whose length does not match the allocation.
    #[error("{operation}: the allocation holds {expected} bytes but the host slice holds {actual}")]
    SizeMismatch {
        /// The operation.
        operation: &'static str,
        /// The allocation's size in bytes.
        expected: usize,
        /// The slice's size in bytes.
        actual: usize,
    },
    /// A device with no allocator in a [`crate::DeviceAllocators`].
    #[error("device {ordinal} has no allocator here: there are {count} devices (0 to {count} - 1)")]
    UnknownDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices have one.
        count: usize,
    },
    /// A [`crate::HostPool`] request for a type aligned more strictly than
    /// the driver aligns host blocks (256 bytes).
    #[error(
        "pinned host pool: {type_name} needs {align}-byte alignment; blocks are aligned to 256 bytes"
    )]
    HostAlignment {
        /// The element type.
        type_name: &'static str,
        /// Its alignment.
        align: usize,
    },
    /// A [`crate::HostPool`] request that found no reusable block and would
    /// take the pool past its cap. Nothing changed; blocks still waiting for
    /// a stream become reusable once it passes their uses.
    #[error(
        "pinned host pool: a block of {class} bytes (for {requested}) would take the pool past \
         its cap of {cap} bytes ({reserved} reserved, {in_use} in use); {}",
        describe_holder(holder)
    )]
    HostPoolFull {
        /// The bytes asked for.
        requested: usize,
        /// The size class that would serve them (`usize::MAX` when rounding overflows).
        class: usize,
        /// The pool's cap.
        cap: usize,
        /// Bytes the pool holds.
        reserved: usize,
        /// Bytes in blocks handed out.
        in_use: usize,
        /// The stream holding the most dropped blocks not yet reusable.
        holder: Option<HostHolder>,
    },
}

/// A device the [`crate::DeviceAllocators`] has no allocator for.
impl From<driver::UnknownDevice> for Error {
    fn from(driver::UnknownDevice { ordinal, count }: driver::UnknownDevice) -> Self {
        Self::UnknownDevice { ordinal, count }
    }
}

impl From<driver::sys::DriverError> for Error {
    fn from(err: driver::sys::DriverError) -> Self {
        Self::Driver(err.into())
    }
}

/// A stream that holds dropped [`crate::HostPool`] blocks: they wait for
/// its uses before they can be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostHolder {
    /// The stream's id.
    pub stream: u64,
    /// How many dropped blocks wait for it.
    pub blocks: usize,
    /// Their bytes.
    pub bytes: usize,
}

fn describe_holder(holder: &Option<HostHolder>) -> String {
    match holder {
        Some(h) => format!(
            "stream {} holds {} dropped block(s) ({} bytes) it has not passed yet: \
             synchronize it, or raise the cap",
            h.stream, h.blocks, h.bytes
        ),
        None => "every block is in use: drop some, or raise the cap".to_string(),
    }
}

/// The operation an allocation on a capturing stream is refused as (in
/// [`driver::Error::StreamCapturing`]): by `allocate_for_stream`'s own check,
/// or by the driver pool's `cuMemAllocAsync` when a capture began since.
pub(crate) const ALLOCATE_WHILE_CAPTURING: &str = "StreamOrderedAllocator::allocate_for_stream (a graph's scratch comes from Capture::graph_buffer, allocated and freed by the graph at every replay, or from Capture::alloc)";

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a call of the allocator inside work that returns a driver `Result`
/// (the closure of an operation graph's operation): a driver failure comes
/// back as itself, anything else as [`driver::Error::Other`], which keeps
/// it whole.
impl From<Error> for driver::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Driver(error) => error,
            other => driver::Error::other(other),
        }
    }
}
