//! [`Graph`] (a finished capture) and [`GraphExec`] (an executable instance
//! of it): instantiate, launch, upload, update in place, and the host
//! buffers a graph owns.

use super::args::{HostSlot, Resources};
use super::device_sets::DeviceSets;
use super::node_args::NodeArgs;
use crate::enqueue::protocol::{Pending, Use, Work};
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::memory::{DeviceCopy, PinnedBuffer};
use crate::objects::stream::Stream;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use sys::{CUgraph, CUgraphExec, CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo, CUresult};

/// A captured graph: instantiate it to replay it ([`Graph::instantiate`]).
/// It keeps alive the buffers, kernels and callbacks its nodes use.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let buf = Arc::new(DeviceBuffer::<u32>::new(&ctx, 64)?);
/// let mut capture = stream.begin_capture()?;
/// capture.memset_u8(&stream, &buf, 0xff)?;
/// let graph = capture.end()?;
/// assert_eq!(graph.node_count(), 1);
/// assert_eq!(Arc::strong_count(&buf), 2, "the graph keeps the buffer");
/// let (first, second) = (graph.instantiate()?, graph.instantiate()?);
/// first.launch(&stream)?;
/// second.launch(&stream)?;
/// assert_eq!(buf.to_vec(&stream)?, vec![u32::MAX; 64]);
/// # Ok(())
/// # }
/// ```
pub struct Graph {
    pub(super) ctx: Arc<Context>,
    pub(super) raw: CUgraph,
    /// CUDA graph objects are not synchronized internally: calls that read
    /// this one (instantiate, update from it) take turns under this lock,
    /// which also holds what instantiating must know of earlier instances.
    pub(super) turns: Mutex<Instances>,
    pub(super) resources: Arc<Resources>,
    pub(super) nodes: usize,
    /// Destroys `raw` once the graph and the instances that name its nodes
    /// ([`KernelNode`](super::KernelNode)) are gone.
    pub(super) owner: Arc<GraphOwner>,
}

/// The driver's graph object, destroyed with the last holder.
pub(super) struct GraphOwner {
    pub(super) ctx: Arc<Context>,
    pub(super) raw: CUgraph,
}

// SAFETY: a graph handle may be destroyed from any thread; nothing else is
// done with it here.
unsafe impl Send for GraphOwner {}
// SAFETY: as above; shared, it is only held.
unsafe impl Sync for GraphOwner {}

impl Drop for GraphOwner {
    fn drop(&mut self) {
        let raw = self.raw;
        self.ctx
            .release_in_drop(format_args!("graph {raw:p}"), "destroying", |driver| {
                // SAFETY: the graph is owned by `self` and destroyed once.
                unsafe { (driver.cuGraphDestroy)(raw) }
            });
    }
}

// SAFETY: a graph handle may be used from any thread; the resources are
// `Send + Sync` (buffers, kernels, `Fn + Send + Sync` callbacks).
unsafe impl Send for Graph {}
// SAFETY: as above; the driver calls that read the graph take turns (`lock`).
unsafe impl Sync for Graph {}

/// What a [`Graph`] knows of its instances, under its lock.
#[derive(Default)]
pub(super) struct Instances {
    /// The live instance's token while it has one and memory nodes: CUDA
    /// allows one instance at a time of such a graph.
    live: Weak<()>,
    /// Whether it has been instantiated: CUDA instantiates a graph with
    /// device-updatable nodes once.
    made: bool,
}

