//! What a managed context's step gives back: a downloaded copy, or the
//! pinned buffer the GPU downloaded into, read in place.

use crate::error::Result;
use driver::{DeviceCopy, PinnedBuffer};
use std::fmt;

/// One step's result, from [`ManagedGpuContext::triple_buffered_step`](crate::ManagedGpuContext::triple_buffered_step) and
/// [`ManagedGpuContext::finish_steps`](crate::ManagedGpuContext::finish_steps): the step kernel's output buffer,
/// downloaded.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StepResult<T> {
    /// The step it belongs to (0 for the first call).
    pub step: u64,
    /// The step kernel's output ([`ManagedGpuContext::OUTPUT`](crate::ManagedGpuContext::OUTPUT)), downloaded.
    pub output: Vec<T>,
}

/// One step's result read in place, from
/// [`ManagedGpuContext::step_in_place`](crate::ManagedGpuContext::step_in_place): the pinned buffer the GPU
/// downloaded into, borrowed until the next step.
pub struct StepOutput<'a, T: DeviceCopy = f32> {
    pub(super) step: u64,
    pub(super) host: &'a PinnedBuffer<T>,
}

impl<T: DeviceCopy> StepOutput<'_, T> {
    /// The step it belongs to (0 for the first call).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The kernel's output, waiting for its download if it is still
    /// running (the work queued after it keeps the GPU busy meanwhile).
    pub fn output(&self) -> Result<&[T]> {
        Ok(self.host.as_slice()?)
    }
}

impl<T: DeviceCopy> fmt::Debug for StepOutput<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepOutput")
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}
