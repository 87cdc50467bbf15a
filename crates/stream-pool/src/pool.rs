//! The pool itself: streams created once, handed out by atomic cursors.

use crate::coordinator::MultiStreamCoordinator;
use crate::error::Result;
use crate::kinds::{AllocationStrategy, StreamPurpose, WorkloadType};
use crate::layout::{AtomicSpan, ClassSplit, Span};
use crate::probe::Probe;
use crate::reserve::Reserve;
use crate::workload_stats::WorkloadStats;
use driver::{Context, Stream, StreamPriority};
use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// A cursor on its own cache line, so threads bumping different cursors do
/// not slow each other down.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Cursor(AtomicUsize);

impl Cursor {
    #[inline]
    pub(crate) fn next(&self) -> usize {
        self.0.fetch_add(1, Relaxed)
    }
}

/// One pooled stream and what the pool knows about it.
pub(crate) struct Slot {
    pub(crate) stream: Arc<Stream>,
    pub(crate) class: StreamPriority,
    pub(crate) probe: Probe,
}

/// A fixed set of streams, created once and handed out without driver calls.
///
/// # Sharing model
///
/// The getters ([`get_stream`](Self::get_stream),
/// [`get_stream_for_workload`](Self::get_stream_for_workload),
/// [`get_priority_stream`](Self::get_priority_stream),
/// [`get_stream_for_purpose`](Self::get_stream_for_purpose)) hand out
/// **shared** streams: the same stream goes to many callers, and a stream is an
/// in-order queue, so your work may wait behind someone else's. That is the
/// point of a pool (creating a stream costs ~28 µs on an H200), and it is
/// safe: the driver layer orders every free after every use. When work must
/// not share a queue (it must not be delayed by, or delay, other callers),
/// take [`acquire_exclusive`](Self::acquire_exclusive): a stream from a
/// separate reserve that no getter hands out while the guard lives.
///
/// # Cost
///
/// `RoundRobin`, `Workload` and purpose lookups are an atomic increment and an
/// `Arc` clone: no lock, no driver call. `LoadBalanced` and `Priority` ask the
/// driver (`cuStreamQuery`, ~0.2 µs per stream on an H200); see
/// [`AllocationStrategy`].
///
/// ```
/// use cuda_streams_stream_pool::driver::{Context, StreamPriority};
/// use cuda_streams_stream_pool::{AllocationStrategy, StreamPool, StreamPurpose, WorkloadType};
/// let ctx = Context::new(0).unwrap();
/// let pool = StreamPool::new_with_strategy(&ctx, 8, AllocationStrategy::Workload).unwrap();
/// let compute = pool.get_stream_for_workload(WorkloadType::Compute);
/// assert_eq!(pool.class_of(&compute), Some(StreamPriority::High));
/// let high = pool.get_priority_stream(StreamPriority::High);
/// assert_eq!(high.priority().unwrap(), ctx.priority_range().greatest);
/// let kernels = pool.get_stream_for_purpose(StreamPurpose::KernelExecution);
/// assert_eq!(kernels.id(), pool.get_stream_for_purpose(StreamPurpose::KernelExecution).id());
/// ```
pub struct StreamPool {
    ctx: Arc<Context>,
    pub(crate) slots: Box<[Slot]>,
    split: ClassSplit,
    strategy: AtomicU8,
    cursor: Cursor,
    class_spans: [Span; 3],
    class_cursors: [Cursor; 3],
    pub(crate) workload_spans: [AtomicSpan; 4],
    workload_cursors: [Cursor; 4],
    purposes: [usize; 5],
    /// Where live scans start, rotated so that ties spread out.
    pub(crate) scan_cursor: Cursor,
    pub(crate) stats: WorkloadStats,
    /// Serialises `optimize_configuration` (readers never take it).
    pub(crate) tuning: Mutex<()>,
    pub(crate) reserve: Arc<Reserve>,
}

impl StreamPool {
    /// The pool itself, from a split that `PoolBuilder::build` has checked.
    pub(crate) fn create(
        ctx: &Arc<Context>,
        split: ClassSplit,
        strategy: AllocationStrategy,
    ) -> Result<Self> {
        let slots = (0..split.total())
            .map(|index| {
                let class = split.class_at(index);
                Ok(Slot {
                    stream: Stream::new_with_priority(ctx, class)?,
                    class,
                    probe: Probe::default(),
                })
            })
            .collect::<Result<Box<[Slot]>>>()?;
        let workload_spans = split.default_workload_spans().map(AtomicSpan::new);
        Ok(Self {
            ctx: Arc::clone(ctx),
            slots,
            split,
            strategy: AtomicU8::new(strategy.to_u8()),
            cursor: Cursor::default(),
            class_spans: StreamPriority::ALL.map(|class| split.class_span(class)),
            class_cursors: Default::default(),
            workload_spans,
            workload_cursors: Default::default(),
            purposes: split.purpose_table(),
            scan_cursor: Cursor::default(),
            stats: WorkloadStats::default(),
            tuning: Mutex::new(()),
            reserve: Arc::new(Reserve::new(ctx)),
        })
    }

    /// A shared stream chosen by the pool's strategy ([`AllocationStrategy`]).
    #[inline]
    pub fn get_stream(&self) -> Arc<Stream> {
        match self.strategy() {
            AllocationStrategy::RoundRobin => self.stream_at(self.cursor.next() % self.slots.len()),
            AllocationStrategy::LoadBalanced => self.least_loaded(self.all()),
            AllocationStrategy::Priority => self.most_urgent_idle(),
            AllocationStrategy::Workload => self.get_stream_for_workload(WorkloadType::Mixed),
        }
    }

