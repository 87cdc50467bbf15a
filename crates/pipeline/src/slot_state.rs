//! The stages a triple-buffer slot moves through, in a file of their own:
//! the errors name them, and the triple buffer (whose errors they are)
//! sits above both.

/// The stage a triple-buffer slot is in.
///
/// A slot goes `Free -> Uploading -> Processing -> Downloading -> Free` and
/// nowhere else. The state names the stage the slot was last handed to:
/// `Uploading` covers "a guard is uploading" and "uploaded, waiting to be
/// processed"; [`GpuTripleBuffer::get_states`](crate::GpuTripleBuffer::get_states) says which.
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
}
