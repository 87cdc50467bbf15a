//! Device-updatable kernel nodes (CUDA 12.4+): a kernel launched in a
//! capture with `CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE` becomes a
//! node whose arguments kernels change on the device, through its *device
//! node handle* (`devNode`, which `cuGraphKernelNodeGetAttribute` gives
//! out) and `cudaGraphKernelNodeSetParam`; a twin calls
//! [`set_kernel_node_param`].
//!
//! The handle is minted by `cuLaunchKernelEx` and travels in the node's
//! `Launch`; the capture registers it when it records the node, with the
//! graph and the node's index. The graph's one instantiation claims it
//! (CUDA allows a single one, so that a handle names one executable
//! node), and from then on an update goes to that executable graph's node,
//! through `graph_exec_params` as `cuGraphExecKernelNodeSetParams` does.
//!
//! CUDA's rules kept here: the attribute is for captures only, such a
//! graph is instantiated once, and neither it nor its executable graph
//! takes part in `cuGraphExecUpdate`. The software driver also refuses the
//! attribute in the body of a conditional node, and a graph holding such
//! nodes launched into a capture (a node has one handle, for one graph).

use crate::errors::{Status, code, fail, write_out};
use crate::graph::{EXECS, GRAPHS, Graph, Node};
use crate::handles::{Registry, lock};
use crate::ops::{Action, Launch};
use std::sync::{Arc, Mutex};
use sys::signature::param_layout;
use sys::{
    CUgraphDeviceNode, CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue, CUlaunchAttributeID,
    CUlaunchAttributeValue_union__bindgen_ty_5, CUresult,
};

/// Where a device node handle's updates go.
struct DeviceNode {
    /// The graph holding the node, and its index there (and in the
    /// executable graph made from it).
    graph: usize,
    index: usize,
    kernel: &'static str,
    /// The executable graph made from the graph, once made: its handle,
    /// resolved at each update, so that one destroyed since is noticed.
    exec: Mutex<Option<usize>>,
}

static DEVICE_NODES: Registry<DeviceNode> = Registry::new();

/// The device node handle `launch` carries, if it was made device-updatable.
fn device_node(action: &Action) -> Option<usize> {
    match action {
        Action::Kernel(launch) => launch.device_node,
        _ => None,
    }
}

/// The first device-updatable node of `nodes`: its index and handle.
fn first_device_node(nodes: &[Node]) -> Option<(usize, usize)> {
    (nodes.iter().enumerate()).find_map(|(index, node)| Some((index, device_node(&node.action)?)))
}

/// A capture records `launch` as node `index` of `graph`: a launch made
/// device-updatable registers its handle. Refused (the capture is then
/// invalidated, with the reason given) in a conditional body, and for a
/// handle already registered: a graph holding device-updatable nodes
/// launched into a capture.
pub(crate) fn recorded(
    launch: &Launch,
    graph: &Graph,
    index: usize,
) -> Result<(), (CUresult, String)> {
    let Some(token) = launch.device_node else {
        return Ok(());
    };
    if graph.root != graph.handle {
        return Err((
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
            format!(
                "kernel `{}` launched device-updatable into the body of a conditional node; \
                 the software driver makes top-level kernel nodes device-updatable only",
                launch.name
            ),
        ));
    }
    let node = DeviceNode {
        graph: graph.handle,
        index,
        kernel: launch.name,
        exec: Mutex::new(None),
    };
    if DEVICE_NODES.insert_new(token, Arc::new(node)) {
        return Ok(());
    }
    Err((
        CUresult::CUDA_ERROR_INVALID_VALUE,
        format!(
            "kernel `{}` is device-updatable node {token:#x} of another graph: a graph holding \
             device-updatable kernel nodes cannot be launched into a capture",
            launch.name
        ),
    ))
}

/// The graph whose frozen nodes are `nodes` is being instantiated as the
/// executable graph `exec`: its device-updatable nodes are claimed by it,
/// or, when an earlier instantiation claimed them, refused.
///
/// Claims are made in node order and a graph's nodes are only ever
/// appended, so two instantiations racing meet at the same first node,
/// and the one that loses there has claimed nothing.
pub(crate) fn instantiating(nodes: &[Node], exec: usize) -> Status {
    for token in nodes.iter().filter_map(|node| device_node(&node.action)) {
        // Registered when recorded (the node is in a graph).
        let Ok(node) = DEVICE_NODES.get(token) else {
            continue;
        };
        let mut claimed = lock(&node.exec);
        if let Some(first) = *claimed {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "graph {:#x} holds device-updatable kernel node {} (`{}`) and was already \
                     instantiated as executable graph {first:#x}; a graph with device-updatable \
                     nodes may be instantiated only once",
                    node.graph, node.index, node.kernel
                ),
            ));
        }
        *claimed = Some(exec);
    }
    Ok(())
}

