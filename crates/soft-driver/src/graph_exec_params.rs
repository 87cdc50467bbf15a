//! A kernel node's launch set in an executable graph
//! (`cuGraphExecKernelNodeSetParams`, and a kernel's own
//! `cudaGraphKernelNodeSetParam` through `device_node`): the launches made
//! after take the new arguments and shape; those already made keep their
//! own copy of the work, as on CUDA.

use crate::errors::{code, fail};
use crate::graph::{EXECS, Exec};
use crate::handles::lock;
use crate::launch_dims::LaunchDims;
use crate::modules::kernel_launch;
use crate::ops::{Action, Launch};
use std::sync::Arc;
use sys::{CUDA_KERNEL_NODE_PARAMS, CUgraphExec, CUgraphNode, CUresult};

/// Replace the launch of kernel node `index` of `exec` with what `update`
/// makes of it. `node` names the node in the messages of the errors.
///
/// The executable graph's node list is locked only for the swap, never
/// while user code runs: `cuGraphLaunch` copies the list under the same
/// lock, so a launch takes either the old launch or the new one, whole.
pub(crate) fn set_kernel_launch(
    exec: &Exec,
    index: usize,
    node: &str,
    update: impl FnOnce(&Launch) -> Result<Launch, String>,
) -> Result<(), String> {
    let mut nodes = lock(&exec.nodes);
    let len = nodes.len();
    let slot = nodes.get_mut(index).ok_or_else(|| {
        format!("{node} is not a node of the executable graph (it has {len} nodes)")
    })?;
    let Action::Kernel(old) = &slot.action else {
        return Err(format!("{node} is not a kernel node"));
    };
    slot.action = Action::Kernel(Arc::new(update(old)?));
    Ok(())
}

pub(crate) unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    hGraphExec: CUgraphExec,
    hNode: CUgraphNode,
    nodeParams: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    code((|| {
        let exec = EXECS.get(hGraphExec as usize)?;
        if nodeParams.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; readable per the API.
        let params = unsafe { &*nodeParams };
        let dims = LaunchDims {
            grid: (params.gridDimX, params.gridDimY, params.gridDimZ),
            block: (params.blockDimX, params.blockDimY, params.blockDimZ),
            shared_mem_bytes: params.sharedMemBytes,
        };
        // SAFETY: CUDA's contract: `kernelParams` holds the function's
        // arguments, as for a launch.
        let mut launch =
            unsafe { kernel_launch(params.func, dims, params.kernelParams, params.extra) }?;
        let node = format!("node {hNode:p}");
        // An executable graph keeps the nodes of the graph it was made
        // from in their places; a node of another graph is none of its.
        let index = match crate::node_handle::decode(hNode) {
            Some((graph, index)) if graph == exec.graph => index,
            _ => usize::MAX,
        };
        set_kernel_launch(&exec, index, &node, |old| {
            // CUDA lets the function change within its context; the safe
            // layer never asks for that, and a twin of another kernel here
            // would be a bug there.
            if old.name != launch.name {
                return Err(format!(
                    "{node} launches `{}`, not `{}`",
                    old.name, launch.name
                ));
            }
            // Still the same node: a kernel may still update it.
            launch.device_node = old.device_node;
            Ok(launch)
        })
        .map_err(|why| fail(CUresult::CUDA_ERROR_INVALID_VALUE, why))
    })())
}
