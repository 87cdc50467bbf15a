//! A snapshot of everything the allocator holds: for "why am I out of
//! memory" questions, in the spirit of PyTorch's memory snapshot.

use crate::allocator::StreamOrderedAllocator;
use crate::config::Backend;
use std::sync::atomic::Ordering;

/// What a block is doing.
///
/// Not exhaustive: backends may grow states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockState {
    /// Free for its stream to reuse.
    Free,
    /// Held by a live [`crate::Allocation`].
    Live,
    /// Freed, waiting for other streams' uses (or dependencies) to complete
    /// before it can be reused.
    PendingFree,
}

/// One block of a segment, or one live driver-pool allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockSnapshot {
    /// Device address.
    pub address: u64,
    /// Its size (a live block: the request rounded up).
    pub size: usize,
    /// Free, live or pending.
    pub state: BlockState,
    /// The bytes asked for (live blocks; 0 otherwise).
    pub requested: usize,
    /// Other streams it was used on (`record_stream`; live blocks).
    pub used_on: Vec<u64>,
}

/// One segment (`cuMemAlloc`) of a stream, with its blocks by address.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentSnapshot {
    /// Device address.
    pub address: u64,
    /// Its size.
    pub size: usize,
    /// Its blocks, by address; their sizes add up to the segment's.
    pub blocks: Vec<BlockSnapshot>,
}

/// One stream's share.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamSnapshot {
    /// The stream's id.
    pub stream_id: u64,
    /// Its segments by address (caching backend; empty for the driver pool).
    pub segments: Vec<SegmentSnapshot>,
    /// Live allocations of the driver pool (empty for the caching backend,
    /// whose live blocks are in `segments`).
    pub pool_allocations: Vec<BlockSnapshot>,
    /// Freed blocks waiting for events: `(address, events waited for)`.
    pub pending_frees: Vec<(u64, usize)>,
    /// Bytes live on it.
    pub allocated_bytes: usize,
    /// Bytes of its segments.
    pub reserved_bytes: usize,
}

/// Every block the allocator holds, per stream, and the shared cache
/// ([`StreamOrderedAllocator::snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemorySnapshot {
    /// The backend.
    pub backend: Backend,
    /// The device ordinal.
    pub device: i32,
    /// Per stream, by stream id.
    pub streams: Vec<StreamSnapshot>,
    /// Fully free segments no stream owns: `(address, size)`.
    pub shared_cache: Vec<(u64, usize)>,
    /// Bytes live.
    pub allocated_bytes: usize,
    /// Bytes held from the driver (caching backend: segments; the driver
    /// pool's reservation is in [`crate::AllocatorStats`]).
    pub reserved_bytes: usize,
}

impl MemorySnapshot {
    /// Every block of every stream's segments, with its stream.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &BlockSnapshot)> {
        self.streams.iter().flat_map(|s| {
            s.segments
                .iter()
                .flat_map(|seg| &seg.blocks)
                .chain(&s.pool_allocations)
                .map(move |b| (s.stream_id, b))
        })
    }
}

impl StreamOrderedAllocator {
    /// Every segment and block, its size, stream and state, and the frees
    /// still waiting for other streams. Locks each stream briefly in turn.
    ///
    /// ```
    /// use cuda_streams_allocator::{BlockState, StreamOrderedAllocator};
    /// use cuda_streams_allocator::driver::{Context, Stream};
    /// # fn main() -> cuda_streams_allocator::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (a, b) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let allocator = StreamOrderedAllocator::new(&ctx)?;
    /// let kept = allocator.allocate_for_stream(&a, 3000)?;
    /// let shared = allocator.allocate_for_stream(&a, 1 << 20)?;
    /// shared.record_stream(&b)?; // used on b too
    /// drop(shared); // its free waits for b
    /// let snapshot = allocator.snapshot();
    /// let live: Vec<_> = snapshot.blocks().filter(|(_, b)| b.state == BlockState::Live).collect();
    /// assert_eq!(live.len(), 1);
    /// assert_eq!((live[0].0, live[0].1.requested), (a.id(), 3000));
    /// let stream = &snapshot.streams[0];
    /// assert_eq!(stream.pending_frees.len(), 1);
    /// assert_eq!(snapshot.allocated_bytes, kept.block_size());
    /// # Ok(())
    /// # }
    /// ```
    pub fn snapshot(&self) -> MemorySnapshot {
        let shared = self.shared();
        let mut streams: Vec<StreamSnapshot> = shared
            .all_slots()
            .iter()
            .map(|slot| {
                let st = slot.lock();
                let pool_allocations = st
                    .pool_live
                    .iter()
                    .map(|(&address, live)| BlockSnapshot {
                        address,
                        size: live.size,
                        state: BlockState::Live,
                        requested: live.size,
                        used_on: live.uses.iter().map(|s| s.id()).collect(),
                    })
                    .collect::<Vec<_>>();
                let mut pool_allocations = pool_allocations;
                pool_allocations.sort_by_key(|b| b.address);
                StreamSnapshot {
                    stream_id: slot.stream.id(),
                    segments: st.arena.segments_snapshot(),
                    pool_allocations,
                    pending_frees: st.pending.iter().map(|p| (p.ptr, p.waits.len())).collect(),
                    allocated_bytes: st.counts.allocated,
                    reserved_bytes: st.arena.reserved,
                }
            })
            .collect();
        streams.sort_by_key(|s| s.stream_id);
        let shared_cache = shared
            .lock_cache()
            .iter()
            .map(|&(_, size, base)| (base, size))
            .collect();
        MemorySnapshot {
            backend: shared.backend,
            device: shared.ctx.ordinal(),
            streams,
            shared_cache,
            allocated_bytes: shared.counters.allocated.load(Ordering::Relaxed),
            reserved_bytes: shared.counters.reserved.load(Ordering::Relaxed),
        }
    }
}
