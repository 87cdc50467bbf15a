//! Device memory is host memory: the allocation registry, the capacity, and the
//! default pool's accounting.
//!
//! Every allocation is zeroed host memory aligned to 256 bytes and is recorded
//! by base address, so that a pointer claimed to be device memory
//! can be checked against the allocation it falls in.
//!
//! Capacity counts device allocations (`cuMemAlloc`, managed) plus the pool's
//! *reserved* bytes: memory freed to the pool stays reserved (reusable by the
//! pool without counting again) until a synchronisation trims it to the
//! release threshold, as CUDA's pools do. The bytes themselves are returned to
//! the host allocator at once; only the accounting is kept.

use crate::errors::fail;
use crate::handles::lock;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use sys::CUresult;

/// Alignment of every allocation, as `cuMemAlloc` guarantees.
pub const ALIGNMENT: usize = 256;

/// The default capacity: 16 GiB.
pub const DEFAULT_CAPACITY: usize = 16 << 30;

/// Environment variable that sets the capacity in MiB at first use.
pub const CAPACITY_ENV: &str = "CUDA_STREAMS_SOFT_CAPACITY_MB";

const UNSET: usize = usize::MAX;
static CAPACITY: AtomicUsize = AtomicUsize::new(UNSET);

/// The software device's memory capacity in bytes: what `cuDeviceTotalMem`
/// and `cuMemGetInfo` report and what allocations are counted against.
/// [`DEFAULT_CAPACITY`] unless set by [`set_capacity`] or, at first use, by
/// `CUDA_STREAMS_SOFT_CAPACITY_MB`.
pub fn capacity() -> usize {
    match CAPACITY.load(Ordering::Acquire) {
        UNSET => {
            let from_env = std::env::var(CAPACITY_ENV)
                .ok()
                .and_then(|mb| mb.trim().parse::<usize>().ok())
                .and_then(|mb| mb.checked_mul(1 << 20))
                .unwrap_or(DEFAULT_CAPACITY);
            match CAPACITY.compare_exchange(UNSET, from_env, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => from_env,
                Err(set) => set,
            }
        }
        set => set,
    }
}

/// Set the capacity in bytes. Live allocations stay; if they already exceed
/// the new capacity, every new device allocation fails until enough are freed.
///
/// ```
/// let before = cuda_streams_soft_driver::capacity();
/// cuda_streams_soft_driver::set_capacity(1 << 30);
/// assert_eq!(cuda_streams_soft_driver::capacity(), 1 << 30);
/// cuda_streams_soft_driver::set_capacity(before);
/// ```
pub fn set_capacity(bytes: usize) {
    CAPACITY.store(bytes.min(UNSET - 1), Ordering::Release);
}

/// Bytes counted against the capacity now: live device and managed
/// allocations plus the default pool's reserved memory.
pub fn memory_in_use() -> usize {
    lock(&MEMORY).in_use()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// `cuMemAlloc`.
    Device,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`: from the default pool.
    Pool,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemHostAlloc`: page-locked host memory, not counted as device memory.
    Pinned,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Pool => "stream-ordered",
            Kind::Managed => "managed",
            Kind::Pinned => "pinned host",
        }
    }
}

struct Allocation {
    size: usize,
    rounded: usize,
    /// What the host allocator returned (the base is rounded up from it).
    raw: usize,
    kind: Kind,
    free_pending: bool,
    /// Stream-ordered memory becomes usable when its stream reaches the
    /// allocation; everything else at once.
    ready: bool,
}

/// The default pool's attributes, kept as CUDA defines them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PoolStats {
    pub(crate) used: usize,
    pub(crate) used_high: usize,
    pub(crate) reserved: usize,
    pub(crate) reserved_high: usize,
    pub(crate) release_threshold: u64,
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC,
    /// REUSE_ALLOW_INTERNAL_DEPENDENCIES: stored and reported (all on by
    /// default, as in CUDA); they do not change anything here.
    pub(crate) reuse: [i32; 3],
}

struct Memory {
    allocations: BTreeMap<usize, Allocation>,
    device_bytes: usize,
    pool: PoolStats,
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory {
    allocations: BTreeMap::new(),
    device_bytes: 0,
    pool: PoolStats {
        used: 0,
        used_high: 0,
        reserved: 0,
        reserved_high: 0,
        release_threshold: 0,
        reuse: [1, 1, 1],
    },
});

