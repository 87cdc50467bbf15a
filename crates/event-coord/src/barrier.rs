//! A barrier across streams: every stream reaches a point before the host (or
//! every other stream) goes on.

use crate::{Error, OperationCoordinator, Result};
use driver::{EventPool, Stream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counters of a [`CrossStreamBarrier`], from [`CrossStreamBarrier::stats`].
///
/// ```
/// use cuda_streams_event_coord::{CrossStreamBarrier, EventPool};
/// use cuda_streams_event_coord::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_event_coord::Result<()> {
/// let ctx = Context::new(0)?;
/// let streams = vec![Stream::new(&ctx)?, Stream::new(&ctx)?];
/// let barrier = CrossStreamBarrier::new(streams, Arc::new(EventPool::new(&ctx, 2, 0)?))?;
/// barrier.arrive()?;
/// let waited = barrier.synchronize()?;
/// let stats = barrier.stats();
/// assert_eq!((stats.arrivals, stats.synchronizations), (1, 1));
/// assert_eq!(stats.total_wait, waited);
/// let line = stats.to_string(); // one line for logs and reports
/// assert!(line.starts_with("barrier: 1 arrival(s), 1 synchronization(s), "), "{line}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BarrierStats {
    /// Completed [`CrossStreamBarrier::synchronize`] calls.
    pub synchronizations: u64,
    /// Completed [`CrossStreamBarrier::arrive`] calls.
    pub arrivals: u64,
    /// Host time spent in `synchronize`, summed.
    pub total_wait: Duration,
}

/// A barrier over a fixed set of streams, with events from a pool: a view on
/// an operation graph ([`graph`](Self::graph)), as the coordinators are.
///
/// - [`synchronize`](Self::synchronize): the host blocks until every stream
///   has finished the work enqueued before the call (one event per stream).
/// - [`arrive`](Self::arrive): no host blocking; work enqueued on any of the
///   streams after the call waits until every stream has reached the barrier.
///   Each arrival is the graph's barrier node
///   ([`OperationCoordinator::barrier`]), so later operations of the graph
///   can depend on it ([`arrive_node`](Self::arrive_node)).
///
/// ```
/// use cuda_streams_event_coord::{CrossStreamBarrier, Error, EventPool};
/// use cuda_streams_event_coord::driver::{Context, Stream};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_event_coord::Result<()> {
/// let ctx = Context::new(0)?;
/// let pool = Arc::new(EventPool::new(&ctx, 2, 0)?);
/// let streams = vec![Stream::new(&ctx)?, Stream::new(&ctx)?];
/// let barrier = CrossStreamBarrier::new(streams, Arc::clone(&pool))?;
/// // Work enqueued on either stream from here on waits for both.
/// barrier.arrive()?;
/// // The host waits for both streams to drain.
/// barrier.synchronize()?;
/// assert!(barrier.streams().iter().all(|stream| stream.query().unwrap()));
/// assert!(matches!(CrossStreamBarrier::new(vec![], pool), Err(Error::EmptyBarrier)));
/// # Ok(())
/// # }
/// ```
pub struct CrossStreamBarrier {
    streams: Vec<Arc<Stream>>,
    graph: Arc<OperationCoordinator>,
    synchronizations: AtomicU64,
    arrivals: AtomicU64,
    wait_ns: AtomicU64,
}

impl CrossStreamBarrier {
    /// A barrier over `streams` (at least one), taking events from `pool`,
    /// on a graph of its own.
    pub fn new(streams: Vec<Arc<Stream>>, pool: Arc<EventPool>) -> Result<CrossStreamBarrier> {
        Self::with_graph(streams, &Arc::new(OperationCoordinator::new(pool)))
    }

    /// A barrier over `streams` (at least one) as a view on `graph`, shared
    /// with other views and with code using the graph's builder: each
    /// arrival is an operation of it.
    ///
    /// ```
    /// use cuda_streams_event_coord::{CrossStreamBarrier, OperationCoordinator};
    /// use cuda_streams_event_coord::driver::{Context, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_event_coord::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (a, b, c) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let graph = Arc::new(OperationCoordinator::for_context(&ctx));
    /// let barrier = CrossStreamBarrier::with_graph(vec![a, b], &graph)?;
    /// barrier.arrive()?; // the seed's call: a node of the graph too
    /// assert_eq!(graph.metrics().total_operations, 1);
    /// let arrival = barrier.arrive_node()?;
    /// // c is not in the barrier; an operation of the graph can wait for it.
    /// graph.op(&c).after(&[arrival.id()]).run(|_| Ok(()))?.wait()?;
    /// assert_eq!(graph.metrics().total_operations, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_graph(
        streams: Vec<Arc<Stream>>,
        graph: &Arc<OperationCoordinator>,
    ) -> Result<CrossStreamBarrier> {
        if streams.is_empty() {
            return Err(Error::EmptyBarrier);
        }
        Ok(CrossStreamBarrier {
            streams,
            graph: Arc::clone(graph),
            synchronizations: AtomicU64::new(0),
            arrivals: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        })
    }

    fn refs(&self) -> Vec<&Stream> {
        self.streams.iter().map(|stream| &**stream).collect()
    }

    /// Block until every stream has finished the work enqueued before this
    /// call; returns how long the host waited.
    pub fn synchronize(&self) -> Result<Duration> {
        let start = Instant::now();
        self.graph.pool().synchronize_all(&self.refs())?;
        let waited = start.elapsed();
        self.wait_ns.fetch_add(
            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.synchronizations.fetch_add(1, Ordering::Relaxed);
        Ok(waited)
    }

    /// Device-side barrier: work enqueued on any of the streams after this
    /// call waits until every stream has finished the work enqueued before
    /// it. The graph's barrier node ([`OperationCoordinator::barrier`]): the
    /// first stream joins the others (one event each), the barrier is an
    /// operation there, and the others wait for its completion event. The
    /// host returns at once.
    pub fn arrive(&self) -> Result<()> {
        self.arrive_node().map(drop)
    }

    /// [`arrive`](Self::arrive), returning the barrier's node of the graph,
    /// for later operations to depend on.
    pub fn arrive_node(&self) -> Result<engine::Barrier> {
        let barrier = self.graph.barrier(&self.streams)?;
        self.arrivals.fetch_add(1, Ordering::Relaxed);
        Ok(barrier)
    }

    /// The operation graph this barrier is a view on.
    pub fn graph(&self) -> &Arc<OperationCoordinator> {
        &self.graph
    }

    /// The streams, in the order given.
    pub fn streams(&self) -> &[Arc<Stream>] {
        &self.streams
    }

    /// Counters so far.
    pub fn stats(&self) -> BarrierStats {
        BarrierStats {
            synchronizations: self.synchronizations.load(Ordering::Relaxed),
            arrivals: self.arrivals.load(Ordering::Relaxed),
            total_wait: Duration::from_nanos(self.wait_ns.load(Ordering::Relaxed)),
        }
    }
}

impl std::fmt::Debug for CrossStreamBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossStreamBarrier")
            .field(
                "streams",
                &self.streams.iter().map(|s| s.id()).collect::<Vec<_>>(),
            )
            .field("stats", &self.stats())
            .finish()
    }
}

impl std::fmt::Display for BarrierStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "barrier: {} arrival(s), {} synchronization(s), {} waited on the host",
            self.arrivals,
            self.synchronizations,
            driver::format_duration(self.total_wait),
        )
    }
}
