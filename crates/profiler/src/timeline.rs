//! One stream's timeline: marks recorded on it, operations waiting for the GPU
//! to pass their marks, operations with resolved GPU times, and the work counts.

use crate::clock::{GpuTimebase, Mark};
use crate::cupti::{ClosedScope, StreamKey, WatchId};
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::timed_op::{Name, TimedOp};
use driver::{CompletionTrail, Stream, StreamCounters, StreamMetrics, TrailSearch, WorkObserver};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Resolve a stream's pending operations once this many have piled up, so the
/// cost of querying is paid once per batch, not once per operation.
pub(crate) const RESOLVE_BATCH: usize = 64;

/// An operation whose end the GPU may not have reached yet.
struct PendingOp {
    name: Name,
    start: Arc<Mark>,
    /// With a shared start boundary: when the host enqueued the scope's
    /// first work, which cannot have started earlier.
    not_before: Option<Instant>,
    end: Arc<Mark>,
    depth: u32,
}

/// The event that completes `op` on its stream's trail.
fn end_of(op: &PendingOp) -> Option<&driver::Event> {
    Some(&op.end.event)
}

/// Where a scope's work starts: set by the stream's [`WorkObserver`] call
/// right before the scope's first work item, after the waits that order it.
/// Scopes opened before that work share one cell.
#[derive(Default)]
pub(crate) struct StartCell(OnceLock<Start>);

#[derive(Clone)]
pub(crate) struct Start {
    pub(crate) mark: Arc<Mark>,
    pub(crate) not_before: Option<Instant>,
}

/// Kernel launches and transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) kernel_launches: u64,
    pub(crate) memory_transfers: u64,
    pub(crate) bytes_transferred: u64,
    pub(crate) graph_launches: u64,
    pub(crate) graph_nodes: u64,
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
            graph_launches: after.graph_launches.saturating_sub(before.graph_launches),
            graph_nodes: after.graph_nodes.saturating_sub(before.graph_nodes),
        }
    }

    fn add(&mut self, other: Self) {
        self.kernel_launches += other.kernel_launches;
        self.memory_transfers += other.memory_transfers;
        self.bytes_transferred += other.bytes_transferred;
        self.graph_launches += other.graph_launches;
        self.graph_nodes += other.graph_nodes;
    }
}

/// A profiled stream: a weak handle (the profiler must not keep streams
/// alive) and its state.
pub(crate) struct StreamSlot {
    pub(crate) id: u64,
    pub(crate) stream: Weak<Stream>,
    /// The stream's counters, which outlive it.
    counters: StreamCounters,
    shared: Arc<Shared>,
    /// The stream as CUPTI names it, with the CUPTI backend.
    pub(crate) cupti_key: Option<(StreamKey, WatchId)>,
    state: Mutex<StreamState>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let (Some(backend), Some(key)) = (&self.shared.cupti, self.cupti_key) {
            backend.unwatch(key);
        }
    }
}

