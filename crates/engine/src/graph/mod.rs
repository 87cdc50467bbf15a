//! The operation graph: registration, begin/complete with cross-stream
//! waits, completion callbacks. The operations live in `table.rs`,
//! retirement in `retire.rs`, the graph queries (deadlocks, ready list) in
//! `queries.rs`.

mod metrics;
mod queries;
mod retire;
mod stamp;
mod table;

pub use metrics::CoordinatorMetrics;

use crate::error::{Error, Result};
use crate::operation::{EventMetadata, EventPriority, OperationId, OperationState, OperationType};
use driver::TrailSearch;
use driver::{Context, Stream};
use driver::{EventPool, PooledEvent, UniqueEvent};
use metrics::Counters;
use smallvec::SmallVec;
use stamp::{Stamp, StampOrigin};
use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use table::Table;

/// A completion callback.
type Callback = Box<dyn FnOnce() + Send + 'static>;

/// Where an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Registered,
    Begun,
    Completed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Registered => "registered",
            Phase::Begun => "begun",
            Phase::Completed => "completed",
        }
    }
}

/// What the builder's work returned; on failure, with the operation's label
/// (boxed: a failure is rare, and the unboxed pair made every operation's
/// result several words longer to move).
pub(crate) type WorkOutcome = std::result::Result<(), Box<(driver::Error, String)>>;

/// One builder operation in this many is timed for
/// [`CoordinatorMetrics::average_coordination_time`].
const TIME_EVERY: u64 = 16;

/// An operation's dependencies: most have a few, kept inline so that an
/// operation costs no allocation for them.
pub(crate) type Deps = smallvec::SmallVec<[OperationId; 4]>;

/// What the builder says of an operation, before it has an id.
pub(crate) struct OpMeta {
    pub(crate) kind: OperationType,
    pub(crate) priority: EventPriority,
    pub(crate) dependencies: Deps,
    pub(crate) label: Cow<'static, str>,
}

/// What the graph keeps of an operation's description; the public
/// [`EventMetadata`] is built from it when asked for.
struct Meta {
    operation_type: OperationType,
    priority: EventPriority,
    creation_time: Stamp,
    dependencies: Deps,
    /// Borrowed when the builder was given a `&'static str`.
    description: Cow<'static, str>,
}

/// One live operation.
struct OpNode {
    meta: Meta,
    /// [`Stream::id`] of its stream.
    stream_id: u64,
    phase: Phase,
    /// Position among the operations begun on any stream (0: not begun).
    begun_at: u64,
    /// Recorded by `complete_operation`; shared so that `begin_operation` can
    /// wait on it without holding the table's lock during the driver call.
    completion: Option<Arc<PooledEvent>>,
    /// What only an operation registered through the seed calls holds. A
    /// builder operation enters the table completed, with none: its stream
    /// is held by the stream's retirement queue, it never holds callbacks
    /// (those added later are scheduled at once), and the smaller operation
    /// is cheaper to move into the table and to drop.
    seed: Option<Box<SeedOp>>,
}

/// The part of an operation registered through the seed calls
/// (`register_operation`, `begin_operation`, `complete_operation`).
struct SeedOp {
    /// Its stream.
    stream: Arc<Stream>,
    /// Callbacks added before the completion event was recorded.
    callbacks: Vec<Callback>,
    /// Set by the completion host function, when there is one.
    done: Option<Arc<AtomicBool>>,
}

impl OpNode {
    /// Whether the completion host function has run (only a seed operation
    /// with callbacks has one).
    #[inline]
    fn finished(&self) -> bool {
        self.seed
            .as_ref()
            .and_then(|seed| seed.done.as_ref())
            .is_some_and(|done| done.load(Ordering::Acquire))
    }
}

