//! Pipeline stages and the validation of their execution order.

use crate::error::{Error, Result};
use crate::ids::{BufferId, StageId};
use driver::{Kernel, LaunchConfig};
use petgraph::graphmap::DiGraphMap;
use std::collections::HashSet;

/// One argument of a stage's kernel.
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{GpuPipelineStage, StageArg};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
/// let cfg = LaunchConfig::for_num_elems(256);
/// let stage = GpuPipelineStage::compute("smooth", compute, cfg, 4, 0, 1);
/// // compute(n, iterations, x, y): the element count, a scalar, then buffers 0 and 1.
/// let expected = [StageArg::Len, StageArg::U32(4), StageArg::buffer(0), StageArg::buffer(1)];
/// assert_eq!(stage.args, expected);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StageArg {
    /// The pipeline's element count, as a `u64` (the `n` most kernels take).
    Len,
    /// A `u32` scalar.
    U32(u32),
    /// A `u64` scalar.
    U64(u64),
    /// An `f32` scalar.
    F32(f32),
    /// A pipeline buffer by id, passed as its device pointer (of the batch
    /// the stage is working on): a `T*` of the pipeline's element type `T`.
    /// It must be listed in `input_buffers` or `output_buffers`; listed in
    /// `output_buffers` it is passed writable.
    Buffer(BufferId),
}

impl StageArg {
    /// [`StageArg::Buffer`] of `id` (a [`BufferId`] or a plain index).
    pub fn buffer(id: impl Into<BufferId>) -> Self {
        Self::Buffer(id.into())
    }
}

/// One kernel launch in a pipeline: which buffers it reads and writes, the
/// kernel, its launch shape and its arguments.
///
/// Buffers are ids into the pipeline's buffers, each of the pipeline's
/// element count of its element type `T` (`f32` unless the
/// [`PipelineStageManager`](crate::PipelineStageManager) was made for another
/// type); every batch in flight has its own copy of each. The kernel's
/// buffer parameters are therefore `T*` (`float*` for `f32`, `unsigned int*`
/// for `u32`): `set_order` checks each stage's arguments against its
/// kernel's signature and refuses, naming the stage, a kernel that expects
/// another type.
///
/// Any kernel can be a stage; here `saxpy(n, a, x, y)` (`y = a x + y`)
/// updates buffer 1 in place:
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{AsyncCoordinator, BufferId, GpuPipelineStage, PipelineStageManager, StageArg};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let saxpy = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("saxpy")?;
/// let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, 32)?;
/// let stage = pipeline.add_stage(GpuPipelineStage {
///     name: "saxpy".into(),
///     input_buffers: vec![BufferId(0), BufferId(1)],
///     output_buffers: vec![BufferId(1)],
///     kernel: saxpy,
///     config: LaunchConfig::for_num_elems(32),
///     args: vec![StageArg::Len, StageArg::F32(2.0), StageArg::buffer(0), StageArg::buffer(1)],
/// });
/// pipeline.set_inputs(vec![0, 1]);
/// pipeline.set_order(vec![stage])?;
/// pipeline.fill_input(0, &[1.0; 32])?;
/// pipeline.fill_input(1, &[3.0; 32])?;
/// pipeline.execute_iteration()?;
/// pipeline.drain()?;
/// assert_eq!(pipeline.output(1)?, &[5.0; 32]); // 2 * 1 + 3
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct GpuPipelineStage {
    /// A name for messages and statistics.
    pub name: String,
    /// Buffers the kernel reads.
    pub input_buffers: Vec<BufferId>,
    /// Buffers the kernel writes.
    pub output_buffers: Vec<BufferId>,
    /// The kernel.
    pub kernel: Kernel,
    /// Grid and block shape.
    pub config: LaunchConfig,
    /// The kernel's arguments, in order.
    pub args: Vec<StageArg>,
}

