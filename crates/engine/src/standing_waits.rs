//! The state behind a graph's standing stream dependencies: the wait graph
//! of stream ids and the streams it names, under one lock. The graph's
//! methods over it are in `streams.rs`; this file sits below the graph,
//! which holds one.

use driver::Stream;
use petgraph::Direction::{Incoming, Outgoing};
use petgraph::graphmap::DiGraphMap;
use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::{Arc, Mutex, MutexGuard};

/// Stream ids; an edge `a -> b` means "a waits for b".
pub(crate) type WaitGraph = DiGraphMap<u64, (), RandomState>;

/// The standing dependencies of one [`OperationGraph`].
#[derive(Default)]
pub(crate) struct StandingWaits(Mutex<Standing>);

#[derive(Default)]
pub(crate) struct Standing {
    pub(crate) waits: WaitGraph,
    /// The streams with at least one standing dependency, to apply them again.
    pub(crate) streams: HashMap<u64, Arc<Stream>>,
}

impl StandingWaits {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Standing> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Standing {
    /// Drop a stream that no standing dependency names any more.
    pub(crate) fn forget_if_isolated(&mut self, id: u64) {
        let isolated = self.waits.contains_node(id)
            && self.waits.neighbors_directed(id, Incoming).next().is_none()
            && self.waits.neighbors_directed(id, Outgoing).next().is_none();
        if isolated {
            self.waits.remove_node(id);
            self.streams.remove(&id);
        }
    }
}
