//! The host pool's shared state: blocks ready for reuse by size class,
//! dropped blocks still waiting for the streams that used them, the figures,
//! and the raw `cuMemHostAlloc` / `cuMemFreeHost` calls.
//!
//! A dropped block comes back through [`RegionOwner::give_back`] with one
//! event per stream whose uses may still run (the driver's per-buffer use
//! tracker, recorded after each use). It waits in `pending` as a list of
//! [`Wait`]s, the allocator's one way of waiting for a freed block, and is
//! reusable once every one has completed.

use super::stats::HostPoolStats;
use crate::dependency::Wait;
use crate::error::{Error, HostHolder, Result};
use driver::{Context, RegionOwner, ReturnedRegion, StreamUse};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// A dropped block that some stream may still be using (both backends').
pub(super) struct PendingBlock {
    pub(super) address: u64,
    /// Its size: a class of the shelves, a request's bytes in a driver pool.
    pub(super) class: usize,
    /// (stream id, its event), the ones not yet seen complete.
    pub(super) waits: Vec<(u64, Wait)>,
}

impl PendingBlock {
    /// A block given back with its streams' uses.
    pub(super) fn returned(address: u64, uses: Vec<StreamUse>, class: usize) -> Self {
        Self {
            address,
            class,
            waits: uses
                .into_iter()
                .map(|u| (u.stream_id, Wait::Use(u.event)))
                .collect(),
        }
    }

    /// Whether every stream has passed its uses (one query per event not
    /// yet seen complete; those are forgotten).
    pub(super) fn finished(&mut self) -> bool {
        self.waits.retain(|(_, wait)| !wait.done(false));
        self.waits.is_empty()
    }
}

/// The stream holding the most of `pending`'s blocks.
pub(super) fn heaviest_holder(pending: &[PendingBlock]) -> Option<HostHolder> {
    let mut by_stream: HashMap<u64, HostHolder> = HashMap::new();
    for block in pending {
        for &(stream, _) in &block.waits {
            let holder = by_stream.entry(stream).or_insert(HostHolder {
                stream,
                blocks: 0,
                bytes: 0,
            });
            holder.blocks += 1;
            holder.bytes += block.class;
        }
    }
    by_stream
        .into_values()
        .max_by_key(|h| (h.blocks, h.bytes, std::cmp::Reverse(h.stream)))
}

/// The warning given once per crossing of the pending-bytes threshold.
pub(super) fn warn_pending(holder: HostHolder, pending_bytes: usize, threshold: usize) {
    tracing::warn!(
        stream = holder.stream,
        "pinned host pool: {pending_bytes} bytes of dropped blocks wait for streams \
         (threshold {threshold}); stream {} holds {} block(s), {} bytes",
        holder.stream,
        holder.blocks,
        holder.bytes
    );
}

#[derive(Default)]
pub(super) struct ShelfState {
    /// Blocks ready for reuse, by class.
    free: BTreeMap<usize, Vec<u64>>,
    pending: Vec<PendingBlock>,
    reserved: usize,
    peak_reserved: usize,
    in_use: usize,
    peak_in_use: usize,
    pending_bytes: usize,
    cached_bytes: usize,
    hits: u64,
    misses: u64,
    /// Set while a warning about pending bytes stands, so it is given once
    /// per crossing of the threshold.
    warned: bool,
    /// References to the pool's context handed back by dropped blocks
    /// ([`ReturnedRegion::context`]), given to the next blocks: a hit then
    /// moves a reference instead of counting one up and one down, two
    /// atomic read-modify-writes that cost a server CPU several
    /// nanoseconds each against a 100 ns budget. At most as many as blocks
    /// were ever out at once.
    spare_contexts: Vec<Arc<Context>>,
}

/// Everything behind a [`crate::HostPool`] and its blocks (each block holds
/// one reference, so the memory outlives every block).
pub(super) struct Shelf {
    pub(super) ctx: Arc<Context>,
    pub(super) cap: usize,
    pub(super) warn_pending: usize,
    state: Mutex<ShelfState>,
}

