//! A device context with optional stream management: one stream, or a
//! triple-buffered upload / kernel / download pipeline.

use crate::coordinator::{AsyncCoordinator, OperationId};
use crate::error::{Error, Result};
use crate::manager::PipelineStageManager;
use crate::triple_buffer::GpuTripleBuffer;
use driver::{
    Context, DeviceBuffer, DeviceCopy, Kernel, LaunchConfig, Module, PinnedBuffer, Stream,
};
use pool::{StreamPool, StreamPurpose};
use std::fmt;
use std::sync::Arc;

/// Streams in the managed context's pool: one per purpose and spares.
const POOL_SIZE: usize = 8;
/// Batches in flight in asynchronous mode.
pub const PIPELINE_DEPTH: u64 = 3;

/// What one [`ManagedGpuContext::triple_buffered_step`] runs: `input` is
/// uploaded, `kernels::COMPUTE`'s `compute` runs `iterations` steps of
/// `v = v / 2 + x` on it, and the result is downloaded.
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{ManagedGpuContext, StepConfig};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let device = Context::new(0)?;
/// let mut ctx = ManagedGpuContext::new(&device, false)?; // synchronous: no lag
/// let config = StepConfig { input: vec![2.0; 16], iterations: 2 };
/// let telemetry = ctx.triple_buffered_step(config.clone())?.expect("answered at once");
/// assert_eq!(telemetry.output, vec![3.5; 16]); // v = x = 2, then 3, then 3.5
/// // Every step of one context has the length of the first.
/// let short = StepConfig { input: vec![1.0; 8], ..config };
/// let err = ctx.triple_buffered_step(short).unwrap_err();
/// assert!(err.to_string().contains("holds 16 element(s) but the host side holds 8"), "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct StepConfig {
    /// The step's input. Every step of one context has the same length.
    pub input: Vec<f32>,
    /// The kernel's iteration count (its arithmetic intensity).
    pub iterations: u32,
}

/// What the GPU sent back for one step.
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{ManagedGpuContext, StepConfig, Telemetry};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let device = Context::new(0)?;
/// let mut ctx = ManagedGpuContext::new(&device, true)?; // asynchronous: results lag
/// for x in [1.0, 2.0] {
///     let step = ctx.triple_buffered_step(StepConfig { input: vec![x; 4], iterations: 1 })?;
///     assert_eq!(step, None); // the pipeline is still filling
/// }
/// let telemetry = ctx.finish_steps()?;
/// assert_eq!(telemetry, [
///     Telemetry { step: 0, output: vec![1.5; 4] }, // one step of v = v/2 + x from v = x
///     Telemetry { step: 1, output: vec![3.0; 4] },
/// ]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Telemetry {
    /// The step it belongs to (0 for the first call).
    pub step: u64,
    /// The kernel's output, downloaded.
    pub output: Vec<f32>,
}

/// One step's result read in place, from
/// [`ManagedGpuContext::step_in_place`]: the pinned buffer the GPU
/// downloaded into, borrowed until the next step.
pub struct StepOutput<'a> {
    step: u64,
    host: &'a PinnedBuffer<f32>,
}

impl StepOutput<'_> {
    /// The step it belongs to (0 for the first call).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The kernel's output, waiting for its download if it is still
    /// running (the work queued after it keeps the GPU busy meanwhile).
    pub fn output(&self) -> Result<&[f32]> {
        Ok(self.host.as_slice()?)
    }
}

impl fmt::Debug for StepOutput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepOutput")
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

/// What a step uploads: a copy of the caller's `Vec`, or a pinned slot the
/// caller fills in place.
enum Upload<'a> {
    Copy(&'a StepConfig),
    InPlace {
        iterations: u32,
        fill: &'a mut dyn FnMut(&mut [f32]),
    },
}

impl Upload<'_> {
    fn iterations(&self) -> u32 {
        match self {
            Upload::Copy(config) => config.iterations,
            Upload::InPlace { iterations, .. } => *iterations,
        }
    }
}

struct SyncState {
    input: DeviceBuffer<f32>,
    output: DeviceBuffer<f32>,
    host: PinnedBuffer<f32>,
    /// The in-place steps' input, allocated on the first one.
    host_in: Option<PinnedBuffer<f32>>,
}

struct AsyncState {
    slots: GpuTripleBuffer<f32>,
    outputs: Vec<DeviceBuffer<f32>>,
    host: Vec<PinnedBuffer<f32>>,
    /// The in-place steps' inputs, one per slot, allocated on the first one.
    host_in: Option<Vec<PinnedBuffer<f32>>>,
    uploads: [Option<OperationId>; 3],
    downloads: [Option<OperationId>; 3],
    iterations: [u32; 3],
    /// The step number each slot's batch came from.
    step_of: [u64; 3],
}

// One per managed context, built once and never moved on a hot path: the
// size difference between the modes costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Mode {
    Sync {
        stream: Arc<Stream>,
        state: Option<SyncState>,
    },
    Async {
        pool: Box<StreamPool>,
        coordinator: AsyncCoordinator,
        state: Option<Box<AsyncState>>,
    },
}

