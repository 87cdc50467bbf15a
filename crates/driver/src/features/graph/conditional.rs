//! Conditional nodes: work a graph repeats while ([`Capture::while_loop`])
//! or runs if ([`Capture::if_then`], [`Capture::if_else`]) a [`Condition`]
//! holds, or picks by its value ([`Capture::switch`]), which kernels of
//! the graph set on the device (`cudaGraphSetConditional`; on the software
//! driver, the twin calls `cuda_streams_soft_driver::set_conditional`).
//!
//! A body is captured with the same builder as any other work: the closure
//! gets a [`Capture`] whose origin is a stream of the driver's own, and
//! whatever it captures (its buffers, its kernels) is kept alive by the
//! top-level graph. A body may hold kernels, copies and memsets; a host
//! callback or work of another crate ([`Capture::record_external`], an NCCL
//! collective, which NCCL cannot instantiate in a body) is refused.

use super::args::GraphArg;
use super::capture::Capture;
use crate::enqueue::order::{CaptureOrder, Touch, Touches};
use crate::enqueue::protocol::Use;
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use std::collections::HashSet;
use std::sync::{Arc, MutexGuard};
use sys::{
    CU_GRAPH_COND_ASSIGN_DEFAULT, CUDA_CONDITIONAL_NODE_PARAMS, CUgraph,
    CUgraphConditionalNodeType, CUgraphNode, CUgraphNodeParams, CUgraphNodeType,
    CUstreamCaptureStatus, CUstreamUpdateCaptureDependencies_flags,
};

/// The first driver version with conditional nodes (CUDA 12.4).
pub const CONDITIONAL_DRIVER_VERSION: i32 = 12040;

/// The first driver version with IF nodes of two bodies and SWITCH nodes
/// (CUDA 12.8).
pub const MULTI_BODY_DRIVER_VERSION: i32 = 12080;

/// A condition of a captured graph: 32 bits a kernel of the graph sets on
/// the device, which a conditional node reads. It takes its default at the
/// start of every launch of the graph. Valid in the capture that made it
/// ([`Capture::condition`]) and in the bodies of its conditional nodes; a
/// conditional node of another capture refuses it.
///
/// A condition serves one conditional node: CUDA refuses to instantiate a
/// graph where two nodes share one (`CUDA_ERROR_INVALID_VALUE`), so a second
/// [`Capture::while_loop`] or [`Capture::if_then`] on it is refused. Make
/// one condition per node.
///
/// A kernel receives it as an argument ([`Condition::arg`], a
/// `cudaGraphConditionalHandle`, 8 bytes) for a parameter declared as a
/// condition ([`Param::Condition`](sys::signature::Param::Condition),
/// `handle: Condition` in [`kernel!`](crate::kernel!)), never for a `u64`.
/// Only a launch captured in its graph's capture (or a body of it) may
/// take it: a launch on a stream, or in another capture, is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Condition {
    pub(super) raw: u64,
    pub(super) family: u64,
}

impl Condition {
    /// The driver's handle (`CUgraphConditionalHandle`).
    pub fn raw(&self) -> u64 {
        self.raw
    }

    /// The condition as a captured launch's argument, for a parameter
    /// declared as a condition (the same as `GraphArg::from(condition)`).
    pub fn arg(&self) -> GraphArg {
        GraphArg::from(*self)
    }
}

