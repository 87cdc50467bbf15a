//! Three device buffers rotating through upload, processing and download,
//! each slot's stage held in one atomic byte (the protocol: [`states`]).

mod states;

use crate::error::{Error, Result};
use crate::slot_state::SlotState;
use driver::{Context, DeviceBuffer, DeviceCopy};
use states::{DOWNLOAD, HELD, PROCESS, SlotStates, UPLOAD, state_of};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// Who holds which slot, and which slot each stage takes next.
    states: SlotStates,
    /// Uncontended: the slot's state decides who may lock it. The Mutex lets
    /// a guard hand out `&mut DeviceBuffer` without unsafe code.
    buffers: [Mutex<DeviceBuffer<T>>; 3],
    size: usize,
    ctx: Arc<Context>,
}

impl<T: DeviceCopy> GpuTripleBuffer<T> {
    /// Three device buffers of `size` elements each (`cuMemAlloc`, usable on
    /// every stream).
    pub fn new(ctx: &Arc<Context>, size: usize) -> Result<Self> {
        let buffer =
            || -> Result<Mutex<DeviceBuffer<T>>> { Ok(Mutex::new(DeviceBuffer::new(ctx, size)?)) };
        Ok(Self {
            states: SlotStates::new(),
            buffers: [buffer()?, buffer()?, buffer()?],
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
        self.states
            .retire()
            .map_err(|(slot, actual)| Error::IllegalTransition {
                slot,
                from: state_of(actual),
                to: SlotState::Free,
                held: actual & HELD != 0,
            })
    }

    /// Elements per buffer.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Each slot's state, in slot order (a snapshot: other threads may move on).
    pub fn get_states(&self) -> [SlotStatus; 3] {
        std::array::from_fn(|i| {
            let bits = self.states.bits(i);
            SlotStatus {
                state: state_of(bits),
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
        let index = self.states.claim(stage, from)?;
        let buffer = self.buffers[index]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Some(StageGuard {
            states: &self.states,
            index,
            stage: from.next(),
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
#[must_use = "dropping a stage guard moves its slot on to the next stage"]
pub struct StageGuard<'a, T: DeviceCopy> {
    states: &'a SlotStates,
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
        self.states.release(self.index, self.stage);
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
