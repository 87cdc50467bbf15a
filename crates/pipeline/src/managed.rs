//! A device context with optional stream management: one stream, or a
//! triple-buffered upload / kernel / download pipeline, running the user's
//! step kernel over buffers of the user's element type.

use crate::coordinator::{AsyncCoordinator, OperationId};
use crate::error::{Error, Result};
use crate::ids::BufferId;
use crate::manager::PipelineStageManager;
use crate::stage::{GpuPipelineStage, StageArg};
use crate::triple_buffer::GpuTripleBuffer;
use driver::{Context, DeviceBuffer, DeviceCopy, KernelArg, PinnedBuffer, Stream};
use pool::{StreamPool, StreamPurpose};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// Streams in the managed context's pool: one per purpose and spares.
const POOL_SIZE: usize = 8;
/// Batches in flight in asynchronous mode.
pub const PIPELINE_DEPTH: u64 = 3;

/// One step's result, from [`ManagedGpuContext::triple_buffered_step`] and
/// [`ManagedGpuContext::finish_steps`]: the step kernel's output buffer,
/// downloaded.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StepResult<T> {
    /// The step it belongs to (0 for the first call).
    pub step: u64,
    /// The step kernel's output ([`ManagedGpuContext::OUTPUT`]), downloaded.
    pub output: Vec<T>,
}

/// One step's result read in place, from
/// [`ManagedGpuContext::step_in_place`]: the pinned buffer the GPU
/// downloaded into, borrowed until the next step.
pub struct StepOutput<'a, T: DeviceCopy = f32> {
    step: u64,
    host: &'a PinnedBuffer<T>,
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

/// What a step uploads: a copy of the caller's slice, or a pinned slot the
/// caller fills in place.
enum Upload<'a, T> {
    Copy(&'a [T]),
    InPlace { fill: &'a mut dyn FnMut(&mut [T]) },
}

struct SyncState<T: DeviceCopy> {
    input: DeviceBuffer<T>,
    output: DeviceBuffer<T>,
    host: PinnedBuffer<T>,
    /// The in-place steps' input, allocated on the first one.
    host_in: Option<PinnedBuffer<T>>,
}

struct AsyncState<T: DeviceCopy> {
    slots: GpuTripleBuffer<T>,
    outputs: Vec<DeviceBuffer<T>>,
    host: Vec<PinnedBuffer<T>>,
    /// The in-place steps' inputs, one per slot, allocated on the first one.
    host_in: Option<Vec<PinnedBuffer<T>>>,
    uploads: [Option<OperationId>; 3],
    downloads: [Option<OperationId>; 3],
    /// The step number each slot's batch came from.
    step_of: [u64; 3],
}

// One per managed context, built once and never moved on a hot path: the
// size difference between the modes costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Mode<T: DeviceCopy> {
    Sync {
        stream: Arc<Stream>,
        state: Option<SyncState<T>>,
    },
    Async {
        pool: Box<StreamPool>,
        coordinator: AsyncCoordinator,
        state: Option<Box<AsyncState<T>>>,
    },
}

