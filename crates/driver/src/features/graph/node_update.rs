//! Kernel nodes whose arguments an executable graph changes in place
//! (`cuGraphExecKernelNodeSetParams`): [`Capture::launch_updatable`] hands
//! back a [`KernelNode`], and [`GraphExec::set_args`] gives that node new
//! arguments for the replays launched after, with no capture and no
//! instantiation. Updating a whole graph from a new capture
//! ([`GraphExec::update`]) costs a capture of every node; this costs one
//! driver call per node changed.
//!
//! What the replays need alive and ordered: an instance keeps each node's
//! latest arguments (`NodeArgs`, in `node_args`) beside its graph's resources, and its
//! launches order the buffers of both. The arguments a node was captured
//! with stay in the graph's resources, so they stay kept and ordered too
//! (a replay is taken to still touch them) until the instance is updated
//! from another graph, which also forgets every argument set here.

use super::args::GraphArg;
use super::capture::Capture;
use super::condition_arg::check_conditions;
use super::exec::GraphExec;
use super::node_args::{KernelNode, kept_buffers, key};
use crate::features::kernel_arg::KernelArg;
use crate::features::launch_config::LaunchConfig;
use crate::features::launch_raw::with_kernel_params;
use crate::features::module::Kernel;
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use sys::CUDA_KERNEL_NODE_PARAMS;

/// The arguments a set takes without allocating.
const INLINE: usize = 8;

impl Capture {
    /// [`Capture::launch`], handing back the node, whose arguments an
    /// instance of the graph can then change in place
    /// ([`GraphExec::set_args`]). Refused in the body of a conditional node:
    /// CUDA sets the parameters of top-level kernel nodes only.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
    /// let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, 32)?);
    /// let mut capture = stream.begin_capture()?;
    /// let args = [GraphArg::from(32u64), 1u32.into(), GraphArg::write(&out)];
    /// let node = capture.launch_updatable(&stream, &fill, LaunchConfig::for_num_elems(32), &args)?;
    /// let mut exec = capture.end()?.instantiate()?;
    /// exec.launch(&stream)?;
    /// assert_eq!(out.to_vec(&stream)?, vec![1; 32]);
    ///
    /// // A new value for the next replays: no capture, no instantiation.
    /// exec.set_args(&node, &[GraphArg::from(32u64), 7u32.into(), GraphArg::write(&out)])?;
    /// exec.launch(&stream)?;
    /// assert_eq!(out.to_vec(&stream)?, vec![7; 32]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn launch_updatable(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
    ) -> Result<KernelNode> {
        if !self.owns_graph {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "capture {} is the body of a conditional node, whose kernel nodes CUDA cannot \
                     update one by one: capture the launch with Capture::launch, and update the \
                     graph with GraphExec::update",
                    self.id
                ),
            });
        }
        self.launch(stream, kernel, config, args)?;
        let function = stream.function_for(kernel)?;
        let raw = self.launch_just_captured(stream, kernel)?;
        self.resources.updatable = true;
        let captured = kept_buffers(args)
            .map(|(memory, write)| (key(memory), write))
            .collect();
        Ok(KernelNode {
            captured,
            raw,
            capture: self.id,
            position: self.nodes - 1,
            kernel: kernel.clone(),
            function,
            config,
            _partition: stream.partition().map(|p| p.keep_alive()),
        })
    }
}

impl Capture {
    /// The node of the launch of `kernel` just captured on `stream`: the
    /// one node later work on the stream depends on.
    pub(super) fn launch_just_captured(
        &self,
        stream: &Stream,
        kernel: &Kernel,
    ) -> Result<sys::CUgraphNode> {
        let (_, frontier) = self.capture_point(stream)?;
        match frontier[..] {
            [raw] => Ok(raw),
            _ => Err(Error::NodeUpdate {
                reason: format!(
                    "the launch of `{}` was captured, but the capture's frontier on stream {} is \
                     {} nodes, not the launch's one",
                    kernel.name(),
                    stream.id(),
                    frontier.len()
                ),
            }),
        }
    }
}

