//! Synchronous mode: one stream, each step uploaded, computed, downloaded
//! in stream order.

use super::Upload;
use super::step_kernel::{check_step_args, step_args};
use crate::error::Result;
use crate::stage::GpuPipelineStage;
use driver::{Context, DeviceBuffer, DeviceCopy, PinnedBuffer, Stream};
use std::sync::Arc;

/// The one stream's buffers.
pub(super) struct SyncState<T: DeviceCopy> {
    pub(super) input: DeviceBuffer<T>,
    pub(super) output: DeviceBuffer<T>,
    pub(super) host: PinnedBuffer<T>,
    /// The in-place steps' input, allocated on the first one.
    pub(super) host_in: Option<PinnedBuffer<T>>,
}

impl<T: DeviceCopy> SyncState<T> {
    /// The step's buffers, once the first step gives its length (the step
    /// kernel's arguments checked against them).
    pub(super) fn new(ctx: &Arc<Context>, kernel: &GpuPipelineStage, len: usize) -> Result<Self> {
        let mut output = DeviceBuffer::new(ctx, len)?;
        let input = DeviceBuffer::new(ctx, len)?;
        check_step_args(kernel, &input, &mut output, len)?;
        Ok(Self {
            input,
            output,
            host: PinnedBuffer::new(ctx, len)?,
            host_in: None,
        })
    }
}

/// One step in stream order: upload, the step kernel, download.
pub(super) fn sync_step<T: DeviceCopy>(
    stream: &Arc<Stream>,
    kernel: &GpuPipelineStage,
    ctx: &Arc<Context>,
    state: &mut SyncState<T>,
    upload: Upload<'_, T>,
    len: usize,
) -> Result<()> {
    match upload {
        Upload::Copy(input) => stream.copy_from_host(&mut state.input, input)?,
        Upload::InPlace { fill } => {
            let host_in = match &mut state.host_in {
                Some(host_in) => host_in,
                None => state.host_in.insert(PinnedBuffer::new(ctx, len)?),
            };
            fill(host_in.as_mut_slice()?);
            stream.copy_from_host_async(&mut state.input, host_in)?;
        }
    }
    let args = step_args(kernel, &state.input, &mut state.output, len);
    stream.launch(&kernel.kernel, kernel.config, &args)?;
    drop(args);
    stream.copy_to_host_async(&mut state.host, &state.output)?;
    Ok(())
}
