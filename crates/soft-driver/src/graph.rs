//! Stream capture and graphs: a capture records a DAG of stream work.
//!
//! `cuStreamBeginCapture` opens a capture on its *origin* stream. Work
//! submitted to a capturing stream becomes a node that depends on the
//! stream's *frontier* (the nodes its next work must follow), and the node
//! becomes the new frontier. Events are edges, never nodes: recording an event
//! on a capturing stream remembers that stream's frontier in the event, and a
//! stream waiting on it adds that frontier to its own. A stream that is not
//! capturing and waits on such an event joins the capture, as on a GPU, which
//! is how work forks to other streams. `cuStreamEndCapture` on the origin
//! ends the capture of every stream in it, and fails with
//! `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` when some stream's last work was not
//! joined back into the origin.
//!
//! The calls a GPU forbids during capture (synchronizing or querying a
//! capturing stream or a captured event, a context synchronize, waiting on an
//! event from outside the capture) fail and *invalidate* the capture, as on a
//! GPU: its end then fails with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
//!
//! Nodes are numbered in capture order, and every dependency names an earlier
//! node, so capture order is a topological order: launching an executable
//! graph submits its nodes to the stream in that order, one contiguous batch
//! (a schedule a GPU may also pick; it never runs nodes concurrently here).

use crate::context::require;
use crate::errors::{code, fail, write_out};
use crate::handles::{Registry, lock};
use crate::ops::{Action, Template};
use crate::stream::{Stream, resolve};
use std::collections::HashSet;
use std::ffi::{c_uint, c_ulonglong};
use std::sync::{Arc, Mutex};
use sys::{
    CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo,
    CUgraphNode, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
    CUstreamUpdateCaptureDependencies_flags, cuuint64_t,
};

/// One node of a graph: the work, and the nodes it runs after.
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) action: Action,
    pub(crate) deps: Vec<usize>,
}

/// A capture in progress, shared by every stream taking part in it.
pub(crate) struct Capture {
    /// The stream `cuStreamBeginCapture` was called on.
    origin: usize,
    /// The graph the work goes into: made by `cuStreamBeginCapture`, or the
    /// user's with `cuStreamBeginCaptureToGraph`.
    graph: Arc<Graph>,
    graph_handle: usize,
    /// Whether `cuStreamBeginCapture` made the graph (a failed capture then
    /// destroys it).
    owns_graph: bool,
    inner: Mutex<CaptureInner>,
}

#[derive(Default)]
struct CaptureInner {
    /// Every stream taking part (the origin first).
    members: Vec<Arc<Stream>>,
    /// Why the capture was invalidated, once it was.
    invalidated: Option<String>,
    /// Set by `cuStreamEndCapture`: the capture's events can no longer be
    /// joined.
    ended: bool,
}

/// A stream's part in a capture (what `State::capture` holds).
pub(crate) struct Capturing {
    pub(crate) capture: Arc<Capture>,
    /// The nodes the stream's next work depends on.
    frontier: Vec<usize>,
    /// The frontier as node handles, as `cuStreamGetCaptureInfo` last
    /// exposed it (valid until the next call on the stream, as in CUDA).
    exposed: Vec<usize>,
    exposed_edges: Vec<CUgraphEdgeData>,
}

impl Capture {
    fn lock(&self) -> std::sync::MutexGuard<'_, CaptureInner> {
        lock(&self.inner)
    }

    /// Mark the capture invalid (the first reason is kept).
    pub(crate) fn invalidate(&self, why: impl Into<String>) {
        let mut inner = self.lock();
        if inner.invalidated.is_none() {
            let why = why.into();
            inner.invalidated = Some(why);
        }
    }

    fn is_invalidated(&self) -> bool {
        self.lock().invalidated.is_some()
    }

    /// The graph the capture's work goes into.
    pub(crate) fn graph(&self) -> &Arc<Graph> {
        &self.graph
    }

    /// Whether `cuStreamEndCapture` has ended it.
    pub(crate) fn has_ended(&self) -> bool {
        self.lock().ended
    }
}

