//! The kernel nodes an executable graph can set ([`KernelNode`]), and what
//! it keeps of the arguments set on them ([`NodeArgs`]): see `node_update`.

use super::args::{GraphArg, Kept};
use crate::features::launch::LaunchConfig;
use crate::features::module::Kernel;
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use sys::{CUfunction, CUgraphNode};

/// A kernel launch captured with [`Capture::launch_updatable`](super::Capture::launch_updatable): pass it to
/// [`GraphExec::set_args`](super::GraphExec::set_args) of an instance of its graph to change the
/// launch's arguments (or, with [`GraphExec::set_launch`](super::GraphExec::set_launch), its shape) for
/// the replays launched after.
///
/// It keeps its kernel loaded. It means something only to instances of the
/// graph its capture made: another instance refuses it.
#[derive(Clone)]
pub struct KernelNode {
    pub(super) raw: CUgraphNode,
    /// The capture that recorded it (what an instance was instantiated from).
    pub(super) capture: u64,
    /// Its place among the capture's nodes, for messages.
    pub(super) position: usize,
    pub(super) kernel: Kernel,
    /// The kernel's function in the stream's context (its partition's, on
    /// a partition's stream), kept loaded by `partition`.
    pub(super) function: CUfunction,
    pub(super) config: LaunchConfig,
    pub(super) _partition: Option<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: the node and function handles are identifiers the driver accepts
// from any thread; they are used only in driver calls made through an
// instance borrowed mutably (`GraphExec::set_launch`).
unsafe impl Send for KernelNode {}
// SAFETY: as above; a shared `KernelNode` is only read.
unsafe impl Sync for KernelNode {}

impl KernelNode {
    /// The kernel it launches.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The launch configuration it was captured with.
    pub fn config(&self) -> LaunchConfig {
        self.config
    }

    /// Its place among the nodes of its capture (0 for the first).
    pub fn position(&self) -> usize {
        self.position
    }

    /// The raw node handle (owned by its graph).
    pub fn as_raw(&self) -> CUgraphNode {
        self.raw
    }
}

impl fmt::Debug for KernelNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelNode")
            .field("kernel", &self.kernel.name())
            .field("capture", &self.capture)
            .field("position", &self.position)
            .finish()
    }
}

/// What [`GraphExec::set_args`](super::GraphExec::set_args) set: each node's latest arguments, and the
/// buffers among them that the graph's resources do not already order as
/// this (or a stronger) use, which every launch orders as well.
#[derive(Default)]
pub(super) struct NodeArgs {
    /// Per node (by its handle), the buffers of its latest arguments that
    /// were counted into `extra`, and whether as written.
    by_node: HashMap<usize, Vec<(usize, bool)>>,
    /// Keyed by the buffer's address in memory (the `Arc`'s).
    extra: HashMap<usize, ExtraBuffer>,
    /// The graph's own buffers, keyed as `extra`, with whether a node
    /// writes each: built at the first set, dropped with the rest on update.
    base: Option<HashMap<usize, bool>>,
}

struct ExtraBuffer {
    memory: Arc<dyn Kept>,
    reads: u32,
    writes: u32,
}

fn key(memory: &Arc<dyn Kept>) -> usize {
    Arc::as_ptr(memory).cast::<()>() as usize
}

impl NodeArgs {
    /// The buffers a launch orders besides the graph's, and whether it
    /// writes each.
    pub(super) fn extra(&self) -> impl Iterator<Item = (&Arc<dyn Kept>, bool)> + Clone {
        self.extra.values().map(|e| (&e.memory, e.writes > 0))
    }

    /// `node`'s arguments are now `args`; what it had before is let go.
    ///
    /// Only the buffers counted into `extra` are remembered per node (none,
    /// in the common case of new scalars with the captured buffers, which
    /// costs no allocation); the node's kernel and function are kept by the
    /// graph's resources, which an update replaces only together with all
    /// of this.
    pub(super) fn replace(
        &mut self,
        base: &[(Arc<dyn Kept>, bool)],
        node: &KernelNode,
        args: &[GraphArg],
    ) {
        let base = self.base.get_or_insert_with(|| {
            base.iter()
                .map(|(memory, write)| (key(memory), *write))
                .collect()
        });
        let mut counted = Vec::new();
        for (memory, write) in args.iter().filter_map(GraphArg::buffer) {
            if memory.graph_family().is_some() {
                // Allocated and freed by the graph itself.
                continue;
            }
            if base
                .get(&key(memory))
                .is_some_and(|&base_writes| base_writes || !write)
            {
                continue;
            }
            let entry = self
                .extra
                .entry(key(memory))
                .or_insert_with(|| ExtraBuffer {
                    memory: Arc::clone(memory),
                    reads: 0,
                    writes: 0,
                });
            if write {
                entry.writes += 1;
            } else {
                entry.reads += 1;
            }
            counted.push((key(memory), write));
        }
        let old = if counted.is_empty() {
            self.by_node.remove(&(node.raw as usize))
        } else {
            self.by_node.insert(node.raw as usize, counted)
        };
        for (buffer, write) in old.into_iter().flatten() {
            let Some(entry) = self.extra.get_mut(&buffer) else {
                continue;
            };
            if write {
                entry.writes -= 1;
            } else {
                entry.reads -= 1;
            }
            if entry.reads == 0 && entry.writes == 0 {
                // Freed (if this was the last owner) after the replays that
                // used it: its use tracker orders the free.
                self.extra.remove(&buffer);
            }
        }
    }
}
