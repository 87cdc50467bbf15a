//! Which memory the allocator manages.

/// Where memory comes from, chosen at construction.
///
/// - [`Backend::Caching`]: segments from `cuMemAlloc`, cached, split and
///   coalesced by this crate, with per-stream free lists. An allocate + free
///   that hits the cache makes no driver call at all; memory moves between
///   streams only once an event (or an idle stream) proves the old stream has
///   passed the free.
/// - [`Backend::DriverPool`]: the device's default memory pool through
///   `cuMemAllocAsync` / `cuMemFreeAsync`; the driver does the caching and the
///   stream ordering. Every allocate and free is a driver call (about 0.9 µs
///   together on an H200). The pool's release threshold is set at
///   construction, because the driver's default of 0 hands the pool's memory
///   back at every synchronisation and makes the next allocation pay for it
///   again. The default pool is shared by everything in the process that uses
///   `cuMemAllocAsync`, so the threshold (and its statistics) are too.
///
/// ```
/// use cuda_streams_allocator::{Backend, Error, StreamOrderedAllocator};
/// use cuda_streams_allocator::driver::{Context, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// assert_eq!(Backend::default(), Backend::Caching);
/// let backend = Backend::driver_pool();
/// assert_eq!(backend, Backend::DriverPool { release_threshold: u64::MAX });
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// match StreamOrderedAllocator::with_backend(&ctx, backend) {
///     Ok(allocator) => {
///         assert_eq!(allocator.backend().name(), "driver-pool");
///         let block = allocator.allocate_for_stream(&stream, 1000)?;
///         assert_eq!(block.block_size(), 1000); // the driver does any rounding
///     }
///     // A device without memory pools has only the caching backend.
///     Err(Error::PoolsUnsupported) => {}
///     Err(err) => return Err(err),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// `cuMemAlloc` segments with this crate's caching.
    #[default]
    Caching,
    /// The driver's default memory pool.
    DriverPool {
        /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: bytes the pool keeps reserved
        /// across synchronisations ([`Backend::DEFAULT_RELEASE_THRESHOLD`]:
        /// keep everything until [`crate::StreamOrderedAllocator::trim`]).
        release_threshold: u64,
    },
}

/// `caching` or `driver pool`, as reports name it.
impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Caching => "caching",
            Backend::DriverPool { .. } => "driver pool",
        })
    }
}

impl Backend {
    /// The release threshold [`Backend::driver_pool`] sets: never release at
    /// synchronisation.
    pub const DEFAULT_RELEASE_THRESHOLD: u64 = u64::MAX;

    /// The driver pool with [`Backend::DEFAULT_RELEASE_THRESHOLD`].
    pub const fn driver_pool() -> Self {
        Self::DriverPool {
            release_threshold: Self::DEFAULT_RELEASE_THRESHOLD,
        }
    }

    /// A short name for reports: `caching` or `driver-pool`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Caching => "caching",
            Self::DriverPool { .. } => "driver-pool",
        }
    }
}
