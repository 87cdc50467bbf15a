//! Graph node handles (`CUgraphNode`). Some of CUDA's node calls
//! (`cuGraphKernelNodeGetAttribute`) name a node by its handle alone, so a
//! handle names its graph as well as the node: the graph's handle in the
//! high bits, the node's index plus one in the low [`INDEX_BITS`] (never
//! zero, so no handle is null). Graph handles are minted from a counter
//! that stays far below 2^40, so the pair always fits in 64 bits, and a
//! handle of one graph never names a node of another.

use crate::errors::fail;
use sys::{CUgraphNode, CUresult};

/// The bits that hold a node's index plus one: a graph's first 2^24 - 1
/// nodes have handles of their own (a larger graph's later nodes alias
/// earlier ones; capture never makes graphs that large).
const INDEX_BITS: u32 = 24;
const INDEX_MASK: usize = (1 << INDEX_BITS) - 1;

/// The handle of node `index` of the graph whose handle is `graph`.
pub(crate) fn node_handle(graph: usize, index: usize) -> usize {
    (graph << INDEX_BITS) | ((index + 1) & INDEX_MASK)
}

/// The graph handle and node index a node handle names, if it is one.
pub(crate) fn decode(node: CUgraphNode) -> Option<(usize, usize)> {
    let node = node as usize;
    let index = (node & INDEX_MASK).checked_sub(1)?;
    Some((node >> INDEX_BITS, index))
}

/// Node handles of the graph whose handle is `graph` (it has `len` nodes)
/// as indices, checked: each names a node that graph has.
///
/// # Safety
/// `nodes` points at `count` readable handles (or `count` is 0).
pub(crate) unsafe fn node_indices(
    graph: usize,
    len: usize,
    nodes: *const CUgraphNode,
    count: usize,
) -> Result<Vec<usize>, CUresult> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if nodes.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's promise.
    let handles = unsafe { std::slice::from_raw_parts(nodes, count) };
    handles
        .iter()
        .map(|&node| match decode(node) {
            Some((owner, index)) if owner == graph && index < len => Ok(index),
            _ => Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("node {node:p} is not a node of graph {graph:#x} (it has {len} nodes)"),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_names_its_graph_and_node_and_is_never_null() {
        let graph = crate::handles::mint();
        let other = crate::handles::mint();
        let node = node_handle(graph, 0) as CUgraphNode;
        assert!(!node.is_null());
        assert_eq!(decode(node), Some((graph, 0)));
        assert_eq!(
            decode(node_handle(graph, 41) as CUgraphNode),
            Some((graph, 41))
        );
        assert_ne!(node_handle(graph, 3), node_handle(other, 3));
        // An index-plus-one of 0 is no node.
        assert_eq!(decode((graph << INDEX_BITS) as CUgraphNode), None);
        assert_eq!(decode(std::ptr::null_mut()), None);
    }
}
