//! The host pool's driver backend ([`HostBackend::DriverPool`](super::HostBackend)):
//! blocks are allocations of a driver memory pool of host memory
//! ([`HostMemPool`], CUDA 12.2 and later), which sizes, caches and trims
//! them; this file keeps what the driver cannot know.
//!
//! A block has no stream of its own, so it is allocated and freed on one
//! stream the backend keeps (`home`), which only ever holds those calls:
//! an allocation is synchronised at once (the host may touch the block when
//! `allocate` returns), and a dropped block waits on the host, as the
//! shelves' do, as a [`PendingBlock`] until every stream that used it has
//! passed those uses; only then is it freed to the driver pool. Freeing
//! earlier with `cuStreamWaitEvent` on `home` would make every later
//! allocation wait behind the slowest stream that holds a block.
//!
//! The figures come from the driver where it keeps them (reserved bytes and
//! their peak, what is cached), from this file where it cannot (blocks in
//! use, blocks waiting for streams); a request is a hit when the pool's
//! reservation did not grow to serve it.

use super::shelf::{PendingBlock, heaviest_holder, warn_pending};
use super::stats::HostPoolStats;
use crate::error::{Error, HostHolder, Result};
use driver::sys::CUmemPool_attribute as Attr;
use driver::{Context, DeviceCopy, HostMemPool, PinnedRegion, RegionOwner, ReturnedRegion, Stream};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    pending: Vec<PendingBlock>,
    /// Blocks handed out and not yet dropped.
    in_use: usize,
    peak_in_use: usize,
    pending_bytes: usize,
    hits: u64,
    misses: u64,
    /// Set while a warning about pending bytes stands.
    warned: bool,
}

/// Everything behind a driver-backed [`crate::HostPool`] and its blocks
/// (each block holds one reference, so the pool outlives every block).
pub(super) struct DriverBackend {
    pub(super) ctx: Arc<Context>,
    pub(super) cap: usize,
    warn_pending: usize,
    pool: HostMemPool,
    /// Where blocks are allocated and freed; nothing else runs on it.
    home: Arc<Stream>,
    state: Mutex<State>,
}

impl DriverBackend {
    /// A driver pool of host memory reserving at most `cap` bytes, which
    /// keeps what is freed until trimmed (as the shelves do), and its
    /// stream. [`driver::Error::HostPoolsUnsupported`] where the driver
    /// makes no such pool.
    pub(super) fn new(ctx: &Arc<Context>, cap: usize, warn_pending: usize) -> Result<Self> {
        let pool = HostMemPool::new(ctx, cap)?;
        // The default threshold (0) would give every freed byte back at the
        // next synchronisation, and `home` is synchronised at every request.
        pool.set_attribute(Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX)?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            cap,
            warn_pending,
            pool,
            home: Stream::new(ctx)?,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the figures consistent between statements
        // that can panic: keep serving after one.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One of the pool's byte figures, 0 when it cannot be read.
    fn figure(&self, attribute: Attr) -> usize {
        self.pool
            .attribute(attribute)
            .map_or(0, |v| usize::try_from(v).unwrap_or(usize::MAX))
    }

    /// A block of `len` values of `T`, `bytes` in all (checked by the
    /// caller: not zero, no overflow).
    pub(super) fn allocate<T: DeviceCopy>(
        self: &Arc<Self>,
        len: usize,
        bytes: usize,
    ) -> Result<PinnedRegion<T>> {
        let align = std::mem::align_of::<T>();
        let address = self.take(bytes, align, std::any::type_name::<T>())?;
        let owner: Arc<dyn RegionOwner> = self.clone();
        // SAFETY: `address` is an allocation of `bytes` from the driver pool
        // of host memory, which `ctx`'s device may use, aligned for `T`
        // (checked by `take`); it holds zeros when new and since only
        // `DeviceCopy` values (valid for any bits); `home` has passed the
        // allocation, and the pool reused the memory only after the free of
        // its last owner, made once every stream had passed that owner's
        // uses; no one else gets it until `give_back`, which frees it only
        // after the events it is handed.
        Ok(unsafe {
            PinnedRegion::from_raw_parts(
                Arc::clone(&self.ctx),
                address as *mut T,
                len,
                owner,
                bytes as u64,
            )
        })
    }

    /// A block of `bytes` whose address is a multiple of `align` (that of
    /// `type_name`, named if the pool's is less), free of every stream and
    /// readable by the host. Past the cap (after giving
    /// idle memory back once), [`Error::HostPoolFull`].
    fn take(&self, bytes: usize, align: usize, type_name: &'static str) -> Result<u64> {
        // Requests are served one at a time: whether one was a hit is read
        // from the reservation around it.
        let mut st = self.lock();
        self.free_finished(&mut st);
        let full = |st: &State| Error::HostPoolFull {
            requested: bytes,
            class: bytes,
            cap: self.cap,
            reserved: self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            in_use: st.in_use,
            holder: heaviest_holder(&st.pending),
        };
        if st.in_use + st.pending_bytes + bytes > self.cap {
            return Err(full(&st));
        }
        let before = self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let block = match self.allocate_synchronised(bytes) {
            Err(err) if crate::shared::is_oom(&err) => {
                // Idle memory of other sizes makes room, once.
                self.pool.trim_to(0)?;
                match self.allocate_synchronised(bytes) {
                    Err(err) if crate::shared::is_oom(&err) => return Err(full(&st)),
                    other => other?,
                }
            }
            other => other?,
        };
        let address = block.as_ptr() as u64;
        if !address.is_multiple_of(align as u64) {
            // SAFETY: just allocated from the pool and never handed out.
            unsafe { self.free(block) };
            return Err(Error::HostAlignment { type_name, align });
        }
        if self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > before {
            st.misses += 1;
            // New memory holds zeros, as the shelves' new blocks do (a
            // reused block holds what its last owner left).
            // SAFETY: `bytes` of host memory, allocated above, that `home`
            // has passed (synchronised) and no one else has.
            unsafe { std::ptr::write_bytes(block.as_ptr(), 0, bytes) };
        } else {
            st.hits += 1;
        }
        st.in_use += bytes;
        st.peak_in_use = st.peak_in_use.max(st.in_use);
        Ok(address)
    }

    /// `bytes` from the pool, allocated on `home` and synchronised.
    fn allocate_synchronised(&self, bytes: usize) -> Result<NonNull<u8>> {
        let block = self.pool.allocate_async(&self.home, bytes)?;
        if let Err(err) = self.home.synchronize() {
            // SAFETY: from the pool, never handed out; `home` orders the
            // free after the allocation.
            unsafe { self.free(block) };
            return Err(err.into());
        }
        Ok(block)
    }

    /// Free `block` to the pool on `home`, logging a failure (the block is
    /// then leaked, which is safe).
    ///
    /// # Safety
    /// `block` came from the pool, is freed once, and no stream or host
    /// reference uses it any more.
    unsafe fn free(&self, block: NonNull<u8>) {
        // SAFETY: the caller's contract.
        if let Err(err) = unsafe { self.pool.free_async(&self.home, block) } {
            tracing::warn!("leaking host pool block {:p}: {err}", block.as_ptr());
        }
    }

    /// Free to the pool the dropped blocks whose streams have all passed
    /// their uses, and wait for `home` to pass the frees, so the pool's
    /// figures count them. Returns whether any was freed.
    fn free_finished(&self, st: &mut State) -> bool {
        let mut freed = false;
        let mut index = 0;
        while index < st.pending.len() {
            if !st.pending[index].finished() {
                index += 1;
                continue;
            }
            let block = st.pending.swap_remove(index);
            st.pending_bytes -= block.class;
            if let Some(ptr) = NonNull::new(block.address as *mut u8) {
                // SAFETY: from the pool, freed once (taken off the list);
                // its block was dropped and every stream using it is done.
                unsafe { self.free(ptr) };
                freed = true;
            }
        }
        if freed && let Err(err) = self.home.synchronize() {
            tracing::warn!("host pool: waiting for its frees: {err}");
        }
        freed
    }

    /// Free what the streams are done with, then give the pool's idle
    /// memory back down to `keep` bytes. Returns the bytes released.
    pub(super) fn trim(&self, keep: usize) -> usize {
        let mut st = self.lock();
        self.free_finished(&mut st);
        let before = self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        if let Err(err) = self.pool.trim_to(keep) {
            tracing::warn!("host pool: trimming to {keep} bytes: {err}");
        }
        before.saturating_sub(self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT))
    }

