//! Device memory is host memory: the allocation registry, each device's
//! capacity, and each device's default pool's accounting.
//!
//! Every allocation is zeroed host memory aligned to 256 bytes and is recorded
//! by base address with the device it belongs to, so that a pointer claimed to
//! be device memory can be checked against the allocation it falls in, and a
//! kernel or memset on another device without peer access faults. Addresses
//! are unique across devices, as with CUDA's unified addressing.
//!
//! Capacity counts device allocations (`cuMemAlloc`, managed) plus the pool's
//! *reserved* bytes: memory freed to the pool stays reserved (reusable by the
//! pool without counting again) until a synchronisation trims it to the
//! release threshold, as CUDA's pools do. The bytes themselves are returned to
//! the host allocator at once; only the accounting is kept. Pools of host
//! memory (`host_pool`, `host_pool_registry`) keep their own and charge no
//! device.

use crate::errors::fail;
use crate::handles::lock;
use crate::pool_stats::PoolStats;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use sys::CUresult;
use sys::env::{EnvError, Setting};

/// Alignment of every allocation, as `cuMemAlloc` guarantees.
pub const ALIGNMENT: usize = 256;

/// The default capacity of each device: 16 GiB.
pub const DEFAULT_CAPACITY: usize = 16 << 30;

/// Environment variable that sets the capacity in MiB at first use.
pub const CAPACITY_ENV: &str = "CUDA_STREAMS_SOFT_CAPACITY_MB";

/// `CUDA_STREAMS_SOFT_CAPACITY_MB` as a setting (see [`check_env`](crate::check_env)).
pub const CAPACITY_SETTING: Setting = Setting {
    name: CAPACITY_ENV,
    aliases: &[],
    default: "16384 (16 GiB)",
    about: "each software device's memory in MiB",
};

/// The capacity in bytes from the environment, parsed once.
pub(crate) fn capacity_from_env() -> &'static Result<usize, EnvError> {
    static FROM_ENV: OnceLock<Result<usize, EnvError>> = OnceLock::new();
    FROM_ENV.get_or_init(|| match CAPACITY_SETTING.from_env()? {
        // At most what fits in bytes, and below the "unset" marker.
        Some(found) => Ok(found.parse_int(1..=(UNSET - 1) >> 20)? << 20),
        None => Ok(DEFAULT_CAPACITY),
    })
}

const UNSET: usize = usize::MAX;
static CAPACITY: AtomicUsize = AtomicUsize::new(UNSET);

/// Device 0's memory capacity in bytes ([`device_capacity`]`(0)`).
pub fn capacity() -> usize {
    device_capacity(0)
}

/// The default capacity of every device: [`DEFAULT_CAPACITY`] unless set by
/// [`set_capacity`] or, at first use, by `CUDA_STREAMS_SOFT_CAPACITY_MB`. A
/// value that is not a whole number of MiB, 1 or more, makes `cuInit` fail,
/// naming it; the capacity is then [`DEFAULT_CAPACITY`].
fn default_capacity() -> usize {
    match CAPACITY.load(Ordering::Acquire) {
        UNSET => {
            let from_env = capacity_from_env().clone().unwrap_or(DEFAULT_CAPACITY);
            match CAPACITY.compare_exchange(UNSET, from_env, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => from_env,
                Err(set) => set,
            }
        }
        set => set,
    }
}

/// Device `ordinal`'s memory capacity in bytes: what `cuDeviceTotalMem` and
/// `cuMemGetInfo` report and what its allocations are counted against. The
/// default capacity (see [`set_capacity`]) unless [`set_device_capacity`]
/// set one for this device; 0 for an ordinal that is not a device.
pub fn device_capacity(ordinal: i32) -> usize {
    if !(0..crate::device::device_count()).contains(&ordinal) {
        return 0;
    }
    lock(&MEMORY)
        .devices
        .get(ordinal as usize)
        .and_then(|d| d.capacity)
        .unwrap_or_else(default_capacity)
}