/// A device context with stream management switched on or off, running the
/// caller's **step kernel** over buffers of the caller's element type `T`
/// (`f32` unless chosen otherwise).
///
/// A step uploads its input into buffer [`INPUT`](Self::INPUT), runs the
/// step kernel, and downloads buffer [`OUTPUT`](Self::OUTPUT). The step
/// kernel is a [`GpuPipelineStage`] that reads `INPUT` and writes `OUTPUT`
/// (both of the step's length), given with
/// [`ManagedGpuContextBuilder::step`] or [`set_step`](Self::set_step).
///
/// - **Synchronous** (the default; the seed's `enable_async = false`): one
///   stream; each [`triple_buffered_step`](Self::triple_buffered_step)
///   uploads, computes, downloads and waits, and returns that step's result.
/// - **Asynchronous** ([`ManagedGpuContextBuilder::asynchronous`]; the
///   seed's `enable_async = true`): a [`StreamPool`] whose `ConfigUpload`,
///   `KernelExecution` and `TelemetryDownload` streams (the seed's names for
///   the upload, compute and download roles) drive an [`AsyncCoordinator`],
///   and a [`GpuTripleBuffer`]: step *k* uploads input *k*, runs the kernel on
///   input *k − 1* and downloads the result of input *k − 2*, all three at
///   once. **Results lag by two steps** (the pipeline depth, 3, minus one):
///   steps 0 and 1 return `None`, step *k* returns the result of step
///   *k − 2*, and [`finish_steps`](Self::finish_steps) returns the last two.
///
/// Both modes compute the same values; only the timing differs. Here the
/// step kernel is `compute(n, iterations, x, y)`, reading the input as `x`
/// and writing the output as `y`:
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{GpuPipelineStage, ManagedGpuContext};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let device = Context::new(0)?;
/// // compute(n, iterations, x, y): 1 step of v = v/2 + x from v = x, so y = 1.5 x.
/// let compute = Module::load(&device, &kernels::COMPUTE)?.function("compute")?;
/// let step = GpuPipelineStage::builder("compute", compute, LaunchConfig::for_num_elems(64))
///     .len()
///     .u32(1)
///     .reads(ManagedGpuContext::INPUT)
///     .writes(ManagedGpuContext::OUTPUT)
///     .build();
/// let mut ctx = ManagedGpuContext::builder(&device).asynchronous().step(step).build()?;
/// let mut results = Vec::new();
/// for step in 0..4 {
///     // None for the first two steps: the pipeline is filling.
///     results.extend(ctx.triple_buffered_step(&vec![step as f32; 64])?);
/// }
/// results.extend(ctx.finish_steps()?);
/// let steps: Vec<u64> = results.iter().map(|r| r.step).collect();
/// assert_eq!(steps, [0, 1, 2, 3]);
/// assert_eq!(results[3].output, vec![4.5; 64]); // 1.5 * 3
/// # Ok(())
/// # }
/// ```
///
/// The seed's constructor, [`new`](Self::new)`(&device, enable_async)`,
/// makes the same context for `f32` without a step kernel: the streams, the
/// coordinator, triple buffers and stage managers are there at once, and
/// [`set_step`](Self::set_step) gives the kernel before the first step.
pub struct ManagedGpuContext<T: DeviceCopy = f32> {
    device: Arc<Context>,
    mode: Mode<T>,
    kernel: Option<GpuPipelineStage>,
    len: Option<usize>,
    /// Steps started, and steps whose result was returned.
    step: u64,
    returned: u64,
}

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
    /// The buffer a step uploads its input into (buffer 0 of the step
    /// kernel, whatever the element type).
    pub const INPUT: BufferId = BufferId(0);
    /// The buffer a step downloads (buffer 1 of the step kernel).
    pub const OUTPUT: BufferId = BufferId(1);

    /// The seed's constructor: a managed context for `f32` buffers on
    /// `device`, asynchronous (triple-buffered, with a stream pool) when
    /// `enable_async`, without a step kernel yet ([`set_step`](Self::set_step)).
    /// [`builder`](Self::builder) names the same choices.
    pub fn new(device: &Arc<Context>, enable_async: bool) -> Result<Self> {
        Self::with_mode(device, enable_async)
    }

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

impl<T: DeviceCopy> ManagedGpuContext<T> {
    fn with_mode(device: &Arc<Context>, enable_async: bool) -> Result<Self> {
        let mode = if enable_async {
            let pool = StreamPool::new(device, POOL_SIZE)?;
            let coordinator = purpose_coordinator(&pool)?;
            Mode::Async {
                pool: Box::new(pool),
                coordinator,
                state: None,
            }
        } else {
            Mode::Sync {
                stream: Stream::new(device)?,
                state: None,
            }
        };
        Ok(Self {
            device: Arc::clone(device),
            mode,
            kernel: None,
            len: None,
            step: 0,
            returned: 0,
        })
    }