/// A device context with stream management switched on or off.
///
/// - **Synchronous** (`enable_async = false`): one stream; each
///   [`triple_buffered_step`](Self::triple_buffered_step) uploads, computes,
///   downloads and waits, and returns that step's telemetry.
/// - **Asynchronous** (`enable_async = true`): a [`StreamPool`] whose
///   `ConfigUpload`, `KernelExecution` and `TelemetryDownload` streams drive
///   an [`AsyncCoordinator`], and a [`GpuTripleBuffer`]: step *k* uploads
///   config *k*, runs the kernel on config *k − 1* and downloads the result
///   of config *k − 2*, all three at once. **Results lag by two steps**
///   (the pipeline depth, 3, minus one): steps 0 and 1 return `None`, step
///   *k* returns the telemetry of step *k − 2*, and
///   [`finish_steps`](Self::finish_steps) returns the last two.
///
/// Both modes compute the same numbers; only the timing differs.
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{ManagedGpuContext, StepConfig};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let device = Context::new(0)?;
/// let mut ctx = ManagedGpuContext::new(&device, true)?;
/// let mut results = Vec::new();
/// for step in 0..4 {
///     let config = StepConfig { input: vec![step as f32; 64], iterations: 1 };
///     // None for the first two steps: the pipeline is filling.
///     results.extend(ctx.triple_buffered_step(config)?);
/// }
/// results.extend(ctx.finish_steps()?);
/// let steps: Vec<u64> = results.iter().map(|t| t.step).collect();
/// assert_eq!(steps, [0, 1, 2, 3]);
/// assert_eq!(results[3].output, vec![4.5; 64]); // 1 step of v = v/2 + x from v = x = 3
/// # Ok(())
/// # }
/// ```
pub struct ManagedGpuContext {
    device: Arc<Context>,
    mode: Mode,
    kernel: Kernel,
    len: Option<usize>,
    /// Steps started, and steps whose telemetry was returned.
    step: u64,
    returned: u64,
}

impl ManagedGpuContext {
    /// A managed context on `device`, asynchronous (triple-buffered, with a
    /// stream pool) when `enable_async`.
    pub fn new(device: &Arc<Context>, enable_async: bool) -> Result<Self> {
        let kernel = Module::load(device, &kernels::COMPUTE)?.function("compute")?;
        let mode = if enable_async {
            let pool = StreamPool::new(device, POOL_SIZE)?;
            let coordinator = AsyncCoordinator::with_streams(
                pool.get_stream_for_purpose(StreamPurpose::ConfigUpload),
                pool.get_stream_for_purpose(StreamPurpose::KernelExecution),
                pool.get_stream_for_purpose(StreamPurpose::TelemetryDownload),
            )?;
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
            kernel,
            len: None,
            step: 0,
            returned: 0,
        })
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
    pub fn create_triple_buffer<T: DeviceCopy>(&self, size: usize) -> Result<GpuTripleBuffer<T>> {
        GpuTripleBuffer::new(&self.device, size)
    }

    /// A stage manager for buffers of `elements` `f32`s, on this context's
    /// upload, compute and download streams (asynchronous mode only).
    pub fn create_pipeline_manager(&self, elements: usize) -> Result<PipelineStageManager> {
        self.create_typed_pipeline_manager(elements)
    }

    /// [`create_pipeline_manager`](Self::create_pipeline_manager) for buffers
    /// of `elements` values of `T` ([`PipelineStageManager::new_typed`]).
    pub fn create_typed_pipeline_manager<T: DeviceCopy>(
        &self,
        elements: usize,
    ) -> Result<PipelineStageManager<T>> {
        let Mode::Async { pool, .. } = &self.mode else {
            return Err(Error::Mode(
                "a pipeline manager needs stream management: create the context with enable_async = true",
            ));
        };
        let coordinator = AsyncCoordinator::with_streams(
            pool.get_stream_for_purpose(StreamPurpose::ConfigUpload),
            pool.get_stream_for_purpose(StreamPurpose::KernelExecution),
            pool.get_stream_for_purpose(StreamPurpose::TelemetryDownload),
        )?;
        PipelineStageManager::new_typed(coordinator, elements)
    }