/// Why the executable graph with nodes `old` cannot be updated from the
/// graph with nodes `new`, if device-updatable nodes are the reason.
pub(crate) fn update_refused(old: &[Node], new: &[Node]) -> Option<String> {
    let (side, (index, token)) = first_device_node(new)
        .map(|found| ("the graph", found))
        .or_else(|| first_device_node(old).map(|found| ("the executable graph", found)))?;
    Some(format!(
        "{side} holds device-updatable kernel node {index} (device node {token:#x}); a graph \
         with device-updatable nodes and its executable graph cannot take part in an update"
    ))
}

/// Overwrite `value.len()` bytes of a device-updatable kernel node's
/// parameter buffer at byte `offset`: what a kernel's twin does where the
/// CUDA kernel calls `cudaGraphKernelNodeSetParam(node, offset, &value,
/// size)`. `node` is the node's device node handle
/// (`cuGraphKernelNodeGetAttribute` with
/// `CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE` gives it out as
/// `devNode`; twins receive it as an integer argument).
///
/// The buffer is laid out as CUDA lays it out: the parameters in order,
/// each at the next offset that is a multiple of its size (8 for pointers
/// and condition handles). The bytes must fall inside one parameter; part
/// of one is fine. The executable graph made from the node's graph runs
/// the node with its parameters as they are when the node runs, as on a
/// GPU: an update made by a kernel that runs before it in stream order
/// reaches it, even when the graph launch was enqueued before the update
/// ran.
///
/// # Panics
/// When `node` is not a device node handle of the software driver, its
/// graph has not been instantiated or its executable graph was destroyed,
/// `value` is empty, or the bytes do not fall inside one parameter (they
/// straddle two, sit in the padding between two, or run past the end).
/// Called from a twin, the panic fails the launch with this message, as a
/// bad call faults a kernel on a GPU.
///
/// ```
/// use cuda_streams_soft_driver::set_kernel_node_param;
/// let outcome = std::panic::catch_unwind(|| set_kernel_node_param(0x1234, 8, &7u32.to_ne_bytes()));
/// assert!(outcome.is_err(), "0x1234 is not a device node handle");
/// ```
pub fn set_kernel_node_param(node: u64, offset: usize, value: &[u8]) {
    if let Err(why) = try_set(node, offset, value) {
        panic!("{why} (cudaGraphKernelNodeSetParam)");
    }
}

/// How many times the executable graph `exec` was uploaded
/// (`cuGraphUpload`): how a test on this driver sees that an instance with
/// device-updatable nodes is uploaded before its first device-side set,
/// and only once. On a GPU the first upload copies the host's parameters
/// over whatever the device set before it; this driver keeps no device
/// copy, so the count is what can be checked.
///
/// ```
/// use cuda_streams_soft_driver as soft;
/// // Not an executable graph of this driver.
/// assert!(soft::graph_uploads(0x7777_0000 as soft::sys::CUgraphExec).is_err());
/// ```
pub fn graph_uploads(exec: sys::CUgraphExec) -> Result<u64, sys::DriverError> {
    let exec = EXECS
        .get(exec as usize)
        .map_err(|code| code.result().unwrap_err())?;
    Ok(exec.uploads.load(std::sync::atomic::Ordering::Relaxed))
}

/// What a queued kernel node runs instead of the copy made at enqueue, if
/// anything: for a device-updatable node of a live executable graph, the
/// node's arguments as they are now, because a GPU reads a node's
/// parameters when the node runs, so an update that ran before it in
/// stream order counts even if the graph launch was enqueued earlier.
/// `None` for any other kernel (one branch, no lock), and for an executable
/// graph destroyed since, whose in-flight launches CUDA finishes as
/// enqueued.
pub(crate) fn as_it_runs(launch: &Launch) -> Option<Arc<Launch>> {
    let token = launch.device_node?;
    let node = DEVICE_NODES.get(token).ok()?;
    let exec = (*lock(&node.exec))?;
    let exec = EXECS.get(exec).ok()?;
    let nodes = lock(&exec.nodes);
    match &nodes.get(node.index)?.action {
        Action::Kernel(now) if now.device_node == Some(token) => Some(Arc::clone(now)),
        _ => None,
    }
}

