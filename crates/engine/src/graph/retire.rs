//! Retirement: completed operations are dropped once the GPU has passed their
//! completion event, so a long-running coordinator stays small.
//!
//! Each stream keeps its completed operations in its completion trail (the
//! driver's [`driver::CompletionTrail`]; the event is recorded under the
//! table's lock, so the trail is in record order), and a sweep asks the
//! trail how far the GPU got, every `SWEEP_EVERY` completions on a stream.
//! A query costs about 0.25 µs on the H200 machine, as much as taking eight
//! operations out of the table, so the automatic sweeps ask the trail to
//! guess ([`TrailSearch::Guess`]: one query while its guess holds) and leave
//! what the GPU passed beyond the guess to the next sweep.
//! [`OperationGraph::retire_completed`] retires exactly what the GPU has
//! passed ([`TrailSearch::Exact`]).

use super::table::{ReleasedList, Table};
use super::{OperationGraph, Phase};
use crate::error::{Error, Result};
use crate::operation::OperationId;
use driver::{PooledEvent, Stream, TrailSearch};
use smallvec::SmallVec;
use std::sync::Arc;

/// Whether the GPU has passed `event`; a failed query counts as "not yet".
fn passed(id: OperationId, event: &PooledEvent) -> bool {
    event.query().unwrap_or_else(|err| {
        tracing::error!(
            operation = id.0,
            "querying the completion event of {id}: {err}"
        );
        false
    })
}

/// How many of a stream's queued operations, from the front, the GPU has
/// passed, by its trail's `search`.
fn passed_count(table: &Table, stream_id: u64, search: TrailSearch) -> usize {
    let Some(lane) = table.lanes.get(&stream_id) else {
        return 0;
    };
    // Every queued operation is live and has its completion event (it leaves
    // the table only through this trail); one missing counts as passed.
    let counted = lane.trail.passed_by(search, |&id| {
        Ok(table
            .get(id)
            .and_then(|op| op.completion.as_ref())
            .is_none_or(|event| passed(id, event)))
    });
    counted.unwrap_or(0)
}

impl OperationGraph {
    /// Drop every completed operation the GPU has passed. A dependency on a
    /// retired operation is satisfied, so nothing needs them any more.
    /// Returns how many were retired. Runs by itself every few completions
    /// per stream; call it to trim the coordinator now (the completion
    /// events kept for the next operations go back to the pool too).
    pub fn retire_completed(&self) -> usize {
        let streams: Vec<(u64, Option<Arc<Stream>>)> = {
            let table = self.table();
            let ids = table.lanes.keys();
            ids.map(|&id| (id, table.lane_stream(id))).collect()
        };
        let mut retired = 0;
        for (id, stream) in streams {
            retired += self.sweep(id, TrailSearch::Exact);
            let Some(stream) = stream else { continue };
            // The stream's latest mark may be an operation's completion
            // event (`run_op` keeps each there for a fork right after it):
            // trimming lets it go too, so every retired operation's event
            // is back in the pool.
            stream.forget_latest_mark();
        }
        // Returned to the pool outside the lock.
        let spares = self.table().spares.trim();
        drop(spares);
        retired
    }

