//! One stream's timeline: marks recorded on it, operations waiting for the GPU
//! to pass their marks, operations with resolved GPU times, and the work counts.

use crate::clock::{Clock, Mark};
use crate::error::Result;
use driver::{Stream, StreamMetrics};
use events::EventPool;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How long after recording a mark the profiler reuses it as the next
/// boundary without asking the GPU: at most this much host time (while the
/// stream may have sat idle) can be counted into a scope that starts there.
/// Scopes opened back to back, nested, or one per launch while the host
/// feeds several streams in turn (on the H200, 4 streams of scoped launches
/// come back to a stream every ~20 µs) stay within it and cost one event per
/// boundary. A 20 µs window made that case record two events per scope and
/// doubled the profiler's per-launch cost there (+127% against +55%).
pub(crate) const REUSE_WITHOUT_QUERY: Duration = Duration::from_micros(100);

/// An operation's name: literals cost no allocation.
pub(crate) type Name = Cow<'static, str>;

/// Resolve a stream's pending operations once this many have piled up, so the
/// cost of querying is paid once per batch, not once per operation.
pub(crate) const RESOLVE_BATCH: usize = 64;

/// An operation whose end the GPU may not have reached yet.
struct PendingOp {
    name: Name,
    start: Arc<Mark>,
    end: Arc<Mark>,
    depth: u32,
}

/// An operation with its GPU start and end, in ns after the base event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TimedOp {
    pub(crate) name: Name,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// How many scopes were open on the stream when this one started.
    pub(crate) depth: u32,
}

/// Kernel launches and transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) kernel_launches: u64,
    pub(crate) memory_transfers: u64,
    pub(crate) bytes_transferred: u64,
}

impl Counts {
    /// What the stream's counters grew by between two snapshots.
    fn between(before: &StreamMetrics, after: &StreamMetrics) -> Self {
        Self {
            kernel_launches: after.kernel_launches.saturating_sub(before.kernel_launches),
            memory_transfers: after
                .memory_transfers
                .saturating_sub(before.memory_transfers),
            bytes_transferred: after
                .bytes_transferred
                .saturating_sub(before.bytes_transferred),
        }
    }

    fn add(&mut self, other: Self) {
        self.kernel_launches += other.kernel_launches;
        self.memory_transfers += other.memory_transfers;
        self.bytes_transferred += other.bytes_transferred;
    }
}

/// A profiled stream: a weak handle (the profiler must not keep streams
/// alive) and its state.
pub(crate) struct StreamSlot {
    pub(crate) id: u64,
    pub(crate) stream: Weak<Stream>,
    state: Mutex<StreamState>,
}