impl Capturing {
    /// `call` is not allowed on a capturing stream: it invalidates the
    /// capture, as on a GPU; returns the error to give.
    pub(crate) fn refuse(&self, call: &str, stream: usize) -> CUresult {
        let why = format!("{call} on stream {stream:#x}, which is capturing");
        self.capture.invalidate(why.clone());
        fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, why)
    }

    /// Record `templates`, submitted to `stream` (which holds this capture
    /// state), into the capture.
    pub(crate) fn record(&mut self, templates: &[Template]) -> Result<(), CUresult> {
        if self.capture.is_invalidated() {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        for template in templates {
            match template {
                Template::Act(action) => {
                    let mut nodes = lock(&self.capture.graph.nodes);
                    if let Action::Kernel(launch) = action
                        && let Err((code, why)) =
                            crate::device_node::recorded(launch, &self.capture.graph, nodes.len())
                    {
                        // Invalidated without the node list locked: the
                        // end of a capture takes the two the other way.
                        drop(nodes);
                        self.capture.invalidate(why.clone());
                        return Err(fail(code, why));
                    }
                    let deps = std::mem::take(&mut self.frontier);
                    nodes.push(Node {
                        action: action.clone(),
                        deps,
                    });
                    self.frontier.push(nodes.len() - 1);
                }
                Template::Record(event) => {
                    event.record_captured(Arc::clone(&self.capture), self.frontier.clone());
                }
                Template::Wait(event) => match event.captured() {
                    Some((capture, frontier)) if Arc::ptr_eq(&capture, &self.capture) => {
                        for node in frontier {
                            if !self.frontier.contains(&node) {
                                self.frontier.push(node);
                            }
                        }
                    }
                    // Never recorded: nothing to wait for, as outside capture.
                    None if event.target().is_none() => {}
                    _ => {
                        let why = "a capturing stream waited on an event recorded outside \
                                   its capture (CUDA requires CU_EVENT_WAIT_EXTERNAL for that)";
                        self.capture.invalidate(why);
                        return Err(fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION, why));
                    }
                },
            }
        }
        Ok(())
    }

    /// A stream that is not capturing waits on `event`, last recorded in
    /// `capture` with `frontier`: the stream joins the capture.
    pub(crate) fn join(
        stream: &Arc<Stream>,
        capture: Arc<Capture>,
        frontier: Vec<usize>,
    ) -> Result<Self, CUresult> {
        {
            let mut inner = capture.lock();
            if inner.ended {
                return Err(fail(
                    CUresult::CUDA_ERROR_CAPTURED_EVENT,
                    format!(
                        "stream {:#x} waits on an event last recorded in a capture that has \
                         ended",
                        stream.handle
                    ),
                ));
            }
            if inner.invalidated.is_some() {
                return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            inner.members.push(Arc::clone(stream));
        }
        Ok(Capturing::new(capture, frontier))
    }
}

impl Capturing {
    fn new(capture: Arc<Capture>, frontier: Vec<usize>) -> Self {
        Capturing {
            capture,
            frontier,
            exposed: Vec::new(),
            exposed_edges: Vec::new(),
        }
    }
}

/// A graph: made by a capture or `cuGraphCreate`, or the body of a
/// conditional node. Nodes are added, never removed, so a node's index is
/// stable; its handle (`CUgraphNode`) names the graph and the index (see
/// `node_handle`).
pub(crate) struct Graph {
    /// Its handle (for a frozen body, that of the body it was made from).
    pub(crate) handle: usize,
    pub(crate) nodes: Mutex<Vec<Node>>,
    /// The handle of the top-level graph this one belongs to (its own for a
    /// top-level graph): condition handles are valid in one such family.
    pub(crate) root: usize,
    /// The condition handles made on this family whose default is assigned
    /// at every launch (kept by the top-level graph).
    pub(crate) defaults: Mutex<Vec<Arc<crate::conditional::Slot>>>,
    /// The bodies of its conditional nodes, destroyed with it.
    pub(crate) bodies: Mutex<Vec<usize>>,
    /// The allocations of its memory nodes (see `graph_memory`).
    pub(crate) allocations: Mutex<Vec<Arc<crate::graph_memory::GraphAllocation>>>,
    /// Its executable instance, while it has memory nodes: one at a time.
    instance: Mutex<std::sync::Weak<Exec>>,
}