    /// Set the step kernel, before the first step. It must pass
    /// [`OUTPUT`](Self::OUTPUT) once, as a buffer it writes, and may pass
    /// [`INPUT`](Self::INPUT), as a buffer it reads; no other buffer.
    /// Its arguments are checked against the kernel's signature at the
    /// first step, when the buffers exist.
    ///
    /// ```
    /// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
    /// use cuda_streams_pipeline::{GpuPipelineStage, ManagedGpuContext};
    /// # fn main() -> cuda_streams_pipeline::Result<()> {
    /// let device = Context::new(0)?;
    /// let compute = Module::load(&device, &kernels::COMPUTE)?.function("compute")?;
    /// let mut ctx = ManagedGpuContext::new(&device, false)?; // the seed's form
    /// assert!(ctx.triple_buffered_step(&[1.0; 4]).is_err()); // no step kernel yet
    /// // Writing the input is refused: the step's input belongs to the upload.
    /// let cfg = LaunchConfig::for_num_elems(4);
    /// let wrong = GpuPipelineStage::builder("wrong", compute.clone(), cfg)
    ///     .len().u32(1).reads(ManagedGpuContext::OUTPUT).writes(ManagedGpuContext::INPUT).build();
    /// let err = ctx.set_step(wrong).unwrap_err();
    /// assert!(err.to_string().contains("writes buffer 0"), "{err}");
    /// ctx.set_step(GpuPipelineStage::compute("compute", compute, cfg, 1, 0, 1))?;
    /// let result = ctx.triple_buffered_step(&[2.0; 4])?.expect("synchronous");
    /// assert_eq!(result.output, [3.0; 4]); // v = x = 2, then v/2 + x
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_step(&mut self, kernel: GpuPipelineStage) -> Result<()> {
        if self.step > 0 {
            return Err(Error::Mode(
                "the step kernel is set before the first step: steps already ran",
            ));
        }
        check_step_kernel(&kernel)?;
        self.kernel = Some(kernel);
        Ok(())
    }

    /// The underlying context.
    pub fn device(&self) -> &Arc<Context> {
        &self.device
    }

    /// Whether streams are managed (asynchronous mode).
    pub fn has_stream_management(&self) -> bool {
        matches!(self.mode, Mode::Async { .. })
    }

    /// The pool's stream for `purpose` (asynchronous mode; `None` otherwise).
    pub fn get_stream(&self, purpose: StreamPurpose) -> Option<Arc<Stream>> {
        match &self.mode {
            Mode::Async { pool, .. } => Some(pool.get_stream_for_purpose(purpose)),
            Mode::Sync { .. } => None,
        }
    }

    /// The single stream of synchronous mode (`None` in asynchronous mode).
    pub fn sync_stream(&self) -> Option<&Arc<Stream>> {
        match &self.mode {
            Mode::Sync { stream, .. } => Some(stream),
            Mode::Async { .. } => None,
        }
    }

    /// The stream pool (asynchronous mode).
    pub fn stream_pool(&self) -> Option<&StreamPool> {
        match &self.mode {
            Mode::Async { pool, .. } => Some(pool),
            Mode::Sync { .. } => None,
        }
    }

    /// The coordinator (asynchronous mode).
    pub fn async_coordinator(&self) -> Option<&AsyncCoordinator> {
        match &self.mode {
            Mode::Async { coordinator, .. } => Some(coordinator),
            Mode::Sync { .. } => None,
        }
    }

    /// The coordinator, mutably (asynchronous mode).
    pub fn async_coordinator_mut(&mut self) -> Option<&mut AsyncCoordinator> {
        match &mut self.mode {
            Mode::Async { coordinator, .. } => Some(coordinator),
            Mode::Sync { .. } => None,
        }
    }

    /// A new triple buffer of `size` elements on this device.
    pub fn create_triple_buffer<U: DeviceCopy>(&self, size: usize) -> Result<GpuTripleBuffer<U>> {
        GpuTripleBuffer::new(&self.device, size)
    }

