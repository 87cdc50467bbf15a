//! Three device buffers rotating through upload, processing and download,
//! each slot's stage held in one atomic byte.

use crate::error::{Error, Result};
use driver::{Context, DeviceBuffer, DeviceCopy};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The stage a triple-buffer slot is in.
///
/// A slot goes `Free -> Uploading -> Processing -> Downloading -> Free` and
/// nowhere else. The state names the stage the slot was last handed to:
/// `Uploading` covers "a guard is uploading" and "uploaded, waiting to be
/// processed"; [`GpuTripleBuffer::get_states`] says which.
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{GpuTripleBuffer, SlotState};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let buffer = GpuTripleBuffer::<u32>::new(&ctx, 16)?;
/// let upload = buffer.get_upload_buffer().expect("slot 0 is free");
/// assert_eq!(upload.stage(), SlotState::Uploading);
/// upload.finish();
/// // Uploaded and waiting for processing: still the stage it was last handed to.
/// let states: Vec<SlotState> = buffer.get_states().iter().map(|s| s.state).collect();
/// assert_eq!(states, [SlotState::Uploading, SlotState::Free, SlotState::Free]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SlotState {
    /// Nothing in it; ready for the next upload.
    Free = 0,
    /// Handed to (or done with) the upload stage.
    Uploading = 1,
    /// Handed to (or done with) the processing stage.
    Processing = 2,
    /// Handed to (or done with) the download stage.
    Downloading = 3,
}

impl SlotState {
    /// The only state this one may move to.
    ///
    /// ```
    /// use cuda_streams_pipeline::SlotState::*;
    /// assert_eq!(Free.next(), Uploading);
    /// assert_eq!(Downloading.next(), Free);
    /// assert!(Uploading.can_become(Processing));
    /// assert!(!Free.can_become(Downloading));
    /// ```
    pub const fn next(self) -> Self {
        match self {
            Self::Free => Self::Uploading,
            Self::Uploading => Self::Processing,
            Self::Processing => Self::Downloading,
            Self::Downloading => Self::Free,
        }
    }

    /// Whether `self -> to` is a legal transition.
    pub const fn can_become(self, to: Self) -> bool {
        self.next() as u8 == to as u8
    }

    fn from_bits(bits: u8) -> Self {
        match bits & STATE_MASK {
            0 => Self::Free,
            1 => Self::Uploading,
            2 => Self::Processing,
            _ => Self::Downloading,
        }
    }
}

/// Set in a slot's byte while a guard owns the slot's current stage.
const HELD: u8 = 0x80;
const STATE_MASK: u8 = 0x03;

/// One slot's state as seen by [`GpuTripleBuffer::get_states`].
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{GpuTripleBuffer, SlotState, SlotStatus};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let buffer = GpuTripleBuffer::<u32>::new(&ctx, 16)?;
/// let upload = buffer.get_upload_buffer().expect("slot 0 is free");
/// let uploading = SlotStatus { state: SlotState::Uploading, held: true };
/// assert_eq!(buffer.get_states()[0], uploading); // the guard is enqueueing the upload
/// drop(upload);
/// assert_eq!(buffer.get_states()[0], SlotStatus { held: false, ..uploading });
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotStatus {
    /// The stage.
    pub state: SlotState,
    /// Whether a guard currently holds it (the stage is being enqueued).
    pub held: bool,
}

struct Slot<T: DeviceCopy> {
    state: AtomicU8,
    /// Uncontended: the state byte decides who may lock it. The Mutex lets a
    /// guard hand out `&mut DeviceBuffer` without unsafe code.
    buffer: Mutex<DeviceBuffer<T>>,
}