impl Graph {
    pub(crate) fn new(handle: usize, root: usize, nodes: Vec<Node>) -> Self {
        Graph {
            handle,
            nodes: Mutex::new(nodes),
            root,
            defaults: Mutex::new(Vec::new()),
            bodies: Mutex::new(Vec::new()),
            allocations: Mutex::new(Vec::new()),
            instance: Mutex::new(std::sync::Weak::new()),
        }
    }

    /// `count` node handles at `nodes` as indices of this graph's nodes,
    /// checked ([`node_indices`](crate::node_handle::node_indices)).
    ///
    /// # Safety
    /// `nodes` points at `count` readable handles (or `count` is 0).
    pub(crate) unsafe fn node_indices(
        &self,
        nodes: *const CUgraphNode,
        count: usize,
    ) -> Result<Vec<usize>, CUresult> {
        let len = lock(&self.nodes).len();
        // SAFETY: the caller's promise.
        unsafe { crate::node_handle::node_indices(self.handle, len, nodes, count) }
    }
}

/// Register a new empty top-level graph; returns its handle.
fn new_graph() -> (usize, Arc<Graph>) {
    let handle = crate::handles::mint();
    let graph = Arc::new(Graph::new(handle, handle, Vec::new()));
    GRAPHS.insert_at(handle, Arc::clone(&graph));
    (handle, graph)
}

/// An executable graph: a snapshot of a graph's nodes, whose parameters
/// `cuGraphExecUpdate` may change.
pub(crate) struct Exec {
    /// The handle of the graph it was made from, whose node handles name
    /// its nodes.
    pub(crate) graph: usize,
    pub(crate) nodes: Mutex<Vec<Node>>,
    /// Condition handles set to their default at the start of each launch
    /// (those of the graph it was last made or updated from).
    defaults: Mutex<Arc<[Arc<crate::conditional::Slot>]>>,
    /// The bytes of graph memory a launch needs (0 without memory nodes).
    footprint: usize,
    /// With memory nodes: recorded at the end of each launch, and waited on
    /// by the next, so launches of the instance never overlap (as CUDA
    /// orders every launch of an executable graph after the previous ones).
    last_launch: Option<Arc<crate::event::Event>>,
    /// `cuGraphUpload` calls made on it ([`crate::graph_uploads`]).
    pub(crate) uploads: std::sync::atomic::AtomicU64,
}

pub(crate) static GRAPHS: Registry<Graph> = Registry::new();
pub(crate) static EXECS: Registry<Exec> = Registry::new();

pub(crate) unsafe extern "C" fn cuStreamBeginCapture(
    hStream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    code((|| {
        require()?;
        begin(hStream, None, Vec::new(), mode)
    })())
}

/// Begin a capture on `hStream` into `into` (a graph handle and the graph),
/// or into a new graph when `None`, its first work depending on `frontier`.
fn begin(
    hStream: CUstream,
    into: Option<(usize, Arc<Graph>)>,
    frontier: Vec<usize>,
    mode: CUstreamCaptureMode,
) -> Result<(), CUresult> {
    if mode.0 > CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if (hStream as usize) <= 2 {
        return Err(fail(
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            "the legacy default stream cannot be captured",
        ));
    }
    let stream = resolve(hStream)?;
    let mut state = stream.state();
    state.fault_status()?;
    if state.capture.is_some() {
        return Err(fail(
            CUresult::CUDA_ERROR_ILLEGAL_STATE,
            format!("stream {:#x} is already capturing", stream.handle),
        ));
    }
    let owns_graph = into.is_none();
    let (graph_handle, graph) = into.unwrap_or_else(new_graph);
    let capture = Arc::new(Capture {
        origin: stream.handle,
        graph,
        graph_handle,
        owns_graph,
        inner: Mutex::new(CaptureInner {
            members: vec![Arc::clone(&stream)],
            ..CaptureInner::default()
        }),
    });
    state.capture = Some(Capturing::new(capture, frontier));
    Ok(())
}

pub(crate) unsafe extern "C" fn cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint) -> CUresult {
    code((|| {
        if phGraph.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (handle, _) = new_graph();
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phGraph, handle as CUgraph) }
    })())
}