/// Tracks operations across streams: dependencies become `cuStreamWaitEvent`s
/// on pooled completion events, callbacks run when the GPU gets there, and the
/// dependency and stream-order graph can be checked for deadlocks.
///
/// Life of an operation: [`register_operation`](Self::register_operation) →
/// [`begin_operation`](Self::begin_operation) (enqueue its GPU work after this)
/// → [`complete_operation`](Self::complete_operation) (records its completion
/// event) → retired once the GPU has passed that event. A dependency on a
/// retired operation is satisfied.
///
/// Every method takes `&self`; share it as `Arc<OperationGraph>` across
/// threads.
///
/// ```
/// use cuda_streams_engine::{EventPool, EventPriority, OperationGraph, OperationType};
/// use cuda_streams_engine::driver::{Context, Stream};
/// use std::sync::{Arc, mpsc};
/// # fn main() -> cuda_streams_engine::Result<()> {
/// let ctx = Context::new(0)?;
/// let (copies, compute) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let coordinator = OperationGraph::new(Arc::new(EventPool::new(&ctx, 2, 0)?));
/// let upload = coordinator.register_operation(
///     OperationType::MemoryTransfer, EventPriority::High, &copies, vec![], "upload",
/// )?;
/// let kernel = coordinator.register_operation(
///     OperationType::Kernel, EventPriority::Normal, &compute, vec![upload], "kernel",
/// )?;
/// let (tx, rx) = mpsc::channel();
/// coordinator.add_completion_callback(kernel, move || tx.send("kernel done").unwrap())?;
/// coordinator.begin_operation(upload, &copies)?; // then enqueue the copy on `copies`
/// coordinator.complete_operation(upload)?;
/// coordinator.begin_operation(kernel, &compute)?; // `compute` now waits for the upload
/// coordinator.complete_operation(kernel)?;
/// assert_eq!(rx.recv().unwrap(), "kernel done"); // run when the GPU got there
/// assert_eq!(coordinator.metrics().completed_operations, 2);
/// # Ok(())
/// # }
/// ```
pub struct OperationGraph {
    pool: Arc<EventPool>,
    /// The operations, their retirement queues and counters.
    table: Mutex<Table>,
    /// Counts builder operations, to time one in [`TIME_EVERY`].
    sampled: AtomicU64,
    counters: Arc<Counters>,
    /// Serialises `add_dependency`: two edges added at once could close an unseen cycle.
    edge_lock: Mutex<()>,
    /// Standing stream dependencies (`crate::streams`).
    pub(crate) stream_order: crate::standing_waits::StandingWaits,
    /// Where operations' creation times come from.
    clock: StampOrigin,
    /// Told about each builder operation's work (`crate::observe`).
    pub(crate) observer: crate::observer::ObserverSlot,
}

impl OperationGraph {
    /// A graph taking its completion events from the context's shared event
    /// pool ([`Context::event_pool`]).
    pub fn for_context(ctx: &Arc<Context>) -> OperationGraph {
        Self::new(ctx.event_pool())
    }

    /// A graph taking its completion events from `pool` (the seed's
    /// constructor).
    pub fn new(pool: Arc<EventPool>) -> OperationGraph {
        OperationGraph {
            table: Mutex::new(Table::new(&pool)),
            pool,
            sampled: AtomicU64::new(0),
            counters: Arc::new(Counters::default()),
            edge_lock: Mutex::new(()),
            stream_order: Default::default(),
            clock: StampOrigin::new(),
            observer: Default::default(),
        }
    }

    /// The pool completion events come from.
    pub fn pool(&self) -> &Arc<EventPool> {
        &self.pool
    }