impl StreamSlot {
    pub(crate) fn new(stream: &Stream, shared: &Arc<Shared>, counting: bool) -> Self {
        let metrics = stream.metrics();
        Self {
            id: stream.id(),
            stream: Arc::downgrade(&stream.to_arc()),
            counters: stream.counters(),
            shared: Arc::clone(shared),
            cupti_key: shared.cupti.as_ref().and_then(|b| b.watch(stream)),
            state: Mutex::new(StreamState {
                resolve_at: RESOLVE_BATCH,
                baseline: counting.then_some(metrics),
                ..StreamState::default()
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, StreamState> {
        // Every update leaves the state consistent between statements that
        // can panic, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A scope opens on `stream`: the cell its start will be set in, and its
    /// depth. The first scope waiting for work asks the stream to call this
    /// slot before that work (no driver call).
    pub(crate) fn open(self: &Arc<Self>, stream: &Stream) -> (Arc<StartCell>, u32) {
        let (cell, arm, depth) = {
            let mut state = self.lock();
            let depth = state.open;
            state.open += 1;
            match &state.awaiting {
                Some(cell) => (Arc::clone(cell), false, depth),
                None => {
                    let cell = Arc::new(StartCell::default());
                    state.awaiting = Some(Arc::clone(&cell));
                    (cell, true, depth)
                }
            }
        };
        if arm {
            stream.observe_next_work(Arc::clone(self) as Arc<dyn WorkObserver>);
        }
        (cell, depth)
    }

    /// A scope opens under the CUPTI backend: its depth (the caller read
    /// CUPTI's clock for its start).
    pub(crate) fn open_cupti(&self, opened: u64) -> u32 {
        let mut state = self.lock();
        let depth = state.open;
        state.open += 1;
        state.cupti_open.push(opened);
        depth
    }

    /// A scope closes under the CUPTI backend: queued until its records are in.
    pub(crate) fn close_cupti(&self, name: Name, opened: u64, closed: u64, depth: u32) {
        let mut state = self.lock();
        state.open = state.open.saturating_sub(1);
        if let Some(at) = state.cupti_open.iter().position(|&t| t == opened) {
            state.cupti_open.swap_remove(at);
        }
        state.cupti_closed.push(ClosedScope {
            name,
            depth,
            open: opened,
            close: closed,
        });
    }

    /// A scope closes: its start (or, with no work in it, its end) and its
    /// end boundary, queued for resolving.
    pub(crate) fn close(
        &self,
        stream: &Stream,
        name: Name,
        cell: Arc<StartCell>,
        depth: u32,
    ) -> Result<()> {
        let clock = self.shared.clock()?;
        let mut state = self.lock();
        state.open = state.open.saturating_sub(1);
        if let Some(err) = state.observer_error.take() {
            return Err(err);
        }
        let start = cell.0.get().cloned();
        if start.is_none()
            && state
                .awaiting
                .as_ref()
                .is_some_and(|waiting| Arc::ptr_eq(waiting, &cell))
            // Only the state and this scope hold it: no other scope waits.
            && Arc::strong_count(&cell) == 2
        {
            state.awaiting = None;
        }
        let end = state.mark_now(stream, &self.shared, clock)?;
        let start = start.unwrap_or_else(|| Start {
            // No work in the scope: it is empty, where the stream is now.
            mark: Arc::clone(&end),
            not_before: None,
        });
        state.push(name, start, end, depth, clock)
    }

    /// The stream's metrics now; once it is dropped, its counters as it
    /// left them (they are shared with it, so nothing it did is lost).
    pub(crate) fn current_metrics(&self) -> StreamMetrics {
        match self.stream.upgrade() {
            Some(stream) => stream.metrics(),
            None => self.counters.metrics(),
        }
    }
}

impl WorkObserver for StreamSlot {
    /// The first work of the scopes waiting for it is about to be enqueued,
    /// after its waits: their start is here. When nothing was enqueued since
    /// the stream's latest boundary (the end of the previous scope), that
    /// boundary is shared (no driver call), with the host's clock now as a
    /// lower bound for the start (the GPU may have passed the boundary and
    /// sat idle since). Otherwise a boundary is recorded here: after any
    /// waits, so they are not counted, and after any work done outside the
    /// scopes, so it is not counted either.
    fn before_work(&self, stream: &Stream) {
        let mut state = self.lock();
        let Some(cell) = state.awaiting.take() else {
            return;
        };
        let ops = stream.operation_count();
        let start = match &state.tail {
            Some(tail) if tail.ops == ops => Start {
                mark: Arc::clone(&tail.mark),
                not_before: Some(Instant::now()),
            },
            _ => match self
                .shared
                .clock()
                .and_then(|clock| state.record(stream, ops, &self.shared, clock))
            {
                Ok(mark) => Start {
                    mark,
                    not_before: None,
                },
                Err(err) => {
                    // Reported when a scope closes; the scope is then empty.
                    state.observer_error.get_or_insert(err);
                    return;
                }
            },
        };
        // The cell is new for each wait, set only here.
        let _ = cell.0.set(start);
    }
}

/// The latest boundary recorded on a stream, and the stream's operation count
/// then: while the count is unchanged, nothing was enqueued after it, and the
/// next boundary is the same point of the stream.
struct Tail {
    mark: Arc<Mark>,
    ops: u64,
}

/// Everything the profiler knows about one stream.
#[derive(Default)]
pub(crate) struct StreamState {
    next_seq: u64,
    /// The latest boundary: shared by the next one while nothing was
    /// enqueued since.
    tail: Option<Tail>,
    /// Scopes open on this stream.
    pub(crate) open: u32,
    /// The start cell of the scopes waiting for their first work.
    awaiting: Option<Arc<StartCell>>,
    /// A failure of the work observer, returned by the next close.
    observer_error: Option<Error>,
    /// Closed operations in the order of their end marks: the stream's
    /// completion trail.
    pending: CompletionTrail<PendingOp>,
    /// CUPTI backend: when the scopes open now opened (CUPTI's clock).
    pub(crate) cupti_open: Vec<u64>,
    /// CUPTI backend: closed scopes waiting for their records.
    pub(crate) cupti_closed: Vec<ClosedScope>,
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
}

impl StreamState {
    /// A boundary at the stream's current end: the tail when nothing was
    /// enqueued since it, a fresh timing event from the pool otherwise.
    pub(crate) fn mark_now(
        &mut self,
        stream: &Stream,
        shared: &Shared,
        clock: &GpuTimebase,
    ) -> Result<Arc<Mark>> {
        let ops = stream.operation_count();
        if let Some(tail) = &self.tail
            && tail.ops == ops
        {
            return Ok(Arc::clone(&tail.mark));
        }
        self.record(stream, ops, shared, clock)
    }

    /// Record a fresh boundary; `ops` is the stream's operation count, read
    /// before recording (work enqueued in between then costs a new boundary
    /// later instead of hiding inside this one).
    fn record(
        &mut self,
        stream: &Stream,
        ops: u64,
        shared: &Shared,
        clock: &GpuTimebase,
    ) -> Result<Arc<Mark>> {
        let pool = &shared.pool;
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
        let host = Instant::now();
        event.record(stream)?;
        let mark = Arc::new(Mark::new(self.next_seq, event, host));
        self.next_seq += 1;
        self.tail = Some(Tail {
            mark: Arc::clone(&mark),
            ops,
        });
        Ok(mark)
    }

    /// Queue a closed operation; resolve a batch when enough have piled up.
    fn push(
        &mut self,
        name: Name,
        start: Start,
        end: Arc<Mark>,
        depth: u32,
        clock: &GpuTimebase,
    ) -> Result<()> {
        self.pending.push(PendingOp {
            name,
            start: start.mark,
            not_before: start.not_before,
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
    /// events back. With `block`, first wait for the last one (the host waits,
    /// through the reactor; the stream does not).
    pub(crate) fn resolve(&mut self, clock: &GpuTimebase, block: bool) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        // Operations end in stream order: the trail finds the finished
        // prefix with a handful of queries, not one per operation.
        let ready = if block {
            self.pending.wait_for(usize::MAX, end_of)?;
            self.pending.len()
        } else {
            self.pending.passed(TrailSearch::Exact, end_of)?
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
            let Some(op) = self.pending.take_front(1).next() else {
                break;
            };
            // A shared start: the work began no earlier than it was enqueued.
            let start_ns = match op.not_before {
                Some(at) => start_ns.max(clock.host_to_gpu(at)).min(end_ns),
                None => start_ns,
            };
            self.timed.push(TimedOp {
                name: op.name,
                start_ns: start_ns.min(end_ns),
                end_ns: end_ns.max(start_ns),
                depth: op.depth,
            });
        }
        if ready > 0
            && let Some(anchor) = &self.anchor
        {
            clock.set_recent(anchor);
        }
        Ok(())
    }

    fn resolve_mark(&mut self, clock: &GpuTimebase, mark: &Arc<Mark>) -> Result<u64> {
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
        self.pending.len() + self.cupti_closed.len()
    }
}