pub(crate) unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    hStream: CUstream,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    _dependencyData: *const CUgraphEdgeData,
    numDependencies: usize,
    mode: CUstreamCaptureMode,
) -> CUresult {
    code((|| {
        require()?;
        let graph = GRAPHS.get(hGraph as usize)?;
        // SAFETY: CUDA's contract: `numDependencies` readable handles.
        let frontier = unsafe { graph.node_indices(dependencies, numDependencies) }?;
        begin(hStream, Some((hGraph as usize, graph)), frontier, mode)
    })())
}

pub(crate) unsafe extern "C" fn cuStreamGetCaptureInfo(
    hStream: CUstream,
    captureStatus_out: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    dependencies_out: *mut *const CUgraphNode,
    edgeData_out: *mut *const CUgraphEdgeData,
    numDependencies_out: *mut usize,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        if captureStatus_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut state = stream.state();
        let Some(capturing) = state.capture.as_mut() else {
            // SAFETY: checked non-null; writable per the API.
            return unsafe {
                write_out(
                    captureStatus_out,
                    CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
                )
            };
        };
        let status = if capturing.capture.is_invalidated() {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
        } else {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        };
        let graph = capturing.capture.graph_handle;
        capturing.exposed = (capturing.frontier.iter())
            .map(|&index| crate::node_handle::node_handle(graph, index))
            .collect();
        capturing.exposed_edges = vec![CUgraphEdgeData::default(); capturing.exposed.len()];
        // SAFETY: each pointer is checked non-null and writable per the API;
        // the arrays live in the stream's state until its next capture call.
        unsafe {
            write_out(captureStatus_out, status)?;
            if !id_out.is_null() {
                write_out(id_out, capturing.capture.graph_handle as cuuint64_t)?;
            }
            if !graph_out.is_null() {
                write_out(graph_out, capturing.capture.graph_handle as CUgraph)?;
            }
            if !dependencies_out.is_null() {
                write_out(
                    dependencies_out,
                    capturing.exposed.as_ptr().cast::<CUgraphNode>(),
                )?;
            }
            if !edgeData_out.is_null() {
                write_out(edgeData_out, capturing.exposed_edges.as_ptr())?;
            }
            if !numDependencies_out.is_null() {
                write_out(numDependencies_out, capturing.exposed.len())?;
            }
        }
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    hStream: CUstream,
    dependencies: *mut CUgraphNode,
    _dependencyData: *const CUgraphEdgeData,
    numDependencies: usize,
    flags: c_uint,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        let mut state = stream.state();
        let Some(capturing) = state.capture.as_mut() else {
            return Err(fail(
                CUresult::CUDA_ERROR_ILLEGAL_STATE,
                format!("stream {:#x} is not capturing", stream.handle),
            ));
        };
        // SAFETY: CUDA's contract: `numDependencies` readable handles.
        let nodes = unsafe {
            capturing
                .capture
                .graph
                .node_indices(dependencies, numDependencies)
        }?;
        match CUstreamUpdateCaptureDependencies_flags(flags) {
            CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES => {
                capturing.frontier = nodes;
            }
            CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES => {
                for node in nodes {
                    if !capturing.frontier.contains(&node) {
                        capturing.frontier.push(node);
                    }
                }
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })())
}

/// The nodes `frontier` depends on, itself included.
fn ancestors(nodes: &[Node], frontier: &[usize]) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut stack = frontier.to_vec();
    while let Some(node) = stack.pop() {
        if seen.insert(node) {
            stack.extend_from_slice(&nodes[node].deps);
        }
    }
    seen
}

