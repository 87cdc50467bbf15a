//! The allocator's shared state: per-stream slots, the shared cache of
//! proven-free segments, counters, and the raw driver calls.

use crate::arena::{Arena, Segment};
use crate::config::Backend;
use crate::dependency::{StreamDependency, Wait};
use crate::error::{Error, Result};
use crate::size::Class;
use crate::stats::{Counters, StreamCounts};
use dashmap::DashMap;
use driver::sys::{CUdeviceptr, CUresult};
use driver::{CompletionTrail, Context, Stream};
use driver::{EventPool, IdBuildHasher, IdMap, PooledEvent};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// A freed block waiting for events.
pub(crate) struct PendingFree {
    pub(crate) ptr: u64,
    pub(crate) waits: Vec<Wait>,
}

/// An event recorded on a stream that proves every free numbered below `seq`
/// has been passed once it completes: an entry of the stream's completion
/// trail ([`SlotState::fences`]).
pub(crate) struct Fence {
    pub(crate) event: PooledEvent,
    pub(crate) seq: u64,
}

/// A live driver-pool allocation.
pub(crate) struct PoolLive {
    pub(crate) id: u64,
    pub(crate) size: usize,
    pub(crate) uses: Vec<Arc<Stream>>,
    pub(crate) pins: crate::arena::Pins,
}

/// What the allocator keeps per stream, under one lock.
#[derive(Default)]
pub(crate) struct SlotState {
    pub(crate) arena: Arena,
    pub(crate) pool_live: IdMap<u64, PoolLive>,
    pub(crate) next_pool_id: u64,
    pub(crate) pending: Vec<PendingFree>,
    /// The stream's fences, oldest first, on the driver's completion trail
    /// (one at a time: a new one is recorded once the last has passed).
    pub(crate) fences: CompletionTrail<Fence>,
    pub(crate) deps: Vec<StreamDependency>,
    pub(crate) counts: StreamCounts,
}

/// One stream's entry. Holds the stream, so it lives as long as the allocator
/// keeps blocks for it, and the allocator's shared state, so that an
/// [`crate::Allocation`] needs only its slot (one reference count, not two).
/// The allocator's map holds every slot until the allocator is dropped; a
/// slot then lives on while allocations of its stream do.
pub(crate) struct Slot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) stream: Arc<Stream>,
    state: Mutex<SlotState>,
}

