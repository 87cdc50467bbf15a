//! Which pools of host memory exist, their accounting, and which pool each
//! live allocation came from: the bookkeeping under `host_pool`'s API calls.
//!
//! A leaf below `memory`, which tells it when a host-pool allocation is
//! freed and trims its pools at a synchronisation; keeping it apart from
//! the API calls (which name streams and ops) lets `memory` do so without
//! reaching back up into them.

use crate::errors::fail;
use crate::handles::lock;
use crate::pool_stats::PoolStats;
use std::collections::BTreeMap;
use std::sync::Mutex;
use sys::CUresult;

/// One pool of host memory.
struct HostPool {
    stats: PoolStats,
    /// `maxSize`, or no cap (0 asks for the system's default, which here is
    /// the host's memory).
    max_size: usize,
    /// Live allocations: a destroyed pool is forgotten once none is left.
    live: usize,
    destroyed: bool,
}

struct Pools {
    pools: BTreeMap<usize, HostPool>,
    /// Each live allocation's base: its pool and its rounded size.
    allocations: BTreeMap<usize, (usize, usize)>,
}

static POOLS: Mutex<Pools> = Mutex::new(Pools {
    pools: BTreeMap::new(),
    allocations: BTreeMap::new(),
});

/// Whether `handle` is a pool of host memory that takes allocations.
pub(crate) fn is_live(handle: usize) -> bool {
    lock(&POOLS)
        .pools
        .get(&handle)
        .is_some_and(|pool| !pool.destroyed)
}

/// Read or change pool `handle`'s attributes; `INVALID_HANDLE` when it is
/// no live pool of host memory.
pub(crate) fn with_stats<R>(
    handle: usize,
    f: impl FnOnce(&mut PoolStats) -> R,
) -> Result<R, CUresult> {
    match lock(&POOLS).pools.get_mut(&handle) {
        Some(pool) if !pool.destroyed => Ok(f(&mut pool.stats)),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    }
}

/// `cuMemPoolTrimTo` on pool `handle`: what no allocation holds is given
/// back down to `keep` bytes.
pub(crate) fn trim_to(handle: usize, keep: usize) -> Result<(), CUresult> {
    with_stats(handle, |stats| {
        stats.reserved = stats.reserved.min(keep).max(stats.used);
    })
}

/// At a synchronisation, give back each pool's reservation above its
/// release threshold, as the default pools do.
pub(crate) fn trim_at_sync() {
    for pool in lock(&POOLS).pools.values_mut() {
        let stats = &mut pool.stats;
        let threshold = usize::try_from(stats.release_threshold).unwrap_or(usize::MAX);
        if stats.reserved > threshold {
            stats.reserved = threshold.max(stats.used);
        }
    }
}

/// Count an allocation of `size` bytes, `rounded` as every allocation is,
/// as used in pool `handle`, within its `maxSize`.
pub(crate) fn reserve(handle: usize, size: usize, rounded: usize) -> Result<(), CUresult> {
    let mut pools = lock(&POOLS);
    let pool = match pools.pools.get_mut(&handle) {
        Some(pool) if !pool.destroyed => pool,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    };
    let stats = &mut pool.stats;
    if stats.used.saturating_add(rounded) > pool.max_size {
        return Err(fail(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!(
                "allocation of {size} bytes from host memory pool {handle:#x} exceeds its \
                 maxSize: {} of {} bytes in use",
                stats.used, pool.max_size
            ),
        ));
    }
    if stats.reserved.max(stats.used + rounded) > pool.max_size {
        // What no allocation holds goes back before the pool grows past
        // its cap, as CUDA's pools do.
        stats.reserved = stats.used;
    }
    stats.used += rounded;
    stats.reserved = stats.reserved.max(stats.used);
    stats.used_high = stats.used_high.max(stats.used);
    stats.reserved_high = stats.reserved_high.max(stats.reserved);
    pool.live += 1;
    Ok(())
}

/// Undo [`reserve`].
pub(crate) fn unreserve(handle: usize, rounded: usize) {
    let mut pools = lock(&POOLS);
    if let Some(pool) = pools.pools.get_mut(&handle) {
        pool.stats.used -= rounded;
        pool.live -= 1;
        if pool.destroyed && pool.live == 0 {
            pools.pools.remove(&handle);
        }
    }
}

/// The host-pool allocation at `base` was freed (its stream reached the
/// free): its pool counts it no more. Called before its bytes go back to
/// the host allocator, so the address cannot belong to a newer one yet.
pub(crate) fn released(base: usize) {
    let mut pools = lock(&POOLS);
    if let Some((handle, rounded)) = pools.allocations.remove(&base) {
        drop(pools);
        unreserve(handle, rounded);
    }
}

/// Remember that the allocation at `base`, `rounded` bytes, came from pool
/// `handle`, for [`released`].
pub(crate) fn record(base: usize, handle: usize, rounded: usize) {
    lock(&POOLS).allocations.insert(base, (handle, rounded));
}

/// A new pool of host memory, `handle`, capped at `max_size` bytes.
pub(crate) fn create(handle: usize, max_size: usize) {
    lock(&POOLS).pools.insert(
        handle,
        HostPool {
            stats: PoolStats {
                reuse: [1, 1, 1],
                ..PoolStats::default()
            },
            max_size,
            live: 0,
            destroyed: false,
        },
    );
}

/// `cuMemPoolDestroy` on pool `handle`: false when it is no live pool of
/// host memory.
pub(crate) fn destroy(handle: usize) -> bool {
    let mut pools = lock(&POOLS);
    match pools.pools.get_mut(&handle) {
        Some(host) if !host.destroyed => {
            // Live allocations stay usable until freed, as in CUDA.
            host.destroyed = true;
            if host.live == 0 {
                pools.pools.remove(&handle);
            }
            true
        }
        _ => false,
    }
}