/// Three device buffers of `size` elements rotating through
/// upload, processing and download.
///
/// Each stage takes the oldest slot that has finished the stage before:
/// [`get_upload_buffer`](Self::get_upload_buffer) a `Free` slot,
/// [`get_process_buffer`](Self::get_process_buffer) an uploaded one,
/// [`get_download_buffer`](Self::get_download_buffer) a processed one; each
/// returns `None` when that slot is not ready (or another thread holds it).
/// The guard it returns owns the slot's buffer; dropping it (or
/// [`StageGuard::finish`]) hands the slot on to the next stage.
/// [`advance`](Self::advance) returns the oldest downloaded slot to `Free`.
/// Every state change is one `compare_exchange` on the slot's byte, so the
/// buffer is safe to share between threads (`&self` everywhere) and a stage
/// can never skip ahead: the transitions that are not legal cannot be
/// expressed, and `advance` on a slot that is not downloaded is an error.
///
/// The states say what has been *enqueued*. GPU-side ordering between the
/// stages' streams is the job of the [`crate::AsyncCoordinator`] (events).
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{GpuTripleBuffer, SlotState};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let buffer = GpuTripleBuffer::<f32>::new(&ctx, 1024)?;
/// assert!(buffer.get_process_buffer().is_none()); // nothing uploaded yet
/// let upload = buffer.get_upload_buffer().expect("slot 0 is free");
/// assert_eq!((upload.slot(), upload.len()), (0, 1024));
/// drop(upload); // slot 0: uploaded, ready for processing
/// let process = buffer.get_process_buffer().expect("slot 0 was uploaded");
/// process.finish();
/// buffer.get_download_buffer().expect("slot 0 was processed").finish();
/// buffer.advance()?; // slot 0 is free again
/// assert_eq!(buffer.get_states()[0].state, SlotState::Free);
/// assert!(buffer.advance().is_err()); // nothing downloaded to retire
/// # Ok(())
/// # }
/// ```
pub struct GpuTripleBuffer<T: DeviceCopy> {
    slots: [Slot<T>; 3],
    /// Monotonic stage cursors: the next upload, process, download and
    /// retirement take slot `cursor % 3`. Only the thread that owns that
    /// slot's transition moves a cursor.
    cursors: [AtomicU64; 4],
    size: usize,
    ctx: Arc<Context>,
}

/// Which cursor a stage moves.
const UPLOAD: usize = 0;
const PROCESS: usize = 1;
const DOWNLOAD: usize = 2;
const RETIRE: usize = 3;

impl<T: DeviceCopy> GpuTripleBuffer<T> {
    /// Three device buffers of `size` elements each (`cuMemAlloc`, usable on
    /// every stream).
    pub fn new(ctx: &Arc<Context>, size: usize) -> Result<Self> {
        let slot = || -> Result<Slot<T>> {
            Ok(Slot {
                state: AtomicU8::new(SlotState::Free as u8),
                buffer: Mutex::new(DeviceBuffer::new(ctx, size)?),
            })
        };
        Ok(Self {
            slots: [slot()?, slot()?, slot()?],
            cursors: Default::default(),
            size,
            ctx: Arc::clone(ctx),
        })
    }

    /// The oldest `Free` slot, for uploading into (`Free -> Uploading`).
    pub fn get_upload_buffer(&self) -> Option<StageGuard<'_, T>> {
        self.claim(UPLOAD, SlotState::Free)
    }

    /// The oldest uploaded slot, for processing (`Uploading -> Processing`).
    pub fn get_process_buffer(&self) -> Option<StageGuard<'_, T>> {
        self.claim(PROCESS, SlotState::Uploading)
    }

    /// The oldest processed slot, for downloading (`Processing -> Downloading`).
    pub fn get_download_buffer(&self) -> Option<StageGuard<'_, T>> {
        self.claim(DOWNLOAD, SlotState::Processing)
    }

    /// Return the oldest downloaded slot to `Free` (`Downloading -> Free`)
    /// and rotate. An error, changing nothing, when that slot is not
    /// downloaded or a download guard still holds it.
    pub fn advance(&self) -> Result<()> {
        let cursor = self.cursors[RETIRE].load(Ordering::Acquire);
        let index = (cursor % 3) as usize;
        let slot = &self.slots[index];
        let expected = SlotState::Downloading as u8;
        match slot.state.compare_exchange(
            expected,
            SlotState::Free as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.cursors[RETIRE].store(cursor + 1, Ordering::Release);
                Ok(())
            }
            Err(actual) => Err(Error::IllegalTransition {
                slot: index,
                from: SlotState::from_bits(actual),
                to: SlotState::Free,
                held: actual & HELD != 0,
            }),
        }
    }

    /// Elements per buffer.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Each slot's state, in slot order (a snapshot: other threads may move on).
    pub fn get_states(&self) -> [SlotStatus; 3] {
        std::array::from_fn(|i| {
            let bits = self.slots[i].state.load(Ordering::Acquire);
            SlotStatus {
                state: SlotState::from_bits(bits),
                held: bits & HELD != 0,
            }
        })
    }

    /// The context the buffers belong to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Take the slot at stage `stage`'s cursor if it is in `from` and unheld.
    fn claim(&self, stage: usize, from: SlotState) -> Option<StageGuard<'_, T>> {
        let cursor = self.cursors[stage].load(Ordering::Acquire);
        let index = (cursor % 3) as usize;
        let slot = &self.slots[index];
        let to = from.next();
        slot.state
            .compare_exchange(
                from as u8,
                to as u8 | HELD,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .ok()?;
        // Our read of the cursor may be stale: another thread may have taken
        // this slot at an earlier turn and moved the cursor past it since.
        // Only the holder of the cursor's slot moves the cursor, so if it
        // still reads `cursor` now, this slot really is the stage's next one.
        if self.cursors[stage]
            .compare_exchange(cursor, cursor + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Undo: nobody else can touch a held slot, so this cannot fail.
            let _ = slot.state.compare_exchange(
                to as u8 | HELD,
                from as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return None;
        }
        let buffer = slot.buffer.lock().unwrap_or_else(|p| p.into_inner());
        Some(StageGuard {
            slot,
            index,
            stage: to,
            buffer: Some(buffer),
        })
    }
}