impl Memory {
    fn in_use(&self) -> usize {
        self.device_bytes + self.pool.reserved
    }

    /// Bytes this allocation adds to `in_use`.
    fn growth(&self, kind: Kind, rounded: usize) -> usize {
        match kind {
            Kind::Device | Kind::Managed => rounded,
            Kind::Pool => (self.pool.used + rounded).saturating_sub(self.pool.reserved),
            Kind::Pinned => 0,
        }
    }

    fn containing(&self, ptr: usize) -> Option<(usize, &Allocation)> {
        let (&base, allocation) = self.allocations.range(..=ptr).next_back()?;
        (ptr < base + allocation.size.max(1)).then_some((base, allocation))
    }
}

/// The host layout behind a `rounded`-byte allocation: over-allocated by the
/// alignment at the allocator's natural alignment, because the system allocator
/// zeroes over-aligned requests by hand (touching every page) but gets natural
/// ones from calloc, whose large blocks are fresh, lazily-zeroed mappings. A
/// 1 GiB allocation thus costs nothing until it is used.
fn raw_layout(rounded: usize) -> Option<Layout> {
    Layout::from_size_align(rounded.checked_add(ALIGNMENT)?, 16).ok()
}

/// Allocate `size` bytes of `kind`, counted against the capacity.
pub(crate) fn allocate(size: usize, kind: Kind) -> Result<usize, CUresult> {
    if size == 0 {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "allocation of 0 bytes",
        ));
    }
    if kind != Kind::Pinned && crate::faults::take_allocation_failure() {
        return Err(fail(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("injected out-of-memory for an allocation of {size} bytes"),
        ));
    }
    let oom = |in_use: usize| {
        fail(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!(
                "allocation of {size} bytes ({}) exceeds the software device's capacity: \
                 {in_use} of {} bytes in use",
                kind.name(),
                capacity()
            ),
        )
    };
    let rounded = size
        .checked_next_multiple_of(ALIGNMENT)
        .ok_or_else(|| oom(0))?;
    let layout = raw_layout(rounded).ok_or_else(|| oom(0))?;
    let mut memory = lock(&MEMORY);
    let capacity = capacity();
    if memory.in_use() + memory.growth(kind, rounded) > capacity {
        // Give the pool's unused reservation back before failing, as CUDA
        // does when an allocation would otherwise run out.
        memory.pool.reserved = memory.pool.used;
        if memory.in_use() + memory.growth(kind, rounded) > capacity {
            return Err(oom(memory.in_use()));
        }
    }
    // SAFETY: the layout has a non-zero size (size > 0, rounded up).
    let raw = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    if raw == 0 {
        return Err(oom(memory.in_use()));
    }
    let ptr = raw.next_multiple_of(ALIGNMENT);
    match kind {
        Kind::Device | Kind::Managed => memory.device_bytes += rounded,
        Kind::Pool => {
            let pool = &mut memory.pool;
            pool.used += rounded;
            pool.reserved = pool.reserved.max(pool.used);
            pool.used_high = pool.used_high.max(pool.used);
            pool.reserved_high = pool.reserved_high.max(pool.reserved);
        }
        Kind::Pinned => {}
    }
    memory.allocations.insert(
        ptr,
        Allocation {
            size,
            rounded,
            raw,
            kind,
            free_pending: false,
            ready: kind != Kind::Pool,
        },
    );
    Ok(ptr)
}

/// Free the allocation at `base` now, if its kind is one of `kinds`.
pub(crate) fn free(base: usize, kinds: &[Kind]) -> Result<(), CUresult> {
    let mut memory = lock(&MEMORY);
    match memory.allocations.get(&base) {
        Some(allocation) if kinds.contains(&allocation.kind) => {}
        Some(allocation) => {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{base:#x} is {} memory, which this call does not free",
                    allocation.kind.name()
                ),
            ));
        }
        None => {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{base:#x} is not the start of a live allocation"),
            ));
        }
    }
    let allocation = memory
        .allocations
        .remove(&base)
        .unwrap_or_else(|| unreachable!());
    match allocation.kind {
        Kind::Device | Kind::Managed => memory.device_bytes -= allocation.rounded,
        Kind::Pool => memory.pool.used -= allocation.rounded,
        Kind::Pinned => {}
    }
    drop(memory);
    let layout = raw_layout(allocation.rounded)
        .unwrap_or_else(|| unreachable!("the layout was valid at allocation"));
    // SAFETY: raw came from alloc_zeroed with this layout and its allocation
    // was just removed from the registry, so it is freed exactly once.
    unsafe { std::alloc::dealloc(allocation.raw as *mut u8, layout) };
    Ok(())
}