impl Graph {
    /// An executable instance (`cuGraphInstantiate`).
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.instantiate_held(None)
    }

    /// An executable instance whose launches, when `held_to` is given, are
    /// refused on any other stream (see `memory_share`).
    pub(super) fn instantiate_held(&self, held_to: Option<Arc<Stream>>) -> Result<GraphExec> {
        self.ctx.bind()?;
        let mut instances = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        if self.resources.device_updatable && instances.made {
            return Err(Error::NodeUpdate {
                reason: format!(
                    "graph {:p} has device-updatable kernel nodes, and CUDA instantiates such a \
                     graph once: it already was",
                    self.raw
                ),
            });
        }
        let device_sets = match self.resources.device_updatable {
            true => Some(DeviceSets::new(&self.ctx)?),
            false => None,
        };
        let token = if self.resources.graph_memory_bytes > 0 {
            if instances.live.strong_count() > 0 {
                return Err(Error::GraphMemory {
                    reason: format!(
                        "graph {:p} has memory nodes, and CUDA allows one executable instance \
                         of such a graph at a time: drop the other GraphExec first",
                        self.raw
                    ),
                });
            }
            let token = Arc::new(());
            instances.live = Arc::downgrade(&token);
            Some(token)
        } else {
            None
        };
        let mut raw: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live graph; valid out-pointer.
        let code = unsafe { (self.ctx.driver().cuGraphInstantiate)(&mut raw, self.raw, 0) };
        self.ctx.check(code)?;
        instances.made = true;
        Ok(GraphExec {
            ctx: Arc::clone(&self.ctx),
            raw,
            resources: Arc::clone(&self.resources),
            nodes: self.nodes,
            launched_on: Mutex::new(Vec::new()),
            held_to,
            _instance: token,
            instantiated_from: self.resources.capture,
            node_args: NodeArgs::default(),
            _graph: self.resources.updatable.then(|| Arc::clone(&self.owner)),
            device_sets,
        })
    }

    /// The nodes captured.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// The bytes its memory nodes allocate at every replay
    /// ([`Capture::graph_buffer`](super::Capture::graph_buffer)); 0 without any.
    pub fn graph_memory_bytes(&self) -> usize {
        self.resources.graph_memory_bytes
    }

    /// The raw handle (it stays owned by this `Graph`).
    pub fn as_raw(&self) -> CUgraph {
        self.raw
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("raw", &self.raw)
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// An executable graph: launch it on any stream of its context, as often as
/// needed ([`GraphExec::launch`]); update it in place from a graph of the
/// same shape ([`GraphExec::update`]).
///
/// It keeps the resources of its graph alive: buffers until the last replay
/// has passed them (through their use trackers), callbacks until every
/// stream it was launched on has passed its last replay.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_u32")?;
/// let out = Arc::new(DeviceBuffer::<u32>::new(&ctx, 32)?);
/// let capture_fill = |value: u32| {
///     let mut capture = stream.begin_capture()?;
///     let args = [GraphArg::from(32u64), value.into(), GraphArg::write(&out)];
///     capture.launch(&stream, &fill, LaunchConfig::for_num_elems(32), &args)?;
///     capture.end()
/// };
/// let mut exec = capture_fill(1)?.instantiate()?;
/// exec.launch(&stream)?;
/// assert_eq!(out.to_vec(&stream)?, vec![1; 32]);
/// exec.update(&capture_fill(2)?)?; // same shape, new argument: no new instance
/// exec.launch(&stream)?;
/// assert_eq!(out.to_vec(&stream)?, vec![2; 32]);
/// # Ok(())
/// # }
/// ```
pub struct GraphExec {
    pub(super) ctx: Arc<Context>,
    pub(super) raw: CUgraphExec,
    pub(super) resources: Arc<Resources>,
    nodes: usize,
    /// Streams it was launched on (callbacks are released after them). Held
    /// across each launch, so launches of one instance take turns.
    launched_on: Mutex<Vec<Arc<Stream>>>,
    /// The one stream it may be launched on, when its graph shares memory
    /// ([`GraphMemoryShare`](super::GraphMemoryShare)).
    held_to: Option<Arc<Stream>>,
    /// Held while it lives, for a graph with memory nodes (`Graph::instance`).
    _instance: Option<Arc<()>>,
    /// The capture whose graph it was instantiated from: the graph whose
    /// kernel nodes it can set ([`GraphExec::set_args`]).
    pub(super) instantiated_from: u64,
    /// The arguments set node by node since instantiation or the last update.
    pub(super) node_args: NodeArgs,
    /// That graph, kept while its nodes can be named, when it has any.
    _graph: Option<Arc<GraphOwner>>,
    /// For a graph with device-updatable nodes: what the device-side sets
    /// need (`device_sets.rs`).
    pub(super) device_sets: Option<DeviceSets>,
}

// SAFETY: an executable graph handle may be used from any thread; launches
// and uploads take turns (`launched_on`'s lock), `update` needs `&mut`.
unsafe impl Send for GraphExec {}
// SAFETY: as above.
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Enqueue one replay of the graph on `stream` (`cuGraphLaunch`): it
    /// runs after the work enqueued on `stream` before, and the work
    /// enqueued after waits for all of it.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // One operation with the graph's whole access set; a profiler scope
        // around it is one scope, the whole replay.
        let pending = self.prepare(stream, Work::GraphLaunch(self.nodes))?;
        pending.call(|driver, raw| {
            let mut launched = self.launched_on.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: a live executable graph and a live stream of its
            // context; its buffers are alive (held by `resources`) and
            // ordered after their allocations on `stream` (prepared).
            let code = unsafe { (driver.cuGraphLaunch)(self.raw, raw) };
            if code == CUresult::CUDA_SUCCESS
                && !self.resources.callbacks.is_empty()
                && !launched.iter().any(|s| s.id() == stream.id())
            {
                launched.push(stream.to_arc());
            }
            code
        })
    }

    /// Upload the graph to the device ahead of its first launch
    /// (`cuGraphUpload`), in stream order on `stream`, so the first launch
    /// costs no more than later ones.
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        // An upload runs none of the graph's work: nothing for the tracker.
        let pending = self.prepare(stream, Work::GraphUpload)?;
        pending.call(|driver, raw| {
            let _turn = self.launched_on.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: a live executable graph and a live stream of its context.
            unsafe { (driver.cuGraphUpload)(self.raw, raw) }
        })
    }

    /// The enqueue protocol's graph case, up to the driver call: the graph
    /// and its buffers checked against `stream`, the stream ordered after
    /// the buffers' allocations, and (for a launch) one step with the
    /// graph's whole access set. Launches of one instance take turns
    /// (`launched_on`, held across the driver call).
    fn prepare<'s>(
        &'s self,
        stream: &'s Stream,
        work: Work,
    ) -> Result<Pending<'s, impl IntoIterator<Item = Use<'s>> + Clone + 's>> {
        // Launched into a capture it would become a child graph, whose
        // resources nothing would keep: the protocol's gate refuses that.
        stream.check_context("the executable graph", &self.ctx)?;
        if let Some(held) = &self.held_to
            && held.id() != stream.id()
        {
            return Err(Error::GraphMemory {
                reason: format!(
                    "the executable graph shares its memory with the other graphs of a \
                     GraphMemoryShare, whose launches are held to stream {} so that they never \
                     run at once: launch it there, not on stream {}",
                    held.id(),
                    stream.id()
                ),
            });
        }
        let devices = self.node_args.uses(&self.resources.buffers);
        let hosts = self.resources.hosts.iter();
        let token = self.device_sets.iter().map(|sets| &sets.token);
        let uses = devices
            .map(|(memory, write)| Use::Device(memory.as_use(), write))
            .chain(token.map(|token| Use::Device(token, false)))
            .chain(hosts.map(|(memory, write)| Use::Host(memory.as_host(), *write)));
        stream.prepare_enqueue(uses, work)
    }

    /// Replace the parameters of every node with those of `graph`
    /// (`cuGraphExecUpdate`), without instantiating again: `graph` must
    /// have been captured from the same sequence of operations (same
    /// nodes, dependencies and kernels), with other arguments. Launches
    /// already enqueued keep the old parameters. On failure
    /// ([`Error::GraphUpdate`]) the executable graph is unchanged.
    pub fn update(&mut self, graph: &Graph) -> Result<()> {
        if self.device_sets.is_some() || graph.resources.device_updatable {
            return Err(Error::NodeUpdate {
                reason: "a graph with device-updatable kernel nodes, and its instance, take no \
                         part in GraphExec::update (CUDA's rule): set their scalars with \
                         GraphExec::set_scalars, or instantiate the new graph"
                    .to_string(),
            });
        }
        let memory_nodes = (
            self.resources.graph_memory_bytes,
            graph.graph_memory_bytes(),
        );
        if memory_nodes != (0, 0) {
            return Err(Error::GraphMemory {
                reason: format!(
                    "an executable graph with memory nodes ({} bytes), or one updated from a \
                     graph with memory nodes ({} bytes), cannot be updated in place: its kernels \
                     were given the addresses of its own allocation nodes; instantiate the new \
                     graph instead",
                    memory_nodes.0, memory_nodes.1
                ),
            });
        }
        if graph.ctx.id() != self.ctx.id() {
            return Err(Error::ContextMismatch {
                what: "the graph",
                expected: self.ctx.id(),
                found: graph.ctx.id(),
            });
        }
        self.ctx.bind()?;
        let _turn = graph.turns.lock().unwrap_or_else(|p| p.into_inner());
        let mut info = CUgraphExecUpdateResultInfo::default();
        // SAFETY: live handles of one context; valid out-pointer.
        let code = unsafe { (self.ctx.driver().cuGraphExecUpdate)(self.raw, graph.raw, &mut info) };
        if let Err(err) = self.ctx.check(code) {
            return Err(match err {
                Error::Driver(source) => Error::GraphUpdate {
                    // Where: the software driver says which node, by its
                    // place in the graph; CUDA gives the node's handle.
                    result: match self.ctx.loaded_driver().last_error_detail() {
                        Some(detail) => format!("{}: {detail}", update_result_name(info.result)),
                        None if !info.errorNode.is_null() => {
                            format!(
                                "{} at node {:p}",
                                update_result_name(info.result),
                                info.errorNode
                            )
                        }
                        None => update_result_name(info.result),
                    },
                    source,
                },
                other => other,
            });
        }
        let old = std::mem::replace(&mut self.resources, Arc::clone(&graph.resources));
        self.nodes = graph.nodes;
        // Every node now has the new graph's arguments.
        self.node_args = NodeArgs::default();
        self.release(old);
        Ok(())
    }

    /// The host buffer `slot` names, for the host to read what replays
    /// downloaded into it or to write what they will upload from it, once
    /// the replays launched before have finished with it (this waits).
    ///
    /// The slice borrows the instance mutably, so no replay can be launched
    /// while it lives. Refused ([`Error::GraphHostAccess`]) while the graph
    /// or another instance of it exists (their replays could touch the
    /// buffer), and for a slot of another capture.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let dev = Arc::new(DeviceBuffer::<u32>::new(&ctx, 4)?);
    /// let mut capture = stream.begin_capture()?;
    /// let input = capture.upload_owned(&stream, &dev, PinnedBuffer::from_slice(&ctx, &[1, 2, 3, 4])?)?;
    /// let output = capture.download_owned(&stream, PinnedBuffer::new(&ctx, 4)?, &dev)?;
    /// let graph = capture.end()?;
    /// let mut exec = graph.instantiate()?;
    /// assert!(exec.host(&output).is_err(), "the graph could still launch another instance");
    /// drop(graph);
    /// exec.launch(&stream)?;
    /// assert_eq!(exec.host(&output)?, &[1, 2, 3, 4]);
    /// exec.host(&input)?.copy_from_slice(&[5, 6, 7, 8]);
    /// exec.launch(&stream)?;
    /// assert_eq!(exec.host(&output)?, &[5, 6, 7, 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn host<T: DeviceCopy>(&mut self, slot: &HostSlot<T>) -> Result<&mut [T]> {
        let refused = |reason: String| Error::GraphHostAccess { reason };
        if slot.capture != self.resources.capture {
            return Err(refused(format!(
                "the host slot belongs to capture {}, this executable graph to capture {}",
                slot.capture, self.resources.capture
            )));
        }
        let resources = Arc::get_mut(&mut self.resources).ok_or_else(|| {
            refused(
                "its graph or another instance of it still exists and could launch replays touching the buffer: drop them first"
                    .to_string(),
            )
        })?;
        let (host, _) = resources
            .hosts
            .get_mut(slot.index)
            .ok_or_else(|| refused(format!("no host slot {}", slot.index)))?;
        let host = Arc::get_mut(host)
            .ok_or_else(|| refused(format!("host slot {} is shared", slot.index)))?
            .as_any_mut()
            .downcast_mut::<PinnedBuffer<T>>()
            .ok_or_else(|| refused(format!("host slot {} holds another type", slot.index)))?;
        // Waits for every replay that used it (each one was tracked).
        host.as_mut_slice()
    }

    /// The nodes of the graph it was made from.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// The bytes its graph's memory nodes allocate at every replay; 0
    /// without any.
    pub fn graph_memory_bytes(&self) -> usize {
        self.resources.graph_memory_bytes
    }

    /// The stream its launches are held to, when its graph shares memory
    /// through a [`GraphMemoryShare`](super::GraphMemoryShare).
    pub fn held_to(&self) -> Option<&Arc<Stream>> {
        self.held_to.as_ref()
    }

    /// The raw handle (it stays owned by this `GraphExec`).
    pub fn as_raw(&self) -> CUgraphExec {
        self.raw
    }

    /// Let go of `resources`: buffers and kernels at once (the buffers'
    /// trackers order their frees after the replays), callbacks once every
    /// stream this was launched on has passed its last replay.
    fn release(&self, resources: Arc<Resources>) {
        let launched =
            std::mem::take(&mut *self.launched_on.lock().unwrap_or_else(|p| p.into_inner()));
        for stream in &launched {
            let held = Arc::clone(&resources.callbacks);
            if let Err(err) = stream.add_callback(move || drop(held)) {
                // Some replay may still reach a callback: keep them forever.
                tracing::warn!(
                    "leaking {} graph callback(s): releasing them after stream {} failed: {err}",
                    resources.callbacks.len(),
                    stream.id()
                );
                std::mem::forget(Arc::clone(&resources.callbacks));
            }
        }
        drop(resources);
    }
}

