//! A device context with optional stream management: one stream, or a
//! triple-buffered upload / kernel / download pipeline, running the user's
//! step kernel over buffers of the user's element type.
//!
//! Asynchronous mode is a view of the pipeline's one orchestrator
//! ([`Rotation`]), the one the stage manager runs on too.

mod builder;
mod one_stream;
mod output;
mod slots;
mod step_kernel;

pub use builder::ManagedGpuContextBuilder;
pub use output::{StepOutput, StepResult};

use crate::coordinator::AsyncCoordinator;
use crate::error::{Error, Result};
use crate::ids::BufferId;
use crate::manager::PipelineStageManager;
use crate::rotation::{Rotation, slot_of};
use crate::stage::GpuPipelineStage;
use crate::triple_buffer::GpuTripleBuffer;
use driver::{Context, DeviceCopy, Stream};
use one_stream::{SyncState, sync_step};
use pool::{StreamPool, StreamPurpose};
use slots::AsyncState;
use std::fmt;
use std::sync::Arc;
use step_kernel::check_step_kernel;

/// Streams in the managed context's pool: one per purpose and spares.
const POOL_SIZE: usize = 8;

/// What a step uploads: a copy of the caller's slice, or a pinned slot the
/// caller fills in place.
enum Upload<'a, T> {
    Copy(&'a [T]),
    InPlace { fill: &'a mut dyn FnMut(&mut [T]) },
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
        /// The batches in flight on the pool's upload, compute and download
        /// streams: the stage manager's orchestrator.
        rotation: Rotation,
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
///   the upload, compute and download roles) drive an [`AsyncCoordinator`]
///   over three slots of buffers, rotated as a [`GpuTripleBuffer`]'s are and
///   as a [`PipelineStageManager`]'s batches are (the same orchestrator):
///   step *k* uploads input *k*, runs the kernel on input *k − 1* and
///   downloads the result of input *k − 2*, all three at once. **Results lag
///   by two steps** ([`PIPELINE_DEPTH`](crate::PIPELINE_DEPTH), 3, minus one):
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
    /// Steps started.
    step: u64,
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
}

impl<T: DeviceCopy> ManagedGpuContext<T> {
    fn with_mode(device: &Arc<Context>, enable_async: bool) -> Result<Self> {
        let mode = if enable_async {
            let pool = StreamPool::new(device, POOL_SIZE)?;
            let rotation = Rotation::new(purpose_coordinator(&pool)?);
            Mode::Async {
                pool: Box::new(pool),
                rotation,
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
            Mode::Async { rotation, .. } => Some(rotation.coordinator()),
            Mode::Sync { .. } => None,
        }
    }

    /// The coordinator, mutably (asynchronous mode).
    pub fn async_coordinator_mut(&mut self) -> Option<&mut AsyncCoordinator> {
        match &mut self.mode {
            Mode::Async { rotation, .. } => Some(rotation.coordinator_mut()),
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
                    None => state.insert(SyncState::new(&self.device, kernel, len)?),
                };
                sync_step(stream, kernel, &self.device, state, upload, len)?;
                Some(StepOutput {
                    step,
                    host: &state.host,
                })
            }
            Mode::Async {
                rotation, state, ..
            } => {
                let state = match state {
                    Some(state) => state,
                    None => state.insert(Box::new(AsyncState::new(&self.device, kernel, len)?)),
                };
                let mut work = slots::Step {
                    kernel,
                    ctx: &self.device,
                    state,
                    upload: Some(upload),
                    len,
                };
                let report = rotation.step(true, &mut work)?;
                report.downloaded.map(|batch| StepOutput {
                    step: batch,
                    host: &state.host[slot_of(batch)],
                })
            }
        };
        self.step += 1;
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
                rotation,
                state: Some(state),
                ..
            },
            Some(kernel),
        ) = (&mut self.mode, &self.kernel)
        {
            // Steps without a new upload until every step has come back.
            while rotation.in_flight() {
                let mut work = slots::Step {
                    kernel,
                    ctx: &self.device,
                    state,
                    upload: None,
                    len,
                };
                if let Some(batch) = rotation.step(false, &mut work)?.downloaded {
                    read(StepOutput {
                        step: batch,
                        host: &state.host[slot_of(batch)],
                    })?;
                }
            }
            rotation.settle()?;
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
