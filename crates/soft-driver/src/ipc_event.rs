//! Events shared between processes (`CU_EVENT_INTERPROCESS`,
//! `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`).
//!
//! An interprocess event's state lives in one page of a memfd mapped
//! `MAP_SHARED` in every process that holds the event, so a record in one
//! process really orders a wait in another:
//!
//! - a record takes the next number from `issued` when it is enqueued, and
//!   the stream's worker raises `done` to it when it gets there;
//! - a wait (on the host or in a stream) takes `issued` when it is made and
//!   lasts until `done` reaches it: the event's latest record then, as CUDA
//!   defines a wait;
//! - the process of the latest record is noted in the page, so a waiter
//!   whose recorder exits before the record completes fails instead of
//!   waiting for ever; a record whose stream failed fails its waiters too.
//!
//! The handle names the exporter's process, the memfd's descriptor there
//! and a random nonce kept in the page: an importer opens
//! `/proc/<pid>/fd/<fd>` (the kernel lets only the same user do so) and
//! refuses a page whose nonce differs (a stale or forged handle).

use crate::errors::{fail, write_out};
use crate::handles::lock;
use crate::ops::{Action, Op};
use crate::sticky_errors::Fault;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sys::{CUevent, CUipcEventHandle, CUresult};

/// The first bytes of a page and of a handle: the software driver's.
const MAGIC: u64 = u64::from_le_bytes(*b"CSSIPCEV");
const PAGE: usize = 4096;

/// The shared page's layout (every field atomic: other processes write it).
#[repr(C)]
struct Page {
    magic: AtomicU64,
    nonce: [AtomicU64; 2],
    device: AtomicI32,
    /// Non-zero once a record's stream had failed when it got there.
    failed: AtomicU32,
    issued: AtomicU64,
    done: AtomicU64,
    /// The process whose record is the latest.
    recorder: AtomicU32,
}

/// One process's mapping of an event's page.
pub(crate) struct SharedEvent {
    page: *const Page,
    /// Kept open by the exporter so importers can open it by its number;
    /// an importer closes it once mapped.
    fd: Option<OwnedFd>,
    /// The handle `cuIpcGetEventHandle` gives (the exporter's).
    handle: Mutex<Option<CUipcEventHandle>>,
}

// SAFETY: the page is a shared mapping that lives as long as this value, and
// every field of it is an atomic.
unsafe impl Send for SharedEvent {}
// SAFETY: as above; all access is through atomics.
unsafe impl Sync for SharedEvent {}

fn os_error(what: &str) -> CUresult {
    fail(
        CUresult::CUDA_ERROR_OPERATING_SYSTEM,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
}

/// Map `PAGE` bytes of `fd` shared.
fn map(fd: &OwnedFd) -> Result<*const Page, CUresult> {
    // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel
    // picks the address.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(os_error("mapping an interprocess event's page"));
    }
    Ok(ptr as *const Page)
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: writes at most 8 bytes into a local buffer of 8.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr() as *mut c_void, 8, 0) };
    if got != 8 {
        // Unique enough for a nonce where getrandom is missing: the clock.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32);
    }
    u64::from_le_bytes(bytes)
}

/// Whether process `pid` still runs: it exists and is not a zombie (a
/// process that exited but was not reaped yet runs nothing).
fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let sent = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if sent != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // The state follows the command's closing parenthesis.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        // No /proc entry to read: trust the signal's answer.
        Err(_) => true,
    }
}

