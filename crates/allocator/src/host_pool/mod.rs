//! A pool of page-locked host memory, stream-ordered like the device
//! allocator: blocks come back on drop without waiting, and are handed out
//! again only once every stream that used them has passed those uses.
//!
//! Its memory comes from one of two backends ([`HostBackend`]): its own
//! shelves of `cuMemHostAlloc` blocks in size classes (the default), or a
//! driver memory pool of host memory (CUDA 12.2 and later).
//!
//! See `docs/host-memory.md` for a guide.

mod classes;
mod driver_backend;
mod shelf;
mod stats;

pub use classes::{HOST_MIN_STEP, host_size_class};
pub use stats::HostPoolStats;

use crate::error::{Error, HostHolder, Result};
use driver::{Context, DeviceCopy, PinnedRegion, RegionOwner};
use driver_backend::DriverBackend;
use shelf::Shelf;
use std::fmt;
use std::sync::Arc;

/// A block of a [`HostPool`]: `len` values of `T` in page-locked host memory,
/// a copy source and destination like a [`driver::PinnedBuffer`] (see
/// [`driver::PinnedRegion`]). Dropping it gives the block back to the pool
/// without waiting; the pool reuses it once the streams that used it have
/// passed those uses. A new block holds zeros; a reused one holds what its
/// last user left.
pub type HostBlock<T> = PinnedRegion<T>;

/// What every host block's address is a multiple of: `cuMemHostAlloc`
/// returns page-aligned memory, the software driver 256-byte aligned.
const BLOCK_ALIGN: usize = 256;

/// Cap on the reserved bytes when the builder sets none and the machine's
/// memory cannot be read.
const FALLBACK_CAP: usize = 64 << 30;

/// A pool of page-locked host blocks in size classes that waste at most an
/// eighth ([`host_size_class`]), with a cap on what it reserves.
///
/// `Send + Sync`; every method takes `&self`. Blocks keep the pool's memory
/// alive: dropping the pool frees each block's memory once the block and the
/// streams using it are done.
///
/// ```
/// use cuda_streams_allocator::HostPool;
/// use cuda_streams_allocator::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = HostPool::builder(&ctx).cap(256 << 20).build()?;
///
/// let mut batch = pool.allocate::<f32>(1 << 16)?;
/// batch.as_mut_slice()?.fill(1.5);
/// let mut device = DeviceBuffer::<f32>::new_async(&stream, 1 << 16)?;
/// stream.copy_from_host_async(&mut device, &batch)?;
/// drop(batch); // no wait: reused once `stream` has passed the copy
///
/// stream.synchronize()?;
/// let again = pool.allocate::<f32>(1 << 16)?; // the same block
/// assert_eq!(pool.stats().hits, 1);
/// # drop(again);
/// # Ok(())
/// # }
/// ```
pub struct HostPool {
    backing: Backing,
}

/// Where a [`HostPool`]'s memory comes from ([`HostPoolBuilder::backend`]).
/// Either way blocks are [`HostBlock`]s, reused only once the streams that
/// used them have passed those uses, with the same figures, cap and trim.
///
/// ```
/// use cuda_streams_allocator::{HostBackend, HostPool};
/// use cuda_streams_allocator::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> cuda_streams_allocator::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let pool = HostPool::builder(&ctx)
///     .backend(HostBackend::DriverPool)
///     .cap(256 << 20)
///     .build()?; // Error::Driver(HostPoolsUnsupported) before CUDA 12.2
/// assert_eq!(pool.backend(), HostBackend::DriverPool);
///
/// let mut batch = pool.allocate::<f32>(1 << 16)?;
/// batch.as_mut_slice()?.fill(1.5);
/// let mut device = DeviceBuffer::<f32>::new_async(&stream, 1 << 16)?;
/// stream.copy_from_host_async(&mut device, &batch)?;
/// drop(batch); // no wait: freed to the driver's pool once `stream` has passed the copy
/// assert_eq!(device.to_vec(&stream)?, vec![1.5; 1 << 16]);
///
/// let again = pool.allocate::<f32>(1 << 16)?; // from what the driver's pool kept
/// assert_eq!((pool.stats().misses, pool.stats().hits), (1, 1));
/// # drop(again);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive] // CUDA 13's default pinned pool (cuMemGetDefaultMemPool) may join
pub enum HostBackend {
    /// The pool's own shelves of `cuMemHostAlloc` blocks in size classes
    /// that waste at most an eighth ([`host_size_class`]). Any driver.
    #[default]
    Shelves,
    /// A driver memory pool of host memory (`cuMemPoolCreate` with a host
    /// location, [`driver::HostMemPool`]): the driver sizes, caches and
    /// trims blocks, of the size asked for. Needs CUDA 12.2 or later; on an
    /// older driver [`HostPoolBuilder::build`] fails with
    /// [`driver::Error::HostPoolsUnsupported`], naming the version.
    DriverPool,
}

