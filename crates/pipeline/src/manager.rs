//! Running a sequence of stages over batches, three batches in flight.

use crate::coordinator::{AsyncCoordinator, OperationId};
use crate::error::{Error, Result};
use crate::graph::{GraphSpec, PipelineGraph};
use crate::ids::{self, BufferId, StageId};
use crate::rotation::{DEPTH, IterationReport, Rotation, SlotWork, slot_of};
use crate::stage::{GpuPipelineStage, validate_order};
use driver::{
    CompletionTrail, DeviceBuffer, DeviceCopy, Event, KernelArg, PinnedBuffer, PooledEvent,
    TrailSearch,
};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

/// Statistics measured with timing events on the GPU
/// ([`PipelineStageManager::get_stats`]).
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager, PipelineStats};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
/// let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, 64)?;
/// let cfg = LaunchConfig::for_num_elems(64);
/// let stage = pipeline.add_stage(GpuPipelineStage::compute("c", compute, cfg, 1, 0, 1));
/// pipeline.set_inputs(vec![0]);
/// pipeline.set_order(vec![stage])?;
/// assert_eq!(pipeline.get_stats()?, PipelineStats::default()); // nothing has run
/// for _ in 0..3 {
///     pipeline.execute_iteration()?;
/// }
/// pipeline.drain()?;
/// let stats = pipeline.get_stats()?;
/// assert_eq!(stats.iterations, 3);
/// assert!((0.0..=1.0).contains(&stats.gpu_utilization));
/// let line = stats.to_string(); // one line for logs and reports
/// assert!(line.starts_with("pipeline: 3 iteration(s), "), "{line}");
/// pipeline.reset_stats();
/// assert_eq!(pipeline.get_stats()?, PipelineStats::default());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PipelineStats {
    /// Batches whose stages the GPU has finished since the last reset.
    pub iterations: usize,
    /// GPU wall time per finished batch, in ms: from the first operation
    /// after the reset to the end of the last finished batch's stages,
    /// divided by `iterations`.
    pub avg_iteration_ms: f64,
    /// Finished batches per second of that wall time.
    pub throughput: f64,
    /// The compute stream's busy time (the stages, timed on the GPU) over
    /// that wall time, 0.0 to 1.0.
    pub gpu_utilization: f64,
    /// The compute stream's busy time, in total.
    pub compute_busy: Duration,
    /// The wall time the figures above are measured over.
    pub wall: Duration,
}

/// The device buffers of one batch slot, indexed by buffer id.
type SlotBuffers<T> = Vec<Option<DeviceBuffer<T>>>;

/// Host buffers by buffer id.
type HostBuffers<T> = HashMap<BufferId, PinnedBuffer<T>>;

/// The buffers of the three slots (which batch each holds is the
/// rotation's).
struct Slots<T: DeviceCopy> {
    device: Vec<SlotBuffers<T>>,
    host_in: Vec<HostBuffers<T>>,
    host_out: Vec<HostBuffers<T>>,
}

/// Timing events come from the context's event pool and go back to it.
#[derive(Default)]
struct Timing {
    /// Recorded before the first operation after a reset.
    wall_start: Option<PooledEvent>,
    /// (start, end) around each batch's stages, oldest first: the compute
    /// stream's completion trail, by the end events.
    pending: CompletionTrail<(PooledEvent, PooledEvent)>,
    iterations: usize,
    busy: Duration,
    wall: Duration,
}