    /// A stage manager for buffers of `elements` values of this context's
    /// element type, on its upload, compute and download streams
    /// (asynchronous mode only).
    pub fn create_pipeline_manager(&self, elements: usize) -> Result<PipelineStageManager<T>> {
        self.create_typed_pipeline_manager(elements)
    }

    /// [`create_pipeline_manager`](Self::create_pipeline_manager) for buffers
    /// of `elements` values of `U` ([`PipelineStageManager::new_typed`]).
    pub fn create_typed_pipeline_manager<U: DeviceCopy>(
        &self,
        elements: usize,
    ) -> Result<PipelineStageManager<U>> {
        let Mode::Async { pool, .. } = &self.mode else {
            return Err(Error::Mode(
                "a pipeline manager needs stream management: create the context with enable_async = true",
            ));
        };
        PipelineStageManager::new_typed(purpose_coordinator(pool)?, elements)
    }

    /// Run one step: upload `input`, run the step kernel, download its
    /// output. Synchronous mode returns this step's result; asynchronous
    /// mode returns step *k − 2*'s (`None` for the first two steps).
    pub fn triple_buffered_step(&mut self, input: &[T]) -> Result<Option<StepResult<T>>> {
        let done = self.step(input.len(), Upload::Copy(input))?;
        done.map(|out| {
            Ok(StepResult {
                step: out.step,
                output: out.output()?.to_vec(),
            })
        })
        .transpose()
    }