impl SharedEvent {
    /// A fresh page for an event of `device` (`cuEventCreate` with
    /// `CU_EVENT_INTERPROCESS`).
    pub(crate) fn create(device: i32) -> Result<Self, CUresult> {
        // SAFETY: a NUL-terminated name; the flags are memfd_create's.
        let raw = unsafe {
            libc::memfd_create(c"cuda-streams-soft-ipc-event".as_ptr(), libc::MFD_CLOEXEC)
        };
        if raw < 0 {
            return Err(os_error("memfd_create for an interprocess event"));
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) } != 0 {
            return Err(os_error("sizing an interprocess event's page"));
        }
        let page = map(&fd)?;
        let event = Self {
            page,
            fd: Some(fd),
            handle: Mutex::new(None),
        };
        let p = event.page();
        p.nonce[0].store(random_u64(), Ordering::Relaxed);
        p.nonce[1].store(random_u64(), Ordering::Relaxed);
        p.device.store(device, Ordering::Relaxed);
        p.magic.store(MAGIC, Ordering::Release);
        Ok(event)
    }

    fn page(&self) -> &Page {
        // SAFETY: mapped for as long as `self` lives (unmapped in Drop).
        unsafe { &*self.page }
    }

    /// The device the event was created on.
    pub(crate) fn device(&self) -> i32 {
        self.page().device.load(Ordering::Relaxed)
    }

    /// A record is being enqueued: its number.
    pub(crate) fn issue(&self) -> u64 {
        let page = self.page();
        page.recorder.store(std::process::id(), Ordering::Release);
        page.issued.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The worker got to record `seq`; `failed`: its stream had failed.
    pub(crate) fn complete(&self, seq: u64, failed: bool) {
        let page = self.page();
        if failed {
            page.failed.store(1, Ordering::Release);
        }
        page.done.fetch_max(seq, Ordering::AcqRel);
    }

    /// The number a wait made now waits for (the latest record's).
    pub(crate) fn latest(&self) -> u64 {
        self.page().issued.load(Ordering::Acquire)
    }

    /// Whether record `target` has completed: `Ok(false)` while it runs, an
    /// error when it cannot complete (its stream failed, or its process
    /// exited first).
    pub(crate) fn reached(&self, target: u64) -> Result<bool, String> {
        let page = self.page();
        if page.done.load(Ordering::Acquire) >= target {
            return match page.failed.load(Ordering::Acquire) {
                0 => Ok(true),
                _ => Err("a record of the interprocess event was on a stream that failed".into()),
            };
        }
        let recorder = page.recorder.load(Ordering::Acquire);
        if recorder != std::process::id() && recorder != 0 && !pid_alive(recorder) {
            return Err(format!(
                "process {recorder}, which recorded the interprocess event, exited before the record completed"
            ));
        }
        Ok(false)
    }

    /// Block until record `target` has completed, or fail as [`Self::reached`].
    pub(crate) fn wait(&self, target: u64) -> Result<(), String> {
        // Spin briefly, then back off: the recorder is usually close, but
        // may be another process's stream that runs for a long time.
        let mut rounds = 0u32;
        while !self.reached(target)? {
            rounds += 1;
            if rounds < 64 {
                std::hint::spin_loop();
            } else if rounds < 128 {
                std::thread::yield_now();
            } else {
                let micros = u64::from((rounds - 128).min(50)) * 20;
                std::thread::sleep(Duration::from_micros(micros.max(20)));
            }
        }
        Ok(())
    }

    /// The handle naming this page to another process (`cuIpcGetEventHandle`).
    fn export(&self) -> Result<CUipcEventHandle, CUresult> {
        let fd = self.fd.as_ref().ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_HANDLE,
                "cuIpcGetEventHandle: the event was opened from a handle; export the original",
            )
        })?;
        let mut guard = lock(&self.handle);
        if let Some(handle) = *guard {
            return Ok(handle);
        }
        let page = self.page();
        let mut bytes = [0u8; 64];
        bytes[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        bytes[12..16].copy_from_slice(&fd.as_raw_fd().to_le_bytes());
        bytes[16..24].copy_from_slice(&page.nonce[0].load(Ordering::Relaxed).to_le_bytes());
        bytes[24..32].copy_from_slice(&page.nonce[1].load(Ordering::Relaxed).to_le_bytes());
        let mut handle = CUipcEventHandle::default();
        for (out, byte) in handle.reserved.iter_mut().zip(bytes) {
            *out = byte as std::ffi::c_char;
        }
        *guard = Some(handle);
        Ok(handle)
    }

    /// The page a handle names (`cuIpcOpenEventHandle`).
    fn open(handle: &CUipcEventHandle) -> Result<Self, CUresult> {
        let bytes: Vec<u8> = handle.reserved.iter().map(|&b| b as u8).collect();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let forged = |why: String| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuIpcOpenEventHandle: {why}"),
            )
        };
        if word(0) != MAGIC {
            return Err(forged(
                "the handle is not an interprocess event handle of the software driver".into(),
            ));
        }
        let pid = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or([0; 4]));
        let number = i32::from_le_bytes(bytes[12..16].try_into().unwrap_or([0; 4]));
        let nonce = [word(16), word(24)];
        let path = format!("/proc/{pid}/fd/{number}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|err| {
                forged(format!(
                    "the exporting process {pid} no longer has the event (it exited or destroyed it): \
                     opening {path}: {err}"
                ))
            })?;
        let fd = OwnedFd::from(file);
        let size = fd_size(&fd);
        if size != Some(PAGE as u64) {
            return Err(forged(format!(
                "{path} is not an interprocess event's page ({size:?} bytes): a stale or forged handle"
            )));
        }
        let page = map(&fd)?;
        let event = Self {
            page,
            fd: None,
            handle: Mutex::new(None),
        };
        let p = event.page();
        let found = [
            p.nonce[0].load(Ordering::Relaxed),
            p.nonce[1].load(Ordering::Relaxed),
        ];
        if p.magic.load(Ordering::Acquire) != MAGIC || found != nonce {
            return Err(forged(format!(
                "process {pid}'s descriptor {number} holds another event now: a stale or forged handle"
            )));
        }
        Ok(event)
    }
}