/// Runs stages over a stream of batches with upload, compute and download
/// overlapped, as a triple buffer does.
///
/// Step *k* ([`execute_iteration`](Self::execute_iteration)) uploads batch
/// *k* into slot *k* mod 3, downloads batch *k − 2*'s outputs and runs every
/// stage, in order, on batch *k − 1*; the three go on the coordinator's three
/// streams, ordered by events only, so they run at once. Results therefore
/// lag two steps behind uploads; [`drain`](Self::drain) finishes the batches
/// still in flight.
///
/// Pipeline inputs ([`set_inputs`](Self::set_inputs)) are uploaded each step
/// from pinned host buffers ([`input_mut`](Self::input_mut),
/// [`fill_input`](Self::fill_input)); outputs ([`set_outputs`](Self::set_outputs),
/// by default the last stage's outputs) are downloaded into pinned host
/// buffers ([`output`](Self::output)). All buffers hold the element count
/// given to [`new`](Self::new) of the element type `T`: `f32` by default,
/// any [`DeviceCopy`] type through [`new_typed`](Self::new_typed). Stages'
/// kernels take them as `T*`.
///
/// Buffers are named by [`BufferId`] and stages by [`StageId`]; calls take
/// plain indices too (`set_inputs(vec![0])`, `output(1)`).
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
/// let cfg = LaunchConfig::for_num_elems(256);
/// let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, 256)?;
/// let a = pipeline.add_stage(GpuPipelineStage::compute("first", compute.clone(), cfg, 1, 0, 1));
/// let b = pipeline.add_stage(GpuPipelineStage::compute("second", compute, cfg, 1, 1, 2));
/// pipeline.set_inputs(vec![0]);
/// pipeline.set_order(vec![a, b])?; // outputs default to the last stage's: buffer 2
/// pipeline.fill_input(0, &[2.0; 256])?;
/// for _ in 0..5 {
///     pipeline.execute_iteration()?;
/// }
/// pipeline.drain()?;
/// // compute(x, 1 step) = 1.5 x, twice: 2.25 x.
/// assert_eq!(pipeline.output(2)?, &[4.5; 256]);
/// let stats = pipeline.get_stats()?;
/// assert_eq!(stats.iterations, 5);
/// assert!(stats.gpu_utilization > 0.0 && stats.gpu_utilization <= 1.0);
/// # Ok(())
/// # }
/// ```
pub struct PipelineStageManager<T: DeviceCopy = f32> {
    /// The batches in flight on the coordinator's streams.
    rotation: Rotation,
    elements: usize,
    stages: Vec<GpuPipelineStage>,
    order: Option<Vec<StageId>>,
    inputs: Vec<BufferId>,
    outputs: Option<Vec<BufferId>>,
    slots: Option<Slots<T>>,
    timing: Timing,
}

impl PipelineStageManager {
    /// A manager over `coordinator`'s streams, for buffers of `elements` `f32`s
    /// ([`new_typed`](Self::new_typed) for another element type).
    pub fn new(coordinator: AsyncCoordinator, elements: usize) -> Result<Self> {
        Self::new_typed(coordinator, elements)
    }
}