    /// [`triple_buffered_step`](Self::triple_buffered_step) without copies
    /// on the host: `fill` writes this step's `elements` inputs straight into
    /// the pinned buffer the GPU uploads from, and the result is read in
    /// place from the pinned buffer the GPU downloaded into. The host never
    /// copies a step's data, and it waits for the GPU only when it reads a
    /// result (with the next steps' work already queued behind it). The
    /// pinned buffer keeps what was last written into it (three steps
    /// before in asynchronous mode, one in synchronous mode): `fill` may
    /// rewrite only what changes.
    ///
    /// ```
    /// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
    /// use cuda_streams_pipeline::{GpuPipelineStage, ManagedGpuContext};
    /// # fn main() -> cuda_streams_pipeline::Result<()> {
    /// let device = Context::new(0)?;
    /// let compute = Module::load(&device, &kernels::COMPUTE)?.function("compute")?;
    /// let cfg = LaunchConfig::for_num_elems(1024);
    /// let mut ctx = ManagedGpuContext::builder(&device)
    ///     .asynchronous()
    ///     .step(GpuPipelineStage::compute("compute", compute, cfg, 1, 0, 1))
    ///     .build()?;
    /// let mut seen = Vec::new();
    /// for step in 0..4 {
    ///     let done = ctx.step_in_place(1024, |input| input.fill(step as f32))?;
    ///     if let Some(done) = done {
    ///         seen.push((done.step(), done.output()?[0])); // two steps late
    ///     }
    /// }
    /// ctx.finish_steps_in_place(|done| {
    ///     seen.push((done.step(), done.output()?[0]));
    ///     Ok(())
    /// })?;
    /// // One step of v = v/2 + x from v = x: 1.5 x.
    /// assert_eq!(seen, [(0, 0.0), (1, 1.5), (2, 3.0), (3, 4.5)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn step_in_place(
        &mut self,
        elements: usize,
        fill: impl FnOnce(&mut [T]),
    ) -> Result<Option<StepOutput<'_, T>>> {
        let mut fill = Some(fill);
        let mut fill_once = |input: &mut [T]| {
            if let Some(fill) = fill.take() {
                fill(input);
            }
        };
        self.step(
            elements,
            Upload::InPlace {
                fill: &mut fill_once,
            },
        )
    }

    fn step(&mut self, len: usize, upload: Upload<'_, T>) -> Result<Option<StepOutput<'_, T>>> {
        let kernel = self.kernel.as_ref().ok_or(Error::Mode(
            "no step kernel: give one with ManagedGpuContext::builder(..).step(..) or set_step",
        ))?;
        let expected = *self.len.get_or_insert(len);
        if len != expected || len == 0 {
            return Err(Error::LengthMismatch {
                operation: "triple_buffered_step",
                device: expected,
                host: len,
            });
        }
        let step = self.step;
        let done = match &mut self.mode {
            Mode::Sync { stream, state } => {
                let state = match state {
                    Some(state) => state,
                    None => {
                        let mut output = DeviceBuffer::new(&self.device, len)?;
                        let input = DeviceBuffer::new(&self.device, len)?;
                        check_step_args(kernel, &input, &mut output, len)?;
                        state.insert(SyncState {
                            input,
                            output,
                            host: PinnedBuffer::new(&self.device, len)?,
                            host_in: None,
                        })
                    }
                };
                sync_step(stream, kernel, &self.device, state, upload, len)?;
                Some(StepOutput {
                    step,
                    host: &state.host,
                })
            }
            Mode::Async {
                coordinator, state, ..
            } => {
                let state = match state {
                    Some(state) => state,
                    None => state.insert(Box::new(AsyncState::new(&self.device, kernel, len)?)),
                };
                let slot = async_step(
                    coordinator,
                    kernel,
                    &self.device,
                    state,
                    Some(upload),
                    step,
                    len,
                )?;
                slot.map(|index| StepOutput {
                    step: state.step_of[index],
                    host: &state.host[index],
                })
            }
        };
        self.step += 1;
        if done.is_some() {
            self.returned += 1;
        }
        Ok(done)
    }

    /// Finish the steps still in flight (asynchronous mode: the last two)
    /// and return their results, oldest first.
    pub fn finish_steps(&mut self) -> Result<Vec<StepResult<T>>> {
        let mut out = Vec::new();
        self.finish_steps_in_place(|done| {
            out.push(StepResult {
                step: done.step(),
                output: done.output()?.to_vec(),
            });
            Ok(())
        })?;
        Ok(out)
    }

    /// Finish the steps still in flight, handing each result to `read` in
    /// place, oldest first (the [`step_in_place`](Self::step_in_place) form
    /// of [`finish_steps`](Self::finish_steps)).
    pub fn finish_steps_in_place(
        &mut self,
        mut read: impl FnMut(StepOutput<'_, T>) -> Result<()>,
    ) -> Result<()> {
        let len = self.len.unwrap_or(0);
        if let (
            Mode::Async {
                coordinator,
                state: Some(state),
                ..
            },
            Some(kernel),
        ) = (&mut self.mode, &self.kernel)
        {
            // Steps without a new upload until every step has come back.
            while self.returned < self.step {
                let slot = async_step(
                    coordinator,
                    kernel,
                    &self.device,
                    state,
                    None,
                    self.step,
                    len,
                )?;
                if let Some(index) = slot {
                    self.returned += 1;
                    read(StepOutput {
                        step: state.step_of[index],
                        host: &state.host[index],
                    })?;
                }
            }
            coordinator.synchronize_all()?;
            coordinator.poll()?;
        }
        Ok(())
    }
}

impl<T: DeviceCopy> fmt::Debug for ManagedGpuContext<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedGpuContext")
            .field("async", &self.has_stream_management())
            .field("step", &self.step)
            .field("kernel", &self.kernel.as_ref().map(|k| &k.name))
            .finish()
    }
}

/// The seed's stream purposes for the pipeline's three roles.
fn purpose_coordinator(pool: &StreamPool) -> Result<AsyncCoordinator> {
    AsyncCoordinator::with_streams(
        pool.get_stream_for_purpose(StreamPurpose::ConfigUpload),
        pool.get_stream_for_purpose(StreamPurpose::KernelExecution),
        pool.get_stream_for_purpose(StreamPurpose::TelemetryDownload),
    )
}