impl<T: DeviceCopy> fmt::Debug for GpuTripleBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuTripleBuffer")
            .field("size", &self.size)
            .field("states", &self.get_states())
            .finish()
    }
}

/// Exclusive use of one slot's buffer for one stage. Derefs to the
/// [`DeviceBuffer`]; dropping it (or [`finish`](Self::finish)) releases the
/// slot to the next stage.
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, Stream};
/// use cuda_streams_pipeline::GpuTripleBuffer;
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let buffer = GpuTripleBuffer::<u32>::new(&ctx, 4)?;
/// {
///     let mut slot = buffer.get_upload_buffer().expect("slot 0 is free");
///     stream.copy_from_host(&mut *slot, &[1, 2, 3, 4])?; // a `&mut DeviceBuffer<u32>`
/// } // dropped: slot 0 moves on to processing
/// let slot = buffer.get_process_buffer().expect("slot 0 was uploaded");
/// assert_eq!(slot.slot(), 0);
/// let mut host = [0u32; 4];
/// stream.copy_to_host(&mut host, &*slot)?;
/// assert_eq!(host, [1, 2, 3, 4]);
/// # Ok(())
/// # }
/// ```
pub struct StageGuard<'a, T: DeviceCopy> {
    slot: &'a Slot<T>,
    index: usize,
    stage: SlotState,
    buffer: Option<MutexGuard<'a, DeviceBuffer<T>>>,
}

impl<T: DeviceCopy> StageGuard<'_, T> {
    /// The slot index (0..3), e.g. to pick companion buffers of the same slot.
    pub fn slot(&self) -> usize {
        self.index
    }

    /// The stage this guard owns (`Uploading`, `Processing` or `Downloading`).
    pub fn stage(&self) -> SlotState {
        self.stage
    }

    /// Release the slot to the next stage (the same as dropping the guard).
    pub fn finish(self) {}
}

impl<T: DeviceCopy> Deref for StageGuard<'_, T> {
    type Target = DeviceBuffer<T>;

    fn deref(&self) -> &DeviceBuffer<T> {
        self.buffer.as_ref().expect("present until drop")
    }
}

impl<T: DeviceCopy> DerefMut for StageGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        self.buffer.as_mut().expect("present until drop")
    }
}

impl<T: DeviceCopy> Drop for StageGuard<'_, T> {
    fn drop(&mut self) {
        // Unlock before publishing the slot, so the next stage's lock is free.
        self.buffer = None;
        let held = self.stage as u8 | HELD;
        // Only this guard can clear HELD, so this always succeeds.
        let _ = self.slot.state.compare_exchange(
            held,
            self.stage as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

impl<T: DeviceCopy> fmt::Debug for StageGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageGuard")
            .field("slot", &self.index)
            .field("stage", &self.stage)
            .finish()
    }
}
