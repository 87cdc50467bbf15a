//! The kernel nodes an executable graph can set ([`KernelNode`]), and what
//! it keeps of the arguments set on them ([`NodeArgs`]): see `node_update`.

use super::args::{GraphArg, Kept, add_use};
use crate::features::launch_config::LaunchConfig;
use crate::features::module::Kernel;
use crate::ground::id_hash::IdMap;
use std::any::Any;
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
    /// The buffers it was captured with (keyed as `NodeArgs` keys them),
    /// and whether it writes each: the uses of its graph's that an
    /// instance stops ordering once the node is set to other buffers.
    pub(super) captured: Arc<[(usize, bool)]>,
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

/// What [`GraphExec::set_args`](super::GraphExec::set_args) set since the
/// instance was made or last updated from a graph, and so what its launches
/// order: the graph's buffers with the uses the nodes make of each now
/// (the captured counts, less the captured uses of the nodes set since,
/// plus the uses of their new arguments), and the buffers of new arguments
/// that are not the graph's. A buffer no node uses any more is not
/// ordered; one a node was set to is, with the strongest use any node
/// makes of it.
#[derive(Default)]
pub(super) struct NodeArgs {
    /// Per node set (by its handle), the buffers of its latest arguments,
    /// and whether it writes each.
    by_node: IdMap<usize, NodeBuffers>,
    /// Which of the graph's buffers each key is: built at the first set,
    /// dropped with the rest on update.
    base: Option<IdMap<usize, usize>>,
    /// Per graph buffer, by its index there: the reads and writes the
    /// nodes make of it now. Empty until the first set: the graph's own.
    net: Vec<(u32, u32)>,
    /// The buffers of the nodes' new arguments, kept while a node is set
    /// to them, keyed by the buffer's address in memory (the `Arc`'s),
    /// with the set nodes' uses of each.
    extra: IdMap<usize, ExtraBuffer>,
}

/// A node's buffers, by key, and whether written: inline for the few a
/// kernel takes, so setting a node allocates nothing.
type NodeBuffers = smallvec::SmallVec<[(usize, bool); 4]>;

struct ExtraBuffer {
    memory: Arc<dyn Kept>,
    /// Reads, writes.
    uses: (u32, u32),
    /// Its index among the graph's buffers, if it is one: then `net`
    /// counts its uses for the launches, and this entry only keeps it.
    base_index: Option<usize>,
}

pub(super) fn key(memory: &Arc<dyn Kept>) -> usize {
    Arc::as_ptr(memory).cast::<()>() as usize
}

/// `args`' buffers that a set keeps and orders, by key, and whether each
/// is written: not those the graph allocates and frees itself.
pub(super) fn kept_buffers(
    args: &[GraphArg],
) -> impl Iterator<Item = (&Arc<dyn Kept>, bool)> + Clone {
    args.iter()
        .filter_map(GraphArg::buffer)
        .filter(|(memory, _)| memory.graph_family().is_none())
}

/// One use fewer in a (reads, writes) pair. More taken than counted cannot
/// happen (a node's uses are among the counts); were it to, the count
/// stays, ordering the buffer as before rather than dropping a use.
fn take_use(pair: &mut (u32, u32), write: bool) {
    let slot = if write { &mut pair.1 } else { &mut pair.0 };
    *slot = slot.checked_sub(1).unwrap_or(*slot);
}

impl NodeArgs {
    /// The buffers a launch orders, and whether it writes each, given the
    /// graph's buffers (and whether some node writes each).
    pub(super) fn uses<'a>(
        &'a self,
        base: &'a [(Arc<dyn Kept>, bool)],
    ) -> impl Iterator<Item = (&'a Arc<dyn Kept>, bool)> + Clone + 'a {
        let graphs = base
            .iter()
            .enumerate()
            .filter_map(|(index, (memory, write))| match self.net.get(index) {
                // Nothing set: the graph's uses as captured.
                None => Some((memory, *write)),
                Some(&(reads, writes)) => (reads + writes > 0).then_some((memory, writes > 0)),
            });
        let added = self
            .extra
            .values()
            .filter(|e| e.base_index.is_none())
            .map(|e| (&e.memory, e.uses.1 > 0));
        graphs.chain(added)
    }

    /// `node`'s arguments are now `args`; what it had before is let go.
    /// `base` and `counts` are the graph's buffers and the uses its nodes
    /// make of each. `captured_in_base`: they are those of the graph the
    /// node was captured in (not of one the instance was updated from), so
    /// the node's captured uses are among the counts and come off them the
    /// first time it is set.
    pub(super) fn replace(
        &mut self,
        base: &[(Arc<dyn Kept>, bool)],
        counts: &[(u32, u32)],
        node: &KernelNode,
        args: &[GraphArg],
        captured_in_base: bool,
    ) {
        let node_key = node.raw as usize;
        if let Some(kept) = self.by_node.get(&node_key)
            && kept
                .iter()
                .copied()
                .eq(kept_buffers(args).map(|(memory, write)| (key(memory), write)))
        {
            // New scalars on the same buffers (the common update): what is
            // kept and ordered stays as it is.
            return;
        }
        if self.base.is_none() {
            self.base = Some(
                base.iter()
                    .enumerate()
                    .map(|(index, (memory, _))| (key(memory), index))
                    .collect(),
            );
            self.net = counts.to_vec();
        }
        let mut counted = NodeBuffers::new();
        for (memory, write) in kept_buffers(args) {
            let buffer = key(memory);
            let base_index = self.base_index(buffer);
            let entry = self.extra.entry(buffer).or_insert_with(|| ExtraBuffer {
                memory: Arc::clone(memory),
                uses: (0, 0),
                base_index,
            });
            add_use(&mut entry.uses, write);
            if let Some(index) = base_index {
                add_use(&mut self.net[index], write);
            }
            counted.push((buffer, write));
        }
        let old = self.by_node.insert(node_key, counted);
        if old.is_none() && captured_in_base {
            // Set for the first time: its captured uses are let go.
            for &(buffer, write) in node.captured.iter() {
                if let Some(index) = self.base_index(buffer) {
                    take_use(&mut self.net[index], write);
                }
            }
        }
        for (buffer, write) in old.into_iter().flatten() {
            let Some(entry) = self.extra.get_mut(&buffer) else {
                continue;
            };
            take_use(&mut entry.uses, write);
            if let Some(index) = entry.base_index {
                take_use(&mut self.net[index], write);
            }
            if entry.uses == (0, 0) {
                // Freed (if this was the last owner) after the replays that
                // used it: its use tracker orders the free.
                self.extra.remove(&buffer);
            }
        }
    }

    /// `buffer`'s index among the graph's buffers, if it is one of them.
    fn base_index(&self, buffer: usize) -> Option<usize> {
        self.base.as_ref()?.get(&buffer).copied()
    }
}
