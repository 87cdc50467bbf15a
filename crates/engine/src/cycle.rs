//! The one cycle check of the workspace: does a new edge close a cycle, and
//! through which nodes? The operation graph, the stream coordinator's stream
//! graph and the pipeline's stage graph all ask it.

use petgraph::algo::astar;
use petgraph::graphmap::{DiGraphMap, NodeTrait};
use std::hash::BuildHasher;

/// Whether adding the edge `from -> to` to `graph` would close a cycle. If it
/// would, the cycle is returned as the nodes in edge order, starting and
/// ending with `from`: `[from, to, …, from]`. An edge from a node to itself is
/// the cycle `[from, from]`.
///
/// Edges mean whatever the caller's graph means (here usually "waits for");
/// the answer is the shortest such cycle, so error messages stay short.
///
/// ```
/// use cuda_streams_engine::cycle::closes_cycle;
/// use petgraph::graphmap::DiGraphMap;
/// let mut waits = DiGraphMap::<u32, (), std::hash::RandomState>::default();
/// waits.add_edge(2, 1, ()); // 2 waits for 1
/// waits.add_edge(3, 2, ());
/// assert_eq!(closes_cycle(&waits, 1, 3), Some(vec![1, 3, 2, 1]));
/// assert_eq!(closes_cycle(&waits, 3, 1), None);
/// assert_eq!(closes_cycle(&waits, 4, 4), Some(vec![4, 4]));
/// ```
pub fn closes_cycle<N, E, S>(graph: &DiGraphMap<N, E, S>, from: N, to: N) -> Option<Vec<N>>
where
    N: NodeTrait,
    S: BuildHasher,
{
    if from == to {
        return Some(vec![from, from]);
    }
    if !graph.contains_node(to) || !graph.contains_node(from) {
        return None;
    }
    let (_, path) = astar(graph, to, |n| n == from, |_| 1u32, |_| 0)?;
    let mut cycle = Vec::with_capacity(path.len() + 1);
    cycle.push(from);
    cycle.extend(path);
    Some(cycle)
}

/// `cycle` written as `a -> b -> a`, each node through `name`.
pub fn describe<N: Copy>(cycle: &[N], mut name: impl FnMut(N) -> String) -> String {
    cycle
        .iter()
        .map(|&n| name(n))
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// The same cycle (`[a, b, …, a]`) starting at its least node, so a cycle
/// reads the same whichever edge closed it.
///
/// ```
/// use cuda_streams_engine::cycle::from_least;
/// assert_eq!(from_least(&[3, 1, 2, 3]), [1, 2, 3, 1]);
/// assert_eq!(from_least(&[4, 4]), [4, 4]);
/// ```
pub fn from_least<N: Copy + Ord>(cycle: &[N]) -> Vec<N> {
    let ring = &cycle[..cycle.len().saturating_sub(1)];
    let Some(start) = ring
        .iter()
        .enumerate()
        .min_by_key(|&(_, n)| *n)
        .map(|(i, _)| i)
    else {
        return cycle.to_vec();
    };
    let mut out: Vec<N> = ring[start..]
        .iter()
        .chain(&ring[..start])
        .copied()
        .collect();
    out.push(ring[start]);
    out
}