impl<T: DeviceCopy> PipelineStageManager<T> {
    /// A manager over `coordinator`'s streams, for buffers of `elements`
    /// values of `T`, which the stages' kernels take as `T*`.
    ///
    /// [`new`](PipelineStageManager::new) is this for `f32`; it exists so
    /// that a plain `PipelineStageManager::new(…)` needs no type annotation.
    /// Here `fill_u32(n, value, out)` overwrites the first 4 of each batch's
    /// 8 `u32`s, in place:
    ///
    /// ```
    /// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
    /// use cuda_streams_pipeline::{AsyncCoordinator, BufferId, GpuPipelineStage, PipelineStageManager, StageArg};
    /// # fn main() -> cuda_streams_pipeline::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
    /// let mut pipeline = PipelineStageManager::<u32>::new_typed(AsyncCoordinator::new(&ctx)?, 8)?;
    /// let stage = pipeline.add_stage(GpuPipelineStage {
    ///     name: "mark".into(),
    ///     input_buffers: vec![BufferId(0)],
    ///     output_buffers: vec![BufferId(0)],
    ///     kernel: fill,
    ///     config: LaunchConfig::for_num_elems(4),
    ///     args: vec![StageArg::U64(4), StageArg::U32(7), StageArg::buffer(0)],
    /// });
    /// pipeline.set_inputs(vec![0]);
    /// pipeline.set_order(vec![stage])?;
    /// pipeline.input_mut(0)?.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    /// pipeline.execute_iteration()?;
    /// pipeline.drain()?;
    /// assert_eq!(pipeline.output_of(0, 0)?, &[7, 7, 7, 7, 5, 6, 7, 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new_typed(coordinator: AsyncCoordinator, elements: usize) -> Result<Self> {
        if elements == 0 {
            return Err(Error::InvalidConfig(
                "a pipeline of 0 elements would be empty: zero-length buffers are refused \
                 (docs/architecture.md#empty-buffers)"
                    .into(),
            ));
        }
        Ok(Self {
            rotation: Rotation::new(coordinator),
            elements,
            stages: Vec::new(),
            order: None,
            inputs: Vec::new(),
            outputs: None,
            slots: None,
            timing: Timing::default(),
        })
    }

    /// Add a stage; returns its id for [`set_order`](Self::set_order).
    pub fn add_stage(&mut self, stage: GpuPipelineStage) -> StageId {
        self.stages.push(stage);
        StageId(self.stages.len() - 1)
    }

    /// The buffers uploaded from the host for every batch ([`BufferId`]s or
    /// plain indices).
    pub fn set_inputs<I>(&mut self, inputs: I)
    where
        I: IntoIterator,
        I::Item: Into<BufferId>,
    {
        self.inputs = ids::collect(inputs);
        self.slots = None;
    }

    /// The buffers downloaded for every batch (default: the last stage's
    /// outputs), as [`BufferId`]s or plain indices.
    pub fn set_outputs<I>(&mut self, outputs: I)
    where
        I: IntoIterator,
        I::Item: Into<BufferId>,
    {
        self.outputs = Some(ids::collect(outputs));
        self.slots = None;
    }

    /// Set the execution order ([`StageId`]s from
    /// [`add_stage`](Self::add_stage), or plain indices) after validating it:
    /// every id names a stage, once; the stages' data flow has no cycle;
    /// every stage reads only pipeline inputs and buffers written by a stage
    /// before it; every stage's arguments fit its kernel's signature over
    /// buffers of `T`. Allocates the buffers of the three slots. On error
    /// nothing changes.
    pub fn set_order<I>(&mut self, order: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: Into<StageId>,
    {
        self.apply_order(ids::collect(order))
    }

    fn apply_order(&mut self, order: Vec<StageId>) -> Result<()> {
        validate_order(&self.stages, &order, &self.inputs)?;
        if order.is_empty() {
            return Err(Error::InvalidConfig("an empty execution order".into()));
        }
        let outputs = self.outputs_for(&order);
        let written: HashSet<BufferId> = order
            .iter()
            .flat_map(|&i| self.stages[i.0].output_buffers.iter().copied())
            .chain(self.inputs.iter().copied())
            .collect();
        if let Some(&missing) = outputs.iter().find(|b| !written.contains(b)) {
            return Err(Error::InvalidConfig(format!(
                "output {missing} is neither an input nor written by any stage"
            )));
        }
        let ids: HashSet<BufferId> = order
            .iter()
            .flat_map(|&i| self.stages[i.0].buffers())
            .chain(self.inputs.iter().copied())
            .chain(outputs.iter().copied())
            .collect();
        let mut slots = self.allocate(&ids, &outputs)?;
        // The kernels' signatures against real buffers of `T`, now rather
        // than at the first step (with its upload already queued).
        let n = self.elements as u64;
        for &id in &order {
            let stage = &self.stages[id.0];
            let args = stage_args(stage, &mut slots.device[0], n);
            stage
                .kernel
                .check_args(&args)
                .map_err(|source| Error::StageArguments {
                    stage: id,
                    name: stage.name.clone(),
                    source,
                })?;
        }
        self.slots = Some(slots);
        self.rotation.forget_slots();
        self.order = Some(order);
        Ok(())
    }

    fn outputs_for(&self, order: &[StageId]) -> Vec<BufferId> {
        match &self.outputs {
            Some(outputs) => outputs.clone(),
            None => order
                .last()
                .map(|&i| self.stages[i.0].output_buffers.clone())
                .unwrap_or_default(),
        }
    }

    fn allocate(&self, ids: &HashSet<BufferId>, outputs: &[BufferId]) -> Result<Slots<T>> {
        let ctx = self.rotation.coordinator().context();
        let count = ids.iter().max().map_or(0, |m| m.0 + 1);
        let mut slots = Slots {
            device: Vec::new(),
            host_in: Vec::new(),
            host_out: Vec::new(),
        };
        for _ in 0..DEPTH {
            let mut device: SlotBuffers<T> = (0..count).map(|_| None).collect();
            for &id in ids {
                device[id.0] = Some(DeviceBuffer::new(ctx, self.elements)?);
            }
            slots.device.push(device);
            let pinned = |ids: &[BufferId]| -> Result<HostBuffers<T>> {
                ids.iter()
                    .map(|&id| Ok((id, PinnedBuffer::new(ctx, self.elements)?)))
                    .collect()
            };
            slots.host_in.push(pinned(&self.inputs)?);
            slots.host_out.push(pinned(outputs)?);
        }
        Ok(slots)
    }

    /// Write all three slots' host copies of input `id` (e.g. once, before a
    /// run that reuses the same data). Waits for uploads still reading them.
    pub fn fill_input(&mut self, id: impl Into<BufferId>, data: &[T]) -> Result<()> {
        let id = id.into();
        let slots = self.slots.as_mut().ok_or(Error::NoOrder)?;
        for host in &mut slots.host_in {
            let buffer = host.get_mut(&id).ok_or_else(|| not_input(id))?;
            let slice = buffer.as_mut_slice()?;
            if slice.len() != data.len() {
                return Err(Error::LengthMismatch {
                    operation: "fill_input",
                    device: slice.len(),
                    host: data.len(),
                });
            }
            slice.copy_from_slice(data);
        }
        Ok(())
    }

    /// The host copy of input `id` that the next step uploads, for writing
    /// the next batch into (waits if its previous upload is still running).
    pub fn input_mut(&mut self, id: impl Into<BufferId>) -> Result<&mut [T]> {
        let id = id.into();
        let slot = slot_of(self.rotation.fed());
        let slots = self.slots.as_mut().ok_or(Error::NoOrder)?;
        let buffer = slots.host_in[slot]
            .get_mut(&id)
            .ok_or_else(|| not_input(id))?;
        Ok(buffer.as_mut_slice()?)
    }

    /// The step captured as CUDA graphs, one per slot, to replay for a
    /// fraction of the launch cost ([`PipelineGraph`]). It has buffers of
    /// its own; its inputs start as this manager's. The capture runs on the
    /// coordinator's streams, which take no other work meanwhile.
    pub fn capture_graph(&self) -> Result<PipelineGraph<T>> {
        let order = self.order.as_ref().ok_or(Error::NoOrder)?;
        let slots = self.slots.as_ref().ok_or(Error::NoOrder)?;
        let inputs = slots
            .host_in
            .iter()
            .map(|host| {
                self.inputs
                    .iter()
                    .map(|&id| {
                        let buffer = host.get(&id).ok_or_else(|| not_input(id))?;
                        Ok((id, buffer.as_slice()?))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let coordinator = self.rotation.coordinator();
        PipelineGraph::capture(GraphSpec {
            ctx: coordinator.context(),
            streams: [
                coordinator.upload_stream(),
                coordinator.compute_stream(),
                coordinator.download_stream(),
            ],
            elements: self.elements,
            stages: order.iter().map(|&i| &self.stages[i.0]).collect(),
            inputs,
            outputs: self.outputs_for(order),
        })
    }

    /// Output `id` of batch `batch` (waits for its download).
    ///
    /// Each batch's outputs stay readable until the download of batch
    /// `batch + 3` is queued, three steps after its own: read every batch
    /// named by an [`IterationReport::downloaded`] before the next three
    /// steps, and after [`drain`](Self::drain) the last three batches.
    /// Other batches are an error naming them.
    ///
    /// ```
    /// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
    /// use cuda_streams_pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager};
    /// # fn main() -> cuda_streams_pipeline::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
    /// let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, 8)?;
    /// let cfg = LaunchConfig::for_num_elems(8);
    /// let stage = pipeline.add_stage(GpuPipelineStage::compute("c", compute, cfg, 1, 0, 1));
    /// pipeline.set_inputs(vec![0]);
    /// pipeline.set_order(vec![stage])?;
    /// for batch in 0..5 {
    ///     pipeline.input_mut(0)?.fill(batch as f32);
    ///     pipeline.execute_iteration()?;
    /// }
    /// pipeline.drain()?;
    /// // Batches 2, 3 and 4 are still held: x, then one step of v = v/2 + x.
    /// assert_eq!(pipeline.output_of(2, 1)?, &[3.0; 8]);
    /// assert_eq!(pipeline.output_of(4, 1)?, &[6.0; 8]);
    /// let gone = pipeline.output_of(1, 1).unwrap_err();
    /// assert!(gone.to_string().contains("batch 1"), "{gone}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn output_of(&self, batch: u64, id: impl Into<BufferId>) -> Result<&[T]> {
        let id = id.into();
        let slots = self.slots.as_ref().ok_or(Error::NoOrder)?;
        let Some(slot) = self.rotation.slot_holding(batch) else {
            let why = if batch >= self.rotation.downloaded() {
                "has not been queued for download yet (results lag two steps)"
            } else {
                "is no longer held: its slot took a later batch (each batch stays readable for three steps)"
            };
            return Err(Error::InvalidConfig(format!("batch {batch} {why}")));
        };
        let buffer = slots.host_out[slot]
            .get(&id)
            .ok_or(Error::NotAnOutput { buffer: id })?;
        Ok(buffer.as_slice()?)
    }

    /// Output `id` of the batch most recently queued for download (waits for
    /// that download).
    pub fn output(&self, id: impl Into<BufferId>) -> Result<&[T]> {
        let id = id.into();
        let slots = self.slots.as_ref().ok_or(Error::NoOrder)?;
        let slot = self.rotation.last_downloaded().ok_or(Error::InvalidConfig(
            "no batch has been downloaded yet (results lag two steps)".into(),
        ))?;
        let buffer = slots.host_out[slot]
            .get(&id)
            .ok_or(Error::NotAnOutput { buffer: id })?;
        Ok(buffer.as_slice()?)
    }

    /// One step: upload the next batch, queue the stages on the previous
    /// one, queue the download of the one before. Never waits on the host
    /// for the GPU (except to recycle timing events that are done).
    pub fn execute_iteration(&mut self) -> Result<IterationReport> {
        self.step_once(true)
    }

    /// Step without new uploads until every batch fed in has been computed
    /// and downloaded, then wait for the GPU.
    pub fn drain(&mut self) -> Result<Vec<IterationReport>> {
        let mut reports = Vec::new();
        while self.rotation.in_flight() {
            reports.push(self.step_once(false)?);
        }
        self.rotation.settle()?;
        Ok(reports)
    }

    fn step_once(&mut self, feed: bool) -> Result<IterationReport> {
        let Some(order) = &self.order else {
            return Err(Error::NoOrder);
        };
        if self.slots.is_none() {
            // The buffers were dropped by a new set of inputs or outputs.
            self.apply_order(order.clone())?;
        }
        if self.timing.wall_start.is_none() {
            let coordinator = self.rotation.coordinator();
            let first = if feed && !self.inputs.is_empty() {
                coordinator.upload_stream()
            } else {
                coordinator.compute_stream()
            };
            let start = take_timing(coordinator)?;
            start.record(first)?;
            self.timing.wall_start = Some(start);
        }
        let Self {
            rotation,
            slots,
            stages,
            order,
            elements,
            timing,
            ..
        } = self;
        let mut work = Stages {
            slots: slots.as_mut().expect("allocated above"),
            stages,
            order: order.as_deref().expect("checked above"),
            elements: *elements as u64,
            timing,
        };
        let report = rotation.step(feed, &mut work)?;
        self.harvest()?;
        Ok(report)
    }

    /// Fold finished batches' timings into the statistics (never blocks):
    /// the prefix of the trail the GPU has passed. Their events go back to
    /// the pool as they are dropped.
    fn harvest(&mut self) -> Result<()> {
        let t = &mut self.timing;
        let passed = t
            .pending
            .passed(TrailSearch::Exact, |(_, end)| Some(&**end))?;
        for (start, end) in t.pending.take_front(passed) {
            t.busy += Event::elapsed(&start, &end)?;
            if let Some(wall_start) = &t.wall_start {
                t.wall = Event::elapsed(wall_start, &end)?;
            }
            t.iterations += 1;
        }
        Ok(())
    }

    /// Statistics over the batches the GPU has finished since the last reset.
    pub fn get_stats(&mut self) -> Result<PipelineStats> {
        self.harvest()?;
        let t = &self.timing;
        let wall_s = t.wall.as_secs_f64();
        let (avg, throughput, utilization) = if t.iterations == 0 || wall_s == 0.0 {
            (0.0, 0.0, 0.0)
        } else {
            (
                wall_s * 1000.0 / t.iterations as f64,
                t.iterations as f64 / wall_s,
                (t.busy.as_secs_f64() / wall_s).min(1.0),
            )
        };
        Ok(PipelineStats {
            iterations: t.iterations,
            avg_iteration_ms: avg,
            throughput,
            gpu_utilization: utilization,
            compute_busy: t.busy,
            wall: t.wall,
        })
    }

    /// Start the statistics afresh from the next step. Batches already in
    /// flight are not counted.
    pub fn reset_stats(&mut self) {
        let t = &mut self.timing;
        // Pending ones may still be in flight; the pool hands them out again
        // only to be re-recorded, which is fine.
        t.pending.take_all();
        t.wall_start = None;
        t.iterations = 0;
        t.busy = Duration::ZERO;
        t.wall = Duration::ZERO;
    }

    /// Wait until everything queued so far has finished.
    pub fn synchronize(&mut self) -> Result<()> {
        self.rotation.settle()?;
        self.harvest()
    }

    /// The coordinator whose streams the pipeline runs on.
    pub fn coordinator(&self) -> &AsyncCoordinator {
        self.rotation.coordinator()
    }

    /// The stages added so far.
    pub fn stages(&self) -> &[GpuPipelineStage] {
        &self.stages
    }

    /// The stage `id` names, if it was added.
    pub fn stage(&self, id: impl Into<StageId>) -> Option<&GpuPipelineStage> {
        self.stages.get(id.into().0)
    }

    /// The validated execution order, once set.
    pub fn order(&self) -> Option<&[StageId]> {
        self.order.as_deref()
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.rotation.steps()
    }
}

impl<T: DeviceCopy> fmt::Debug for PipelineStageManager<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineStageManager")
            .field("element", &std::any::type_name::<T>())
            .field("stages", &self.stages.len())
            .field("order", &self.order)
            .field("inputs", &self.inputs)
            .field("step", &self.rotation.steps())
            .finish()
    }
}

/// The manager's work on one slot: its inputs' uploads, every stage in
/// order between two timing events, its outputs' downloads.
struct Stages<'a, T: DeviceCopy> {
    slots: &'a mut Slots<T>,
    stages: &'a [GpuPipelineStage],
    order: &'a [StageId],
    elements: u64,
    timing: &'a mut Timing,
}

