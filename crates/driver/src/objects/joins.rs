//! Ordering streams against each other: waits, fork, join and barriers, each
//! made of events from the context's pool ([`Context::event_pool`]).
//!
//! A wait (`cuStreamWaitEvent`) takes the event's state when it is enqueued,
//! so an event can go back to the pool as soon as the waits on it are
//! enqueued: re-recording it later cannot change them.

use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::event_pool::{EventPool, PooledEvent};
use crate::objects::stream::Stream;
use std::sync::Arc;

impl Stream {
    /// The event pool of this stream's context, kept by the stream after the
    /// first call (no lock on later calls).
    pub fn event_pool(&self) -> &Arc<EventPool> {
        self.pool.get_or_init(|| self.context().event_pool())
    }

    /// A pooled plain event recorded at the current end of this stream.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let mark = stream.mark().unwrap();
    /// mark.synchronize().unwrap();
    /// assert!(mark.query().unwrap());
    /// ```
    pub fn mark(&self) -> Result<PooledEvent> {
        let event = self.event_pool().acquire_event(false)?;
        event.record(self)?;
        Ok(event)
    }

    /// Make work enqueued on this stream from now on wait until `other` has
    /// finished the work enqueued on it so far: one event, recorded on
    /// `other` and waited here; the host does not wait. `other` may belong to
    /// another context (another device): the GPU orders across devices.
    /// Waiting on itself changes nothing and makes no driver call. No event
    /// is recorded when `other`'s latest mark ([`Stream::record_latest`])
    /// still stands.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (producer, consumer) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let mut buf = DeviceBuffer::<u32>::new(&ctx, 1 << 16)?;
    /// producer.memset_u32_async(&mut buf, 7)?;
    /// consumer.wait_stream(&producer)?; // the copy below sees the memset
    /// let mut host = PinnedBuffer::<u32>::new(&ctx, 1 << 16)?;
    /// consumer.copy_to_host_async(&mut host, &buf)?;
    /// assert!(host.as_slice()?.iter().all(|&v| v == 7));
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if other.id() == self.id() {
            return Ok(());
        }
        other.order_after_me(&[self]).map(drop)
    }

    /// The join of a fork/join: this stream waits for the work enqueued so
    /// far on each of `branches`, one event per branch.
    pub fn join(&self, branches: &[&Stream]) -> Result<()> {
        for branch in branches {
            self.wait_stream(branch)?;
        }
        Ok(())
    }

    /// The fork of a fork/join: work enqueued on each of `branches` from now
    /// on waits for the work enqueued on this stream so far. One event,
    /// recorded here once and waited by every branch; none at all when the
    /// stream's latest mark ([`Stream::record_latest`], which the engine
    /// uses for each operation's completion) still stands, nothing having
    /// been enqueued here since.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let main = Stream::new(&ctx)?;
    /// let branches = [Stream::new(&ctx)?, Stream::new(&ctx)?];
    /// let mut data = DeviceBuffer::<u32>::new(&ctx, 1024)?;
    /// main.memset_u32_async(&mut data, 3)?;
    /// main.fork(&[&branches[0], &branches[1]])?; // both start after the memset
    /// let mut halves = [PinnedBuffer::<u32>::new(&ctx, 1024)?, PinnedBuffer::<u32>::new(&ctx, 1024)?];
    /// for (branch, half) in branches.iter().zip(halves.iter_mut()) {
    ///     branch.copy_to_host_async(half, &data)?;
    /// }
    /// main.join(&[&branches[0], &branches[1]])?; // main goes on after both
    /// main.synchronize()?;
    /// assert!(halves.iter().all(|h| h.as_slice().unwrap().iter().all(|&v| v == 3)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fork(&self, branches: &[&Stream]) -> Result<()> {
        let others: smallvec::SmallVec<[&Stream; 8]> = branches
            .iter()
            .copied()
            .filter(|b| b.id() != self.id())
            .collect();
        self.order_after_me(&others).map(drop)
    }

    /// A device-side barrier over `streams`: work enqueued on any of them
    /// from now on waits until every one has finished the work enqueued
    /// before this call. One event per stream and two waits per stream but
    /// the first (a join into the first stream, then a fork out of it); the
    /// host does not wait.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let streams = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
    /// Stream::barrier(&[&streams[0], &streams[1]]).unwrap();
    /// streams[0].synchronize().unwrap();
    /// ```
    pub fn barrier(streams: &[&Stream]) -> Result<()> {
        barrier_with(streams, |stream| stream.mark())
    }

    /// [`Stream::barrier`] whose gathering point is made by `gather` on the
    /// first stream (after it has joined the others): an operation of a
    /// graph, say, whose completion event every other stream then waits for
    /// (`event_of`). Marks of the other streams come from their own pools.
    /// Returns what `gather` made, or `None` for no streams. Used by the
    /// engine's barrier node, so there is one device-side barrier.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let streams = [Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?];
    /// let refs = [&*streams[0], &*streams[1], &*streams[2]];
    /// let gathered = Stream::barrier_through(&refs, |first| first.mark(), |e| &**e)?;
    /// gathered.expect("three streams").synchronize()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn barrier_through<G, E: From<crate::ground::error::Error>>(
        streams: &[&Stream],
        gather: impl FnOnce(&Stream) -> std::result::Result<G, E>,
        event_of: impl Fn(&G) -> &crate::objects::event::Event,
    ) -> std::result::Result<Option<G>, E> {
        barrier_gathered(streams, |stream| stream.mark(), gather, event_of)
    }

    /// Block the host until every stream in `streams` has finished the work
    /// enqueued so far (all marks are recorded first, so the streams drain in
    /// parallel while the host waits).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Stream};
    /// let ctx = Context::new(0).unwrap();
    /// let streams = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
    /// Stream::synchronize_all(&[&streams[0], &streams[1]]).unwrap();
    /// assert!(streams.iter().all(|s| s.query().unwrap()));
    /// ```
    pub fn synchronize_all(streams: &[&Stream]) -> Result<()> {
        synchronize_with(streams, |stream| stream.mark())
    }
}