impl Slot {
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, SlotState> {
        // The state is updated so that a panic cannot leave it half-changed
        // in a way that frees memory twice; keep serving after one.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Slot {
    /// The allocator is gone and so is the stream's last allocation: hand the
    /// stream's blocks to the shared state, which gives their segments back
    /// when its own last reference goes (as it did when it held the slots).
    fn drop(&mut self) {
        if self.shared.backend != Backend::Caching {
            return;
        }
        let state = std::mem::take(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        if state.arena.segment_count() == 0 && state.pending.is_empty() {
            return;
        }
        self.shared
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Retired {
                stream: Arc::clone(&self.stream),
                state,
            });
    }
}

/// A dropped slot's blocks, waiting for [`Shared`]'s drop.
pub(crate) struct Retired {
    pub(crate) stream: Arc<Stream>,
    pub(crate) state: SlotState,
}

/// Everything behind a `StreamOrderedAllocator` and its `Allocation`s.
pub(crate) struct Shared {
    /// Unique in the process, for the per-thread slot memo.
    pub(crate) id: u64,
    pub(crate) ctx: Arc<Context>,
    pub(crate) backend: Backend,
    pub(crate) total_memory: usize,
    /// Cleared when the allocator is dropped: the slots hold this state.
    pub(crate) slots: DashMap<u64, Arc<Slot>, IdBuildHasher>,
    /// Slots dropped after the allocator (see [`Slot`]'s `Drop`).
    pub(crate) retired: Mutex<Vec<Retired>>,
    /// Fully free segments proven unused by any stream: `(class, size, base)`.
    pub(crate) cache: Mutex<BTreeSet<(Class, usize, u64)>>,
    pub(crate) events: Arc<EventPool>,
    pub(crate) counters: Counters,
    pub(crate) pool: Option<driver::MemPool>,
    /// Told about every allocation and free (`observer.rs`).
    pub(crate) observers: crate::observer::Observers,
}

/// Whether `err` is the driver's `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn is_oom(err: &Error) -> bool {
    matches!(err, Error::Driver(driver::Error::Driver(e)) if e.code() == CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

impl Shared {
    /// The slot of `stream` from the map, created on first use. The hot path
    /// asks the per-thread memo first ([`Shared::slot`], `last_slot.rs`).
    #[cold]
    pub(crate) fn map_slot(self: &Arc<Self>, stream: &Stream) -> Result<Arc<Slot>> {
        if let Some(slot) = self.slots.get(&stream.id()) {
            return Ok(Arc::clone(slot.value()));
        }
        self.check_stream(stream)?;
        let slot = self.slots.entry(stream.id()).or_insert_with(|| {
            Arc::new(Slot {
                shared: Arc::clone(self),
                stream: stream.to_arc(),
                state: Mutex::default(),
            })
        });
        Ok(Arc::clone(slot.value()))
    }

    /// The slot of `stream` if it has one.
    pub(crate) fn existing_slot(&self, stream: &Stream) -> Option<Arc<Slot>> {
        self.slots
            .get(&stream.id())
            .map(|slot| Arc::clone(slot.value()))
    }

    pub(crate) fn check_stream(&self, stream: &Stream) -> Result<()> {
        let found = stream.context().id();
        if found == self.ctx.id() {
            Ok(())
        } else {
            Err(Error::ContextMismatch {
                what: "the stream",
                expected: self.ctx.id(),
                found,
            })
        }
    }

    /// Every slot, collected so no map lock is held while slots are locked.
    pub(crate) fn all_slots(&self) -> Vec<Arc<Slot>> {
        self.slots.iter().map(|e| Arc::clone(e.value())).collect()
    }

    /// An event recorded now on `stream`.
    pub(crate) fn record_on(&self, stream: &Stream) -> Result<PooledEvent> {
        let event = self.events.acquire_event(false)?;
        event.record(stream)?;
        Ok(event)
    }

    /// Events proving that every use of a block on `uses`, and every
    /// dependency of its home stream, is over. `None` when that cannot be
    /// proven (the block must then never be reused).
    pub(crate) fn waits_for(
        &self,
        uses: &[Arc<Stream>],
        deps: &[StreamDependency],
    ) -> Option<Vec<Wait>> {
        let mut waits = Vec::new();
        for stream in uses {
            match self.record_on(stream) {
                Ok(event) => waits.push(Wait::Use(event)),
                // No event: wait for the stream itself instead.
                Err(err) => {
                    if let Err(sync) = stream.synchronize() {
                        tracing::warn!(
                            "cannot prove stream {} is done with a block \
                             ({err}; {sync}); the block is leaked rather than reused",
                            stream.id()
                        );
                        return None;
                    }
                }
            }
        }
        for dep in deps {
            if !matches!(dep.event().query(), Ok(true)) {
                waits.push(Wait::Dependency(dep.clone()));
            }
        }
        Some(waits)
    }

    /// `cuMemAlloc` of one segment.
    pub(crate) fn driver_alloc(&self, size: usize) -> Result<CUdeviceptr> {
        let ptr = driver::result::mem_alloc(&self.ctx, size)?;
        self.counters.reserved(size);
        Ok(ptr)
    }

    /// `cuMemFree` of a segment that no stream can still be using.
    pub(crate) fn driver_free(&self, segment: Segment) {
        // SAFETY: `base` came from cuMemAlloc in this context, is freed once
        // (it has just left every list), and every stream that used it has
        // been proven past its last use (a completed fence or an idle stream).
        match unsafe { driver::result::mem_free(&self.ctx, segment.base) } {
            Ok(()) => self.counters.released(segment.size),
            Err(err) => tracing::warn!(
                "freeing segment {:#x} of {} bytes: {err}",
                segment.base,
                segment.size
            ),
        }
    }

    /// Free device memory now, for error messages.
    pub(crate) fn free_device_memory(&self) -> usize {
        self.ctx.memory_info().map(|(free, _)| free).unwrap_or(0)
    }
}

impl Drop for Shared {
    /// The last handle is gone (the allocator, and every slot with it every
    /// allocation): give every segment back, the retired slots' included.
    /// Each stream is synchronised first, because its last frees may still be
    /// queued behind work that uses the memory.
    fn drop(&mut self) {
        if self.backend != Backend::Caching {
            return;
        }
        let retired = std::mem::take(self.retired.get_mut().unwrap_or_else(|p| p.into_inner()));
        for mut slot in retired {
            let segments = self.proven_segments(&slot.stream, &mut slot.state, true);
            self.lock_cache()
                .extend(segments.into_iter().map(|s| (s.class, s.size, s.base)));
        }
        // Blocks whose proof never came (leaked) keep their segments.
        self.release_cache(true, 0);
    }
}
