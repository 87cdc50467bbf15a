//! The memory event an allocation or a free makes: built from the stream's
//! and the allocator's figures right after it (the driver pool's reservation
//! included), and handed to the allocator's observers (`observer.rs`, which
//! knows nothing of the allocator's state).

use crate::config::Backend;
use crate::observer::{MemoryEvent, MemoryEventKind};
use crate::shared::{Shared, Slot, SlotState};
use driver::sys::CUmemPool_attribute as PoolAttr;
use std::sync::atomic::Ordering;

impl Shared {
    /// After an allocation on `slot` (locks it, only when observed).
    #[inline]
    pub(crate) fn observe_alloc(&self, slot: &Slot, address: u64, bytes: usize) {
        if self.observers.watched() {
            let st = slot.lock();
            self.observe(slot, &st, MemoryEventKind::Alloc, address, bytes);
        }
    }

    /// After a free attempt on `slot`; `before` is the stream's live bytes
    /// before it (a dead handle frees nothing and reports nothing).
    #[inline]
    pub(crate) fn observe_free(&self, slot: &Slot, st: &SlotState, address: u64, before: usize) {
        if self.observers.watched() && st.counts.allocated < before {
            let bytes = before - st.counts.allocated;
            self.observe(slot, st, MemoryEventKind::Free, address, bytes);
        }
    }

    #[cold]
    fn observe(
        &self,
        slot: &Slot,
        st: &SlotState,
        kind: MemoryEventKind,
        address: u64,
        bytes: usize,
    ) {
        let allocated = self.counters.allocated.load(Ordering::Relaxed);
        let (stream_reserved, reserved) = match self.backend {
            Backend::Caching => (
                st.arena.reserved,
                self.counters.reserved.load(Ordering::Relaxed),
            ),
            Backend::DriverPool { .. } => (
                st.counts.allocated,
                self.pool_attribute(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            ),
        };
        self.observers.notify(&MemoryEvent {
            kind,
            device: self.ctx.ordinal(),
            stream_id: slot.stream.id(),
            address,
            bytes,
            stream_allocated_bytes: st.counts.allocated,
            stream_reserved_bytes: stream_reserved,
            allocated_bytes: allocated,
            reserved_bytes: reserved,
        });
    }
}