impl EventPool {
    /// [`Stream::barrier`] with events from this pool. Every stream must
    /// belong to the pool's context.
    pub fn barrier(self: &Arc<Self>, streams: &[&Stream]) -> Result<()> {
        barrier_with(streams, |stream| self.mark(stream))
    }

    /// [`Stream::synchronize_all`] with events from this pool. Every stream
    /// must belong to the pool's context.
    pub fn synchronize_all(self: &Arc<Self>, streams: &[&Stream]) -> Result<()> {
        synchronize_with(streams, |stream| self.mark(stream))
    }

    /// A plain event from this pool recorded at the end of `stream`.
    pub fn mark(self: &Arc<Self>, stream: &Stream) -> Result<PooledEvent> {
        check_context(self.context(), stream)?;
        let event = self.acquire_event(false)?;
        event.record(stream)?;
        Ok(event)
    }
}

fn check_context(ctx: &Context, stream: &Stream) -> Result<()> {
    if stream.context().id() == ctx.id() {
        Ok(())
    } else {
        Err(crate::ground::error::Error::ContextMismatch {
            what: "an event pool",
            expected: stream.context().id(),
            found: ctx.id(),
        })
    }
}

/// The one device-side barrier: `mark` records an event at a stream's end.
///
/// A join and a fork through the first stream: it waits for a mark of every
/// other stream, then every other stream waits for one mark of it. One event
/// per stream and 2(n − 1) waits, where each stream waiting for every other
/// would take n(n − 1).
fn barrier_with(streams: &[&Stream], mark: impl Fn(&Stream) -> Result<PooledEvent>) -> Result<()> {
    let distinct = streams
        .split_first()
        .is_some_and(|(first, rest)| rest.iter().any(|stream| stream.id() != first.id()));
    if !distinct {
        // One stream (or none) is its own barrier: nothing to record.
        return Ok(());
    }
    barrier_gathered(streams, &mark, |first| mark(first), |e| &**e).map(drop)
}

/// The barrier's steps, with the gathering point made by `gather` on the
/// first stream after its join; `None` for no streams.
fn barrier_gathered<G, E: From<crate::ground::error::Error>>(
    streams: &[&Stream],
    mut mark: impl FnMut(&Stream) -> Result<PooledEvent>,
    gather: impl FnOnce(&Stream) -> std::result::Result<G, E>,
    event_of: impl Fn(&G) -> &crate::objects::event::Event,
) -> std::result::Result<Option<G>, E> {
    let Some((first, rest)) = streams.split_first() else {
        return Ok(None);
    };
    let others: Vec<&Stream> = rest
        .iter()
        .copied()
        .filter(|stream| stream.id() != first.id())
        .collect();
    for other in &others {
        let done = mark(other)?;
        first.wait_event(&done)?;
    }
    let gathered = gather(first)?;
    for other in &others {
        other.wait_event(event_of(&gathered))?;
    }
    Ok(Some(gathered))
}

fn synchronize_with(
    streams: &[&Stream],
    mut mark: impl FnMut(&Stream) -> Result<PooledEvent>,
) -> Result<()> {
    let marks = streams
        .iter()
        .map(|stream| mark(stream))
        .collect::<Result<Vec<_>>>()?;
    for event in &marks {
        event.synchronize()?;
    }
    Ok(())
}