    /// The table, locked. A panic cannot leave it half-changed (nothing that
    /// can panic runs under the lock), so a poisoned lock is taken as is.
    #[inline]
    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.table)
    }

    /// Register an operation to run on `stream` after `dependencies`.
    ///
    /// Each dependency must be an operation of this coordinator (live or
    /// retired); otherwise [`Error::UnknownDependency`] names both ids and the
    /// new id is never usable.
    pub fn register_operation(
        &self,
        operation_type: OperationType,
        priority: EventPriority,
        stream: &Arc<Stream>,
        dependencies: Vec<OperationId>,
        description: impl Into<String>,
    ) -> Result<OperationId> {
        let start = Instant::now();
        let description = description.into();
        let mut table = self.table();
        let result = match dependencies.iter().find(|&&dep| !table.is_known(dep)) {
            Some(&dependency) => Err(Error::UnknownDependency {
                operation: table.abandon_next(),
                dependency,
            }),
            None => Ok(table.issue(OpNode {
                meta: Meta {
                    operation_type,
                    priority,
                    creation_time: Stamp::At(start),
                    dependencies: Deps::from_vec(dependencies),
                    description: Cow::Owned(description),
                },
                stream_id: stream.id(),
                phase: Phase::Registered,
                begun_at: 0,
                completion: None,
                seed: Some(Box::new(SeedOp {
                    stream: Arc::clone(stream),
                    callbacks: Vec::new(),
                    done: None,
                })),
            })),
        };
        drop(table);
        self.counters.add_time(start.elapsed());
        result
    }

    /// Add `dependency` to an operation not begun yet (dependencies given at
    /// registration can only name earlier operations; this can name any).
    /// An edge that would close a cycle is refused with [`Error::Cycle`],
    /// naming it, and the graph is unchanged. Adding one already present does
    /// nothing.
    pub fn add_dependency(&self, id: OperationId, dependency: OperationId) -> Result<()> {
        if id == dependency {
            return Err(Error::SelfDependency { operation: id });
        }
        {
            let mut table = self.table();
            if !table.is_known(dependency) {
                return Err(Error::UnknownDependency {
                    operation: id,
                    dependency,
                });
            }
            let op = table.live_mut(id, "add_dependency")?;
            match op.phase {
                Phase::Registered => {}
                Phase::Begun => return Err(Error::AlreadyBegun { operation: id }),
                Phase::Completed => {
                    return Err(Error::AlreadyCompleted { operation: id });
                }
            }
            if op.meta.dependencies.contains(&dependency) {
                return Ok(());
            }
        }
        // Registration only names earlier operations, so only this call can
        // close a cycle: refuse it here, before anything waits on it.
        let _edges = lock(&self.edge_lock);
        if let Some(cycle) = self.closes_cycle(id, dependency) {
            return Err(Error::Cycle { cycle });
        }
        let mut table = self.table();
        let op = table.live_mut(id, "add_dependency")?;
        if op.phase != Phase::Registered {
            return Err(Error::AlreadyBegun { operation: id });
        }
        if !op.meta.dependencies.contains(&dependency) {
            op.meta.dependencies.push(dependency);
        }
        Ok(())
    }

    /// Mark `id` as starting on `stream` (the stream it was registered on):
    /// for each dependency on another stream, `stream` waits
    /// (`cuStreamWaitEvent`) for that dependency's completion event. Enqueue
    /// the operation's GPU work after this returns.
    ///
    /// Every dependency must have been completed with
    /// [`complete_operation`](Self::complete_operation) (or retired): a wait
    /// on an unrecorded event would silently not wait, so that is
    /// [`Error::DependencyNotComplete`] instead. On any error the operation
    /// stays registered.
    pub fn begin_operation(&self, id: OperationId, stream: &Stream) -> Result<()> {
        let start = Instant::now();
        let result = self.begin_inner(id, stream);
        self.counters.add_time(start.elapsed());
        result
    }

    fn begin_inner(&self, id: OperationId, stream: &Stream) -> Result<()> {
        let mut table = self.table();
        let at = table.tick();
        let op = table.live_mut(id, "begin_operation")?;
        match op.phase {
            Phase::Registered => {}
            Phase::Begun => return Err(Error::AlreadyBegun { operation: id }),
            Phase::Completed => {
                return Err(Error::AlreadyCompleted { operation: id });
            }
        }
        if op.stream_id != stream.id() {
            return Err(Error::StreamMismatch {
                operation: id,
                registered: op.stream_id,
                given: stream.id(),
            });
        }
        let dependencies = op.meta.dependencies.clone();
        // Every dependency was known at registration (or added since). The
        // waits are enqueued under the lock, as the builder's are; on an
        // error the operation stays registered.
        let events = dependency_events(&table, &dependencies, stream)
            .map_err(|problem| problem.for_operation(id))?;
        for event in events {
            stream.wait_event(event)?;
        }
        let op = table.live_mut(id, "begin_operation")?;
        op.phase = Phase::Begun;
        op.begun_at = at;
        Ok(())
    }

    /// The builder's path ([`crate::OpBuilder::run`]): the dependencies'
    /// events are looked up (one lock), waited on, `work` runs, and the
    /// completion event is recorded as the operation enters the table,
    /// already completed (a second lock). Only the graph's own time is
    /// counted, on one operation in [`TIME_EVERY`].
    #[inline]
    pub(crate) fn run_op(
        &self,
        meta: OpMeta,
        stream: &Stream,
        work: impl FnOnce(&Stream) -> driver::Result<()>,
    ) -> Result<(OperationId, Arc<PooledEvent>, WorkOutcome)> {
        let created = self.clock.now();
        // Timing every operation would cost four clock reads, a sizeable
        // share of the operation itself: one in `TIME_EVERY` is timed.
        // A plain load and store, not an atomic increment: two threads may
        // count one operation twice, which only moves the sample.
        let count = self.sampled.load(Ordering::Relaxed);
        self.sampled.store(count.wrapping_add(1), Ordering::Relaxed);
        let started = count.is_multiple_of(TIME_EVERY).then(Instant::now);
        if !meta.dependencies.is_empty() {
            // The waits are enqueued under the lock, on the events where the
            // table keeps them: no reference count changes hands. Every
            // dependency is checked before the first wait, so a problem
            // leaves the stream as it was; one alone (the usual case) is
            // looked up and waited on without a list of events.
            let mut table = self.table();
            let problem = match &meta.dependencies[..] {
                &[dependency] => match dependency_event(&table, dependency, stream) {
                    Ok(Some(event)) => stream.wait_event(event).err().map(Err),
                    Ok(None) => None,
                    Err(problem) => Some(Ok(problem)),
                },
                dependencies => match dependency_events(&table, dependencies, stream) {
                    Ok(events) => events
                        .into_iter()
                        .find_map(|event| stream.wait_event(event).err())
                        .map(Err),
                    Err(problem) => Some(Ok(problem)),
                },
            };
            match problem {
                None => {}
                Some(Ok(problem)) => return Err(problem.for_operation(table.abandon_next())),
                Some(Err(err)) => return Err(err.into()),
            }
        }
        let registered = started.map(|started| started.elapsed());
        // Nobody holds the id before `run` returns, so the operation enters
        // the table only once its work is enqueued, already completed.
        let outcome = {
            // Named in Nsight Systems (nothing without a tool attached).
            let _range = driver::nvtx::range(&meta.label);
            // The label names the operation in stream-order reports.
            driver::order::labelled(&meta.label, || self.observed(&meta, stream, work))
        };
        let outcome = outcome.map_err(|err| Box::new((err, meta.label.to_string())));
        let completing = started.map(|_| Instant::now());
        let stream_id = stream.id();
        // A spare from the table (its own pool's: a stream of another device
        // records an event of its own context) saves the pool and the `Arc`.
        let own_pool = Arc::ptr_eq(self.pool.context(), stream.context());
        let (id, sweep_due, event) = {
            let mut table = self.table();
            let spare = if own_pool { table.spares.take() } else { None };
            let event = match spare {
                Some(event) => event,
                None => match self.completion_event(stream) {
                    Ok(event) => UniqueEvent::new(event),
                    Err(err) => {
                        // Its work may be enqueued, but without a completion
                        // event nothing could wait for it: it never enters.
                        table.abandon_next();
                        return Err(err);
                    }
                },
            };
            // Recorded under the lock, so each stream's retirement queue is
            // in record order. Kept as the stream's latest mark: a fork or a
            // `wait_stream` right after the operation waits on it instead of
            // recording an event of its own (the fork/join node's fork).
            // Nothing else holds it yet, so it is recorded without the
            // checks a shared event needs.
            let event = match stream.record_latest_unique(event) {
                Ok(event) => event,
                Err(err) => {
                    table.abandon_next();
                    return Err(err.into());
                }
            };
            // Under `Auto`, an inferred edge after this operation waits for
            // this event rather than recording one of its own.
            driver::order::offer_mark(stream, &event);
            let begun_at = table.tick();
            let id = table.issue(OpNode {
                meta: Meta {
                    operation_type: meta.kind,
                    priority: meta.priority,
                    creation_time: created,
                    dependencies: meta.dependencies,
                    description: meta.label,
                },
                stream_id,
                phase: Phase::Completed,
                begun_at,
                completion: Some(Arc::clone(&event)),
                seed: None,
            });
            table.completed += 1;
            (id, table.queue(stream, id), event)
        };
        if sweep_due {
            self.sweep(stream_id, TrailSearch::Guess);
        }
        if let (Some(registered), Some(completing)) = (registered, completing) {
            self.counters
                .add_sampled_time(registered + completing.elapsed(), TIME_EVERY);
        }
        Ok((id, event, outcome))
    }

    /// A completion event for an operation on `stream`: from the graph's
    /// pool, or from the stream's own context when it belongs to another
    /// device (a stream may wait on another device's event, never record one).
    fn completion_event(&self, stream: &Stream) -> Result<PooledEvent> {
        Ok(match Arc::ptr_eq(self.pool.context(), stream.context()) {
            true => self.pool.acquire_event(false)?,
            false => stream.event_pool().acquire_event(false)?,
        })
    }

    /// Record `id`'s completion event (from the pool) on its stream, after the
    /// work enqueued since [`begin_operation`](Self::begin_operation).
    /// Callbacks added so far are scheduled to run when the GPU reaches it.
    pub fn complete_operation(&self, id: OperationId) -> Result<()> {
        let start = Instant::now();
        let result = self.complete_inner(id);
        self.counters.add_time(start.elapsed());
        result.map(drop)
    }

    /// [`complete_operation`](Self::complete_operation), returning the
    /// completion event.
    pub(crate) fn complete_inner(&self, id: OperationId) -> Result<Arc<PooledEvent>> {
        let stream = {
            let mut table = self.table();
            let op = table.live_mut(id, "complete_operation")?;
            match op.phase {
                Phase::Begun => {}
                Phase::Registered => return Err(Error::NotBegun { operation: id }),
                Phase::Completed => return Err(Error::AlreadyCompleted { operation: id }),
            }
            // Begun: registered through the seed calls, which keep the stream.
            op.seed
                .as_ref()
                .map(|seed| Arc::clone(&seed.stream))
                .ok_or(Error::NotBegun { operation: id })?
        };
        let event = Arc::new(self.completion_event(&stream)?);
        // The event is recorded and the operation marked completed under one
        // lock, so no one sees it half-completed, a concurrent completion
        // fails, and the stream's retirement queue stays in record order.
        let (scheduled, sweep_due) = {
            let mut table = self.table();
            let op = table.live_mut(id, "complete_operation")?;
            if op.phase != Phase::Begun {
                return Err(Error::AlreadyCompleted { operation: id });
            }
            event.record(&stream)?;
            op.completion = Some(Arc::clone(&event));
            op.phase = Phase::Completed;
            let scheduled = match op.seed.as_deref_mut() {
                Some(seed) if !seed.callbacks.is_empty() => {
                    let done = Arc::new(AtomicBool::new(false));
                    seed.done = Some(Arc::clone(&done));
                    Some((std::mem::take(&mut seed.callbacks), done))
                }
                _ => None,
            };
            table.completed += 1;
            (scheduled, table.queue(&stream, id))
        };
        if let Some((callbacks, done)) = scheduled {
            self.schedule_callbacks(id, &stream, &event, callbacks, done);
        }
        if sweep_due {
            self.sweep(stream.id(), TrailSearch::Guess);
        }
        Ok(event)
    }

    /// Run `callbacks` when `stream` passes `event` (recorded just before).
    fn schedule_callbacks(
        &self,
        id: OperationId,
        stream: &Stream,
        event: &PooledEvent,
        callbacks: Vec<Callback>,
        done: Arc<AtomicBool>,
    ) {
        let counters = Arc::clone(&self.counters);
        // The host function must not own driver objects (dropping them there
        // is a driver call): only the closures, the flag and the counters.
        let slot = Arc::new(Mutex::new(Some((callbacks, done))));
        let for_host = Arc::clone(&slot);
        let host = move || {
            if let Some((callbacks, done)) = take_slot(&for_host) {
                done.store(true, Ordering::Release);
                run_callbacks(id, callbacks, &counters);
            }
        };
        if let Err(err) = stream.add_callback(host) {
            // Still exactly once, after the event: wait for it here.
            tracing::warn!(
                operation = id.0,
                "{id}: scheduling completion callbacks failed ({err}); running them after a host wait"
            );
            if let Some((callbacks, done)) = take_slot(&slot) {
                if let Err(err) = event.synchronize() {
                    tracing::error!(
                        operation = id.0,
                        "{id}: waiting for the completion event: {err}"
                    );
                }
                done.store(true, Ordering::Release);
                run_callbacks(id, callbacks, &self.counters);
            }
        }
    }

    /// Run `f` once, when the GPU has passed `id`'s completion event.
    ///
    /// Before [`complete_operation`](Self::complete_operation), `f` waits for
    /// it. After it, if the GPU is already past the event (or `id` is
    /// retired), `f` runs now on the calling thread; otherwise it is enqueued
    /// on the operation's stream, so it also waits for work enqueued there
    /// since. A panic in `f` is caught and counted in
    /// [`CoordinatorMetrics::callback_panics`].
    pub fn add_completion_callback<F>(&self, id: OperationId, f: F) -> Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        let late = {
            let mut table = self.table();
            let known = table.is_known(id);
            match table.get_mut(id) {
                None if known => None,
                None => {
                    return Err(Error::UnknownOperation {
                        operation: id,
                        call: "add_completion_callback",
                    });
                }
                Some(op) => {
                    // Not completed: registered through the seed calls
                    // (a builder operation enters completed).
                    if op.phase != Phase::Completed
                        && let Some(seed) = op.seed.as_deref_mut()
                    {
                        seed.callbacks.push(Box::new(f));
                        return Ok(());
                    }
                    let finished = op.finished();
                    let stream = op.seed.as_ref().map(|seed| Arc::clone(&seed.stream));
                    let (stream_id, event) = (op.stream_id, op.completion.clone());
                    // A completed operation is queued for retirement: its
                    // stream is held there when the operation does not.
                    (!finished).then(|| (stream.or_else(|| table.lane_stream(stream_id)), event))
                }
            }
        };
        let callbacks: Vec<Callback> = vec![Box::new(f)];
        if let Some((stream, Some(event))) = late
            && !event.query()?
        {
            match stream {
                Some(stream) => {
                    let done = Arc::new(AtomicBool::new(false));
                    self.schedule_callbacks(id, &stream, &event, callbacks, done);
                    return Ok(());
                }
                // Not reached (a completed operation's stream is held by its
                // retirement queue); if it were, wait here rather than run early.
                None => event.synchronize()?,
            }
        }
        run_callbacks(id, callbacks, &self.counters);
        Ok(())
    }

    /// The id the next operation registered will get: every id below it
    /// was issued (to an operation, or to a registration that failed).
    pub fn next_id(&self) -> OperationId {
        OperationId(self.table().next_id())
    }

    /// Where `id` is, or `None` for an id this coordinator never issued.
    pub fn state(&self, id: OperationId) -> Option<OperationState> {
        let table = self.table();
        match table.get(id) {
            Some(op) => Some(match op.phase {
                Phase::Registered => OperationState::Registered,
                Phase::Begun => OperationState::Begun,
                Phase::Completed => OperationState::Completed,
            }),
            None => table.is_known(id).then_some(OperationState::Retired),
        }
    }

    /// A copy of `id`'s metadata, while the coordinator holds it (not retired).
    pub fn metadata(&self, id: OperationId) -> Option<EventMetadata> {
        self.table().get(id).map(|op| EventMetadata {
            operation_type: op.meta.operation_type,
            priority: op.meta.priority,
            stream_id: op.stream_id,
            operation_id: id,
            creation_time: self.clock.instant(op.meta.creation_time),
            dependencies: op.meta.dependencies.to_vec(),
            description: op.meta.description.to_string(),
        })
    }

    /// Counters: operations, completions, coordination time, deadlocks found.
    pub fn metrics(&self) -> CoordinatorMetrics {
        let table = self.table();
        self.counters
            .snapshot(table.live(), table.total, table.completed, table.retired)
    }
}

