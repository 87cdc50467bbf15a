//! A pipeline's step as CUDA graphs: one graph per slot (upload, the stages,
//! download), each replayed on its own lane stream, so the buffer rotation is
//! the choice of graph and consecutive batches overlap across lanes.

use crate::error::{Error, Result};
use crate::ids::BufferId;
use crate::stage::GpuPipelineStage;
use driver::{
    Context, DeviceBuffer, DeviceCopy, GraphArg, GraphExec, HostSlot, PinnedBuffer, Stream,
};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

/// Batches in flight, as in the eager pipeline.
const DEPTH: usize = 3;

/// What a capture needs from the manager.
pub(crate) struct GraphSpec<'a, T> {
    pub(crate) ctx: &'a Arc<Context>,
    /// Upload, compute and download streams (the capture's, not the lanes').
    pub(crate) streams: [&'a Arc<Stream>; 3],
    pub(crate) elements: usize,
    pub(crate) stages: Vec<&'a GpuPipelineStage>,
    /// Each input id with its current host data, per slot.
    pub(crate) inputs: Vec<Vec<(BufferId, &'a [T])>>,
    pub(crate) outputs: Vec<BufferId>,
}

struct SlotGraph<T> {
    exec: GraphExec,
    inputs: HashMap<BufferId, HostSlot<T>>,
    outputs: HashMap<BufferId, HostSlot<T>>,
}

/// The step of a [`crate::PipelineStageManager`] captured as CUDA graphs
/// ([`crate::PipelineStageManager::capture_graph`]): each step is one
/// replay, of slot `step % 3`'s graph on that slot's lane stream. A replay
/// uploads the slot's inputs, runs the stages in order and downloads the
/// outputs; one host launch replaces the step's copies, launches and events.
///
/// Inputs start as the manager's when captured; write new ones with
/// [`PipelineGraph::fill_input`] or [`PipelineGraph::input_mut`], read results
/// with [`PipelineGraph::output`]. Its element type `T` is the manager's.
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{AsyncCoordinator, GpuPipelineStage, PipelineStageManager};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
/// let cfg = LaunchConfig::for_num_elems(256);
/// let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, 256)?;
/// let stage = pipeline.add_stage(GpuPipelineStage::compute("c", compute, cfg, 1, 0, 1));
/// pipeline.set_inputs(vec![0]);
/// pipeline.set_order(vec![stage])?;
/// pipeline.fill_input(0, &[2.0; 256])?;
/// let mut graph = pipeline.capture_graph()?;
/// for _ in 0..6 {
///     graph.execute_iteration()?;
/// }
/// assert_eq!(graph.output(1)?, &[3.0; 256]); // compute(x, 1 step) = 1.5 x
/// graph.fill_input(0, &[4.0; 256])?;
/// graph.execute_iteration()?;
/// assert_eq!(graph.output(1)?, &[6.0; 256]);
/// # Ok(())
/// # }
/// ```
pub struct PipelineGraph<T: DeviceCopy = f32> {
    lanes: Vec<Arc<Stream>>,
    slots: Vec<SlotGraph<T>>,
    steps: u64,
    nodes: usize,
}

impl<T: DeviceCopy> PipelineGraph<T> {
    pub(crate) fn capture(spec: GraphSpec<'_, T>) -> Result<Self> {
        let [up, compute, down] = spec.streams;
        let mut slots = Vec::with_capacity(DEPTH);
        let mut nodes = 0;
        for slot_inputs in &spec.inputs {
            let ids: HashSet<BufferId> = spec
                .stages
                .iter()
                .flat_map(|stage| stage.buffers())
                .chain(slot_inputs.iter().map(|(id, _)| *id))
                .chain(spec.outputs.iter().copied())
                .collect();
            let device: HashMap<BufferId, Arc<DeviceBuffer<T>>> = ids
                .iter()
                .map(|&id| Ok((id, Arc::new(DeviceBuffer::new(spec.ctx, spec.elements)?))))
                .collect::<Result<_>>()?;
            let mut capture = up.begin_capture()?;
            capture.fork(up, &[compute, down])?;
            let mut inputs = HashMap::new();
            for &(id, data) in slot_inputs {
                let host = PinnedBuffer::from_slice(spec.ctx, data)?;
                inputs.insert(id, capture.upload_owned(up, &device[&id], host)?);
            }
            capture.join(compute, &[up])?;
            for stage in &spec.stages {
                let args = stage_args(stage, &device, spec.elements as u64);
                capture.launch(compute, &stage.kernel, stage.config, &args)?;
            }
            capture.join(down, &[compute])?;
            let mut outputs = HashMap::new();
            for &id in &spec.outputs {
                let host = PinnedBuffer::new(spec.ctx, spec.elements)?;
                outputs.insert(id, capture.download_owned(down, host, &device[&id])?);
            }
            capture.join(up, &[compute, down])?;
            nodes = capture.node_count();
            // The graph goes at once: its instance is then the only holder of
            // the host buffers, which `GraphExec::host` needs.
            let exec = capture.end()?.instantiate()?;
            slots.push(SlotGraph {
                exec,
                inputs,
                outputs,
            });
        }
        let lanes = (0..DEPTH)
            .map(|_| Stream::new(spec.ctx))
            .collect::<driver::Result<_>>()?;
        Ok(Self {
            lanes,
            slots,
            steps: 0,
            nodes,
        })
    }

    /// One step: replay the next slot's graph on its lane. Returns the slot.
    pub fn execute_iteration(&mut self) -> Result<usize> {
        let slot = (self.steps % DEPTH as u64) as usize;
        self.slots[slot].exec.launch(&self.lanes[slot])?;
        self.steps += 1;
        Ok(slot)
    }

    /// Write input `id` of every slot (each waits for the replays reading it).
    pub fn fill_input(&mut self, id: impl Into<BufferId>, data: &[T]) -> Result<()> {
        let id = id.into();
        for slot in 0..DEPTH {
            let input = self.input_of(slot, id)?;
            if input.len() != data.len() {
                return Err(Error::LengthMismatch {
                    operation: "PipelineGraph::fill_input",
                    device: input.len(),
                    host: data.len(),
                });
            }
            input.copy_from_slice(data);
        }
        Ok(())
    }

    /// Input `id` of the slot the next step replays, for writing the next
    /// batch into (waits for that slot's replays to finish reading it).
    pub fn input_mut(&mut self, id: impl Into<BufferId>) -> Result<&mut [T]> {
        let slot = (self.steps % DEPTH as u64) as usize;
        self.input_of(slot, id.into())
    }

    fn input_of(&mut self, slot: usize, id: BufferId) -> Result<&mut [T]> {
        let SlotGraph { exec, inputs, .. } = &mut self.slots[slot];
        let input = inputs.get(&id).ok_or(Error::NotAnInput { buffer: id })?;
        Ok(exec.host(input)?)
    }

    /// Output `id` of the latest step (waits for its replay).
    pub fn output(&mut self, id: impl Into<BufferId>) -> Result<&[T]> {
        let id = id.into();
        let slot = match self.steps {
            0 => {
                return Err(Error::InvalidConfig("no step has been replayed yet".into()));
            }
            steps => ((steps - 1) % DEPTH as u64) as usize,
        };
        let SlotGraph { exec, outputs, .. } = &mut self.slots[slot];
        let output = outputs.get(&id).ok_or(Error::NotAnOutput { buffer: id })?;
        Ok(exec.host(output)?)
    }

    /// Wait for every replay launched so far.
    pub fn synchronize(&self) -> Result<()> {
        for lane in &self.lanes {
            lane.synchronize()?;
        }
        Ok(())
    }

    /// Steps replayed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Nodes of one slot's graph (copies and launches).
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// The lane stream of each slot, in slot order.
    pub fn lanes(&self) -> &[Arc<Stream>] {
        &self.lanes
    }
}

impl<T: DeviceCopy> fmt::Debug for PipelineGraph<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineGraph")
            .field("steps", &self.steps)
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// A stage's arguments over one slot's buffers: a buffer the stage writes
/// and passes once is lent for writing, others for reading (as the eager
/// pipeline lends them).
fn stage_args<T: DeviceCopy>(
    stage: &GpuPipelineStage,
    device: &HashMap<BufferId, Arc<DeviceBuffer<T>>>,
    n: u64,
) -> Vec<GraphArg> {
    stage.kernel_args(n, |b| {
        if stage.output_buffers.contains(&b) && stage.passes(b) == 1 {
            GraphArg::write(&device[&b])
        } else {
            GraphArg::read(&device[&b])
        }
    })
}
