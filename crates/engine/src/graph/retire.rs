//! Retirement: completed operations are dropped once the GPU has passed their
//! completion event, so a long-running coordinator stays small.
//!
//! Each stream keeps its completed operations in record order (the event is
//! recorded under the table's lock), and events on one stream complete in
//! that order. So a sweep queries the newest event first (one `cuEventQuery`
//! when the GPU has caught up), then one a few places before it (two when
//! the GPU trails a little), then the oldest, then bisects: O(log n)
//! queries per sweep. Sweeps run every `SWEEP_EVERY` completions on a
//! stream and on [`OperationGraph::retire_completed`].

use super::OperationGraph;
use super::table::Table;
use crate::operation::OperationId;
use driver::PooledEvent;

/// How far before the newest queued operation a sweep looks when the GPU has
/// not passed the newest: a GPU trailing the host by fewer operations than
/// this costs a sweep two event queries instead of a bisection.
const NEAR_NEWEST: usize = 8;

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

/// How thorough a sweep is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Sweep {
    /// Every operation the GPU has passed ([`OperationGraph::retire_completed`]).
    All,
    /// The automatic sweep, on the hot path: when the GPU trails the host by
    /// a few operations, those few wait for the next sweep.
    Cheap,
}

/// How many of a stream's queued operations, from the front, the GPU has
/// passed. All of them when it passed the newest (one query: the GPU keeps
/// up). Otherwise, for a cheap sweep, when it passed the one [`NEAR_NEWEST`]
/// places before the newest, those up to it (a second query: the GPU
/// trails by a few operations, which the next sweep retires). Otherwise
/// those before the first it has not passed, by bisection.
fn passed_count(table: &Table, stream_id: u64, sweep: Sweep) -> usize {
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
    // queue[lo] passed (or lo is -1), queue[hi] not: find the first not passed.
    let mut hi = len - 1;
    if let Some(near) = hi.checked_sub(NEAR_NEWEST)
        && sweep == Sweep::Cheap
    {
        if passed_at(near) {
            return near + 1;
        }
        hi = near;
    }
    if !passed_at(0) {
        return 0;
    }
    let mut lo = 0;
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
        streams
            .into_iter()
            .map(|stream| self.sweep(stream, Sweep::All))
            .sum()
    }

    /// Retire the completed operations of one stream that the GPU has
    /// passed ([`passed_count`]).
    pub(super) fn sweep(&self, stream_id: u64, sweep: Sweep) -> usize {
        let (retired, released) = {
            let mut table = self.table();
            let count = passed_count(&table, stream_id, sweep);
            table.retire_front(stream_id, count)
        };
        // Their streams and events are let go of here, outside the lock.
        drop(released);
        retired
    }
}
