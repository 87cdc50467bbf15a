//! The slots and what the reactor keeps beside them: one table under one
//! lock, shared by the handle that registers waits and the thread that
//! watches them.

use super::config::ReactorConfig;
use super::predict::{WaitPredictor, Window};
use super::stats::ReactorStats;
use std::sync::atomic::AtomicU32;
use std::sync::{Mutex, MutexGuard};
use std::task::Waker;
use std::thread::{JoinHandle, Thread};
use std::time::Instant;
use sys::{CUcontext, CUdeviceptr, CUevent, CUresult, CUstream, Driver};

/// Slots per chunk of mapped pinned memory (16 KiB).
pub(super) const SLOTS_PER_CHUNK: usize = 4096;
/// Streams the reactor creates to watch events of streams it does not know.
pub(super) const MAX_WATCH_STREAMS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    /// A future waits.
    Pending,
    /// Its future was dropped; the write may still land.
    Cancelled,
    /// Finished with this code; the future has not collected it yet.
    Done(CUresult),
}

pub(super) struct Slot {
    pub(super) seq: u32,
    pub(super) state: SlotState,
    pub(super) waker: Option<Waker>,
    /// Recorded after the flag write: its query carries the stream's error.
    pub(super) event: CUevent,
    /// The watch stream this wait uses, if any.
    pub(super) watch: Option<usize>,
    /// When the flag write was enqueued.
    pub(super) registered: Instant,
    /// The stream or event waited on, for [`WaitPredictor`].
    pub(super) key: usize,
    /// When to watch it closely, if its key has a history.
    pub(super) window: Option<Window>,
}

pub(super) struct Chunk {
    pub(super) host: *mut u32,
    pub(super) device: CUdeviceptr,
}

pub(super) struct WatchStream {
    pub(super) raw: CUstream,
    pub(super) pending: usize,
}

pub(super) struct State {
    pub(super) chunks: Vec<Chunk>,
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<u32>,
    /// Slots the thread watches: pending and cancelled.
    pub(super) watched: Vec<u32>,
    pub(super) spare_events: Vec<CUevent>,
    pub(super) watch_streams: Vec<WatchStream>,
    pub(super) config: ReactorConfig,
    pub(super) predictor: WaitPredictor,
    /// Set by new waits, so the thread spins again.
    pub(super) activity: bool,
    pub(super) shutdown: bool,
    pub(super) thread: Option<(Thread, JoinHandle<()>)>,
    pub(super) stats: ReactorStats,
}

pub(super) struct Shared {
    pub(super) driver: &'static Driver,
    pub(super) ctx: CUcontext,
    pub(super) state: Mutex<State>,
}

// SAFETY: the raw pointers (slot memory, events, streams, the context) are
// only handed to the thread-safe driver or read atomically, always under the
// Mutex or through atomics; the slot memory lives until `shutdown`.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn flag(state: &State, slot: u32) -> &AtomicU32 {
        let (chunk, offset) = (
            slot as usize / SLOTS_PER_CHUNK,
            slot as usize % SLOTS_PER_CHUNK,
        );
        // SAFETY: the chunk holds SLOTS_PER_CHUNK aligned u32s of mapped pinned
        // memory that stay allocated while `state` exists; the GPU (or the
        // software driver) only writes them with 4-byte stores, and we only
        // read them atomically.
        unsafe { AtomicU32::from_ptr(state.chunks[chunk].host.add(offset)) }
    }

    pub(super) fn kick(state: &State) {
        if let Some((thread, _)) = &state.thread {
            thread.unpark();
        }
    }
}