impl GpuPipelineStage {
    /// `kernels::COMPUTE`'s `compute(n, iterations, x, y)` as a stage reading
    /// buffer `input` and writing buffer `output` (`f32` buffers: `x` and `y`
    /// are `float*`).
    pub fn compute(
        name: impl Into<String>,
        kernel: Kernel,
        config: LaunchConfig,
        iterations: u32,
        input: impl Into<BufferId>,
        output: impl Into<BufferId>,
    ) -> Self {
        let (input, output) = (input.into(), output.into());
        Self {
            name: name.into(),
            input_buffers: vec![input],
            output_buffers: vec![output],
            kernel,
            config,
            args: vec![
                StageArg::Len,
                StageArg::U32(iterations),
                StageArg::Buffer(input),
                StageArg::Buffer(output),
            ],
        }
    }

    /// A stage named `name` running `kernel` with launch shape `config`,
    /// its arguments given in order by name ([`StageBuilder`]), the
    /// positional [`compute`](Self::compute) and the struct literal's
    /// buffer lists following from them.
    ///
    /// ```
    /// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
    /// use cuda_streams_pipeline::{BufferId, GpuPipelineStage, StageArg};
    /// # fn main() -> cuda_streams_pipeline::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
    /// let cfg = LaunchConfig::for_num_elems(256);
    /// // compute(n, iterations, x, y): reads buffer 0, writes buffer 1.
    /// let stage = GpuPipelineStage::builder("smooth", compute.clone(), cfg)
    ///     .len()
    ///     .u32(4)
    ///     .reads(0)
    ///     .writes(1)
    ///     .build();
    /// let positional = GpuPipelineStage::compute("smooth", compute, cfg, 4, 0, 1);
    /// assert_eq!(stage.args, positional.args);
    /// assert_eq!((stage.input_buffers, stage.output_buffers), (vec![BufferId(0)], vec![BufferId(1)]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(name: impl Into<String>, kernel: Kernel, config: LaunchConfig) -> StageBuilder {
        StageBuilder {
            stage: Self {
                name: name.into(),
                input_buffers: Vec::new(),
                output_buffers: Vec::new(),
                kernel,
                config,
                args: Vec::new(),
            },
        }
    }

    /// The arguments for `n` elements (a launch's `KernelArg`s or a
    /// graph's `GraphArg`s), scalars from the stage and each buffer argument
    /// from `buffer` (called once per buffer argument, in order).
    pub(crate) fn kernel_args<A>(&self, n: u64, mut buffer: impl FnMut(BufferId) -> A) -> Vec<A>
    where
        A: From<u64> + From<u32> + From<f32>,
    {
        self.args
            .iter()
            .map(|arg| match *arg {
                StageArg::Len => n.into(),
                StageArg::U32(v) => v.into(),
                StageArg::U64(v) => v.into(),
                StageArg::F32(v) => v.into(),
                StageArg::Buffer(b) => buffer(b),
            })
            .collect()
    }

    /// How many times `buffer` is passed to the kernel.
    pub(crate) fn passes(&self, buffer: BufferId) -> usize {
        self.args
            .iter()
            .filter(|a| **a == StageArg::Buffer(buffer))
            .count()
    }

    /// Every buffer id the stage names.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = BufferId> + '_ {
        self.input_buffers
            .iter()
            .chain(&self.output_buffers)
            .copied()
    }
}

/// A [`GpuPipelineStage`] being described, argument by argument, from
/// [`GpuPipelineStage::builder`]. A buffer argument says how the kernel uses
/// it (`reads`, `writes`, `updates`), which fills the stage's buffer lists.
#[derive(Clone, Debug)]
#[must_use = "a stage builder does nothing until `build`"]
pub struct StageBuilder {
    stage: GpuPipelineStage,
}

impl StageBuilder {
    fn arg(mut self, arg: StageArg) -> Self {
        self.stage.args.push(arg);
        self
    }

    /// The pipeline's element count, as a `u64` ([`StageArg::Len`]).
    pub fn len(self) -> Self {
        self.arg(StageArg::Len)
    }

    /// A `u32` scalar.
    pub fn u32(self, value: u32) -> Self {
        self.arg(StageArg::U32(value))
    }

    /// A `u64` scalar.
    pub fn u64(self, value: u64) -> Self {
        self.arg(StageArg::U64(value))
    }

