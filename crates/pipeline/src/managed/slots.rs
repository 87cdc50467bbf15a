//! Asynchronous mode's buffers, three slots of them, and its work on one
//! slot for the pipeline's rotation: upload the step's input, run the step
//! kernel, download its output.

use super::Upload;
use super::step_kernel::{check_step_args, step_args};
use crate::coordinator::{AsyncCoordinator, OperationId};
use crate::error::Result;
use crate::rotation::{DEPTH, SlotWork};
use crate::stage::GpuPipelineStage;
use driver::{Context, DeviceBuffer, DeviceCopy, PinnedBuffer};
use std::sync::Arc;

/// Each slot's input and output on the device and its output on the host.
pub(super) struct AsyncState<T: DeviceCopy> {
    inputs: Vec<DeviceBuffer<T>>,
    outputs: Vec<DeviceBuffer<T>>,
    pub(super) host: Vec<PinnedBuffer<T>>,
    /// The in-place steps' inputs, one per slot, allocated on the first one.
    host_in: Option<Vec<PinnedBuffer<T>>>,
}

impl<T: DeviceCopy> AsyncState<T> {
    pub(super) fn new(ctx: &Arc<Context>, kernel: &GpuPipelineStage, len: usize) -> Result<Self> {
        let device = || -> driver::Result<Vec<DeviceBuffer<T>>> {
            (0..DEPTH).map(|_| DeviceBuffer::new(ctx, len)).collect()
        };
        let (inputs, mut outputs) = (device()?, device()?);
        check_step_args(kernel, &inputs[0], &mut outputs[0], len)?;
        Ok(Self {
            inputs,
            outputs,
            host: (0..DEPTH)
                .map(|_| PinnedBuffer::new(ctx, len))
                .collect::<driver::Result<_>>()?,
            host_in: None,
        })
    }
}

/// One step's work on the slots: its upload (none while finishing), the
/// step kernel, the download.
pub(super) struct Step<'a, 'u, T: DeviceCopy> {
    pub(super) kernel: &'a GpuPipelineStage,
    pub(super) ctx: &'a Arc<Context>,
    pub(super) state: &'a mut AsyncState<T>,
    pub(super) upload: Option<Upload<'u, T>>,
    pub(super) len: usize,
}

impl<T: DeviceCopy> SlotWork for Step<'_, '_, T> {
    fn upload(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        queued: &mut Vec<OperationId>,
    ) -> Result<()> {
        let AsyncState {
            inputs, host_in, ..
        } = &mut *self.state;
        let id = match self.upload.take() {
            Some(Upload::Copy(input)) => coordinator.queue_upload(input, &mut inputs[slot])?,
            Some(Upload::InPlace { fill }) => {
                let pinned = match host_in {
                    Some(pinned) => pinned,
                    None => host_in.insert(
                        (0..DEPTH)
                            .map(|_| PinnedBuffer::new(self.ctx, self.len))
                            .collect::<driver::Result<_>>()?,
                    ),
                };
                // Waits only for this slot's previous upload (three steps ago).
                fill(pinned[slot].as_mut_slice()?);
                coordinator.queue_upload_pinned(&pinned[slot], &mut inputs[slot], &[])?
            }
            // The rotation uploads only on a step that feeds one.
            None => return Ok(()),
        };
        queued.push(id);
        Ok(())
    }

    fn download(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        queued: &mut Vec<OperationId>,
    ) -> Result<()> {
        let state = &mut *self.state;
        queued.push(coordinator.queue_download(&state.outputs[slot], &mut state.host[slot])?);
        Ok(())
    }

    fn compute(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        after: &[OperationId],
    ) -> Result<()> {
        let state = &mut *self.state;
        let kernel = self.kernel;
        let args = step_args(
            kernel,
            &state.inputs[slot],
            &mut state.outputs[slot],
            self.len,
        );
        coordinator.queue_compute(&kernel.kernel, kernel.config, &args, after)?;
        Ok(())
    }
}
