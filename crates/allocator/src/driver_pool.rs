//! The driver-pool backend: `cuMemAllocAsync` / `cuMemFreeAsync` on the
//! device's default pool. The driver caches and orders; this file tracks live
//! allocations (for `free_for_stream` and statistics) and turns other streams'
//! uses and dependencies into `cuStreamWaitEvent` before the free.

use crate::error::{ALLOCATE_WHILE_CAPTURING, Error, Result};
use crate::shared::{PoolLive, Shared, Slot, SlotState, is_oom};
use driver::sys::{CUdeviceptr, CUmemPool_attribute};
use driver::{Context, MemPool, result};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The device's default pool, with its release threshold set.
pub(crate) fn open_pool(ctx: &Arc<Context>, release_threshold: u64) -> Result<MemPool> {
    if !ctx.info().memory_pools_supported {
        return Err(Error::PoolsUnsupported);
    }
    let pool = MemPool::device_default(ctx)?;
    pool.set_attribute(
        CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        release_threshold,
    )?;
    Ok(pool)
}

impl Shared {
    /// One of the pool's byte attributes, 0 when unreadable (or no pool).
    pub(crate) fn pool_attribute(&self, attribute: CUmemPool_attribute) -> usize {
        let Some(pool) = &self.pool else {
            return 0;
        };
        pool.attribute(attribute)
            .map_or(0, |value| usize::try_from(value).unwrap_or(usize::MAX))
    }

    /// Reset the pool's high watermarks (CUDA resets them when set to 0).
    pub(crate) fn reset_pool_peaks(&self) {
        let Some(pool) = &self.pool else {
            return;
        };
        for attribute in [
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        ] {
            let _ = pool.set_attribute(attribute, 0);
        }
    }

    fn alloc_async(&self, slot: &Slot, bytes: usize) -> Result<CUdeviceptr> {
        // Captured, the allocation would become a node of the graph: the
        // enqueue protocol refuses it (its gate is the only one taken), and
        // the refusal names what the caller asked for.
        let ptr = result::mem_alloc_async(&slot.stream, bytes).map_err(|err| match err {
            driver::Error::StreamCapturing { stream, .. } => driver::Error::StreamCapturing {
                operation: ALLOCATE_WHILE_CAPTURING,
                stream,
            },
            other => other,
        })?;
        self.counters.driver_allocs.fetch_add(1, Ordering::Relaxed);
        Ok(ptr)
    }

    /// `cuMemAllocAsync` on `slot`'s stream, recovering once from out-of-memory.
    pub(crate) fn pool_allocate(&self, slot: &Slot, bytes: usize) -> Result<(u64, u64)> {
        let ptr = match self.alloc_async(slot, bytes) {
            Ok(ptr) => ptr,
            Err(err) if is_oom(&err) => {
                // Frees still queued on other streams hold pool memory: let
                // them complete, give the pool's unused memory back, retry.
                self.pool_release(true, 0)?;
                self.counters.oom_recoveries.fetch_add(1, Ordering::Relaxed);
                match self.alloc_async(slot, bytes) {
                    Ok(ptr) => ptr,
                    Err(err) if is_oom(&err) => {
                        return Err(Error::OutOfMemory {
                            requested: bytes,
                            reserved: self.pool_attribute(
                                CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                            ),
                            free: self.free_device_memory(),
                        });
                    }
                    Err(err) => return Err(err),
                }
            }
            Err(err) => return Err(err),
        };
        let mut st = slot.lock();
        st.next_pool_id += 1;
        let id = st.next_pool_id;
        st.pool_live.insert(
            ptr,
            PoolLive {
                id,
                size: bytes,
                uses: Vec::new(),
                pins: crate::arena::Pins::default(),
            },
        );
        st.counts.add(bytes, bytes);
        self.counters.allocated(bytes);
        Ok((ptr, id))
    }

    /// Free `ptr` (id `id`) stream-ordered on `slot`'s stream, after its other
    /// streams' uses and the stream's unfinished dependencies. A dead handle is
    /// a no-op.
    pub(crate) fn pool_free(&self, slot: &Slot, st: &mut SlotState, ptr: u64, id: u64) {
        match st.pool_live.get(&ptr) {
            Some(live) if live.id == id => {}
            _ => return,
        }
        let Some(live) = st.pool_live.remove(&ptr) else {
            return;
        };
        st.counts.sub(live.size, live.size);
        self.counters.freed(live.size);
        let Some(waits) = self.waits_for(&live.uses, &st.deps) else {
            return; // leaked: no proof that the other streams are done
        };
        for wait in &waits {
            if let Err(err) = slot.stream.wait_event(wait.event())
                && !wait.done(true)
            {
                tracing::warn!(
                    "leaking {ptr:#x}: cannot order its free after \
                         another stream's use ({err})"
                );
                return;
            }
        }
        // The waits are enqueued; the pooled events can go back now.
        drop(waits);
        // SAFETY: `ptr` came from cuMemAllocAsync and is freed once (its live
        // record was just removed); the free is ordered after every use on
        // this stream by stream order and after other streams' uses by the
        // waits above.
        match unsafe { result::mem_free_async(&slot.stream, ptr) } {
            Ok(()) => {
                self.counters.driver_frees.fetch_add(1, Ordering::Relaxed);
            }
            // Captured, the free would become a node of the graph, run at
            // every replay: the protocol refuses it, and it is leaked (a
            // capture began since the caller looked).
            Err(driver::Error::StreamCapturing { stream, .. }) => {
                tracing::warn!("leaking {ptr:#x}: stream {stream} began a capture as it was freed");
            }
            Err(err) => tracing::warn!("freeing {ptr:#x}: {err}"),
        }
    }

    /// Let queued frees complete (with `block`: synchronise every stream the
    /// allocator knows) and trim the pool to `keep` bytes. Returns the bytes
    /// the pool's reservation shrank by.
    pub(crate) fn pool_release(&self, block: bool, keep: usize) -> Result<usize> {
        if block {
            for slot in self.all_slots() {
                slot.stream.synchronize()?;
            }
        }
        let before = self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        if let Some(pool) = &self.pool {
            pool.trim_to(keep)?;
        }
        let after = self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        Ok(before.saturating_sub(after))
    }
}