    pub(super) fn stats(&self) -> HostPoolStats {
        let mut st = self.lock();
        self.free_finished(&mut st);
        let reserved = self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let used = self.figure(Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        HostPoolStats {
            reserved_bytes: reserved,
            peak_reserved_bytes: self.figure(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
            in_use_bytes: st.in_use,
            peak_in_use_bytes: st.peak_in_use,
            pending_bytes: st.pending_bytes,
            cached_bytes: reserved.saturating_sub(used),
            hits: st.hits,
            misses: st.misses,
            cap_bytes: self.cap,
        }
    }

    pub(super) fn heaviest_holder(&self) -> Option<HostHolder> {
        let mut st = self.lock();
        self.free_finished(&mut st);
        heaviest_holder(&st.pending)
    }

    pub(super) fn reset_peaks(&self) {
        let mut st = self.lock();
        st.peak_in_use = st.in_use;
        // CUDA resets a high watermark set to 0 to the current value.
        if let Err(err) = self
            .pool
            .set_attribute(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0)
        {
            tracing::warn!("host pool: resetting its peak: {err}");
        }
    }
}

impl RegionOwner for DriverBackend {
    /// No driver call here: a block may be dropped where the driver cannot
    /// be called (a stream callback). It waits for its streams, and is
    /// freed by the next request, trim or look at the figures.
    fn give_back(&self, region: ReturnedRegion) {
        let bytes = region.token as usize;
        let mut st = self.lock();
        st.in_use -= bytes;
        st.pending_bytes += bytes;
        st.pending
            .push(PendingBlock::returned(region.address, region.uses, bytes));
        if st.pending_bytes <= self.warn_pending {
            st.warned = false;
        } else if !st.warned
            && let Some(holder) = heaviest_holder(&st.pending)
        {
            st.warned = true;
            warn_pending(holder, st.pending_bytes, self.warn_pending);
        }
    }
}

impl Drop for DriverBackend {
    /// The pool and its last block are gone: wait for the streams still
    /// using dropped blocks, then free everything, before the pool is
    /// destroyed. A block whose streams cannot be waited for is leaked
    /// rather than freed under a copy.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let pending = std::mem::take(&mut st.pending);
        for block in pending {
            let Some(ptr) = NonNull::new(block.address as *mut u8) else {
                continue;
            };
            if block.waits.iter().all(|(_, wait)| wait.done(true)) {
                // SAFETY: from the pool, freed once; no block is live (each
                // held a reference to this backend) and every use is done.
                if let Err(err) = unsafe { self.pool.free_async(&self.home, ptr) } {
                    tracing::warn!("leaking host pool block {ptr:p}: {err}");
                }
            } else {
                tracing::warn!(
                    "leaking host pool block {ptr:p} ({} bytes): a stream using it could not \
                     be waited for",
                    block.class
                );
            }
        }
        if let Err(err) = self.home.synchronize() {
            tracing::warn!("host pool: waiting for its last frees: {err}");
        }
    }
}