impl Capture {
    /// A new condition of this capture's graph, `default` at the start of
    /// each launch. Fails on a driver older than CUDA 12.4, naming its
    /// version.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// // ++counter, and the condition is whether it is still below the limit.
    /// let count = Module::load(&ctx, &kernels::SOLVER)?.function("count_while_below")?;
    /// let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1)?);
    /// let mut capture = stream.begin_capture()?;
    /// capture.memset_u8(&stream, &counter, 0)?;
    /// let more = capture.condition(&stream, 1)?;
    /// capture.while_loop(&stream, more, |body| {
    ///     let origin = Arc::clone(body.origin());
    ///     let args = [GraphArg::write(&counter), 3u32.into(), more.arg()];
    ///     body.launch(&origin, &count, LaunchConfig::for_num_elems(1), &args)
    /// })?;
    /// let exec = capture.end()?.instantiate()?;
    /// exec.launch(&stream)?;
    /// exec.launch(&stream)?; // the condition is 1 again at each launch
    /// assert_eq!(counter.to_vec(&stream)?, [3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn condition(&mut self, stream: &Stream, default: u32) -> Result<Condition> {
        self.check_member(stream)?;
        let ctx = stream.context();
        ctx.bind()?;
        let mut version = 0;
        // SAFETY: a valid out-pointer.
        ctx.check(unsafe { (ctx.driver().cuDriverGetVersion)(&mut version) })?;
        if version < CONDITIONAL_DRIVER_VERSION {
            return Err(Error::Conditional {
                reason: format!(
                    "the driver is CUDA {}.{}; conditional nodes need CUDA 12.4 or later",
                    version / 1000,
                    version % 1000 / 10
                ),
            });
        }
        let (graph, _) = self.capture_point(stream)?;
        let mut raw = 0;
        // SAFETY: the graph under capture, the current context, a valid
        // out-pointer.
        ctx.check(unsafe {
            (ctx.driver().cuGraphConditionalHandleCreate)(
                &mut raw,
                graph,
                ctx.as_raw(),
                default,
                CU_GRAPH_COND_ASSIGN_DEFAULT,
            )
        })?;
        Ok(Condition {
            raw,
            family: self.family,
        })
    }

    /// Capture on `stream` a node that runs `body` again and again while
    /// `condition` is not 0 (it is read before each turn, so a body may run
    /// no time at all). A kernel in the body (or before the node) sets it.
    pub fn while_loop(
        &mut self,
        stream: &Stream,
        condition: Condition,
        body: impl FnOnce(&mut Capture) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE;
        let mut body = Some(body);
        self.conditional(stream, condition, kind, 1, |_, capture| {
            body.take().map_or(Ok(()), |body| body(capture))
        })
    }

    /// Capture on `stream` a node that runs `body` once if `condition` is
    /// not 0 when the node is reached.
    pub fn if_then(
        &mut self,
        stream: &Stream,
        condition: Condition,
        body: impl FnOnce(&mut Capture) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF;
        let mut body = Some(body);
        self.conditional(stream, condition, kind, 1, |_, capture| {
            body.take().map_or(Ok(()), |body| body(capture))
        })
    }

    /// Capture on `stream` a node that runs `then` once if `condition` is
    /// not 0 when the node is reached, and `otherwise` once if it is 0
    /// (an IF node of two bodies). CUDA 12.8 or later: an older driver is
    /// refused with [`Error::Conditional`] naming its version.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
    /// let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1)?);
    /// let mut capture = stream.begin_capture()?;
    /// // No kernel sets it: the condition is its default, 0, at each launch.
    /// let cond = capture.condition(&stream, 0)?;
    /// let fill_with = |value: u32| {
    ///     let (out, fill) = (&out, &fill);
    ///     move |body: &mut cuda_streams_driver::Capture| {
    ///         let origin = Arc::clone(body.origin());
    ///         let args = [1u64.into(), value.into(), GraphArg::write(out)];
    ///         body.launch(&origin, fill, LaunchConfig::for_num_elems(1), &args)
    ///     }
    /// };
    /// capture.if_else(&stream, cond, fill_with(1), fill_with(2))?;
    /// capture.end()?.instantiate()?.launch(&stream)?;
    /// assert_eq!(out.to_vec(&stream)?, [2]); // the `otherwise` body ran
    /// # Ok(())
    /// # }
    /// ```
    pub fn if_else(
        &mut self,
        stream: &Stream,
        condition: Condition,
        then: impl FnOnce(&mut Capture) -> Result<()>,
        otherwise: impl FnOnce(&mut Capture) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF;
        let (mut then, mut otherwise) = (Some(then), Some(otherwise));
        self.conditional(stream, condition, kind, 2, |index, capture| match index {
            0 => then.take().map_or(Ok(()), |body| body(capture)),
            _ => otherwise.take().map_or(Ok(()), |body| body(capture)),
        })
    }

    /// Capture on `stream` a node of `cases` bodies that runs body `n` once
    /// when `condition` is `n` when the node is reached, and none when it is
    /// `cases` or more (a SWITCH node). `body(n, capture)` captures body
    /// `n`, for `n` in `0..cases`, in order. CUDA 12.8 or later: an older
    /// driver is refused with [`Error::Conditional`] naming its version, as
    /// are no cases at all.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
    /// let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1)?);
    /// let mut capture = stream.begin_capture()?;
    /// let choice = capture.condition(&stream, 2)?; // 2 at each launch
    /// capture.switch(&stream, choice, 4, |case, body| {
    ///     let origin = Arc::clone(body.origin());
    ///     let args = [1u64.into(), (10 + case).into(), GraphArg::write(&out)];
    ///     body.launch(&origin, &fill, LaunchConfig::for_num_elems(1), &args)
    /// })?;
    /// capture.end()?.instantiate()?.launch(&stream)?;
    /// assert_eq!(out.to_vec(&stream)?, [12]); // case 2 ran
    /// # Ok(())
    /// # }
    /// ```
    pub fn switch(
        &mut self,
        stream: &Stream,
        condition: Condition,
        cases: u32,
        mut body: impl FnMut(u32, &mut Capture) -> Result<()>,
    ) -> Result<()> {
        if cases == 0 {
            return Err(Error::Conditional {
                reason: format!(
                    "a SWITCH node on condition {:#x} needs at least one case, not 0",
                    condition.raw
                ),
            });
        }
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH;
        self.conditional(stream, condition, kind, cases, |index, capture| {
            body(index, capture)
        })
    }

    /// The conditions of this capture's family that have their node (a
    /// poisoned lock still holds a valid set: each change is one insert).
    fn conditioned_lock(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.conditioned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The graph under capture on `stream` and the nodes its next work
    /// depends on.
    pub(super) fn capture_point(&self, stream: &Stream) -> Result<(CUgraph, Vec<CUgraphNode>)> {
        let ctx = stream.context();
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut graph, mut deps, mut count) = (std::ptr::null_mut(), std::ptr::null(), 0);
        // SAFETY: a live stream taking part in this capture; valid
        // out-pointers (the id and edge data are not asked for).
        ctx.check(unsafe {
            (ctx.driver().cuStreamGetCaptureInfo)(
                stream.as_raw(),
                &mut status,
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                std::ptr::null_mut(),
                &mut count,
            )
        })?;
        let deps = if count == 0 || deps.is_null() {
            Vec::new()
        } else {
            // SAFETY: the driver's array of `count` nodes, valid until the
            // next call on the stream; copied now.
            unsafe { std::slice::from_raw_parts(deps, count) }.to_vec()
        };
        Ok((graph, deps))
    }

    /// Capture a conditional node of `kind` with `bodies` bodies, body `i`
    /// captured by `body(i, ..)`.
    fn conditional(
        &mut self,
        stream: &Stream,
        condition: Condition,
        kind: CUgraphConditionalNodeType,
        bodies: u32,
        mut body: impl FnMut(u32, &mut Capture) -> Result<()>,
    ) -> Result<()> {
        self.check_member(stream)?;
        self.check_family(condition, "the node")?;
        if self.conditioned_lock().contains(&condition.raw) {
            return Err(Error::Conditional {
                reason: format!(
                    "condition {:#x} already has its conditional node; CUDA refuses a graph \
                     where one condition serves two nodes, so make a condition per node",
                    condition.raw
                ),
            });
        }
        let ctx = stream.context();
        ctx.bind()?;
        if bodies > 1 || kind == CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH {
            let mut version = 0;
            // SAFETY: a valid out-pointer.
            ctx.check(unsafe { (ctx.driver().cuDriverGetVersion)(&mut version) })?;
            if version < MULTI_BODY_DRIVER_VERSION {
                return Err(Error::Conditional {
                    reason: format!(
                        "the driver is CUDA {}.{}; IF nodes with an else body and SWITCH \
                         nodes need CUDA 12.8 or later",
                        version / 1000,
                        version % 1000 / 10
                    ),
                });
            }
        }
        let (graph, deps) = self.capture_point(stream)?;
        let mut params = CUgraphNodeParams {
            type_: CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL,
            ..Default::default()
        };
        params.__bindgen_anon_1.conditional = CUDA_CONDITIONAL_NODE_PARAMS {
            handle: condition.raw,
            type_: kind,
            size: bodies,
            phGraph_out: std::ptr::null_mut(),
            ctx: ctx.as_raw(),
        };
        let mut node = std::ptr::null_mut();
        // SAFETY: the graph under capture and its nodes `deps`; parameters
        // of a conditional node with one body.
        ctx.check(unsafe {
            (ctx.driver().cuGraphAddNode)(
                &mut node,
                graph,
                deps.as_ptr(),
                std::ptr::null(),
                deps.len(),
                &mut params,
            )
        })?;
        self.conditioned_lock().insert(condition.raw);
        // SAFETY: the node's driver-owned array of `bodies` body graphs,
        // copied now.
        let body_graphs: Vec<CUgraph> = unsafe {
            std::slice::from_raw_parts(
                params.__bindgen_anon_1.conditional.phGraph_out,
                bodies as usize,
            )
        }
        .to_vec();
        // SAFETY: a node of the graph under capture on `stream`.
        ctx.check(unsafe {
            (ctx.driver().cuStreamUpdateCaptureDependencies)(
                stream.as_raw(),
                &mut node,
                std::ptr::null(),
                1,
                CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES.0,
            )
        })?;
        // Each body: a capture of its own into its body graph, on a stream
        // of its own (a stream takes part in one capture at a time).
        for (index, body_graph) in (0..bodies).zip(body_graphs) {
            let captured = Stream::new(ctx).and_then(|body_stream: Arc<Stream>| {
                let mut inner = body_stream.begin_capture_into(Some((body_graph, self.family)))?;
                inner.conditioned = Arc::clone(&self.conditioned);
                body(index, &mut inner).and_then(|()| self.adopt_body(stream, &mut inner))
            });
            if let Err(err) = captured {
                // The node is in the graph with part of its bodies: the
                // whole capture is void.
                self.discard();
                return Err(err);
            }
        }
        Ok(())
    }

    /// Check the node just placed on `stream` (the stream's only capture
    /// dependency) within the graph's order. Under `Auto` the check repairs
    /// a race with a wait captured on `stream`, which comes after the node:
    /// the nodes that wait brought in become the node's own dependencies.
    fn check_placed(
        &self,
        order: &mut CaptureOrder,
        stream: &Stream,
        touches: &[Touch],
    ) -> Result<()> {
        let (graph, placed) = self.capture_point(stream)?;
        let races = order.check(stream, "conditional node", touches)?;
        let (_, now) = self.capture_point(stream)?;
        let waited: Vec<CUgraphNode> = now.into_iter().filter(|n| !placed.contains(n)).collect();
        if !waited.is_empty() {
            let ctx = stream.context();
            for node in &placed {
                let to = vec![*node; waited.len()];
                // SAFETY: the graph under capture, nodes of it; the node
                // was added after every node in `waited`, so no cycle.
                ctx.check(unsafe {
                    (ctx.driver().cuGraphAddDependencies)(
                        graph,
                        waited.as_ptr(),
                        to.as_ptr(),
                        std::ptr::null(),
                        waited.len(),
                    )
                })?;
            }
            let mut placed = placed;
            // SAFETY: nodes of the graph under capture on `stream`; the
            // next work depends on the node alone again, as it does on
            // what the node now follows.
            ctx.check(unsafe {
                (ctx.driver().cuStreamUpdateCaptureDependencies)(
                    stream.as_raw(),
                    placed.as_mut_ptr(),
                    std::ptr::null(),
                    placed.len(),
                    CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES.0,
                )
            })?;
        }
        order.record(stream, "conditional node", touches, races);
        Ok(())
    }

    /// End the body capture `inner` and take over what it keeps alive;
    /// refuses what a body may not hold.
    fn adopt_body(&mut self, stream: &Stream, inner: &mut Capture) -> Result<()> {
        if !inner.callbacks.is_empty() {
            return Err(Error::Conditional {
                reason: "a body captured a host callback, which CUDA does not allow in one"
                    .to_owned(),
            });
        }
        if !inner.resources.external.is_empty() {
            return Err(Error::Conditional {
                reason: "a body captured work of another crate (Capture::record_external, an \
                         NCCL collective): NCCL cannot instantiate it in a conditional body"
                    .to_owned(),
            });
        }
        inner.end_body()?;
        let resources = std::mem::take(&mut inner.resources);
        let touches: Touches = resources
            .buffers
            .iter()
            .map(|(memory, writable)| Use::Device(memory.as_use(), *writable).touch())
            .collect();
        // The node touches what its body touches, checked within the
        // graph's order like any other node (after it is in the graph, as
        // for `record_external`).
        if let Some(mut order) = self.order.take() {
            let checked = self.check_placed(&mut order, stream, &touches);
            self.order = Some(order);
            checked?;
        }
        for (memory, writable) in &resources.buffers {
            self.resources.add_buffer(memory, *writable);
        }
        for (host, writable) in resources.hosts {
            self.resources.add_host(host, writable);
        }
        for kernel in &resources.kernels {
            self.resources.add_kernel(kernel);
        }
        self.worked_on(stream);
        self.nodes += inner.nodes;
        Ok(())
    }
}
