//! Conditional nodes: a node that runs a body graph while (WHILE), once if
//! (IF, IF-ELSE) or by the value of (SWITCH) a condition that kernels set on
//! the device.
//!
//! A condition handle (`cuGraphConditionalHandleCreate`) names a slot of 32
//! bits belonging to one graph family (a top-level graph and the bodies of
//! its conditional nodes). Kernel twins set it with [`set_conditional`], as
//! CUDA kernels call `cudaGraphSetConditional`. With
//! `CU_GRAPH_COND_ASSIGN_DEFAULT`, each launch of an executable graph sets
//! it to its default first.
//!
//! A conditional node is added with `cuGraphAddNode`, which makes its empty
//! body graphs; they are filled with `cuStreamBeginCaptureToGraph`. The
//! stream worker runs a conditional node in place: it reads the condition,
//! runs the body's nodes in order (its capture order is a topological
//! order), and for WHILE reads it again.
//!
//! A body holds only what CUDA allows in one: kernels, copies, memsets,
//! empty nodes and conditionals. A host function, a stream-ordered
//! allocation or free, a stream memory operation or a collective in a body
//! is refused when the graph is instantiated, naming the node.
//!
//! Where it differs from a GPU: the condition slot is shared by every
//! executable graph made from the same graph (CUDA gives each its own), so
//! two such executables must not run at once when they use a condition.

use crate::errors::{code, fail, write_out};
use crate::graph::{GRAPHS, Graph, Node};
use crate::handles::{Registry, lock};
use crate::ops::Action;
use crate::sticky_errors::Fault;
use std::collections::HashSet;
use std::ffi::c_uint;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use sys::{
    CU_GRAPH_COND_ASSIGN_DEFAULT, CUcontext, CUgraph, CUgraphConditionalHandle,
    CUgraphConditionalNodeType, CUgraphEdgeData, CUgraphNode, CUgraphNodeParams, CUgraphNodeType,
    CUresult,
};

/// The value behind a condition handle.
pub(crate) struct Slot {
    handle: usize,
    value: AtomicU32,
    default: u32,
    /// The top-level graph whose family may use it.
    root: usize,
}

impl Slot {
    fn get(&self) -> u32 {
        self.value.load(Ordering::Acquire)
    }

    /// Set to the default, at the start of a launch.
    pub(crate) fn assign_default(&self) {
        self.value.store(self.default, Ordering::Release);
    }
}

static SLOTS: Registry<Slot> = Registry::new();

/// Set the condition `handle` to `value`: what a kernel's twin does where
/// the CUDA kernel calls `cudaGraphSetConditional(handle, value)`.
///
/// # Panics
/// When `handle` is not a condition handle of the software driver; called
/// from a twin, the panic fails the launch with this message, as a bad
/// handle faults a kernel on a GPU.
///
/// ```
/// use cuda_streams_soft_driver::set_conditional;
/// let outcome = std::panic::catch_unwind(|| set_conditional(0x1234, 1));
/// assert!(outcome.is_err(), "0x1234 is not a condition handle");
/// ```
pub fn set_conditional(handle: u64, value: u32) {
    match SLOTS.get(handle as usize) {
        Ok(slot) => slot.value.store(value, Ordering::Release),
        Err(_) => panic!("{handle:#x} is not a condition handle (cudaGraphSetConditional)"),
    }
}

/// A conditional node: which condition, what kind, and its bodies.
pub(crate) struct Conditional {
    slot: Arc<Slot>,
    kind: CUgraphConditionalNodeType,
    bodies: Vec<Arc<Graph>>,
    /// The body handles `cuGraphAddNode` handed out (`phGraph_out`), kept
    /// for as long as the node lives, as CUDA keeps its array.
    handles: Box<[usize]>,
}

