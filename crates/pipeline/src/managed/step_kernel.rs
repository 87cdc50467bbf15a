//! The step kernel's contract: it reads `INPUT`, writes `OUTPUT` once, and
//! its arguments fit its signature over the step's buffers.

use super::ManagedGpuContext;
use crate::error::{Error, Result};
use crate::stage::{GpuPipelineStage, StageArg};
use driver::{DeviceBuffer, DeviceCopy, KernelArg};

/// A step kernel passes `OUTPUT` once, writing it, and `INPUT` only to read.
pub(super) fn check_step_kernel(kernel: &GpuPipelineStage) -> Result<()> {
    let input = ManagedGpuContext::INPUT;
    let output = ManagedGpuContext::OUTPUT;
    let refuse = |reason: String| {
        Err(Error::InvalidConfig(format!(
            "step kernel {:?} {reason}: a step kernel reads buffer {} (its input) and writes buffer {} (its output)",
            kernel.name, input.0, output.0
        )))
    };
    for arg in &kernel.args {
        if let StageArg::Buffer(b) = *arg
            && b != input
            && b != output
        {
            return refuse(format!("passes buffer {}", b.0));
        }
    }
    if kernel.output_buffers.contains(&input) {
        return refuse(format!("writes buffer {}", input.0));
    }
    if kernel.input_buffers.contains(&output) {
        return refuse(format!("reads buffer {}", output.0));
    }
    let passes = kernel.passes(output);
    if passes != 1 || !kernel.output_buffers.contains(&output) {
        return refuse(format!(
            "passes buffer {} {passes} time(s) (once, written, expected)",
            output.0
        ));
    }
    Ok(())
}

/// The step kernel's arguments over one input and one output buffer.
pub(super) fn step_args<'a, T: DeviceCopy>(
    kernel: &GpuPipelineStage,
    input: &'a DeviceBuffer<T>,
    output: &'a mut DeviceBuffer<T>,
    len: usize,
) -> Vec<KernelArg<'a>> {
    // `check_step_kernel` made sure OUTPUT is passed exactly once, and no
    // buffer but INPUT besides.
    let mut output = Some(output);
    kernel.kernel_args(len as u64, |b| {
        match output.take_if(|_| b == ManagedGpuContext::OUTPUT) {
            Some(output) => KernelArg::from(output),
            None => KernelArg::from(input),
        }
    })
}

/// The step kernel's arguments against its signature, once the buffers
/// exist and before any upload is queued.
pub(super) fn check_step_args<T: DeviceCopy>(
    kernel: &GpuPipelineStage,
    input: &DeviceBuffer<T>,
    output: &mut DeviceBuffer<T>,
    len: usize,
) -> Result<()> {
    let args = step_args(kernel, input, output, len);
    kernel
        .kernel
        .check_args(&args)
        .map_err(|source| Error::InvalidConfig(format!("step kernel {:?}: {source}", kernel.name)))
}