/// Claim the allocation at `base` for a stream-ordered free: fails when it is
/// unknown, pinned, or already being freed.
pub(crate) fn begin_free_async(base: usize) -> Result<(), CUresult> {
    let mut memory = lock(&MEMORY);
    match memory.allocations.get_mut(&base) {
        Some(allocation) if allocation.kind == Kind::Pinned => Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{base:#x} is pinned host memory; free it with cuMemFreeHost"),
        )),
        Some(allocation) if allocation.free_pending => Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{base:#x} is already being freed (double free)"),
        )),
        Some(allocation) => {
            allocation.free_pending = true;
            Ok(())
        }
        None => Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{base:#x} is not the start of a live allocation"),
        )),
    }
}

/// Undo [`begin_free_async`] when the free could not be enqueued.
pub(crate) fn cancel_free_async(base: usize) {
    if let Some(allocation) = lock(&MEMORY).allocations.get_mut(&base) {
        allocation.free_pending = false;
    }
}

/// The worker reached a `cuMemFreeAsync`.
pub(crate) fn release_async(base: usize) {
    let _ = free(base, &[Kind::Device, Kind::Pool, Kind::Managed]);
}

/// The worker of the allocating stream reached a `cuMemAllocAsync`: its
/// memory may be used from now on, in stream order.
pub(crate) fn mark_ready(base: usize) {
    if let Some(allocation) = lock(&MEMORY).allocations.get_mut(&base) {
        allocation.ready = true;
    }
}

/// Ok when `[ptr, ptr + len)` lies inside one live allocation that the
/// device may use now (a stream-ordered allocation once its stream has
/// reached it); otherwise why not. For the workers, at the time an
/// operation runs.
pub(crate) fn check_range(ptr: usize, len: usize) -> Result<Kind, String> {
    check_range_at(ptr, len, true)
}

fn check_range_at(ptr: usize, len: usize, in_stream_order: bool) -> Result<Kind, String> {
    let memory = lock(&MEMORY);
    let Some((base, allocation)) = memory.containing(ptr) else {
        return Err(format!("{ptr:#x} is not inside any live allocation"));
    };
    if in_stream_order && !allocation.ready {
        return Err(format!(
            "{ptr:#x} is in a stream-ordered allocation ({} bytes at {base:#x}) that its \
             stream has not reached yet: order the use after the cuMemAllocAsync (an \
             event recorded after it, waited on)",
            allocation.size
        ));
    }
    let end = ptr.checked_add(len).ok_or("the range overflows")?;
    if end > base + allocation.size {
        return Err(format!(
            "[{ptr:#x}, {end:#x}) runs past the end of the {}-byte allocation at {base:#x}",
            allocation.size
        ));
    }
    Ok(allocation.kind)
}

/// Check a range claimed to be device memory, for an entry point.
pub(crate) fn check_device(ptr: usize, len: usize, what: &str) -> Result<Kind, CUresult> {
    // At the call, not in stream order: the work runs later, and the worker
    // checks again then.
    check_range_at(ptr, len, false)
        .map_err(|why| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{what}: {why}")))
}

/// `(free, total)` for `cuMemGetInfo`.
pub(crate) fn info() -> (usize, usize) {
    let capacity = capacity();
    (capacity.saturating_sub(memory_in_use()), capacity)
}

/// At a synchronisation, give back the pool's reservation above its release
/// threshold.
pub(crate) fn trim_pool_at_sync() {
    let mut memory = lock(&MEMORY);
    let pool = &mut memory.pool;
    let threshold = usize::try_from(pool.release_threshold).unwrap_or(usize::MAX);
    if pool.reserved > threshold {
        pool.reserved = threshold.max(pool.used);
    }
}

/// `cuMemPoolTrimTo`.
pub(crate) fn trim_pool_to(keep: usize) {
    let mut memory = lock(&MEMORY);
    let pool = &mut memory.pool;
    pool.reserved = pool.reserved.min(keep).max(pool.used);
}

/// Read or change the pool's attributes under the memory lock.
pub(crate) fn with_pool<R>(f: impl FnOnce(&mut PoolStats) -> R) -> R {
    f(&mut lock(&MEMORY).pool)
}