/// The memory behind a [`HostPool`], shared with its blocks.
enum Backing {
    Shelves(Arc<Shelf>),
    Driver(Arc<DriverBackend>),
}

/// Settings for a [`HostPool`] ([`HostPool::builder`]).
#[derive(Debug)]
#[must_use = "call build() to make the pool"]
pub struct HostPoolBuilder {
    ctx: Arc<Context>,
    cap: Option<usize>,
    warn_pending: Option<usize>,
    backend: HostBackend,
}

impl HostPoolBuilder {
    /// The most bytes the pool may hold from the driver. Past it, a request
    /// that finds no reusable block fails with [`Error::HostPoolFull`]
    /// naming the stream that holds the most dropped blocks. The default is
    /// half the machine's memory (64 GiB where it cannot be read).
    pub fn cap(mut self, bytes: usize) -> Self {
        self.cap = Some(bytes);
        self
    }

    /// Warn (a `tracing` warning naming the stream that holds the most)
    /// when dropped blocks still waiting for streams pass this many bytes;
    /// once per crossing. The default is half the cap.
    pub fn warn_pending_bytes(mut self, bytes: usize) -> Self {
        self.warn_pending = Some(bytes);
        self
    }

    /// Where the memory comes from; the default is
    /// [`HostBackend::Shelves`].
    pub fn backend(mut self, backend: HostBackend) -> Self {
        self.backend = backend;
        self
    }

    /// The pool. Allocates nothing yet (a driver pool is created, empty).
    pub fn build(self) -> Result<HostPool> {
        let cap = self.cap.unwrap_or_else(default_cap);
        let warn = self.warn_pending.unwrap_or(cap / 2);
        let backing = match self.backend {
            HostBackend::Shelves => Backing::Shelves(Arc::new(Shelf::new(&self.ctx, cap, warn))),
            HostBackend::DriverPool => {
                Backing::Driver(Arc::new(DriverBackend::new(&self.ctx, cap, warn)?))
            }
        };
        Ok(HostPool { backing })
    }
}

