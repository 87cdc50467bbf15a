//! Edges into a node already in a graph (`cuGraphAddDependencies`): how
//! the order check makes a conditional node, whose body is captured after
//! it, follow the writer that body races with.

use crate::errors::{code, fail};
use crate::graph::GRAPHS;
use crate::handles::lock;
use sys::{CUgraph, CUgraphEdgeData, CUgraphNode, CUresult};

pub(crate) unsafe extern "C" fn cuGraphAddDependencies(
    hGraph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    _edgeData: *const CUgraphEdgeData,
    numDependencies: usize,
) -> CUresult {
    code((|| {
        let graph = GRAPHS.get(hGraph as usize)?;
        // SAFETY: CUDA's contract: `numDependencies` readable handles in
        // each array.
        let from = unsafe { graph.node_indices(from, numDependencies) }?;
        // SAFETY: as above.
        let to = unsafe { graph.node_indices(to, numDependencies) }?;
        let mut nodes = lock(&graph.nodes);
        for (&before, &after) in from.iter().zip(&to) {
            // Nodes run in the order they were added, so an edge may only
            // point forward; CUDA would refuse a cycle at instantiation.
            if before >= after {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "an edge from node {} to node {}: the software driver runs a graph's \
                         nodes in the order they were added, so the first must come earlier",
                        before + 1,
                        after + 1
                    ),
                ));
            }
            if !nodes[after].deps.contains(&before) {
                nodes[after].deps.push(before);
            }
        }
        Ok(())
    })())
}