impl StreamSlot {
    pub(crate) fn new(stream: &Arc<Stream>, counting: bool) -> Self {
        let metrics = stream.metrics();
        Self {
            id: stream.id(),
            stream: Arc::downgrade(stream),
            state: Mutex::new(StreamState {
                resolve_at: RESOLVE_BATCH,
                baseline: counting.then(|| metrics.clone()),
                last_metrics: metrics,
                ..StreamState::default()
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, StreamState> {
        // Every update leaves the state consistent between statements that
        // can panic, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stream's metrics now, or the last seen if it was dropped.
    pub(crate) fn current_metrics(&self, state: &mut StreamState) -> StreamMetrics {
        if let Some(stream) = self.stream.upgrade() {
            state.last_metrics = stream.metrics();
        }
        state.last_metrics.clone()
    }
}

/// The latest mark of a stream and what is needed to decide whether the next
/// boundary may reuse it.
struct Tail {
    mark: Arc<Mark>,
    /// The stream's operation count when the mark was recorded.
    ops: u64,
    /// When the host recorded it.
    at: Instant,
}

impl Tail {
    /// Whether the next work enqueued starts where this mark is. Once the GPU
    /// has passed the mark the stream may sit idle until the next work
    /// arrives, and starting the next scope at the mark would count that idle
    /// time, the host's and not the GPU's, as the scope's. So: a mark the GPU
    /// has not reached yet (the next work follows it at once), or one
    /// recorded so recently that the idle time is negligible.
    fn reusable(&self) -> bool {
        if self.at.elapsed() <= REUSE_WITHOUT_QUERY {
            return true;
        }
        // If the GPU reaches it between this query and the next enqueue, the
        // scope gains that gap: the host's enqueue time.
        self.mark.ns().is_none() && matches!(self.mark.event.query(), Ok(false))
    }
}

/// Everything the profiler knows about one stream.
#[derive(Default)]
pub(crate) struct StreamState {
    next_seq: u64,
    /// The latest mark, with the stream's operation count when it was
    /// recorded: while the count is unchanged and the GPU has not reached the
    /// mark, it is still the point where the next work starts, and is reused
    /// instead of recording another event.
    tail: Option<Tail>,
    /// Scopes open on this stream.
    pub(crate) open: u32,
    pending: VecDeque<PendingOp>,
    /// Resolve when `pending` reaches this length.
    resolve_at: usize,
    /// The latest resolved mark: later marks are measured from it.
    anchor: Option<Arc<Mark>>,
    pub(crate) timed: Vec<TimedOp>,
    /// Durations given to `record_operation` (measured elsewhere, no position
    /// on the timeline).
    pub(crate) external: Vec<(Name, Duration)>,
    /// Counted with `record_kernel_launch` / `record_memory_transfer`.
    pub(crate) manual: Counts,
    /// Stream counter growth over earlier enabled periods.
    folded: Counts,
    /// The stream's counters when the current enabled period began (`None`
    /// while disabled).
    baseline: Option<StreamMetrics>,
    last_metrics: StreamMetrics,
}

impl StreamState {
    /// A mark at the stream's current end: the tail when nothing was enqueued
    /// since it and the stream is still busy before it, a fresh timing event
    /// from the pool otherwise.
    pub(crate) fn mark_now(
        &mut self,
        stream: &Stream,
        pool: &Arc<EventPool>,
        clock: &Clock,
    ) -> Result<Arc<Mark>> {
        // Read before recording: work enqueued in between then only costs a
        // new mark later, instead of being hidden inside a reused one.
        let ops = stream.metrics().operations_count;
        if let Some(tail) = &self.tail {
            if tail.ops == ops && tail.reusable() {
                return Ok(Arc::clone(&tail.mark));
            }
        }
        let event = match pool.acquire_event(true) {
            Ok(event) => event,
            Err(driver::Error::EventPoolExhausted { .. }) if !self.pending.is_empty() => {
                // A capped pool: give back what this stream holds, then retry.
                self.resolve(clock, true)?;
                self.tail = None;
                pool.acquire_event(true)?
            }
            Err(err) => return Err(err.into()),
        };
        event.record(stream)?;
        let mark = Arc::new(Mark::new(self.next_seq, event));
        self.next_seq += 1;
        self.tail = Some(Tail {
            mark: Arc::clone(&mark),
            ops,
            at: Instant::now(),
        });
        Ok(mark)
    }

    /// Queue a closed operation; resolve a batch when enough have piled up.
    pub(crate) fn push(
        &mut self,
        name: Name,
        start: Arc<Mark>,
        end: Arc<Mark>,
        depth: u32,
        clock: &Clock,
    ) -> Result<()> {
        self.pending.push_back(PendingOp {
            name,
            start,
            end,
            depth,
        });
        if self.pending.len() >= self.resolve_at {
            self.resolve(clock, false)?;
            // When the GPU lags, the next pass waits for another batch rather
            // than querying again at every close.
            self.resolve_at = self.pending.len() + RESOLVE_BATCH;
        }
        Ok(())
    }

    /// Turn the operations the GPU has finished into `TimedOp`s and give their
    /// events back. With `block`, first wait for the last one (the host waits;
    /// the stream does not).
    pub(crate) fn resolve(&mut self, clock: &Clock, block: bool) -> Result<()> {
        let Some(last) = self.pending.back() else {
            return Ok(());
        };
        // Operations end in stream order, so when the last has completed all
        // have, and one query covers the batch.
        let ready = if block {
            last.end.event.synchronize()?;
            self.pending.len()
        } else if last.end.event.query()? {
            self.pending.len()
        } else {
            // The finished operations are a prefix: find its end with a
            // binary search (a handful of queries, not one per operation).
            let (mut done, mut not_done) = (0, self.pending.len() - 1);
            while done < not_done {
                let mid = done + (not_done - done) / 2;
                if self.pending[mid].end.event.query()? {
                    done = mid + 1;
                } else {
                    not_done = mid;
                }
            }
            done
        };
        for _ in 0..ready {
            // The start precedes the end on the same stream, so it completed too.
            let Some((start, end)) = self
                .pending
                .front()
                .map(|op| (Arc::clone(&op.start), Arc::clone(&op.end)))
            else {
                break;
            };
            let start_ns = self.resolve_mark(clock, &start)?;
            let end_ns = self.resolve_mark(clock, &end)?;
            let Some(op) = self.pending.pop_front() else {
                break;
            };
            self.timed.push(TimedOp {
                name: op.name,
                start_ns,
                end_ns: end_ns.max(start_ns),
                depth: op.depth,
            });
        }
        if ready > 0 {
            if let Some(anchor) = &self.anchor {
                clock.set_recent(anchor);
            }
        }
        Ok(())
    }

    fn resolve_mark(&mut self, clock: &Clock, mark: &Arc<Mark>) -> Result<u64> {
        let ns = clock.resolve(mark, self.anchor.as_ref())?;
        if self.anchor.as_ref().is_none_or(|a| mark.seq > a.seq) {
            self.anchor = Some(Arc::clone(mark));
        }
        Ok(ns)
    }

    /// Work counts over the enabled periods, given the stream's metrics now.
    pub(crate) fn counts(&self, now: &StreamMetrics) -> Counts {
        let mut counts = self.folded;
        counts.add(self.manual);
        if let Some(baseline) = &self.baseline {
            counts.add(Counts::between(baseline, now));
        }
        counts
    }

    /// Profiling was disabled: keep what the stream's counters grew by.
    pub(crate) fn stop_counting(&mut self, now: &StreamMetrics) {
        if let Some(baseline) = self.baseline.take() {
            self.folded.add(Counts::between(&baseline, now));
        }
    }

    /// Profiling was enabled: count from here on.
    pub(crate) fn start_counting(&mut self, now: StreamMetrics) {
        self.baseline.get_or_insert(now);
    }

    /// Operations still waiting for the GPU.
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }
}
