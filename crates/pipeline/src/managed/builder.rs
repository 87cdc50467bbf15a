//! The managed context's settings by name: mode, element type, step kernel.

use super::ManagedGpuContext;
use crate::error::Result;
use crate::stage::GpuPipelineStage;
use driver::{Context, DeviceCopy};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// Settings for a [`ManagedGpuContext`], from [`ManagedGpuContext::builder`]:
/// the mode, the element type and the step kernel, by name.
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{GpuPipelineStage, ManagedGpuContext};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let device = Context::new(0)?;
/// // fill_u32(n, value, out): a step kernel over u32 that ignores its input.
/// let fill = Module::load(&device, &kernels::ELEMENTWISE)?.function("fill_u32")?;
/// let step = GpuPipelineStage::builder("fill", fill, LaunchConfig::for_num_elems(8))
///     .len()
///     .u32(7)
///     .writes(ManagedGpuContext::OUTPUT)
///     .build();
/// let mut ctx = ManagedGpuContext::builder(&device).element::<u32>().step(step).build()?;
/// assert!(!ctx.has_stream_management()); // synchronous unless asked
/// let result = ctx.triple_buffered_step(&[0u32; 8])?.expect("synchronous: at once");
/// assert_eq!(result.output, [7; 8]);
/// # Ok(())
/// # }
/// ```
#[must_use = "a context builder does nothing until `build`"]
pub struct ManagedGpuContextBuilder<T: DeviceCopy = f32> {
    device: Arc<Context>,
    asynchronous: bool,
    kernel: Option<GpuPipelineStage>,
    element: PhantomData<fn() -> T>,
}

impl<T: DeviceCopy> fmt::Debug for ManagedGpuContextBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedGpuContextBuilder")
            .field("asynchronous", &self.asynchronous)
            .field("element", &std::any::type_name::<T>())
            .field("step", &self.kernel.as_ref().map(|k| &k.name))
            .finish()
    }
}

impl<T: DeviceCopy> ManagedGpuContextBuilder<T> {
    /// Triple-buffered, with a stream pool (the seed's `enable_async = true`).
    pub fn asynchronous(mut self) -> Self {
        self.asynchronous = true;
        self
    }

    /// One stream, each step waited for (the default).
    pub fn synchronous(mut self) -> Self {
        self.asynchronous = false;
        self
    }

    /// Buffers of `U` instead (the step kernel's buffer parameters are `U*`).
    pub fn element<U: DeviceCopy>(self) -> ManagedGpuContextBuilder<U> {
        ManagedGpuContextBuilder {
            device: self.device,
            asynchronous: self.asynchronous,
            kernel: self.kernel,
            element: PhantomData,
        }
    }

    /// The step kernel: it reads [`ManagedGpuContext::INPUT`] and writes
    /// [`ManagedGpuContext::OUTPUT`] (checked by `build`, as in
    /// [`ManagedGpuContext::set_step`]).
    pub fn step(mut self, kernel: GpuPipelineStage) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// Create the context (and in asynchronous mode its streams).
    pub fn build(self) -> Result<ManagedGpuContext<T>> {
        let mut ctx = ManagedGpuContext::with_mode(&self.device, self.asynchronous)?;
        if let Some(kernel) = self.kernel {
            ctx.set_step(kernel)?;
        }
        Ok(ctx)
    }
}

impl ManagedGpuContext<f32> {
    /// Settings for a context on `device`: synchronous and `f32` unless
    /// changed ([`ManagedGpuContextBuilder`]).
    pub fn builder(device: &Arc<Context>) -> ManagedGpuContextBuilder<f32> {
        ManagedGpuContextBuilder {
            device: Arc::clone(device),
            asynchronous: false,
            kernel: None,
            element: PhantomData,
        }
    }
}