/// A step kernel passes `OUTPUT` once, writing it, and `INPUT` only to read.
fn check_step_kernel(kernel: &GpuPipelineStage) -> Result<()> {
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
fn step_args<'a, T: DeviceCopy>(
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
fn check_step_args<T: DeviceCopy>(
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

fn sync_step<T: DeviceCopy>(
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

impl<T: DeviceCopy> AsyncState<T> {
    fn new(ctx: &Arc<Context>, kernel: &GpuPipelineStage, len: usize) -> Result<Self> {
        let mut outputs: Vec<DeviceBuffer<T>> = (0..3)
            .map(|_| DeviceBuffer::new(ctx, len))
            .collect::<driver::Result<_>>()?;
        // Two buffers of the step's type and length stand for a slot and
        // its output: the check needs their types and lengths only.
        let (first, rest) = outputs.split_at_mut(1);
        check_step_args(kernel, &rest[0], &mut first[0], len)?;
        Ok(Self {
            slots: GpuTripleBuffer::new(ctx, len)?,
            outputs,
            host: (0..3)
                .map(|_| PinnedBuffer::new(ctx, len))
                .collect::<driver::Result<_>>()?,
            host_in: None,
            uploads: [None; 3],
            downloads: [None; 3],
            step_of: [0; 3],
        })
    }
}

fn illegal(stage: &'static str) -> Error {
    Error::Mode(stage)
}

/// Step `k` (the number given to an uploaded input): upload (when given)
/// into the next free slot, download step k − 2's output, run the kernel on
/// step k − 1's input, in that order (a download waits for the computes
/// queued before it). The slot guards follow the triple buffer's state
/// machine; the coordinator's events order the GPU work. Returns the slot
/// whose download was queued, if any.
fn async_step<T: DeviceCopy>(
    coordinator: &mut AsyncCoordinator,
    kernel: &GpuPipelineStage,
    ctx: &Arc<Context>,
    state: &mut AsyncState<T>,
    upload: Option<Upload<'_, T>>,
    k: u64,
    len: usize,
) -> Result<Option<usize>> {
    let AsyncState {
        slots,
        outputs,
        host,
        host_in,
        uploads,
        downloads,
        step_of,
    } = state;
    // Claim the batch uploaded in an earlier step before this step's upload
    // makes another slot ready for processing.
    let process = slots.get_process_buffer();
    if let Some(upload) = upload {
        let mut slot = slots
            .get_upload_buffer()
            .ok_or_else(|| illegal("triple buffer: no free slot to upload into"))?;
        let index = slot.slot();
        uploads[index] = Some(match upload {
            Upload::Copy(input) => coordinator.queue_upload(input, &mut slot)?,
            Upload::InPlace { fill } => {
                let pinned = match host_in {
                    Some(pinned) => pinned,
                    None => host_in.insert(
                        (0..3)
                            .map(|_| PinnedBuffer::new(ctx, len))
                            .collect::<driver::Result<_>>()?,
                    ),
                };
                // Waits only for this slot's previous upload (three steps ago).
                fill(pinned[index].as_mut_slice()?);
                coordinator.queue_upload_pinned(&pinned[index], &mut slot, &[])?
            }
        });
        step_of[index] = k;
    }
    let mut downloaded = None;
    if let Some(slot) = slots.get_download_buffer() {
        let index = slot.slot();
        downloads[index] = Some(coordinator.queue_download(&outputs[index], &mut host[index])?);
        drop(slot);
        slots.advance()?;
        downloaded = Some(index);
    }
    if let Some(slot) = process {
        let index = slot.slot();
        // Its upload, and the download that may still read this slot's output.
        let deps: Vec<OperationId> = uploads[index]
            .iter()
            .chain(&downloads[index])
            .copied()
            .collect();
        let args = step_args(kernel, &slot, &mut outputs[index], len);
        coordinator.queue_compute(&kernel.kernel, kernel.config, &args, &deps)?;
    }
    coordinator.poll()?;
    Ok(downloaded)
}
