//! Retirement: completed operations are dropped once the GPU has passed their
//! completion event, so a long-running coordinator stays small.
//!
//! Each stream keeps its completed operations with their events in record
//! order (the event is recorded under the lane's lock), and events on one
//! stream complete in that order. So a sweep queries the newest event first
//! (one `cuEventQuery` when the GPU has caught up), then the oldest, then
//! bisects: O(log n) queries per sweep. Sweeps run every [`SWEEP_EVERY`]
//! completions on a stream and on [`OperationGraph::retire_completed`]. The
//! automatic ones query only the newest event while the queue is short: the
//! GPU usually catches up soon, and one query then retires everything, where
//! bisecting a queue the GPU is still working through would cost a handful
//! of queries per sweep to retire a part of it.

use super::OperationGraph;
use crate::error::Result;
use crate::operation::OperationId;
use driver::PooledEvent;
use driver::Stream;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// How many completions on one stream between two sweeps of that stream.
const SWEEP_EVERY: u32 = 32;

/// From this many queued operations on, an automatic sweep bisects too.
const BISECT_FROM: usize = 4 * SWEEP_EVERY as usize;

/// Completed operations of one stream and their completion events, in record order.
#[derive(Default)]
pub(super) struct Lane {
    queue: VecDeque<(OperationId, Arc<PooledEvent>)>,
    since_sweep: u32,
}

fn lock(lane: &Mutex<Lane>) -> MutexGuard<'_, Lane> {
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

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

impl OperationGraph {
    /// Record `event` on `stream` and queue `id` for retirement, under the
    /// lane's lock so the queue is in record order. Returns whether a sweep of
    /// this stream is due.
    pub(super) fn record_and_queue(
        &self,
        stream: &Stream,
        id: OperationId,
        event: &Arc<PooledEvent>,
    ) -> Result<bool> {
        let record = |lane: &Mutex<Lane>| -> Result<bool> {
            let mut lane = lock(lane);
            event.record(stream)?;
            lane.queue.push_back((id, Arc::clone(event)));
            lane.since_sweep += 1;
            let due = lane.since_sweep >= SWEEP_EVERY;
            if due {
                lane.since_sweep = 0;
            }
            Ok(due)
        };
        // Look up first: `entry` would take the shard's write lock every time.
        match self.lanes.get(&stream.id()) {
            Some(lane) => record(&lane),
            None => record(&self.lanes.entry(stream.id()).or_default()),
        }
    }

    /// Drop every completed operation the GPU has passed. A dependency on a
    /// retired operation is satisfied, so nothing needs them any more.
    /// Returns how many were retired. Runs by itself every few completions
    /// per stream; call it to trim the coordinator now.
    pub fn retire_completed(&self) -> usize {
        let streams: Vec<u64> = self.lanes.iter().map(|lane| *lane.key()).collect();
        streams
            .into_iter()
            .map(|stream| self.sweep_lane(stream, true))
            .sum()
    }

    /// The automatic sweep of one stream: [`Self::sweep_lane`], bisecting
    /// only a long queue.
    pub(super) fn sweep(&self, stream_id: u64) -> usize {
        self.sweep_lane(stream_id, false)
    }

    /// Retire the completed operations of one stream that the GPU has
    /// passed: all of them when it passed the newest; otherwise, when
    /// `thorough` or the queue is long, those before the first it has not
    /// passed (found by bisection).
    fn sweep_lane(&self, stream_id: u64, thorough: bool) -> usize {
        let passed_ids: Vec<OperationId> = {
            let Some(lane) = self.lanes.get(&stream_id) else {
                return 0;
            };
            let mut lane = lock(&lane);
            let queue = &lane.queue;
            let count = match (queue.front(), queue.back()) {
                (Some(_), Some((id, event))) if passed(*id, event) => queue.len(),
                _ if !thorough && queue.len() < BISECT_FROM => 0,
                (Some((id, event)), Some(_)) if passed(*id, event) => {
                    // queue[lo] passed, queue[hi] not: find the first not passed.
                    let (mut lo, mut hi) = (0, queue.len() - 1);
                    while hi - lo > 1 {
                        let mid = lo + (hi - lo) / 2;
                        let (id, event) = &queue[mid];
                        if passed(*id, event) {
                            lo = mid;
                        } else {
                            hi = mid;
                        }
                    }
                    hi
                }
                _ => 0,
            };
            // The events go back to the pool when the operations drop theirs.
            lane.queue.drain(..count).map(|(id, _)| id).collect()
        };
        let mut retired = 0;
        for id in passed_ids {
            // Dropped outside every lock.
            if self.ops.remove(&id).is_some() {
                retired += 1;
            }
        }
        self.counters
            .retired
            .fetch_add(retired as u64, Ordering::Relaxed);
        retired
    }
}