/// Why an operation cannot run after its dependencies (its id is given later).
enum DependencyProblem {
    Unknown(OperationId),
    NotComplete(OperationId, &'static str),
}

impl DependencyProblem {
    fn for_operation(self, operation: OperationId) -> Error {
        match self {
            DependencyProblem::Unknown(dependency) => Error::UnknownDependency {
                operation,
                dependency,
            },
            DependencyProblem::NotComplete(dependency, state) => Error::DependencyNotComplete {
                operation,
                dependency,
                state,
            },
        }
    }
}

/// The completion events `stream` must wait for before an operation runs
/// after `dependencies`: those of completed operations on other streams that
/// the GPU may not have passed yet, where the table keeps them. A dependency
/// that is unknown, or registered but not completed, is a problem naming it.
fn dependency_events<'t>(
    table: &'t Table,
    dependencies: &[OperationId],
    stream: &Stream,
) -> std::result::Result<SmallVec<[&'t Arc<PooledEvent>; 4]>, DependencyProblem> {
    let mut events = SmallVec::new();
    for &dependency in dependencies {
        if let Some(event) = dependency_event(table, dependency, stream)? {
            events.push(event);
        }
    }
    Ok(events)
}

/// The completion event `stream` must wait for before an operation runs
/// after `dependency` (see [`dependency_events`]): `None` when there is
/// none to wait for (retired, finished, or on `stream` itself).
#[inline]
fn dependency_event<'t>(
    table: &'t Table,
    dependency: OperationId,
    stream: &Stream,
) -> std::result::Result<Option<&'t Arc<PooledEvent>>, DependencyProblem> {
    let Some(dep) = table.get(dependency) else {
        // Absent and issued: retired, so the GPU is past it.
        return match table.is_known(dependency) {
            true => Ok(None),
            false => Err(DependencyProblem::Unknown(dependency)),
        };
    };
    if dep.phase != Phase::Completed {
        return Err(DependencyProblem::NotComplete(dependency, dep.phase.name()));
    }
    if dep.stream_id == stream.id() || dep.finished() {
        return Ok(None);
    }
    Ok(dep.completion.as_ref())
}

impl std::fmt::Debug for OperationGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationGraph")
            .field("metrics", &self.metrics())
            .finish()
    }
}

impl Drop for OperationGraph {
    /// Operations begun and never completed leave their dependants waiting
    /// forever: say so, naming them, rather than hang silently.
    fn drop(&mut self) {
        let mut unfinished: Vec<(OperationId, String)> = self
            .table()
            .iter()
            .filter(|(_, op)| op.phase == Phase::Begun)
            .map(|(id, op)| (id, op.meta.description.to_string()))
            .collect();
        if unfinished.is_empty() {
            return;
        }
        unfinished.sort();
        let names: Vec<String> = unfinished
            .iter()
            .map(|(id, label)| format!("{id} ({label:?})"))
            .collect();
        tracing::warn!(
            count = unfinished.len(),
            "operation graph dropped with operations begun and never completed: {}",
            names.join(", ")
        );
    }
}

#[inline]
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn take_slot<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Run each callback, catching and counting panics so one cannot skip the rest.
fn run_callbacks(id: OperationId, callbacks: Vec<Callback>, counters: &Counters) {
    for callback in callbacks {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(callback)) {
            counters.panicked(&id.to_string(), payload.as_ref());
        }
    }
}