/// [`set_kernel_node_param`], with what is wrong as an error: no lock is
/// held when it panics.
fn try_set(token: u64, offset: usize, value: &[u8]) -> Result<(), String> {
    let node = usize::try_from(token)
        .ok()
        .and_then(|handle| DEVICE_NODES.get(handle).ok())
        .ok_or_else(|| format!("{token:#x} is not a device node handle"))?;
    let name = format!(
        "device node {token:#x} (node {} of graph {:#x}, kernel `{}`)",
        node.index, node.graph, node.kernel
    );
    let exec = (*lock(&node.exec))
        .ok_or_else(|| format!("{name}: its graph has not been instantiated"))?;
    let exec = EXECS
        .get(exec)
        .map_err(|_| format!("{name}: its executable graph {exec:#x} was destroyed"))?;
    crate::graph_exec_params::set_kernel_launch(&exec, node.index, &name, |old| {
        if old.device_node != usize::try_from(token).ok() {
            return Err(format!(
                "{name}: the executable graph's node is not that node"
            ));
        }
        let (param, at) =
            locate(old, offset, value.len()).map_err(|why| format!("{name}: {why}"))?;
        let mut new = old.clone();
        let words = &mut new.args[param];
        for (position, &byte) in (at..).zip(value) {
            // Bytes of native-endian words: the buffer's bytes as the twin
            // reads them.
            let word = &mut words[position / 16];
            let mut bytes = word.to_ne_bytes();
            bytes[position % 16] = byte;
            *word = u128::from_ne_bytes(bytes);
        }
        Ok(new)
    })
}

/// The parameter of `launch` that bytes `offset..offset + len` of its
/// parameter buffer fall in, and where in it they start.
fn locate(launch: &Launch, offset: usize, len: usize) -> Result<(usize, usize), String> {
    if len == 0 {
        return Err(format!("an empty value at offset {offset}"));
    }
    let ranges: Vec<_> = param_layout(launch.params).collect();
    if let Some(index) = ranges.iter().position(|bytes| bytes.contains(&offset)) {
        let (bytes, param) = (&ranges[index], &launch.params[index]);
        if len > bytes.end - offset {
            return Err(format!(
                "{len} bytes at offset {offset} run past the end of parameter {index} \
                 ({param}, bytes {}..{}) of `{}`: a write stays inside one parameter",
                bytes.start, bytes.end, launch.name
            ));
        }
        return Ok((index, offset - bytes.start));
    }
    let end = ranges.last().map_or(0, |bytes| bytes.end);
    let layout = (ranges.iter().zip(launch.params))
        .map(|(bytes, param)| format!("{}..{} {param}", bytes.start, bytes.end))
        .collect::<Vec<_>>()
        .join(", ");
    Err(if offset >= end {
        format!(
            "offset {offset} is past the end of the parameter buffer of `{}` ({end} bytes: \
             {layout})",
            launch.name
        )
    } else {
        format!(
            "offset {offset} falls in the padding between parameters of `{}` ({layout})",
            launch.name
        )
    })
}

pub(crate) unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    hNode: CUgraphNode,
    attr: CUkernelNodeAttrID,
    value_out: *mut CUkernelNodeAttrValue,
) -> CUresult {
    code((|| {
        if value_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let not_a_node = || {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{hNode:p} is not a node of a graph of the software driver"),
            )
        };
        let (graph, index) = crate::node_handle::decode(hNode).ok_or_else(not_a_node)?;
        let graph = GRAPHS.get(graph).map_err(|_| not_a_node())?;
        let action = (lock(&graph.nodes).get(index))
            .map(|node| node.action.clone())
            .ok_or_else(not_a_node)?;
        let Action::Kernel(launch) = action else {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "node {hNode:p} (node {index} of graph {:#x}) is not a kernel node",
                    graph.handle
                ),
            ));
        };
        let wanted = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE;
        if attr != wanted {
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                format!(
                    "cuGraphKernelNodeGetAttribute: the software driver answers only \
                     CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE ({}), not attribute {}",
                    wanted.0, attr.0
                ),
            ));
        }
        let mut value = CUkernelNodeAttrValue::default();
        value.deviceUpdatableKernelNode = CUlaunchAttributeValue_union__bindgen_ty_5 {
            deviceUpdatable: i32::from(launch.device_node.is_some()),
            devNode: launch.device_node.unwrap_or(0) as CUgraphDeviceNode,
        };
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(value_out, value) }
    })())
}
