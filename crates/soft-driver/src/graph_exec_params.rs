//! A kernel node's launch set in an executable graph
//! (`cuGraphExecKernelNodeSetParams`): the launches made after take the
//! new arguments and shape; those already made keep their own copy of the
//! work, as on CUDA.

use crate::errors::{code, fail};
use crate::graph::EXECS;
use crate::handles::lock;
use crate::modules::{LaunchDims, kernel_launch};
use crate::ops::Action;
use std::sync::Arc;
use sys::{CUDA_KERNEL_NODE_PARAMS, CUgraphExec, CUgraphNode, CUresult};

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
        let launch =
            unsafe { kernel_launch(params.func, dims, params.kernelParams, params.extra) }?;
        let mut nodes = lock(&exec.nodes);
        // A node's handle is its index in the graph plus one, and an
        // executable graph keeps the graph's nodes in their places.
        let len = nodes.len();
        let node = (hNode as usize)
            .checked_sub(1)
            .and_then(|index| nodes.get_mut(index))
            .ok_or_else(|| {
                fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "node {hNode:p} is not a node of the executable graph (it has {len} nodes)"
                    ),
                )
            })?;
        match &node.action {
            // CUDA lets the function change within its context; the safe
            // layer never asks for that, and a twin of another kernel here
            // would be a bug there.
            Action::Kernel(old) if old.name == launch.name => {
                node.action = Action::Kernel(Arc::new(launch));
                Ok(())
            }
            Action::Kernel(old) => Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "node {hNode:p} launches `{}`, not `{}`",
                    old.name, launch.name
                ),
            )),
            _ => Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("node {hNode:p} is not a kernel node"),
            )),
        }
    })())
}