impl Shelf {
    pub(super) fn new(ctx: &Arc<Context>, cap: usize, warn_pending: usize) -> Self {
        Self {
            ctx: Arc::clone(ctx),
            cap,
            warn_pending,
            state: Mutex::default(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ShelfState> {
        // Every update leaves the figures and lists consistent between
        // statements that can panic: keep serving after one.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of `class` bytes for a request of `requested` bytes: cached,
    /// else a finished pending one, else a new one from the driver within
    /// the cap. Returns its address and a reference to the context for it.
    pub(super) fn take(&self, class: usize, requested: usize) -> Result<(u64, Arc<Context>)> {
        let mut st = self.lock();
        if let Some(address) = st.take_free(class) {
            st.hits += 1;
            st.note_in_use(class);
            return Ok((address, self.context_for_block(&mut st)));
        }
        st.collect_finished();
        if let Some(address) = st.take_free(class) {
            st.hits += 1;
            st.note_in_use(class);
            return Ok((address, self.context_for_block(&mut st)));
        }
        if st.reserved + class > self.cap {
            // Idle blocks of other classes make room first.
            let keep = st
                .cached_bytes
                .saturating_sub(st.reserved + class - self.cap);
            self.release_free(&mut st, keep);
        }
        if st.reserved + class > self.cap {
            return Err(Error::HostPoolFull {
                requested,
                class,
                cap: self.cap,
                reserved: st.reserved,
                in_use: st.in_use,
                holder: st.heaviest_holder(),
            });
        }
        // Reserve before unlocking, so concurrent misses respect the cap.
        st.reserved += class;
        st.peak_reserved = st.peak_reserved.max(st.reserved);
        st.misses += 1;
        drop(st);
        match self.driver_alloc(class) {
            Ok(address) => {
                let mut st = self.lock();
                st.note_in_use(class);
                Ok((address, self.context_for_block(&mut st)))
            }
            Err(err) => {
                self.lock().reserved -= class;
                Err(err)
            }
        }
    }

    /// A spare reference to the context, else a new one.
    fn context_for_block(&self, st: &mut ShelfState) -> Arc<Context> {
        st.spare_contexts
            .pop()
            .unwrap_or_else(|| Arc::clone(&self.ctx))
    }

    /// `cuMemHostAlloc` of `class` bytes, zeroed (the block's values are
    /// read as `T` by the first owner).
    fn driver_alloc(&self, class: usize) -> Result<u64> {
        let raw = driver::result::mem_host_alloc(&self.ctx, class)?;
        if raw.is_null() {
            return Err(driver::sys::DriverError::new(
                driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            )
            .into());
        }
        // SAFETY: `class` bytes at `raw` belong to this fresh allocation.
        unsafe { std::ptr::write_bytes(raw.cast::<u8>(), 0, class) };
        Ok(raw as u64)
    }

    /// Free cached blocks, largest first, until at most `keep` cached bytes
    /// remain. Returns the bytes freed.
    pub(super) fn release_free(&self, st: &mut ShelfState, keep: usize) -> usize {
        if st.cached_bytes <= keep || self.ctx.bind().is_err() {
            return 0;
        }
        let mut freed = 0;
        while st.cached_bytes > keep {
            let Some(mut entry) = st.free.last_entry() else {
                break;
            };
            let class = *entry.key();
            let Some(address) = entry.get_mut().pop() else {
                entry.remove();
                continue;
            };
            if entry.get().is_empty() {
                entry.remove();
            }
            st.cached_bytes -= class;
            // SAFETY: from mem_host_alloc, freed once: the block was cached,
            // so no block hands it out and every stream use has completed.
            if let Err(err) = unsafe { driver::result::mem_free_host(&self.ctx, address as *mut _) }
            {
                tracing::warn!("freeing a pinned host pool block {address:#x}: {err}");
            }
            st.reserved -= class;
            freed += class;
        }
        freed
    }

    pub(super) fn stats(&self) -> HostPoolStats {
        let mut st = self.lock();
        st.collect_finished();
        HostPoolStats {
            reserved_bytes: st.reserved,
            peak_reserved_bytes: st.peak_reserved,
            in_use_bytes: st.in_use,
            peak_in_use_bytes: st.peak_in_use,
            pending_bytes: st.pending_bytes,
            cached_bytes: st.cached_bytes,
            hits: st.hits,
            misses: st.misses,
            cap_bytes: self.cap,
        }
    }

    /// The stream holding the most dropped blocks that are not yet reusable.
    pub(super) fn heaviest_holder(&self) -> Option<HostHolder> {
        let mut st = self.lock();
        st.collect_finished();
        st.heaviest_holder()
    }

    pub(super) fn reset_peaks(&self) {
        let mut st = self.lock();
        st.peak_reserved = st.reserved;
        st.peak_in_use = st.in_use;
    }
}

impl ShelfState {
    fn take_free(&mut self, class: usize) -> Option<u64> {
        let list = self.free.get_mut(&class)?;
        let address = list.pop()?;
        self.cached_bytes -= class;
        Some(address)
    }

    fn note_in_use(&mut self, class: usize) {
        self.in_use += class;
        self.peak_in_use = self.peak_in_use.max(self.in_use);
    }

    /// Move the pending blocks whose streams have all passed their uses to
    /// the free lists (one query per event not yet seen complete).
    pub(super) fn collect_finished(&mut self) {
        let mut index = 0;
        while index < self.pending.len() {
            if self.pending[index].finished() {
                let block = self.pending.swap_remove(index);
                self.pending_bytes -= block.class;
                self.cached_bytes += block.class;
                self.free
                    .entry(block.class)
                    .or_default()
                    .push(block.address);
            } else {
                index += 1;
            }
        }
    }

    fn heaviest_holder(&self) -> Option<HostHolder> {
        heaviest_holder(&self.pending)
    }
}

impl RegionOwner for Shelf {
    fn give_back(&self, region: ReturnedRegion) {
        let class = region.token as usize;
        let ReturnedRegion {
            address,
            uses,
            context,
            ..
        } = region;
        // Only `HostPool::allocate` lends this shelf's blocks, each with a
        // reference to the shelf's own context.
        debug_assert!(
            Arc::ptr_eq(&context, &self.ctx),
            "a block of another context"
        );
        let mut st = self.lock();
        st.in_use -= class;
        st.spare_contexts.push(context);
        if uses.is_empty() {
            st.cached_bytes += class;
            st.free.entry(class).or_default().push(address);
            return;
        }
        st.pending_bytes += class;
        st.pending
            .push(PendingBlock::returned(address, uses, class));
        if st.pending_bytes > self.warn_pending && !st.warned {
            st.collect_finished();
            if st.pending_bytes > self.warn_pending {
                st.warned = true;
                if let Some(holder) = st.heaviest_holder() {
                    warn_pending(holder, st.pending_bytes, self.warn_pending);
                }
            }
        } else if st.pending_bytes <= self.warn_pending {
            st.warned = false;
        }
    }
}

impl Drop for Shelf {
    /// The pool and its last block are gone: wait for the streams still
    /// using dropped blocks, then free everything. A block whose streams
    /// cannot be waited for is leaked rather than freed under a copy.
    fn drop(&mut self) {
        let ctx = Arc::clone(&self.ctx);
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = ctx.bind() {
            tracing::warn!(
                "leaking the pinned host pool's {} bytes: {err}",
                st.reserved
            );
            return;
        }
        let mut addresses: Vec<u64> = std::mem::take(&mut st.free)
            .into_values()
            .flatten()
            .collect();
        for block in std::mem::take(&mut st.pending) {
            if block.waits.iter().all(|(_, wait)| wait.done(true)) {
                addresses.push(block.address);
            } else {
                tracing::warn!(
                    "leaking pinned host pool block {:#x} ({} bytes): a stream using it could not be waited for",
                    block.address,
                    block.class
                );
            }
        }
        for address in addresses {
            // SAFETY: from mem_host_alloc, freed once; no block is live (each
            // held a reference to this state) and every stream use is done.
            if let Err(err) = unsafe { driver::result::mem_free_host(&ctx, address as *mut _) } {
                tracing::warn!("freeing a pinned host pool block {address:#x}: {err}");
            }
        }
    }
}