impl Conditional {
    /// What an update may not change: the kind, and the nodes of each
    /// body (compared node by node).
    pub(crate) fn shape(&self) -> (u32, Vec<Vec<Node>>) {
        let bodies = self.bodies.iter().map(|body| lock(&body.nodes).clone());
        (self.kind.0, bodies.collect())
    }

    /// Run the node on a stream worker of `device`.
    pub(crate) fn run(&self, device: i32) -> Option<Fault> {
        let body = |index: usize| -> Option<Fault> {
            let body = self.bodies.get(index)?;
            let actions: Vec<Action> = lock(&body.nodes)
                .iter()
                .map(|node| node.action.clone())
                .collect();
            actions
                .into_iter()
                .find_map(|action| action.run(false, device))
        };
        match self.kind {
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE => {
                while self.slot.get() != 0 {
                    if let Some(fault) = body(0) {
                        return Some(fault);
                    }
                }
                None
            }
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF => {
                let value = self.slot.get();
                if value != 0 { body(0) } else { body(1) }
            }
            // SWITCH: the body numbered by the value; none past the last.
            _ => body(self.slot.get() as usize),
        }
    }
}

/// What a body may not hold, by CUDA's rules, if `action` is such.
fn refused_in_body(action: &Action) -> Option<&'static str> {
    match action {
        Action::Host { .. } => Some("a host function"),
        Action::Free(_) | Action::Ready(_) => Some("a stream-ordered allocation or free"),
        Action::GraphAlloc(_) | Action::GraphFree(_) => Some("a memory node"),
        Action::Write32 { .. } => Some("a stream memory operation"),
        Action::Call(_) | Action::Instance(_) => Some("a collective"),
        _ => None,
    }
}

/// The nodes of an executable graph made from `nodes`: a snapshot, bodies
/// included, so that later changes to the graph do not reach it. Refuses a
/// body holding work CUDA does not allow there, and a condition handle
/// that serves two conditional nodes (a GPU driver refuses such a graph
/// with `CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn freeze(nodes: &[Node]) -> Result<Vec<Node>, CUresult> {
    one_node_per_condition(nodes, &mut HashSet::new())?;
    freeze_nodes(nodes)
}

/// Refuses a condition handle used by a second conditional node of
/// `nodes` or their bodies; `seen` holds the handles met so far.
fn one_node_per_condition(nodes: &[Node], seen: &mut HashSet<usize>) -> Result<(), CUresult> {
    for node in nodes {
        if let Action::Conditional(cond) = &node.action {
            if !seen.insert(cond.slot.handle) {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "condition handle {:#x} serves two conditional nodes; a handle \
                         belongs to a single conditional node",
                        cond.slot.handle
                    ),
                ));
            }
            for body in &cond.bodies {
                one_node_per_condition(&lock(&body.nodes), seen)?;
            }
        }
    }
    Ok(())
}

fn freeze_nodes(nodes: &[Node]) -> Result<Vec<Node>, CUresult> {
    nodes
        .iter()
        .map(|node| {
            let action = match &node.action {
                Action::Conditional(cond) => {
                    let mut bodies = Vec::with_capacity(cond.bodies.len());
                    for (number, body) in cond.bodies.iter().enumerate() {
                        let inner = lock(&body.nodes);
                        if let Some((index, what)) = inner
                            .iter()
                            .enumerate()
                            .find_map(|(i, n)| refused_in_body(&n.action).map(|w| (i, w)))
                        {
                            return Err(fail(
                                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                                format!(
                                    "body {number} of a conditional node holds {what} (its node \
                                     {index}); a conditional body may hold kernels, copies, \
                                     memsets and conditionals only"
                                ),
                            ));
                        }
                        bodies.push(Arc::new(Graph::new(
                            body.handle,
                            body.root,
                            freeze_nodes(&inner)?,
                        )));
                    }
                    Action::Conditional(Arc::new(Conditional {
                        slot: Arc::clone(&cond.slot),
                        kind: cond.kind,
                        bodies,
                        handles: Box::new([]),
                    }))
                }
                other => other.clone(),
            };
            Ok(Node {
                action,
                deps: node.deps.clone(),
            })
        })
        .collect()
}