impl GraphExec {
    /// Give `node` the arguments `args` for the replays launched from now
    /// on (`cuGraphExecKernelNodeSetParams`), keeping its launch
    /// configuration: one driver call, no capture, no instantiation.
    /// Replays already launched keep the old arguments.
    ///
    /// `args` are checked against the kernel's signature as
    /// [`Capture::launch`] checks them; buffers must be of this graph's
    /// context. The instance keeps them alive, and its launches order them,
    /// until the node's next new arguments or an update from another graph.
    /// Refused, naming the node, for a node of another graph.
    pub fn set_args(&mut self, node: &KernelNode, args: &[GraphArg]) -> Result<()> {
        self.set_launch(node, node.config, args)
    }

    /// [`GraphExec::set_args`] with a new launch configuration too (a grid
    /// sized to a new problem size).
    pub fn set_launch(
        &mut self,
        node: &KernelNode,
        config: LaunchConfig,
        args: &[GraphArg],
    ) -> Result<()> {
        if node.capture != self.instantiated_from {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "kernel node {} (`{}`) was captured by capture {}, but this executable graph \
                     was instantiated from the graph of capture {}",
                    node.position,
                    node.kernel.name(),
                    node.capture,
                    self.instantiated_from
                ),
            });
        }
        config.validate()?;
        let ctx = &self.ctx;
        for (memory, _) in args.iter().filter_map(GraphArg::buffer) {
            ctx.check_context_id("a buffer", memory.as_use().use_context_id())?;
            if let Some(family) = memory.graph_family()
                && family != node.capture
            {
                return Err(Error::NodeUpdate {
                    reason: format!(
                        "the graph buffer at {:#x} belongs to the graph of capture {family}, not \
                         to that of kernel node {} (capture {})",
                        memory.ptr(),
                        node.position,
                        node.capture
                    ),
                });
            }
        }
        // Up to `INLINE` arguments on the stack: setting a node is the whole
        // point of avoiding a capture, so it allocates nothing it need not.
        let mut inline: [KernelArg<'_>; INLINE] = std::array::from_fn(|_| KernelArg::from(0u8));
        let mut spilled = Vec::new();
        let lent: &[KernelArg<'_>] = if args.len() <= INLINE {
            for (slot, arg) in inline.iter_mut().zip(args) {
                *slot = arg.arg();
            }
            &inline[..args.len()]
        } else {
            spilled.extend(args.iter().map(GraphArg::arg));
            &spilled
        };
        node.kernel.check_args(lent)?;
        // A condition means something only to the graph that made it.
        check_conditions(node.capture, &node.kernel, args)?;
        let (gx, gy, gz) = config.grid_dim;
        let (bx, by, bz) = config.block_dim;
        let node_params = |kernel_params| CUDA_KERNEL_NODE_PARAMS {
            func: node.function,
            gridDimX: gx,
            gridDimY: gy,
            gridDimZ: gz,
            blockDimX: bx,
            blockDimY: by,
            blockDimZ: bz,
            sharedMemBytes: config.shared_mem_bytes,
            kernelParams: kernel_params,
            ..Default::default()
        };
        ctx.bind()?;
        // SAFETY: a live executable graph instantiated from the graph that
        // holds `node` (checked above; the instance keeps that graph alive);
        // the function is the node's own, kept loaded by the node; every
        // argument matches the kernel's signature (checked above) and points
        // at a value inside `lent`, alive for the call (the driver copies
        // them); the buffers are kept alive below for every later replay.
        let code = with_kernel_params(lent, |kernel_params| unsafe {
            (ctx.driver().cuGraphExecKernelNodeSetParams)(
                self.raw,
                node.raw,
                &node_params(kernel_params),
            )
        });
        ctx.check(code)?;
        let captured_in_base = self.resources.capture == self.instantiated_from;
        self.node_args.replace(
            &self.resources.buffers,
            &self.resources.counts,
            node,
            args,
            captured_in_base,
        );
        Ok(())
    }
}