/// Set the capacity of every device in bytes (forgetting capacities set per
/// device). Live allocations stay; if they already exceed the new capacity,
/// every new device allocation fails until enough are freed.
///
/// ```
/// let before = cuda_streams_soft_driver::capacity();
/// cuda_streams_soft_driver::set_capacity(1 << 30);
/// assert_eq!(cuda_streams_soft_driver::capacity(), 1 << 30);
/// cuda_streams_soft_driver::set_capacity(before);
/// ```
pub fn set_capacity(bytes: usize) {
    let mut memory = lock(&MEMORY);
    CAPACITY.store(bytes.min(UNSET - 1), Ordering::Release);
    for device in &mut memory.devices {
        device.capacity = None;
    }
}

/// Set one device's capacity in bytes; the others keep theirs. Ignored for
/// an ordinal that is not a device.
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// let before = soft::device_capacity(1);
/// soft::set_device_capacity(1, 1 << 30);
/// assert_eq!(soft::device_capacity(1), 1 << 30);
/// soft::set_device_capacity(1, before);
/// ```
pub fn set_device_capacity(ordinal: i32, bytes: usize) {
    if (0..crate::device::device_count()).contains(&ordinal) {
        lock(&MEMORY).device(ordinal).capacity = Some(bytes.min(UNSET - 1));
    }
}

/// Bytes counted against device 0's capacity now
/// ([`device_memory_in_use`]`(0)`).
pub fn memory_in_use() -> usize {
    device_memory_in_use(0)
}

/// Bytes counted against device `ordinal`'s capacity now: its live device and
/// managed allocations plus its default pool's reserved memory.
///
/// ```
/// assert_eq!(cuda_streams_soft_driver::device_memory_in_use(99), 0);
/// ```
pub fn device_memory_in_use(ordinal: i32) -> usize {
    if !(0..crate::device::device_count()).contains(&ordinal) {
        return 0;
    }
    lock(&MEMORY).in_use(ordinal)
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
    /// `cuMemAllocFromPoolAsync` from a pool of host memory (`host_pool`):
    /// stream-ordered like `Pool`, usable by every device like `Pinned`,
    /// counted by its pool, not against a device's capacity.
    HostPool,
    /// Physical memory mapped at a reserved range (`cuMemMap`, see `vmm`):
    /// counted when created, freed by `cuMemUnmap` and `cuMemRelease`.
    Mapped,
    /// A graph's memory-node allocation (`cuMemAllocAsync` while capturing):
    /// an address the graph keeps for its life, usable only while a launch
    /// runs between its allocation and free nodes. Counted through the
    /// device's graph memory (`graph_memory`), not here.
    Graph,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Pool => "stream-ordered",
            Kind::Managed => "managed",
            Kind::Pinned => "pinned host",
            Kind::HostPool => "host pool",
            Kind::Mapped => "mapped",
            Kind::Graph => "graph",
        }
    }
}

struct Allocation {
    size: usize,
    rounded: usize,
    /// What the host allocator returned (the base is rounded up from it).
    raw: usize,
    kind: Kind,
    /// The device it belongs to (for pinned memory: the device whose context
    /// allocated it; every device may use it).
    device: i32,
    free_pending: bool,
    /// Stream-ordered memory becomes usable when its stream reaches the
    /// allocation; everything else at once.
    ready: bool,
}

/// One device's accounting.
struct DeviceMemory {
    device_bytes: usize,
    pool: PoolStats,
    /// What graph launches keep for their memory nodes.
    graph: crate::graph_memory::GraphStats,
    /// Set by `set_device_capacity`; `None`: the default capacity.
    capacity: Option<usize>,
}

impl Default for DeviceMemory {
    fn default() -> Self {
        Self {
            device_bytes: 0,
            pool: PoolStats {
                reuse: [1, 1, 1],
                ..PoolStats::default()
            },
            graph: crate::graph_memory::GraphStats::default(),
            capacity: None,
        }
    }
}

impl DeviceMemory {
    fn in_use(&self) -> usize {
        self.device_bytes + self.pool.reserved + self.graph.reserved
    }

    /// Bytes this allocation adds to `in_use`.
    fn growth(&self, kind: Kind, rounded: usize) -> usize {
        match kind {
            Kind::Device | Kind::Managed => rounded,
            Kind::Pool => (self.pool.used + rounded).saturating_sub(self.pool.reserved),
            Kind::Pinned | Kind::HostPool | Kind::Mapped | Kind::Graph => 0,
        }
    }
}