/// The size of the file behind `fd`, when it can be read.
pub(crate) fn fd_size(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: a zeroed `stat` is a valid value for fstat to overwrite.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we hold and a valid out-pointer.
    let code = unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) };
    (code == 0).then_some(stat.st_size as u64)
}

impl Drop for SharedEvent {
    fn drop(&mut self) {
        // SAFETY: mapped in `create`/`open` with this size, unmapped once.
        unsafe { libc::munmap(self.page as *mut c_void, PAGE) };
    }
}

pub(crate) unsafe extern "C" fn cuIpcGetEventHandle(
    pHandle: *mut CUipcEventHandle,
    event: CUevent,
) -> CUresult {
    crate::errors::code((|| {
        let event = crate::event::EVENTS.get(event as usize)?;
        let shared = event.shared().ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_HANDLE,
                "cuIpcGetEventHandle: the event was not created with CU_EVENT_INTERPROCESS",
            )
        })?;
        let handle = shared.export()?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(pHandle, handle) }
    })())
}

pub(crate) unsafe extern "C" fn cuIpcOpenEventHandle(
    phEvent: *mut CUevent,
    handle: CUipcEventHandle,
) -> CUresult {
    crate::errors::code((|| {
        crate::context::require()?;
        if phEvent.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let shared = SharedEvent::open(&handle)?;
        let raw = crate::event::create_shared(shared);
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phEvent, raw) }
    })())
}

/// The worker's part of a record of an interprocess event: the record takes
/// its number now, in enqueue order, and completes when the worker gets to
/// it.
pub(crate) fn record_op(event: &crate::event::Event) -> Op {
    let Some(shared) = event.shared().cloned() else {
        unreachable!("record_op is called for interprocess events only")
    };
    let seq = shared.issue();
    Op::Act(Action::Call(Arc::new(move |_, faulted| {
        shared.complete(seq, faulted);
        None
    })))
}

/// The worker's part of a wait for an interprocess event: the latest record
/// now, waited for when the worker gets there; `None` when it has completed
/// already (nothing to wait for).
pub(crate) fn wait_op(event: &crate::event::Event) -> Option<Op> {
    let shared = event.shared().cloned()?;
    let target = shared.latest();
    if matches!(shared.reached(target), Ok(true)) {
        return None;
    }
    Some(Op::Act(Action::Call(Arc::new(move |_, _| {
        shared.wait(target).err().map(|detail| Fault {
            code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
            detail,
        })
    }))))
}