pub(crate) unsafe extern "C" fn cuStreamEndCapture(
    hStream: CUstream,
    phGraph: *mut CUgraph,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        if phGraph.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let capture = match &stream.state().capture {
            Some(capturing) => Arc::clone(&capturing.capture),
            None => {
                return Err(fail(
                    CUresult::CUDA_ERROR_ILLEGAL_STATE,
                    format!("stream {:#x} is not capturing", stream.handle),
                ));
            }
        };
        if capture.origin != stream.handle {
            return Err(fail(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                format!(
                    "stream {:#x} joined a capture begun on stream {:#x}; only that stream can \
                     end it",
                    stream.handle, capture.origin
                ),
            ));
        }
        // Every stream leaves the capture, whatever the outcome (as on a GPU).
        let members = {
            let mut inner = capture.lock();
            inner.ended = true;
            std::mem::take(&mut inner.members)
        };
        let mut frontiers = Vec::new();
        for member in &members {
            let mut state = member.state();
            if let Some(capturing) = state.capture.take_if(|c| Arc::ptr_eq(&c.capture, &capture)) {
                frontiers.push((member.handle, capturing.frontier));
            }
        }
        let inner = capture.lock();
        let drop_graph = || {
            if capture.owns_graph {
                let _ = GRAPHS.remove(capture.graph_handle);
            }
        };
        if let Some(why) = &inner.invalidated {
            drop_graph();
            return Err(fail(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                format!("the capture was invalidated: {why}"),
            ));
        }
        let origin_frontier = frontiers
            .iter()
            .find(|(handle, _)| *handle == stream.handle)
            .map(|(_, frontier)| frontier.clone())
            .unwrap_or_default();
        let joined = ancestors(&lock(&capture.graph.nodes), &origin_frontier);
        for (handle, frontier) in &frontiers {
            if let Some(node) = frontier.iter().find(|node| !joined.contains(node)) {
                drop_graph();
                return Err(fail(
                    CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                    format!(
                        "stream {handle:#x} took part in the capture begun on stream {:#x}, but \
                         its last work (node {node}) was not joined back into that stream",
                        stream.handle
                    ),
                ));
            }
        }
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phGraph, capture.graph_handle as CUgraph) }
    })())
}

pub(crate) unsafe extern "C" fn cuStreamIsCapturing(
    hStream: CUstream,
    captureStatus: *mut CUstreamCaptureStatus,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        if captureStatus.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let status = match &stream.state().capture {
            None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(capturing) if capturing.capture.is_invalidated() => {
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
            }
            Some(_) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        };
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(captureStatus, status) }
    })())
}

pub(crate) unsafe extern "C" fn cuGraphInstantiate(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    code((|| {
        let graph = GRAPHS.get(hGraph as usize)?;
        if phGraphExec.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // An executable graph is a snapshot: later changes to (or destruction
        // of) the graph do not affect it.
        let nodes = crate::conditional::freeze(&lock(&graph.nodes))?;
        let defaults = lock(&graph.defaults).clone().into();
        let footprint = crate::graph_memory::footprint(&nodes);
        let device = require()?;
        let mut instance = lock(&graph.instance);
        if footprint > 0 && instance.strong_count() > 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                "a graph with memory nodes has one executable instance at a time: destroy the \
                 other first",
            ));
        }
        // Claimed last, when nothing can fail any more: a refused
        // instantiation must not use up the graph's one.
        let handle = crate::handles::mint();
        crate::device_node::instantiating(&nodes, handle)?;
        let exec = Arc::new(Exec {
            graph: graph.handle,
            nodes: Mutex::new(nodes),
            defaults: Mutex::new(defaults),
            footprint,
            last_launch: (footprint > 0).then(|| crate::event::Event::internal(device)),
            uploads: Default::default(),
        });
        if footprint > 0 {
            *instance = Arc::downgrade(&exec);
        }
        drop(instance);
        EXECS.insert_at(handle, exec);
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phGraphExec, handle as CUgraphExec) }
    })())
}

pub(crate) unsafe extern "C" fn cuGraphUpload(
    hGraphExec: CUgraphExec,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let exec = EXECS.get(hGraphExec as usize)?;
        // Nothing to upload to: an ordered no-op on the stream, counted.
        resolve(hStream)?.submit(&[Template::Act(Action::Nop)])?;
        exec.uploads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuGraphLaunch(
    hGraphExec: CUgraphExec,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let exec = EXECS.get(hGraphExec as usize)?;
        // The parameters at launch time: a later update does not change
        // launches already made.
        let defaults = Arc::clone(&lock(&exec.defaults));
        let reset = (!defaults.is_empty()).then(|| Template::Act(Action::AssignDefaults(defaults)));
        let after_last = exec.last_launch.clone().map(Template::Wait);
        let templates: Vec<Template> = after_last
            .into_iter()
            .chain(reset)
            .chain(
                lock(&exec.nodes)
                    .iter()
                    .map(|node| Template::Act(node.action.clone())),
            )
            .chain(exec.last_launch.clone().map(Template::Record))
            .collect();
        let stream = resolve(hStream)?;
        crate::graph_memory::launched(&stream, exec.footprint)?;
        stream.submit(&templates)
    })())
}