struct Memory {
    allocations: BTreeMap<usize, Allocation>,
    /// By ordinal, grown on first use.
    devices: Vec<DeviceMemory>,
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory {
    allocations: BTreeMap::new(),
    devices: Vec::new(),
});

impl Memory {
    /// Device `ordinal`'s accounting (a checked ordinal).
    fn device(&mut self, ordinal: i32) -> &mut DeviceMemory {
        let index = ordinal as usize;
        if self.devices.len() <= index {
            self.devices.resize_with(index + 1, DeviceMemory::default);
        }
        &mut self.devices[index]
    }

    fn in_use(&mut self, ordinal: i32) -> usize {
        self.device(ordinal).in_use()
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

/// Device allocations still to fail with an injected out-of-memory
/// (`faults::fail_next_allocations`).
static FAIL_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Make the next `count` device allocations fail (replacing any count still
/// pending; 0 cancels).
pub(crate) fn set_allocation_failures(count: usize) {
    FAIL_ALLOCATIONS.store(count, Ordering::Release);
}

/// How many injected allocation failures are still pending.
pub(crate) fn allocation_failures_pending() -> usize {
    FAIL_ALLOCATIONS.load(Ordering::Acquire)
}

/// Consume one injected allocation failure, if any is pending.
fn take_allocation_failure() -> bool {
    FAIL_ALLOCATIONS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

/// Allocate `size` bytes of `kind` on device `device` (a checked ordinal),
/// counted against its capacity.
pub(crate) fn allocate(size: usize, kind: Kind, device: i32) -> Result<usize, CUresult> {
    if size == 0 {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "allocation of 0 bytes",
        ));
    }
    // A faulted context allocates nothing more, as on a GPU.
    crate::sticky_errors::check_context(device)?;
    if kind != Kind::Pinned && take_allocation_failure() {
        return Err(fail(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("injected out-of-memory for an allocation of {size} bytes"),
        ));
    }
    let capacity = device_capacity(device);
    let oom = |in_use: usize| {
        fail(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!(
                "allocation of {size} bytes ({}) exceeds software device {device}'s capacity: \
                 {in_use} of {capacity} bytes in use",
                kind.name(),
            ),
        )
    };
    let rounded = size
        .checked_next_multiple_of(ALIGNMENT)
        .ok_or_else(|| oom(0))?;
    let layout = raw_layout(rounded).ok_or_else(|| oom(0))?;
    let mut memory = lock(&MEMORY);
    let dev = memory.device(device);
    if dev.in_use() + dev.growth(kind, rounded) > capacity {
        // Give the pool's unused reservation back before failing, as CUDA
        // does when an allocation would otherwise run out.
        dev.pool.reserved = dev.pool.used;
        if dev.in_use() + dev.growth(kind, rounded) > capacity {
            return Err(oom(dev.in_use()));
        }
    }
    // SAFETY: the layout has a non-zero size (size > 0, rounded up).
    let raw = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    if raw == 0 {
        return Err(oom(dev.in_use()));
    }
    let ptr = raw.next_multiple_of(ALIGNMENT);
    match kind {
        Kind::Device | Kind::Managed => dev.device_bytes += rounded,
        Kind::Pool => {
            let pool = &mut dev.pool;
            pool.used += rounded;
            pool.reserved = pool.reserved.max(pool.used);
            pool.used_high = pool.used_high.max(pool.used);
            pool.reserved_high = pool.reserved_high.max(pool.reserved);
        }
        // Mapped memory is entered by `register_mapped`, never allocated
        // here; a host pool counts its own.
        Kind::Pinned | Kind::HostPool | Kind::Mapped | Kind::Graph => {}
    }
    memory.allocations.insert(
        ptr,
        Allocation {
            size,
            rounded,
            raw,
            kind,
            device,
            free_pending: false,
            ready: !matches!(kind, Kind::Pool | Kind::HostPool | Kind::Graph),
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
    let dev = memory.device(allocation.device);
    match allocation.kind {
        Kind::Device | Kind::Managed => dev.device_bytes -= allocation.rounded,
        Kind::Pool => dev.pool.used -= allocation.rounded,
        // Never in `kinds` (`cuMemUnmap` forgets a mapping instead), or
        // counted by a host pool, told below.
        Kind::Pinned | Kind::HostPool | Kind::Mapped | Kind::Graph => {}
    }
    drop(memory);
    if allocation.kind == Kind::HostPool {
        // Before the bytes go back: until then no newer allocation has
        // this address.
        crate::host_pool_registry::released(base);
    }
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
        Some(allocation) if allocation.kind == Kind::Mapped => Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{base:#x} is mapped memory; unmap it with cuMemUnmap"),
        )),
        Some(allocation) if allocation.kind == Kind::Graph => Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!(
                "{base:#x} is graph memory: it is freed by its graph's free node, captured \
                 with the graph"
            ),
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

/// Enter `size` bytes mapped at `base` (by `cuMemMap`) for device `device`:
/// device memory from now on, checked like any other; `physical` is added
/// to the device's count (the exporter's creation; 0 for an import).
pub(crate) fn register_mapped(base: usize, size: usize, device: i32, physical: usize) {
    let mut memory = lock(&MEMORY);
    memory.device(device).device_bytes += physical;
    memory.allocations.insert(
        base,
        Allocation {
            size,
            rounded: physical,
            raw: 0,
            kind: Kind::Mapped,
            device,
            free_pending: false,
            ready: true,
        },
    );
}

/// Forget the mapping at `base` (`cuMemUnmap`); `false` when there is none.
pub(crate) fn unregister_mapped(base: usize) -> bool {
    let mut memory = lock(&MEMORY);
    match memory.allocations.get(&base) {
        Some(allocation) if allocation.kind == Kind::Mapped => {}
        _ => return false,
    }
    let Some(allocation) = memory.allocations.remove(&base) else {
        return false;
    };
    let dev = memory.device(allocation.device);
    dev.device_bytes = dev.device_bytes.saturating_sub(allocation.rounded);
    true
}

/// Undo [`begin_free_async`] when the free could not be enqueued.
pub(crate) fn cancel_free_async(base: usize) {
    if let Some(allocation) = lock(&MEMORY).allocations.get_mut(&base) {
        allocation.free_pending = false;
    }
}

/// The worker reached a `cuMemFreeAsync`.
pub(crate) fn release_async(base: usize) {
    let _ = free(
        base,
        &[Kind::Device, Kind::Pool, Kind::HostPool, Kind::Managed],
    );
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
    check_range_at(ptr, len, true).map(|(kind, _)| kind)
}

/// [`check_range`], and the memory is one that work on device `from` may
/// touch directly (kernels, memsets): pinned or managed memory, memory of
/// `from`, or of a device `from` has peer access to.
pub(crate) fn check_access(ptr: usize, len: usize, from: i32) -> Result<Kind, String> {
    let (kind, owner) = check_range_at(ptr, len, true)?;
    accessible(ptr, kind, owner, from)
}

fn accessible(ptr: usize, kind: Kind, owner: i32, from: i32) -> Result<Kind, String> {
    let host = matches!(kind, Kind::Pinned | Kind::HostPool | Kind::Managed);
    if host || crate::context::can_access(from, owner) {
        Ok(kind)
    } else {
        Err(format!(
            "{ptr:#x} is {} memory of device {owner}, and device {from} has no peer access \
             to device {owner} (cuCtxEnablePeerAccess)",
            kind.name()
        ))
    }
}

/// The device `[ptr, ptr + len)` belongs to, checked as [`check_device`] does.
pub(crate) fn owner(ptr: usize, len: usize, what: &str) -> Result<i32, CUresult> {
    check_range_at(ptr, len, false)
        .map(|(_, owner)| owner)
        .map_err(|why| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{what}: {why}")))
}

fn check_range_at(ptr: usize, len: usize, in_stream_order: bool) -> Result<(Kind, i32), String> {
    let memory = lock(&MEMORY);
    let Some((base, allocation)) = memory.containing(ptr) else {
        return Err(format!("{ptr:#x} is not inside any live allocation"));
    };
    if in_stream_order && !allocation.ready && allocation.kind == Kind::Graph {
        return Err(format!(
            "{ptr:#x} is in graph memory ({} bytes at {base:#x}), which is mapped only while \
             a launch of its graph runs between the allocation's node and its free node",
            allocation.size
        ));
    }
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
    Ok((allocation.kind, allocation.device))
}

/// Check a range claimed to be device memory, for an entry point.
pub(crate) fn check_device(ptr: usize, len: usize, what: &str) -> Result<Kind, CUresult> {
    // At the call, not in stream order: the work runs later, and the worker
    // checks again then.
    check_range_at(ptr, len, false)
        .map(|(kind, _)| kind)
        .map_err(|why| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{what}: {why}")))
}

/// [`check_device`], and work on device `from` may touch it directly (see
/// [`check_access`]).
pub(crate) fn check_device_access(
    ptr: usize,
    len: usize,
    from: i32,
    what: &str,
) -> Result<Kind, CUresult> {
    check_range_at(ptr, len, false)
        .and_then(|(kind, owner)| accessible(ptr, kind, owner, from))
        .map_err(|why| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{what}: {why}")))
}

/// `(free, total)` of device `ordinal` for `cuMemGetInfo`.
pub(crate) fn info(ordinal: i32) -> (usize, usize) {
    let capacity = device_capacity(ordinal);
    (
        capacity.saturating_sub(device_memory_in_use(ordinal)),
        capacity,
    )
}

/// At a synchronisation, give back each pool's reservation above its release
/// threshold (the pools of host memory's too).
pub(crate) fn trim_pool_at_sync() {
    let mut memory = lock(&MEMORY);
    for device in &mut memory.devices {
        let pool = &mut device.pool;
        let threshold = usize::try_from(pool.release_threshold).unwrap_or(usize::MAX);
        if pool.reserved > threshold {
            pool.reserved = threshold.max(pool.used);
        }
    }
    drop(memory);
    crate::host_pool_registry::trim_at_sync();
}

/// `cuMemPoolTrimTo` on device `ordinal`'s default pool.
pub(crate) fn trim_pool_to(ordinal: i32, keep: usize) {
    let mut memory = lock(&MEMORY);
    let pool = &mut memory.device(ordinal).pool;
    pool.reserved = pool.reserved.min(keep).max(pool.used);
}

/// Read or change device `ordinal`'s default pool's attributes under the
/// memory lock.
pub(crate) fn with_pool<R>(ordinal: i32, f: impl FnOnce(&mut PoolStats) -> R) -> R {
    f(&mut lock(&MEMORY).device(ordinal).pool)
}

/// A graph's memory node reached at a launch (`mapped`) or its free node
/// (`!mapped`): the memory at `base` is usable, or no longer. Fails, saying
/// why, when the allocation is not graph memory or is already so.
pub(crate) fn map_graph_memory(base: usize, mapped: bool) -> Result<(), String> {
    let mut memory = lock(&MEMORY);
    match memory.allocations.get_mut(&base) {
        Some(allocation) if allocation.kind == Kind::Graph => {
            if allocation.ready == mapped {
                return Err(if mapped {
                    format!(
                        "graph allocation {base:#x} is reached again before its free node: a \
                         graph whose allocation is not freed inside it cannot launch again \
                         until the memory is freed"
                    )
                } else {
                    format!("graph allocation {base:#x} is freed twice")
                });
            }
            allocation.ready = mapped;
            Ok(())
        }
        _ => Err(format!("{base:#x} is not a live graph allocation")),
    }
}

/// Read or change device `ordinal`'s graph memory under the memory lock,
/// with the bytes the device has in use besides it and its capacity.
pub(crate) fn with_graph_memory<R>(
    ordinal: i32,
    f: impl FnOnce(&mut crate::graph_memory::GraphStats, usize, usize) -> R,
) -> R {
    let capacity = device_capacity(ordinal);
    let mut memory = lock(&MEMORY);
    let device = memory.device(ordinal);
    let others = device.device_bytes + device.pool.reserved;
    f(&mut device.graph, others, capacity)
}