    /// A shared stream among those serving `workload` (see [`WorkloadType`];
    /// [`optimize_configuration`](Self::optimize_configuration) may change
    /// them). `LoadBalanced` picks by live work among them, the other
    /// strategies in turn.
    #[inline]
    pub fn get_stream_for_workload(&self, workload: WorkloadType) -> Arc<Stream> {
        let span = self.workload_spans[workload.index()].load();
        self.pick(span, &self.workload_cursors[workload.index()])
    }

    /// A shared stream of priority class `priority` (an empty class borrows a
    /// neighbour's streams, see [`ClassSplit`]). `LoadBalanced` picks by live
    /// work within the class, the other strategies in turn.
    #[inline]
    pub fn get_priority_stream(&self, priority: StreamPriority) -> Arc<Stream> {
        let index = priority as usize;
        self.pick(self.class_spans[index], &self.class_cursors[index])
    }

    /// The shared stream assigned to `purpose`: always the same one
    /// (see [`StreamPurpose`]).
    #[inline]
    pub fn get_stream_for_purpose(&self, purpose: StreamPurpose) -> Arc<Stream> {
        self.stream_at(self.purposes[purpose.index()])
    }

    #[inline]
    fn pick(&self, span: Span, cursor: &Cursor) -> Arc<Stream> {
        if self.strategy() == AllocationStrategy::LoadBalanced {
            self.least_loaded(span)
        } else {
            self.stream_at(span.nth(cursor.next()))
        }
    }

    pub(crate) fn class_span(&self, class: StreamPriority) -> Span {
        self.class_spans[class as usize]
    }

    pub(crate) fn get_priority_stream_in_turn(&self, class: StreamPriority) -> Arc<Stream> {
        let index = class as usize;
        self.stream_at(self.class_spans[index].nth(self.class_cursors[index].next()))
    }

    #[inline]
    pub(crate) fn stream_at(&self, index: usize) -> Arc<Stream> {
        Arc::clone(&self.slots[index].stream)
    }

    pub(crate) fn all(&self) -> Span {
        Span::new(0, self.slots.len())
    }

    /// The strategy `get_stream` uses now.
    #[inline]
    pub fn strategy(&self) -> AllocationStrategy {
        AllocationStrategy::from_u8(self.strategy.load(Relaxed))
    }

    /// Change the strategy; getters running now finish with the old one.
    pub fn set_strategy(&self, strategy: AllocationStrategy) {
        self.strategy.store(strategy.to_u8(), Relaxed);
    }

    /// How many shared streams the pool has.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always `false`: a pool has at least one stream.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The shared streams, most urgent class first.
    pub fn streams(&self) -> impl ExactSizeIterator<Item = &Arc<Stream>> + '_ {
        self.slots.iter().map(|slot| &slot.stream)
    }

    /// The priority class of a pooled stream (`None` for a stream not in the pool).
    pub fn class_of(&self, stream: &Stream) -> Option<StreamPriority> {
        self.slots
            .iter()
            .find(|slot| slot.stream.id() == stream.id())
            .map(|slot| slot.class)
    }

    /// How many streams each class has.
    pub fn class_split(&self) -> ClassSplit {
        self.split
    }

    /// The streams serving `workload` now.
    pub fn workload_streams(&self, workload: WorkloadType) -> Vec<Arc<Stream>> {
        self.span_streams(self.workload_spans[workload.index()].load())
    }

    /// The streams of class `priority` (an empty class: the borrowed ones).
    pub fn priority_streams(&self, priority: StreamPriority) -> Vec<Arc<Stream>> {
        self.span_streams(self.class_spans[priority as usize])
    }

    pub(crate) fn span_streams(&self, span: Span) -> Vec<Arc<Stream>> {
        span.indices().map(|index| self.stream_at(index)).collect()
    }

    /// The context the streams belong to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// A [`MultiStreamCoordinator`] over all of the pool's shared streams.
    pub fn coordinator(&self) -> MultiStreamCoordinator {
        MultiStreamCoordinator::new(self.streams().cloned())
    }
}

/// The engine takes streams from a pool by class: an operation built with
/// `OperationGraph::op_from(&pool)` runs on one of the pool's streams of the
/// class its priority maps to (`Critical`/`High` → high-priority streams).
///
/// ```
/// use cuda_streams_stream_pool::driver::{Context, StreamPriority};
/// use cuda_streams_stream_pool::StreamPool;
/// use cuda_streams_stream_pool::engine::{EventPriority, OperationGraph};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new(0)?;
/// let pool = StreamPool::new(&ctx, 6)?;
/// let graph = OperationGraph::for_context(&ctx);
/// let urgent = graph.op_from(&pool).priority(EventPriority::Critical).run(|_| Ok(()))?;
/// let stream = graph.metadata(urgent.id()).unwrap().stream_id;
/// let high: Vec<u64> = pool.priority_streams(StreamPriority::High).iter().map(|s| s.id()).collect();
/// assert!(high.contains(&stream));
/// # Ok(())
/// # }
/// ```
impl engine::StreamSource for StreamPool {
    fn stream_for(&self, class: StreamPriority) -> Arc<Stream> {
        self.get_priority_stream(class)
    }
}

impl fmt::Debug for StreamPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPool")
            .field("streams", &self.slots.len())
            .field("split", &self.split)
            .field("strategy", &self.strategy())
            .finish_non_exhaustive()
    }
}