/// Why `new` cannot replace `old` in place, if it cannot.
fn update_refused(old: &[Node], new: &[Node]) -> Option<(CUgraphExecUpdateResult, String)> {
    if let Some(why) = crate::device_node::update_refused(old, new) {
        return Some((
            CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED,
            why,
        ));
    }
    if old.len() != new.len() {
        return Some((
            CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
            format!(
                "the graph has {} nodes, the executable graph {}",
                new.len(),
                old.len()
            ),
        ));
    }
    for (index, (old, new)) in old.iter().zip(new).enumerate() {
        if old.deps != new.deps {
            return Some((
                CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
                format!("node {index} has other dependencies"),
            ));
        }
        if std::mem::discriminant(&old.action) != std::mem::discriminant(&new.action) {
            return Some((
                CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED,
                format!("node {index} is another kind of node"),
            ));
        }
        if let (Action::GraphAlloc(old), Action::GraphAlloc(new))
        | (Action::GraphFree(old), Action::GraphFree(new)) = (&old.action, &new.action)
            && !Arc::ptr_eq(old, new)
        {
            return Some((
                CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED,
                format!("node {index} is a memory node of another graph"),
            ));
        }
        if let (Action::Kernel(old), Action::Kernel(new)) = (&old.action, &new.action)
            && old.name != new.name
        {
            return Some((
                CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED,
                format!("node {index} launches `{}`, not `{}`", new.name, old.name),
            ));
        }
        if let (Action::Conditional(old), Action::Conditional(new)) = (&old.action, &new.action) {
            let ((old_kind, old), (new_kind, new)) = (old.shape(), new.shape());
            if old_kind != new_kind || old.len() != new.len() {
                return Some((
                    CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED,
                    format!("conditional node {index} has another kind or number of bodies"),
                ));
            }
            for (number, (old, new)) in old.iter().zip(&new).enumerate() {
                if let Some((result, why)) = update_refused(old, new) {
                    return Some((result, format!("body {number} of node {index}: {why}")));
                }
            }
        }
    }
    None
}

pub(crate) unsafe extern "C" fn cuGraphExecUpdate(
    hGraphExec: CUgraphExec,
    hGraph: CUgraph,
    resultInfo: *mut CUgraphExecUpdateResultInfo,
) -> CUresult {
    code((|| {
        let exec = EXECS.get(hGraphExec as usize)?;
        let graph = GRAPHS.get(hGraph as usize)?;
        let mut nodes = lock(&exec.nodes);
        let new = crate::conditional::freeze(&lock(&graph.nodes))?;
        let refused = update_refused(&nodes, &new);
        let result = refused.as_ref().map_or(
            CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            |(result, _)| *result,
        );
        if !resultInfo.is_null() {
            let info = CUgraphExecUpdateResultInfo {
                result,
                errorNode: std::ptr::null_mut(),
                errorFromNode: std::ptr::null_mut(),
            };
            // SAFETY: non-null; writable per the API.
            unsafe { write_out(resultInfo, info)? };
        }
        if let Some((_, why)) = refused {
            return Err(fail(
                CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
                format!("the executable graph cannot be updated in place: {why}"),
            ));
        }
        *nodes = new;
        *lock(&exec.defaults) = lock(&graph.defaults).clone().into();
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    // Launches already submitted hold their own copies of the work.
    code(EXECS.remove(hGraphExec as usize).map(drop))
}

pub(crate) unsafe extern "C" fn cuGraphDestroy(hGraph: CUgraph) -> CUresult {
    code(destroy_graph(hGraph as usize))
}

/// Unregister a graph and, with it, the bodies of its conditional nodes.
fn destroy_graph(handle: usize) -> Result<(), CUresult> {
    let graph = GRAPHS.remove(handle)?;
    for body in lock(&graph.bodies).drain(..) {
        // A body is unregistered only here: it is there.
        let _ = destroy_graph(body);
    }
    Ok(())
}

/// The capture an event was last recorded in, with the recording stream's
/// frontier at that point.
pub(crate) type CapturedAt = (Arc<Capture>, Vec<usize>);