    /// Retire `id` once the GPU has passed it, together with what it was
    /// ordered after: the operations before it on its stream and, through
    /// the waits on its dependencies, theirs, followed back as far as the
    /// table still holds them. At most one query, of `id`'s completion
    /// event, which makes no driver call when the host has waited for it
    /// already ([`Event::is_known_complete`](driver::Event::is_known_complete)):
    /// stream order and the dependency waits say the others passed too.
    ///
    /// Call it once the host has seen `id` finish (after
    /// [`Op::wait`](crate::Op::wait), or reading what it downloaded). Its
    /// operations and their completion events leave the table then, instead
    /// of at the next sweep of each stream (every 32 completions on it), so
    /// a program that waits for each round of work keeps only the rounds in
    /// flight and reuses a few events while they are warm. Returns how many
    /// were retired: 0 when the GPU has not passed `id` yet, when it was
    /// retired already, or when it was registered and not completed.
    ///
    /// ```
    /// use cuda_streams_engine::OperationGraph;
    /// use cuda_streams_engine::driver::{Context, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let (s0, s1) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let graph = OperationGraph::for_context(&ctx);
    /// let first = graph.op(&s0).run(|_| Ok(()))?;
    /// let side = graph.op(&s1).run(|_| Ok(()))?;
    /// let last = graph.op(&s0).after(&[side.id()]).run(|_| Ok(()))?;
    /// last.wait()?;
    /// // `first` before it on its stream, `side` through its dependency.
    /// assert_eq!(graph.retire_through(last.id())?, 3);
    /// assert_eq!(graph.metrics().retired_operations, 3);
    /// # let _ = first;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownOperation`] for an id this graph never issued, and the
    /// driver's error when the query fails (nothing is retired then).
    pub fn retire_through(&self, id: OperationId) -> Result<usize> {
        let mut released = ReleasedList::new();
        let retired = {
            let mut table = self.table();
            if !table.is_known(id) {
                return Err(Error::UnknownOperation {
                    operation: id,
                    call: "retire_through",
                });
            }
            let passed = match table.get(id) {
                // After the host's own wait for it, no driver call
                // (`Event::query` knows).
                Some(op) if op.phase == Phase::Completed => match &op.completion {
                    Some(event) => event.query()?,
                    None => false,
                },
                // Retired already, or not completed.
                _ => false,
            };
            if !passed {
                return Ok(0);
            }
            let mut retired = 0;
            let mut ordered_before: SmallVec<[OperationId; 8]> = smallvec::smallvec![id];
            while let Some(next) = ordered_before.pop() {
                // Gone: retired meanwhile (or on another path to it).
                let Some(op) = table.get(next) else { continue };
                // A completed operation waited on each dependency (or shares
                // its stream, or its completion host function ran), so
                // each passed before it did.
                ordered_before.extend(op.meta.dependencies.iter().copied());
                let stream_id = op.stream_id;
                // Its stream's trail is in record order: it and every entry
                // before it passed.
                let count = table.lanes.get(&stream_id).map_or(0, |lane| {
                    lane.trail
                        .iter()
                        .position(|&entry| entry == next)
                        .map_or(0, |at| at + 1)
                });
                retired += table.retire_front(stream_id, count, &mut released);
            }
            retired
        };
        // Their streams and events are let go of here, outside the lock.
        drop(released);
        Ok(retired)
    }

    /// The completed operations on `stream` that the GPU has not passed
    /// yet, in stream order (its completion trail, searched exactly). A
    /// failed query counts as not passed.
    ///
    /// ```
    /// use cuda_streams_engine::OperationGraph;
    /// use cuda_streams_engine::driver::{Context, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let graph = OperationGraph::for_context(&ctx);
    /// let op = graph.op(&stream).run(|_| Ok(()))?;
    /// op.wait()?;
    /// assert!(graph.in_flight(&stream).is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn in_flight(&self, stream: &driver::Stream) -> Vec<OperationId> {
        let table = self.table();
        let passed = passed_count(&table, stream.id(), TrailSearch::Exact);
        table
            .lanes
            .get(&stream.id())
            .map(|lane| lane.trail.iter().skip(passed).copied().collect())
            .unwrap_or_default()
    }

    /// Retire the completed operations of one stream that the GPU has
    /// passed ([`passed_count`]).
    pub(super) fn sweep(&self, stream_id: u64, search: TrailSearch) -> usize {
        let mut released = ReleasedList::new();
        let retired = {
            let mut table = self.table();
            let count = passed_count(&table, stream_id, search);
            table.retire_front(stream_id, count, &mut released)
        };
        // Their streams and events are let go of here, outside the lock.
        drop(released);
        retired
    }
}