pub(crate) unsafe extern "C" fn cuGraphConditionalHandleCreate(
    pHandle_out: *mut CUgraphConditionalHandle,
    hGraph: CUgraph,
    _ctx: CUcontext,
    defaultLaunchValue: c_uint,
    flags: c_uint,
) -> CUresult {
    code((|| {
        crate::context::require()?;
        if pHandle_out.is_null() || flags & !CU_GRAPH_COND_ASSIGN_DEFAULT != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let graph = GRAPHS.get(hGraph as usize)?;
        let handle = crate::handles::mint();
        let slot = Arc::new(Slot {
            handle,
            value: AtomicU32::new(defaultLaunchValue),
            default: defaultLaunchValue,
            root: graph.root,
        });
        SLOTS.insert_at(handle, Arc::clone(&slot));
        if flags & CU_GRAPH_COND_ASSIGN_DEFAULT != 0 {
            let root = GRAPHS.get(graph.root)?;
            lock(&root.defaults).push(slot);
        }
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(pHandle_out, handle as CUgraphConditionalHandle) }
    })())
}

pub(crate) unsafe extern "C" fn cuGraphAddNode(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    _dependencyData: *const CUgraphEdgeData,
    numDependencies: usize,
    nodeParams: *mut CUgraphNodeParams,
) -> CUresult {
    code((|| {
        if phGraphNode.is_null() || nodeParams.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let graph = GRAPHS.get(hGraph as usize)?;
        // SAFETY: CUDA's contract: a readable, writable parameter block.
        let params = unsafe { &mut *nodeParams };
        if params.type_ != CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL {
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                format!(
                    "cuGraphAddNode of node type {}: the software driver adds conditional \
                     nodes only (other work is captured)",
                    params.type_.0
                ),
            ));
        }
        // SAFETY: the type says which member of the union is in use.
        let cond = unsafe { &mut params.__bindgen_anon_1.conditional };
        let slot = SLOTS.get(cond.handle as usize).map_err(|_| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{:#x} is not a condition handle", cond.handle),
            )
        })?;
        if slot.root != graph.root {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "condition handle {:#x} belongs to graph {:#x}, not to graph {:#x} where the \
                     node is added",
                    slot.handle, slot.root, graph.root
                ),
            ));
        }
        let size = cond.size as usize;
        let size_ok = match cond.type_ {
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE => size == 1,
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF => size == 1 || size == 2,
            CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH => size >= 1,
            _ => false,
        };
        if !size_ok {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "a conditional node of type {} cannot have {size} bodies",
                    cond.type_.0
                ),
            ));
        }
        // SAFETY: CUDA's contract: `numDependencies` readable handles.
        let deps = unsafe { graph.node_indices(dependencies, numDependencies) }?;
        let mut bodies = Vec::with_capacity(size);
        let mut handles = Vec::with_capacity(size);
        for _ in 0..size {
            let handle = crate::handles::mint();
            let body = Arc::new(Graph::new(handle, graph.root, Vec::new()));
            GRAPHS.insert_at(handle, Arc::clone(&body));
            lock(&graph.bodies).push(handle);
            bodies.push(body);
            handles.push(handle);
        }
        let node = Arc::new(Conditional {
            slot,
            kind: cond.type_,
            bodies,
            handles: handles.into_boxed_slice(),
        });
        // A body handle is a number the size of a pointer: the array reads
        // as `CUgraph`s.
        cond.phGraph_out = node.handles.as_ptr().cast::<CUgraph>().cast_mut();
        let mut nodes = lock(&graph.nodes);
        nodes.push(Node {
            action: Action::Conditional(node),
            deps,
        });
        let handle = crate::node_handle::node_handle(graph.handle, nodes.len() - 1);
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phGraphNode, handle as CUgraphNode) }
    })())
}
