//! The kernel nodes an executable graph can set ([`KernelNode`]), and what
//! it keeps of the arguments set on them ([`NodeArgs`]): see `node_update`.

use super::args::{GraphArg, Kept};
use crate::features::launch::LaunchConfig;
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
/// order: the graph's buffers (`base`, with how many uses the nodes make of
/// each), less the captured uses of the nodes set since, plus the buffers
/// of their new arguments. A buffer no node uses any more is not ordered;
/// one a node was set to is, with the strongest use any node makes of it.
#[derive(Default)]
pub(super) struct NodeArgs {
    /// Per node set (by its handle), the buffers of its latest arguments,
    /// counted in `extra`, and whether as written.
    by_node: IdMap<usize, NodeBuffers>,
    /// Keyed by the buffer's address in memory (the `Arc`'s).
    extra: IdMap<usize, ExtraBuffer>,
    /// The graph's uses the nodes set no longer make: reads, writes.
    removed: IdMap<usize, (u32, u32)>,
    /// Which of the graph's buffers each key is: built at the first set,
    /// dropped with the rest on update.
    base: Option<IdMap<usize, usize>>,
}

/// A node's buffers, by key, and whether written: inline for the few a
/// kernel takes, so setting a node allocates nothing.
type NodeBuffers = smallvec::SmallVec<[(usize, bool); 4]>;

struct ExtraBuffer {
    memory: Arc<dyn Kept>,
    reads: u32,
    writes: u32,
}

pub(super) fn key(memory: &Arc<dyn Kept>) -> usize {
    Arc::as_ptr(memory).cast::<()>() as usize
}

/// A use, counted in a (reads, writes) pair.
fn count(pair: &mut (u32, u32), write: bool, by: i64) {
    let slot = if write { &mut pair.1 } else { &mut pair.0 };
    *slot = u32::try_from(i64::from(*slot) + by).unwrap_or(0);
}

impl NodeArgs {
    /// The buffers a launch orders, and whether it writes each, given the
    /// graph's buffers and their use counts.
    pub(super) fn uses<'a>(
        &'a self,
        base: &'a [(Arc<dyn Kept>, bool)],
        counts: &'a [(u32, u32)],
    ) -> impl Iterator<Item = (&'a Arc<dyn Kept>, bool)> + Clone + 'a {
        let nothing_set = self.by_node.is_empty();
        let graphs = base
            .iter()
            .zip(counts)
            .filter_map(move |((memory, write), &(r, w))| {
                if nothing_set {
                    return Some((memory, *write));
                }
                let k = key(memory);
                let (gone_r, gone_w) = self.removed.get(&k).copied().unwrap_or((0, 0));
                let (new_r, new_w) = self.extra.get(&k).map_or((0, 0), |e| (e.reads, e.writes));
                // More removed than counted cannot happen (a node's captured
                // uses are among the counts); were it to, order the buffer as
                // captured rather than drop a use.
                let (Some(r), Some(w)) = (r.checked_sub(gone_r), w.checked_sub(gone_w)) else {
                    return Some((memory, *write));
                };
                let (reads, writes) = (r + new_r, w + new_w);
                (reads + writes > 0).then_some((memory, writes > 0))
            });
        let base_keys = self.base.as_ref();
        let added = self
            .extra
            .values()
            .filter(move |e| base_keys.is_none_or(|keys| !keys.contains_key(&key(&e.memory))))
            .map(|e| (&e.memory, e.writes > 0));
        graphs.chain(added)
    }

    /// `node`'s arguments are now `args`; what it had before is let go.
    /// `captured_in_base`: the graph's buffers are those of the graph the
    /// node was captured in (not of one the instance was updated from),
    /// so the node's captured uses are among their counts and come off them
    /// the first time it is set.
    pub(super) fn replace(
        &mut self,
        base: &[(Arc<dyn Kept>, bool)],
        node: &KernelNode,
        args: &[GraphArg],
        captured_in_base: bool,
    ) {
        self.base.get_or_insert_with(|| {
            base.iter()
                .enumerate()
                .map(|(index, (memory, _))| (key(memory), index))
                .collect()
        });
        // Allocated and freed by the graph itself: neither kept nor ordered.
        let buffers = || {
            args.iter()
                .filter_map(GraphArg::buffer)
                .filter(|(memory, _)| memory.graph_family().is_none())
        };
        let node_key = node.raw as usize;
        if let Some(kept) = self.by_node.get(&node_key)
            && kept
                .iter()
                .copied()
                .eq(buffers().map(|(memory, write)| (key(memory), write)))
        {
            // New scalars on the same buffers (the common update): what is
            // kept and ordered stays as it is.
            return;
        }
        let mut counted = NodeBuffers::new();
        for (memory, write) in buffers() {
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
        let old = self.by_node.insert(node_key, counted);
        if old.is_none() && captured_in_base {
            for &(buffer, write) in node.captured.iter() {
                count(self.removed.entry(buffer).or_default(), write, 1);
            }
        }
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