impl HostPool {
    /// A pool on `ctx` with the default cap and warning threshold.
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        Self::builder(ctx).build()
    }

    /// Settings for a pool on `ctx`.
    pub fn builder(ctx: &Arc<Context>) -> HostPoolBuilder {
        HostPoolBuilder {
            ctx: Arc::clone(ctx),
            cap: None,
            warn_pending: None,
            backend: HostBackend::default(),
        }
    }

    /// A block of `len` values of `T`: a cached block of the request's size
    /// class when one is free of every stream, else a new one (with
    /// [`HostBackend::DriverPool`]: a block of exactly the bytes asked for,
    /// from what the driver's pool keeps, else new). Zero or overflowing
    /// lengths are refused (the driver's error naming them); past the cap,
    /// [`Error::HostPoolFull`].
    pub fn allocate<T: DeviceCopy>(&self, len: usize) -> Result<HostBlock<T>> {
        let bytes = driver::region_bytes::<T>(len)?;
        let align = std::mem::align_of::<T>();
        let type_name = std::any::type_name::<T>();
        if align > BLOCK_ALIGN {
            return Err(Error::HostAlignment { type_name, align });
        }
        let shelf = match &self.backing {
            Backing::Shelves(shelf) => shelf,
            Backing::Driver(backend) => return backend.allocate(len, bytes),
        };
        let class = host_size_class(bytes).ok_or(Error::HostPoolFull {
            requested: bytes,
            class: usize::MAX,
            cap: shelf.cap,
            reserved: 0,
            in_use: 0,
            holder: None,
        })?;
        let (address, ctx) = shelf.take(class, bytes)?;
        let owner: Arc<dyn RegionOwner> = shelf.clone();
        // SAFETY: `address` is a block of `class >= bytes` bytes from
        // cuMemHostAlloc in this context (aligned to BLOCK_ALIGN, checked
        // above to be enough for `T`),
        // zeroed when new and since written only with `DeviceCopy` values
        // (valid for any bits); it is free of every stream (cached blocks
        // are, by `collect_finished`) and handed to no one else until the
        // shelf gets it back, which reuses it only after its events.
        Ok(unsafe {
            PinnedRegion::from_raw_parts(ctx, address as *mut T, len, owner, class as u64)
        })
    }

    /// Free cached blocks until at most `keep_bytes` of them remain, without
    /// waiting for any stream (blocks still in use by one stay). Returns the
    /// bytes given back to the driver. With [`HostBackend::DriverPool`] the
    /// driver's pool gives back its idle memory (`cuMemPoolTrimTo`).
    pub fn trim(&self, keep_bytes: usize) -> usize {
        match &self.backing {
            Backing::Shelves(shelf) => {
                let mut st = shelf.lock();
                st.collect_finished();
                shelf.release_free(&mut st, keep_bytes)
            }
            Backing::Driver(backend) => backend.trim(keep_bytes),
        }
    }

    /// The pool's figures. With [`HostBackend::DriverPool`], the reserved
    /// bytes, their peak and the cached bytes are the driver's pool's.
    pub fn stats(&self) -> HostPoolStats {
        match &self.backing {
            Backing::Shelves(shelf) => shelf.stats(),
            Backing::Driver(backend) => backend.stats(),
        }
    }

    /// Reset the peaks to the current values.
    pub fn reset_peaks(&self) {
        match &self.backing {
            Backing::Shelves(shelf) => shelf.reset_peaks(),
            Backing::Driver(backend) => backend.reset_peaks(),
        }
    }

    /// The stream holding the most dropped blocks that are not yet reusable,
    /// if any: the one to look at when the pool grows.
    pub fn heaviest_holder(&self) -> Option<HostHolder> {
        match &self.backing {
            Backing::Shelves(shelf) => shelf.heaviest_holder(),
            Backing::Driver(backend) => backend.heaviest_holder(),
        }
    }

    /// The cap on reserved bytes.
    pub fn cap(&self) -> usize {
        match &self.backing {
            Backing::Shelves(shelf) => shelf.cap,
            Backing::Driver(backend) => backend.cap,
        }
    }

    /// Where the memory comes from.
    pub fn backend(&self) -> HostBackend {
        match &self.backing {
            Backing::Shelves(_) => HostBackend::Shelves,
            Backing::Driver(_) => HostBackend::DriverPool,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        match &self.backing {
            Backing::Shelves(shelf) => &shelf.ctx,
            Backing::Driver(backend) => &backend.ctx,
        }
    }
}

impl fmt::Debug for HostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Half of the machine's memory (`MemTotal` in `/proc/meminfo`), else
/// [`FALLBACK_CAP`].
fn default_cap() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024) / 2)
        })
        .unwrap_or(FALLBACK_CAP)
}
