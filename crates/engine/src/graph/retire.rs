//! Retirement: completed operations are dropped once the GPU has passed their
//! completion event, so a long-running coordinator stays small.
//!
//! Each stream keeps its completed operations in record order (the event is
//! recorded under the table's lock), and events on one stream complete in
//! that order, so a sweep finds how far the GPU got with a few
//! `cuEventQuery`s, every `SWEEP_EVERY` completions on a stream. A query
//! costs about 0.25 µs on the H200 machine, as much as taking eight
//! operations out of the table, so the automatic sweeps guess rather than
//! bisect: each stream remembers how many operations the GPU trailed by at
//! its last sweep, queries the one that far back from the newest, and
//! retires up to it when the GPU has passed it (one query while the guess
//! holds); when it has not, it looks twice as far back, and so on. What the
//! GPU passed beyond the guess waits for the next sweep.
//! [`OperationGraph::retire_completed`] retires exactly what the GPU has
//! passed: the newest, else the oldest, then a bisection.

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

/// How thorough a sweep is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Sweep {
    /// Every operation the GPU has passed ([`OperationGraph::retire_completed`]).
    All,
    /// The automatic sweep, on the hot path: from the stream's guess of how
    /// far the GPU trails, so those it passed beyond it may wait.
    Cheap,
}

/// How many of a stream's queued operations, from the front, a sweep
/// retires (all of them the GPU has passed for [`Sweep::All`]), and how far
/// the GPU trailed the newest, for the stream's next cheap sweep.
fn passed_count(table: &Table, stream_id: u64, sweep: Sweep) -> (usize, usize) {
    let Some(lane) = table.lanes.get(&stream_id) else {
        return (0, 0);
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
        return (0, 0);
    }
    if sweep == Sweep::Cheap {
        // Query `back` places before the newest; further back while not passed.
        let mut back = lane.trail.min(len - 1);
        loop {
            let at = len - 1 - back;
            if passed_at(at) {
                // Next time, start a little nearer the newest, so the guess
                // follows a GPU that catches up.
                return (at + 1, back - back / 4);
            }
            if at == 0 {
                return (0, len);
            }
            back = (2 * back + 1).min(len - 1);
        }
    }
    if passed_at(len - 1) {
        return (len, 0);
    }
    if !passed_at(0) {
        return (0, len);
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
    (hi, len - hi)
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
            let (count, trail) = passed_count(&table, stream_id, sweep);
            table.retire_front(stream_id, count, trail)
        };
        // Their streams and events are let go of here, outside the lock.
        drop(released);
        retired
    }
}
