//! The host memory the workers fill: one anonymous file in memory
//! (`memfd_create`), mapped `MAP_SHARED` by the GPU process and by every
//! worker, cut into equal slots of one batch each.
//!
//! A memfd rather than a named `shm_open` object: it has no name another
//! process could open, and it disappears with the last descriptor and
//! mapping, so a loader that dies leaves nothing behind in `/dev/shm`.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots start on page boundaries, so that no two slots share a page (the
/// copy engine reads whole pages, and a worker's writes never touch a page
/// another slot's upload reads).
const SLOT_ALIGN: usize = 4096;

/// How every region's memfd name starts (`/proc/<pid>/fd` shows
/// `/memfd:<name> (deleted)`); workers map only such a file.
pub(crate) const REGION_NAME_PREFIX: &str = "cuda-streams-loader-";

/// `slots` slots of `slot_len` `f32`s in shared memory.
pub(crate) struct SharedSlots {
    fd: OwnedFd,
    base: NonNull<f32>,
    slots: usize,
    slot_len: usize,
    /// Elements from one slot's start to the next's.
    stride: usize,
    bytes: usize,
}

// SAFETY: the mapping is plain memory owned by this value until it is
// dropped; who may touch which slot is the loader's protocol (one holder per
// slot at a time), not a property of the thread holding this value.
unsafe impl Send for SharedSlots {}
// SAFETY: as for Send: `&SharedSlots` hands out only raw pointers, and every
// access through them is justified where it is made.
unsafe impl Sync for SharedSlots {}

impl SharedSlots {
    /// A new zeroed region (a memfd sized and mapped here), in the GPU process.
    pub(crate) fn create(slots: usize, slot_len: usize) -> io::Result<Self> {
        let (stride, bytes) = layout(slots, slot_len)?;
        // One name per region, so `/proc/<pid>/fd` tells regions apart.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{REGION_NAME_PREFIX}{}-{}\0",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // SAFETY: a NUL-terminated name that outlives the call; the flags
        // make a new descriptor, closed on exec (workers get it explicitly).
        let raw = unsafe { libc::memfd_create(name.as_ptr().cast(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is the descriptor just created, owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        file.set_len(bytes as u64)?;
        Self::map(file.into(), slots, slot_len, stride, bytes)
    }

    /// In a worker: map the region whose descriptor the GPU process passed
    /// down. Refuses a file shorter than the layout needs.
    pub(crate) fn attach(fd: OwnedFd, slots: usize, slot_len: usize) -> io::Result<Self> {
        let (stride, bytes) = layout(slots, slot_len)?;
        let file = File::from(fd);
        let len = file.metadata()?.len();
        if len < bytes as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the shared region holds {len} bytes, the layout needs {bytes}"),
            ));
        }
        Self::map(file.into(), slots, slot_len, stride, bytes)
    }

    fn map(
        fd: OwnedFd,
        slots: usize,
        slot_len: usize,
        stride: usize,
        bytes: usize,
    ) -> io::Result<Self> {
        // MAP_POPULATE: without it every process faults the region in page
        // by page on its first write to each slot (16,384 faults for a
        // 64 MiB batch), and a worker fills each slot for the first time
        // well into a run: on a GPU that doubled a batch's fill time. The
        // pages are the memfd's, so populating one mapping costs page-table
        // entries only, once, when the worker starts.
        // SAFETY: a new shared mapping of the first `bytes` bytes of `fd`
        // (at least that long: sized by `create`, checked by `attach`) at an
        // address the kernel picks; it overlaps no memory Rust knows of.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<f32>()).ok_or_else(|| io::Error::other("mmap at 0"))?;
        Ok(Self {
            fd,
            base,
            slots,
            slot_len,
            stride,
            bytes,
        })
    }