    /// An `f32` scalar.
    pub fn f32(self, value: f32) -> Self {
        self.arg(StageArg::F32(value))
    }

    /// A buffer the kernel only reads.
    pub fn reads(mut self, buffer: impl Into<BufferId>) -> Self {
        let buffer = buffer.into();
        push_once(&mut self.stage.input_buffers, buffer);
        self.arg(StageArg::Buffer(buffer))
    }

    /// A buffer the kernel writes without reading it first.
    pub fn writes(mut self, buffer: impl Into<BufferId>) -> Self {
        let buffer = buffer.into();
        push_once(&mut self.stage.output_buffers, buffer);
        self.arg(StageArg::Buffer(buffer))
    }

    /// A buffer the kernel reads and rewrites in place.
    pub fn updates(mut self, buffer: impl Into<BufferId>) -> Self {
        let buffer = buffer.into();
        push_once(&mut self.stage.input_buffers, buffer);
        push_once(&mut self.stage.output_buffers, buffer);
        self.arg(StageArg::Buffer(buffer))
    }

    /// The stage.
    pub fn build(self) -> GpuPipelineStage {
        self.stage
    }
}

fn push_once(list: &mut Vec<BufferId>, buffer: BufferId) {
    if !list.contains(&buffer) {
        list.push(buffer);
    }
}

/// Check an execution order: indices exist and appear once, the stages'
/// data flow has no cycle, each stage reads only pipeline `inputs` or
/// buffers an earlier stage wrote, and kernel buffer arguments are declared.
pub(crate) fn validate_order(
    stages: &[GpuPipelineStage],
    order: &[StageId],
    inputs: &[BufferId],
) -> Result<()> {
    let mut seen = HashSet::new();
    for &id in order {
        let stage = stages.get(id.0).ok_or(Error::UnknownStage {
            stage: id,
            stages: stages.len(),
        })?;
        if !seen.insert(id) {
            return Err(Error::DuplicateStage {
                stage: id,
                name: stage.name.clone(),
            });
        }
        for arg in &stage.args {
            if let StageArg::Buffer(buffer) = *arg
                && !stage.buffers().any(|b| b == buffer)
            {
                return Err(Error::UndeclaredBuffer {
                    stage: id,
                    name: stage.name.clone(),
                    buffer,
                });
            }
        }
    }
    check_cycles(stages, order)?;
    let mut written: HashSet<BufferId> = inputs.iter().copied().collect();
    for &id in order {
        let stage = &stages[id.0];
        if let Some(&buffer) = stage.input_buffers.iter().find(|b| !written.contains(b)) {
            return Err(Error::ReadBeforeWrite {
                stage: id,
                name: stage.name.clone(),
                buffer,
            });
        }
        written.extend(stage.output_buffers.iter().copied());
    }
    Ok(())
}

/// Stage `w` feeds stage `r` when `r` reads a buffer `w` writes. A stage that
/// rewrites a buffer it reads (in place) is not fed by the other writers of
/// that buffer, so sequential in-place stages do not count as a cycle.
fn check_cycles(stages: &[GpuPipelineStage], order: &[StageId]) -> Result<()> {
    // Nodes are stages; an edge w -> r means "w feeds r". Each edge is
    // checked as it is added, by the workspace's one cycle check.
    let mut graph = DiGraphMap::<StageId, (), std::hash::RandomState>::default();
    for &stage in order {
        graph.add_node(stage);
    }
    for &r in order {
        for &w in order.iter().filter(|&&w| w != r) {
            let (reader, writer) = (&stages[r.0], &stages[w.0]);
            let feeds = reader
                .input_buffers
                .iter()
                .any(|b| writer.output_buffers.contains(b) && !reader.output_buffers.contains(b));
            if !feeds {
                continue;
            }
            if let Some(cycle) = engine::cycle::closes_cycle(&graph, w, r) {
                return Err(Error::StageCycle {
                    cycle: engine::cycle::describe(&engine::cycle::from_least(&cycle), |i| {
                        format!("{} {:?}", i.0, stages[i.0].name)
                    }),
                });
            }
            graph.add_edge(w, r, ());
        }
    }
    Ok(())
}
