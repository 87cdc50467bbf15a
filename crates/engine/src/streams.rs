//! Standing stream dependencies: "stream B waits for stream A", kept by the
//! graph and applied again on request, prerequisites first.
//!
//! An operation's dependency orders one operation after another; a standing
//! dependency orders a whole stream after another, now and whenever it is
//! applied again. An edge that would make a stream wait, transitively, for
//! itself is refused when it is added, by the workspace's one cycle check
//! ([`crate::cycle`]), so the standing dependencies stay acyclic.

use crate::error::{Error, Result};
use crate::graph::OperationGraph;
use driver::Stream;
use petgraph::visit::DfsPostOrder;

impl OperationGraph {
    /// Make work enqueued on `dependent` from now on wait until
    /// `prerequisite` has finished the work enqueued on it so far (one event,
    /// [`Stream::wait_stream`]), and keep the dependency, so that
    /// [`apply_stream_dependencies`](Self::apply_stream_dependencies) orders
    /// later work the same way.
    ///
    /// Fails, changing nothing, with [`Error::StreamCycle`] when
    /// `prerequisite` already waits for `dependent` (directly or through
    /// other streams), or when both are the same stream: the error names the
    /// cycle, each stream waiting for the next. Adding a dependency already
    /// kept applies it again. The graph keeps a handle to both streams
    /// until the dependency is removed.
    ///
    /// ```
    /// use cuda_streams_engine::{Error, OperationGraph};
    /// use cuda_streams_engine::driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let (upload, compute) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let graph = OperationGraph::for_context(&ctx);
    /// graph.add_stream_dependency(&compute, &upload)?; // compute waits for upload
    /// let err = graph.add_stream_dependency(&upload, &compute).unwrap_err();
    /// assert!(matches!(&err, Error::StreamCycle { path } if *path == [upload.id(), compute.id(), upload.id()]));
    /// assert_eq!(graph.stream_dependencies(), [(compute.id(), upload.id())]);
    ///
    /// // Later work: apply the standing dependencies again.
    /// let mut data = DeviceBuffer::<u32>::new(&ctx, 256)?;
    /// upload.memset_u32_async(&mut data, 4)?;
    /// graph.apply_stream_dependencies()?;
    /// let mut host = PinnedBuffer::<u32>::new(&ctx, 256)?;
    /// compute.copy_to_host_async(&mut host, &data)?;
    /// assert!(host.as_slice()?.iter().all(|&v| v == 4));
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_stream_dependency(&self, dependent: &Stream, prerequisite: &Stream) -> Result<()> {
        let (d, p) = (dependent.id(), prerequisite.id());
        let mut standing = self.stream_order.lock();
        if let Some(path) = crate::cycle::closes_cycle(&standing.waits, d, p) {
            return Err(Error::StreamCycle { path });
        }
        dependent.wait_stream(prerequisite)?;
        standing.waits.add_edge(d, p, ());
        standing
            .streams
            .entry(d)
            .or_insert_with(|| dependent.to_arc());
        standing
            .streams
            .entry(p)
            .or_insert_with(|| prerequisite.to_arc());
        tracing::debug!(
            dependent = d,
            prerequisite = p,
            "stream {d} waits for stream {p} (standing)"
        );
        Ok(())
    }

    /// Forget a standing dependency (work already ordered stays ordered).
    /// Returns whether there was one.
    pub fn remove_stream_dependency(&self, dependent: &Stream, prerequisite: &Stream) -> bool {
        let (d, p) = (dependent.id(), prerequisite.id());
        let mut standing = self.stream_order.lock();
        let removed = standing.waits.remove_edge(d, p).is_some();
        if removed {
            standing.forget_if_isolated(d);
            standing.forget_if_isolated(p);
        }
        removed
    }

    /// The standing dependencies as `(dependent id, prerequisite id)`.
    pub fn stream_dependencies(&self) -> Vec<(u64, u64)> {
        let standing = self.stream_order.lock();
        standing.waits.all_edges().map(|(d, p, _)| (d, p)).collect()
    }

    /// Whether the standing dependencies contain a cycle.
    /// [`add_stream_dependency`](Self::add_stream_dependency) refuses the
    /// edge that would close one, so this stays `false`; it is a check for
    /// callers that assert the invariant, asked of the same one cycle check
    /// ([`crate::cycle`]): does some edge's prerequisite reach its dependent.
    pub fn has_stream_cycles(&self) -> bool {
        let standing = self.stream_order.lock();
        let waits = &standing.waits;
        waits
            .all_edges()
            .any(|(d, p, _)| crate::cycle::closes_cycle(waits, d, p).is_some())
    }

    /// Apply every standing dependency again, for the work enqueued since:
    /// prerequisites first (a depth-first post-order of "waits for"), so a
    /// chain `c -> b -> a` puts `c` after `a`'s current end in one call. The
    /// host does not wait. The dependencies are acyclic (refused at
    /// [`add_stream_dependency`](Self::add_stream_dependency)), so no second
    /// cycle check runs here; a post-order visits each stream once
    /// whatever the edges.
    pub fn apply_stream_dependencies(&self) -> Result<()> {
        let standing = self.stream_order.lock();
        let waits = &standing.waits;
        let mut order = DfsPostOrder::empty(waits);
        for start in waits.nodes() {
            order.move_to(start);
            while let Some(id) = order.next(waits) {
                let dependent = &standing.streams[&id];
                for prerequisite in waits.neighbors(id) {
                    dependent.wait_stream(&standing.streams[&prerequisite])?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use driver::Context;

    /// Through `add_stream_dependency` the standing dependencies never hold a
    /// cycle, so `has_stream_cycles` is `false` in every test that builds
    /// them that way. Forcing the edge the check refuses shows it does see
    /// one (and that applying them then ends instead of looping).
    #[test]
    fn a_cycle_forced_past_the_check_is_seen() {
        let ctx = Context::new(0).unwrap();
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let graph = OperationGraph::for_context(&ctx);
        graph.add_stream_dependency(&b, &a).unwrap();
        assert!(!graph.has_stream_cycles());
        graph.stream_order.lock().waits.add_edge(a.id(), b.id(), ());
        assert!(graph.has_stream_cycles());
        graph.apply_stream_dependencies().unwrap();
    }
}
