//! Whole-graph queries, built on demand from a snapshot: deadlock detection
//! and the ready list. The hot path never touches a graph.

use super::{OperationGraph, Phase};
use crate::operation::{EventPriority, OperationId};
use petgraph::algo::tarjan_scc;
use petgraph::graphmap::DiGraphMap;
use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::atomic::Ordering;

/// What the graph queries need of one operation.
struct Node {
    id: OperationId,
    phase: Phase,
    stream_id: u64,
    begun_at: u64,
    priority: EventPriority,
    dependencies: Vec<OperationId>,
}

impl OperationGraph {
    /// Copy what the queries need, so no map lock is held while they run.
    fn snapshot(&self) -> Vec<Node> {
        self.table()
            .iter()
            .map(|(id, op)| Node {
                id,
                phase: op.phase,
                stream_id: op.stream_id,
                begun_at: op.begun_at,
                priority: op.meta.priority,
                dependencies: op.meta.dependencies.to_vec(),
            })
            .collect()
    }

    /// Whether making `id` depend on `dependency` would close a cycle among
    /// the live operations; the cycle as `[id, dependency, …, id]`.
    pub(super) fn closes_cycle(
        &self,
        id: OperationId,
        dependency: OperationId,
    ) -> Option<Vec<OperationId>> {
        let nodes = self.snapshot();
        let mut graph = DiGraphMap::<u64, (), RandomState>::with_capacity(nodes.len(), nodes.len());
        for node in &nodes {
            graph.add_node(node.id.0);
        }
        for node in &nodes {
            for dep in &node.dependencies {
                // Retired dependencies are behind the GPU: no edge.
                if graph.contains_node(dep.0) {
                    graph.add_edge(node.id.0, dep.0, ());
                }
            }
        }
        crate::cycle::closes_cycle(&graph, id.0, dependency.0)
            .map(|cycle| cycle.into_iter().map(OperationId).collect())
    }

    /// Cycles among the operations not yet retired, each as its ids in
    /// ascending order (a strongly connected set: every one waits,
    /// transitively, for every other).
    ///
    /// "Waits for" has two kinds of edge: an operation waits for its
    /// dependencies, and for the operation queued just before it on its
    /// stream. Queue order on a stream is begin order for operations already
    /// begun, then registration order for those not begun yet. So
    /// dependencies alone (always on earlier registrations) cannot form a
    /// cycle, but combined with stream order they can: A queued on stream 1
    /// waiting for B on stream 2, B behind C on stream 2, C waiting for D,
    /// and D behind A on stream 1.
    ///
    /// Each cycle found adds one to
    /// [`CoordinatorMetrics::deadlock_detections`](super::CoordinatorMetrics).
    pub fn detect_deadlocks(&self) -> Vec<Vec<OperationId>> {
        let nodes = self.snapshot();
        let mut graph =
            DiGraphMap::<u64, (), RandomState>::with_capacity(nodes.len(), nodes.len() * 2);
        for node in &nodes {
            graph.add_node(node.id.0);
        }
        for node in &nodes {
            for dep in &node.dependencies {
                // Retired dependencies are behind the GPU: no edge.
                if graph.contains_node(dep.0) {
                    graph.add_edge(node.id.0, dep.0, ());
                }
            }
        }
        let mut by_stream: HashMap<u64, Vec<&Node>> = HashMap::new();
        for node in &nodes {
            by_stream.entry(node.stream_id).or_default().push(node);
        }
        for queue in by_stream.values_mut() {
            queue.sort_by_key(|n| queue_position(n));
            for pair in queue.windows(2) {
                graph.add_edge(pair[1].id.0, pair[0].id.0, ());
            }
        }
        let mut cycles: Vec<Vec<OperationId>> = tarjan_scc(&graph)
            .into_iter()
            .filter(|scc| scc.len() > 1 || graph.contains_edge(scc[0], scc[0]))
            .map(|scc| {
                let mut ids: Vec<OperationId> = scc.into_iter().map(OperationId).collect();
                ids.sort_unstable();
                ids
            })
            .collect();
        cycles.sort_unstable();
        self.counters
            .deadlocks
            .fetch_add(cycles.len() as u64, Ordering::Relaxed);
        cycles
    }

    /// Registered operations (not begun) whose dependencies are all completed
    /// or retired: `Critical` first, then `High`, ..., and within a priority
    /// in registration order.
    pub fn ready_operations(&self) -> Vec<OperationId> {
        let nodes = self.snapshot();
        let phases: HashMap<OperationId, Phase> = nodes.iter().map(|n| (n.id, n.phase)).collect();
        let mut ready: Vec<(EventPriority, OperationId)> = nodes
            .iter()
            .filter(|n| n.phase == Phase::Registered)
            .filter(|n| {
                n.dependencies.iter().all(|dep| match phases.get(dep) {
                    Some(phase) => *phase == Phase::Completed,
                    // Retired (it was known at registration).
                    None => true,
                })
            })
            .map(|n| (n.priority, n.id))
            .collect();
        ready.sort_unstable();
        ready.into_iter().map(|(_, id)| id).collect()
    }
}

/// Sort key for queue order on a stream: begun operations by begin order,
/// then the rest by registration order.
fn queue_position(node: &Node) -> (bool, u64) {
    match node.phase {
        Phase::Registered => (true, node.id.0),
        _ => (false, node.begun_at),
    }
}