    /// The descriptor a worker maps (closed on exec unless the spawn keeps it).
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    pub(crate) fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// The first element of `slot` (page-aligned, `slot_len` elements).
    /// Panics past the last slot: callers index with slots they handed out.
    pub(crate) fn slot_ptr(&self, slot: usize) -> *mut f32 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        // SAFETY: `slot * stride` elements lie inside the mapping (checked
        // above; `layout` checked that the whole product fits).
        unsafe { self.base.as_ptr().add(slot * self.stride) }
    }

    /// The whole mapping, as elements: what the GPU process registers.
    pub(crate) fn whole(&self) -> (NonNull<f32>, usize) {
        (self.base, self.bytes / std::mem::size_of::<f32>())
    }
}

impl Drop for SharedSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `map`, of `bytes` bytes; its users
        // (registration, regions, fill slices) are gone before this value.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
        if rc != 0 {
            tracing::warn!(
                "unmapping the loader's shared region: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Each slot's stride in elements and the region's size in bytes, or an
/// error naming the values when the size overflows or is zero.
fn layout(slots: usize, slot_len: usize) -> io::Result<(usize, usize)> {
    let elem = std::mem::size_of::<f32>();
    let bytes = slot_len
        .checked_mul(elem)
        .and_then(|b| b.checked_next_multiple_of(SLOT_ALIGN))
        .and_then(|stride| Some((stride, stride.checked_mul(slots)?)))
        .filter(|&(_, total)| total > 0);
    match bytes {
        Some((stride, total)) => Ok((stride / elem, total)),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{slots} slot(s) of {slot_len} f32 element(s) do not make a region"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_start_on_pages_and_a_second_mapping_sees_the_first_ones_writes() {
        let region = SharedSlots::create(3, 1000).unwrap();
        assert_eq!(
            region.slot_ptr(1) as usize - region.slot_ptr(0) as usize,
            4096
        );
        let dup = region.fd.try_clone().unwrap();
        let other = SharedSlots::attach(dup, 3, 1000).unwrap();
        // SAFETY: slot 2 of a fresh region, touched by nothing else here.
        unsafe { *region.slot_ptr(2).add(999) = 7.5 };
        // SAFETY: the same shared page through the second mapping.
        assert_eq!(unsafe { *other.slot_ptr(2).add(999) }, 7.5);
    }

    /// Minor page faults taken by this thread so far.
    fn thread_minor_faults() -> i64 {
        // SAFETY: `usage` is a plain C struct, valid zeroed, written by the call.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer for the calling thread's usage.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(rc, 0, "getrusage: {}", io::Error::last_os_error());
        usage.ru_minflt
    }

    #[test]
    fn a_worker_mapping_writes_a_slot_without_faulting_page_by_page() {
        let slot_len = 1 << 20; // 4 MiB: 1,024 pages
        let region = SharedSlots::create(2, slot_len).unwrap();
        let worker = SharedSlots::attach(region.fd.try_clone().unwrap(), 2, slot_len).unwrap();
        let before = thread_minor_faults();
        // SAFETY: slot 1 of a fresh region, touched by nothing else here.
        let slot = unsafe { std::slice::from_raw_parts_mut(worker.slot_ptr(1), slot_len) };
        slot.fill(3.0);
        let faults = thread_minor_faults() - before;
        assert!(
            faults < 64,
            "writing 1,024 pages of a mapped region took {faults} minor faults: \
             the mapping was not populated"
        );
        // SAFETY: the same page through the creator's mapping.
        assert_eq!(unsafe { *region.slot_ptr(1).add(slot_len - 1) }, 3.0);
    }

    #[test]
    fn a_short_file_and_an_empty_layout_are_refused() {
        let region = SharedSlots::create(1, 10).unwrap();
        let err = SharedSlots::attach(region.fd.try_clone().unwrap(), 2, 10)
            .err()
            .unwrap();
        assert!(err.to_string().contains("holds 4096 bytes"), "{err}");
        let err = SharedSlots::create(0, 10).err().unwrap();
        assert!(err.to_string().contains("0 slot(s)"), "{err}");
    }
}
