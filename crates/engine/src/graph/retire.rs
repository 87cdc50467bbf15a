//! Retirement: completed operations are dropped once the GPU has passed their
//! completion event, so a long-running coordinator stays small.
//!
//! Each stream keeps its completed operations in record order (the event is
//! recorded under the table's lock), and events on one stream complete in
//! that order. So a sweep queries the newest event first (one `cuEventQuery`
//! when the GPU has caught up), then the oldest, then bisects: O(log n)
//! queries per sweep. Sweeps run every `SWEEP_EVERY` completions on a
//! stream and on [`OperationGraph::retire_completed`].

use super::OperationGraph;
use super::table::Table;
use crate::operation::OperationId;
use driver::PooledEvent;

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
/// passed: all when it passed the newest; otherwise those before the first
/// it has not passed (bisection).
fn passed_count(table: &Table, stream_id: u64) -> usize {
    let Some(lane) = table.lanes.get(&stream_id) else {
        return 0;
    };
    let queue = &lane.queue;
    // Every queued operation is live and has its completion event (it leaves
    // the table only through this queue); one missing counts as passed.
    let passed_at = |i: usize| {
        let id = queue[i];
        table
            .get(id)
            .and_then(|op| op.completion.as_ref())
            .is_none_or(|event| passed(id, event))
    };
    let len = queue.len();
    if len == 0 {
        return 0;
    }
    if passed_at(len - 1) {
        return len;
    }
    if !passed_at(0) {
        return 0;
    }
    // queue[lo] passed, queue[hi] not: find the first not passed.
    let (mut lo, mut hi) = (0, len - 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if passed_at(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

impl OperationGraph {
    /// Drop every completed operation the GPU has passed. A dependency on a
    /// retired operation is satisfied, so nothing needs them any more.
    /// Returns how many were retired. Runs by itself every few completions
    /// per stream; call it to trim the coordinator now.
    pub fn retire_completed(&self) -> usize {
        let streams: Vec<u64> = self.table().lanes.keys().copied().collect();
        streams.into_iter().map(|stream| self.sweep(stream)).sum()
    }

    /// Retire the completed operations of one stream that the GPU has
    /// passed ([`passed_count`]).
    pub(super) fn sweep(&self, stream_id: u64) -> usize {
        let (retired, released) = {
            let mut table = self.table();
            let count = passed_count(&table, stream_id);
            table.retire_front(stream_id, count)
        };
        // Their streams and events are let go of here, outside the lock.
        drop(released);
        retired
    }
}