fn update_result_name(result: CUgraphExecUpdateResult) -> String {
    use CUgraphExecUpdateResult as R;
    let name = match result {
        R::CU_GRAPH_EXEC_UPDATE_SUCCESS => "CU_GRAPH_EXEC_UPDATE_SUCCESS",
        R::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED => {
            "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED => {
            "CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED => {
            "CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED => {
            "CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED => "CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED",
        other => return format!("update result {}", other.0),
    };
    name.to_string()
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let raw = self.raw;
        // A device-side set still in flight writes into the instance's
        // parameters: it must finish first. If it cannot be waited for, the
        // instance is left undestroyed rather than written after its end.
        if let Some(sets) = &self.device_sets
            && let Err(err) = sets.token.wait_uses()
        {
            tracing::warn!(
                "executable graph {raw:p}: could not wait for its device-side sets ({err}); \
                 leaving it undestroyed"
            );
            let resources = std::mem::take(&mut self.resources);
            self.release(resources);
            return;
        }
        // CUDA frees an executable graph still in flight once it completes.
        self.ctx.release_in_drop(
            format_args!("executable graph {raw:p}"),
            "destroying",
            |driver| {
                // SAFETY: owned by `self` and destroyed once.
                unsafe { (driver.cuGraphExecDestroy)(raw) }
            },
        );
        let resources = std::mem::take(&mut self.resources);
        self.release(resources);
    }
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphExec")
            .field("raw", &self.raw)
            .field("nodes", &self.nodes)
            .finish()
    }
}