impl<T: DeviceCopy> SlotWork for Stages<'_, T> {
    fn upload(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        queued: &mut Vec<OperationId>,
    ) -> Result<()> {
        let slots = &mut *self.slots;
        for (&id, host) in &slots.host_in[slot] {
            let dst = slots.device[slot][id.0].as_mut().expect("allocated");
            queued.push(coordinator.queue_upload_pinned(host, dst, &[])?);
        }
        Ok(())
    }

    fn download(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        queued: &mut Vec<OperationId>,
    ) -> Result<()> {
        let slots = &mut *self.slots;
        for (&id, host) in slots.host_out[slot].iter_mut() {
            let src = slots.device[slot][id.0].as_ref().expect("allocated");
            queued.push(coordinator.queue_download(src, host)?);
        }
        Ok(())
    }

    fn compute(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        after: &[OperationId],
    ) -> Result<()> {
        let start = take_timing(coordinator)?;
        let end = take_timing(coordinator)?;
        let buffers = &mut self.slots.device[slot];
        let (stages, n) = (self.stages, self.elements);
        coordinator.queue_compute_with(after, |stream| {
            start.record(stream)?;
            for &id in self.order {
                let stage = &stages[id.0];
                let _range = driver::nvtx::range(&stage.name);
                stream.launch(&stage.kernel, stage.config, &stage_args(stage, buffers, n))?;
            }
            end.record(stream)
        })?;
        self.timing.pending.push((start, end));
        Ok(())
    }
}

