//! A stream-ordered caching allocator for device memory.
//!
//! [`StreamOrderedAllocator::allocate_for_stream`] hands out an [`Allocation`]
//! tied to a stream; dropping it frees the memory *in stream order*: work
//! already queued on that stream may still use it, and only work queued after
//! the free can get it again. Two backends, chosen at construction
//! ([`Backend`]):
//!
//! - **Caching** (PyTorch's caching allocator, RMM's pool): `cuMemAlloc`
//!   segments split into blocks (512-byte granules; small requests packed into
//!   2 MiB segments, larger ones best-fit from split blocks, coalesced with
//!   free neighbours on the miss path), per-stream free lists, so allocate +
//!   free on one stream is a lock each way, a few bookkeeping steps and no
//!   driver call (see `docs/allocator.md`). A block goes to another stream only
//!   once its segment is fully free and the old stream is proven past the free
//!   (idle, or a pooled fence event recorded after it has completed).
//! - **Driver pool**: `cuMemAllocAsync` / `cuMemFreeAsync` on the device's
//!   default pool with a release threshold set, so the pool keeps its memory
//!   across synchronisations.
//!
//! Uses on other streams are declared with [`Allocation::record_stream`]; the
//! block is then reused only after an event recorded on each of those streams
//! at free time has completed. [`StreamOrderedAllocator::add_stream_dependency`]
//! makes a stream's frees wait for an event. [`StreamOrderedAllocator::stats`]
//! reports allocated and reserved bytes, peaks, segments, fragmentation, driver
//! calls, cache hits and per-stream figures; [`StreamOrderedAllocator::trim`]
//! gives cached memory back. Out of memory is recovered from by releasing the
//! cache (waiting for streams if needed) and retrying once.
//!
//! ```
//! use cuda_streams_allocator::{Backend, StreamOrderedAllocator};
//! use cuda_streams_allocator::driver::{Context, Stream};
//! # fn main() -> cuda_streams_allocator::Result<()> {
//! let ctx = Context::new(0)?;
//! let (stream1, stream2) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
//! let allocator = StreamOrderedAllocator::with_backend(&ctx, Backend::Caching)?;
//!
//! let alloc1 = allocator.allocate_for_stream(&stream1, 1024 * 1024)?;
//! let alloc2 = allocator.allocate_for_stream(&stream2, 2048 * 1024)?;
//! alloc2.memset_u32_async(0x5eed)?;
//! assert_eq!(allocator.stats().live_allocations, 2);
//!
//! allocator.free_for_stream(&stream1)?; // alloc1's handle is now dead
//! assert!(alloc1.device_ptr().is_err());
//! drop((alloc1, alloc2));
//! assert_eq!(allocator.stats().allocated_bytes, 0);
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/allocator.md` for a guide and when to pick which backend.
//!
//! For host memory, [`HostPool`] keeps page-locked blocks the same way: a
//! dropped block is reused once every stream that used it has passed that
//! use, in size classes that waste at most an eighth, under a cap whose
//! error names the stream holding the most blocks (`docs/host-memory.md`).
//!
//! This crate uses `unsafe` for raw driver calls the safe driver layer does not
//! offer for memory it does not own (`cuMemAlloc`/`cuMemFree` of segments,
//! `cuMemAllocAsync`/`cuMemFreeAsync`, the pool's attributes, memsets and copies
//! on a block); each call says why it is sound.

mod allocation;
mod allocator;
mod arena;
mod caching;
mod config;
mod dependency;
mod devices;
mod driver_pool;
mod error;
mod graph_memory;
mod host_pool;
mod last_slot;
mod memory_events;
mod observer;
mod shared;
mod size;
mod snapshot;
mod stats;
mod view;

pub use allocation::Allocation;
pub use allocator::StreamOrderedAllocator;
pub use config::Backend;
pub use dependency::StreamDependency;
pub use devices::DeviceAllocators;
/// The safe driver layer this crate builds on (streams, contexts, events).
pub use driver;
pub use error::{Error, HostHolder, Result};
pub use host_pool::{
    HOST_MIN_STEP, HostBackend, HostBlock, HostPool, HostPoolBuilder, HostPoolStats,
    host_size_class,
};
pub use observer::{MemoryEvent, MemoryEventKind, MemoryObserver};
pub use size::{
    BLOCK_GRANULE, MEDIUM_LIMIT, MEDIUM_SEGMENT, SEGMENT_GRANULE, SMALL_LIMIT, SMALL_SEGMENT,
};
pub use snapshot::{BlockSnapshot, BlockState, MemorySnapshot, SegmentSnapshot, StreamSnapshot};
pub use stats::{AllocatorStats, StreamStats};
pub use view::{AllocationView, AllocationViewMut};

/// The examples of `docs/host-memory.md`, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/host-memory.md")]
pub struct HostMemoryGuide;