    /// Run one step: upload `config.input`, run the kernel, download the
    /// result. Synchronous mode returns this step's telemetry; asynchronous
    /// mode returns step *k − 2*'s (`None` for the first two steps).
    pub fn triple_buffered_step(&mut self, config: StepConfig) -> Result<Option<Telemetry>> {
        let len = config.input.len();
        let done = self.step(len, Upload::Copy(&config))?;
        done.map(|out| {
            Ok(Telemetry {
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
    /// result (with the next steps' work already queued behind it).
    ///
    /// ```
    /// use cuda_streams_pipeline::driver::Context;
    /// use cuda_streams_pipeline::ManagedGpuContext;
    /// # fn main() -> cuda_streams_pipeline::Result<()> {
    /// let device = Context::new(0)?;
    /// let mut ctx = ManagedGpuContext::new(&device, true)?;
    /// let mut seen = Vec::new();
    /// for step in 0..4 {
    ///     let done = ctx.step_in_place(1024, 1, |input| input.fill(step as f32))?;
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
        iterations: u32,
        fill: impl FnOnce(&mut [f32]),
    ) -> Result<Option<StepOutput<'_>>> {
        let mut fill = Some(fill);
        let mut fill_once = |input: &mut [f32]| {
            if let Some(fill) = fill.take() {
                fill(input);
            }
        };
        self.step(
            elements,
            Upload::InPlace {
                iterations,
                fill: &mut fill_once,
            },
        )
    }

    fn step(&mut self, len: usize, upload: Upload<'_>) -> Result<Option<StepOutput<'_>>> {
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
                    None => state.insert(SyncState {
                        input: DeviceBuffer::new(&self.device, len)?,
                        output: DeviceBuffer::new(&self.device, len)?,
                        host: PinnedBuffer::new(&self.device, len)?,
                        host_in: None,
                    }),
                };
                sync_step(stream, &self.kernel, &self.device, state, upload, len)?;
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
                    None => state.insert(Box::new(AsyncState::new(&self.device, len)?)),
                };
                let slot = async_step(
                    coordinator,
                    &self.kernel,
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
    /// and return their telemetry, oldest first.
    pub fn finish_steps(&mut self) -> Result<Vec<Telemetry>> {
        let mut out = Vec::new();
        self.finish_steps_in_place(|done| {
            out.push(Telemetry {
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
        mut read: impl FnMut(StepOutput<'_>) -> Result<()>,
    ) -> Result<()> {
        let len = self.len.unwrap_or(0);
        if let Mode::Async {
            coordinator,
            state: Some(state),
            ..
        } = &mut self.mode
        {
            // Steps without a new upload until every step has come back.
            while self.returned < self.step {
                let slot = async_step(
                    coordinator,
                    &self.kernel,
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

impl fmt::Debug for ManagedGpuContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedGpuContext")
            .field("async", &self.has_stream_management())
            .field("step", &self.step)
            .finish()
    }
}

fn launch_config(len: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(len.min(1 << 20) as u32)
}

fn sync_step(
    stream: &Arc<Stream>,
    kernel: &Kernel,
    ctx: &Arc<Context>,
    state: &mut SyncState,
    upload: Upload<'_>,
    len: usize,
) -> Result<()> {
    let iterations = upload.iterations();
    match upload {
        Upload::Copy(config) => stream.copy_from_host(&mut state.input, &config.input)?,
        Upload::InPlace { fill, .. } => {
            let host_in = match &mut state.host_in {
                Some(host_in) => host_in,
                None => state.host_in.insert(PinnedBuffer::new(ctx, len)?),
            };
            fill(host_in.as_mut_slice()?);
            stream.copy_from_host_async(&mut state.input, host_in)?;
        }
    }
    stream.launch(
        kernel,
        launch_config(len),
        &[
            (len as u64).into(),
            iterations.into(),
            (&state.input).into(),
            (&mut state.output).into(),
        ],
    )?;
    stream.copy_to_host_async(&mut state.host, &state.output)?;
    Ok(())
}

impl AsyncState {
    fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        Ok(Self {
            slots: GpuTripleBuffer::new(ctx, len)?,
            outputs: (0..3)
                .map(|_| DeviceBuffer::new(ctx, len))
                .collect::<driver::Result<_>>()?,
            host: (0..3)
                .map(|_| PinnedBuffer::new(ctx, len))
                .collect::<driver::Result<_>>()?,
            host_in: None,
            uploads: [None; 3],
            downloads: [None; 3],
            iterations: [0; 3],
            step_of: [0; 3],
        })
    }
}

fn illegal(stage: &'static str) -> Error {
    Error::Mode(stage)
}

/// Step `k` (the number given to an uploaded config): upload (when given)
/// into the next free slot, download step k − 2's output, run the kernel on
/// step k − 1's input, in that order (a download waits for the computes
/// queued before it). The slot guards follow the triple buffer's state
/// machine; the coordinator's events order the GPU work. Returns the slot
/// whose download was queued, if any.
fn async_step(
    coordinator: &mut AsyncCoordinator,
    kernel: &Kernel,
    ctx: &Arc<Context>,
    state: &mut AsyncState,
    upload: Option<Upload<'_>>,
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
        iterations,
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
        iterations[index] = upload.iterations();
        uploads[index] = Some(match upload {
            Upload::Copy(config) => coordinator.queue_upload(&config.input, &mut slot)?,
            Upload::InPlace { fill, .. } => {
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
        coordinator.queue_compute(
            kernel,
            launch_config(len),
            &[
                (len as u64).into(),
                iterations[index].into(),
                (&*slot).into(),
                (&mut outputs[index]).into(),
            ],
            &deps,
        )?;
    }
    coordinator.poll()?;
    Ok(downloaded)
}