/// A timing event from the context's pool (through the compute stream's
/// handle on it: no lock).
fn take_timing(coordinator: &AsyncCoordinator) -> Result<PooledEvent> {
    Ok(coordinator
        .compute_stream()
        .event_pool()
        .acquire_event(true)?)
}

fn not_input(id: BufferId) -> Error {
    Error::NotAnInput { buffer: id }
}

/// One stage's kernel arguments over one slot's buffers. A buffer the stage
/// writes and passes once goes as `&mut`; others (read, or passed twice) as
/// `&`: the driver tracks both kinds of use for the buffer's lifetime alike.
fn stage_args<'a, T: DeviceCopy>(
    stage: &GpuPipelineStage,
    buffers: &'a mut SlotBuffers<T>,
    n: u64,
) -> Vec<KernelArg<'a>> {
    let writable: HashSet<BufferId> = stage
        .output_buffers
        .iter()
        .copied()
        .filter(|&b| stage.passes(b) == 1)
        .collect();
    let mut muts = HashMap::new();
    let mut shared = HashMap::new();
    for (id, buffer) in buffers.iter_mut().enumerate() {
        let id = BufferId(id);
        if let Some(buffer) = buffer {
            if writable.contains(&id) {
                muts.insert(id, buffer);
            } else {
                shared.insert(id, &*buffer);
            }
        }
    }
    stage.kernel_args(n, |b| match muts.remove(&b) {
        Some(buffer) => KernelArg::from(buffer),
        None => KernelArg::from(shared[&b]),
    })
}

impl std::fmt::Display for PipelineStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pipeline: {} iteration(s), {:.3} ms each, {:.1} per second; \
             compute busy {} of {} ({:.0}%)",
            self.iterations,
            self.avg_iteration_ms,
            self.throughput,
            driver::format_duration(self.compute_busy),
            driver::format_duration(self.wall),
            self.gpu_utilization * 100.0,
        )
    }
}
