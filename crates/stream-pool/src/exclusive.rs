//! Exclusive streams: a reserve apart from the shared streams, one holder at a time.

use crate::error::Result;
use crate::pool::StreamPool;
use driver::{Context, Stream, StreamPriority};
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Streams kept for exclusive use, one free list per priority class. They are
/// never among the shared streams, so no getter can hand one out.
pub(crate) struct Reserve {
    ctx: Arc<Context>,
    free: [Mutex<Vec<Arc<Stream>>>; 3],
    created: AtomicUsize,
}

impl Reserve {
    pub(crate) fn new(ctx: &Arc<Context>) -> Self {
        Self {
            ctx: Arc::clone(ctx),
            free: Default::default(),
            created: AtomicUsize::new(0),
        }
    }

    fn take(&self, priority: StreamPriority) -> Result<Arc<Stream>> {
        let reused = {
            let mut free = self.free[priority as usize]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // An idle one first, so the new holder does not wait behind the
            // previous holder's last work.
            let idle = free.iter().position(|s| s.query().unwrap_or(false));
            match idle {
                Some(index) => Some(free.swap_remove(index)),
                None => free.pop(),
            }
        };
        match reused {
            Some(stream) => Ok(stream),
            None => {
                let stream = Stream::new_with_priority(&self.ctx, priority)?;
                self.created.fetch_add(1, Relaxed);
                Ok(stream)
            }
        }
    }

    fn give_back(&self, priority: StreamPriority, stream: Arc<Stream>) {
        // A clone kept past the guard (a buffer's home stream, say) could
        // still enqueue work, so such a stream never goes to another holder.
        if Arc::strong_count(&stream) == 1 {
            self.free[priority as usize]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(stream);
        }
    }
}

/// A stream that no one else is handed while this guard lives; it goes back
/// to the pool's reserve on drop. Derefs to the [`Stream`].
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::StreamPool;
/// let ctx = Context::new(0).unwrap();
/// let pool = StreamPool::new(&ctx, 4).unwrap();
/// let mine = pool.acquire_exclusive().unwrap();
/// // Never one of the shared streams.
/// assert!(pool.streams().all(|s| s.id() != mine.id()));
/// let other = pool.acquire_exclusive().unwrap();
/// assert_ne!(mine.id(), other.id());
/// let id = mine.id();
/// drop(mine);
/// // Reused once given back.
/// assert_eq!(pool.acquire_exclusive().unwrap().id(), id);
/// ```
#[must_use = "an exclusive stream goes back to the pool's reserve when dropped"]
pub struct ExclusiveStream {
    stream: Option<Arc<Stream>>,
    priority: StreamPriority,
    reserve: Arc<Reserve>,
}

impl ExclusiveStream {
    /// The stream as an `Arc` (for APIs that keep it, such as
    /// `DeviceBuffer::new_async`). A clone still alive when the guard drops
    /// keeps the stream out of the reserve for good.
    pub fn stream(&self) -> &Arc<Stream> {
        self.stream
            .as_ref()
            .expect("the stream is only taken in Drop")
    }

    /// The priority class it was created with (`priority()`, through
    /// `Deref`, is the driver's raw value).
    pub fn class(&self) -> StreamPriority {
        self.priority
    }
}

impl Deref for ExclusiveStream {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        self.stream()
    }
}

impl Drop for ExclusiveStream {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            self.reserve.give_back(self.priority, stream);
        }
    }
}

impl fmt::Debug for ExclusiveStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExclusiveStream")
            .field("stream", &self.stream)
            .field("priority", &self.priority)
            .finish()
    }
}

impl StreamPool {
    /// A Normal-priority stream for this caller alone until the guard drops
    /// (see the sharing model on [`StreamPool`]). The first call per
    /// concurrent holder creates a stream; later ones reuse returned streams.
    pub fn acquire_exclusive(&self) -> Result<ExclusiveStream> {
        self.acquire_exclusive_with_priority(StreamPriority::Normal)
    }

    /// [`acquire_exclusive`](Self::acquire_exclusive) of a given priority class.
    pub fn acquire_exclusive_with_priority(
        &self,
        priority: StreamPriority,
    ) -> Result<ExclusiveStream> {
        Ok(ExclusiveStream {
            stream: Some(self.reserve.take(priority)?),
            priority,
            reserve: Arc::clone(&self.reserve),
        })
    }

    /// How many streams the exclusive reserve has created so far.
    pub fn exclusive_streams_created(&self) -> usize {
        self.reserve.created.load(Relaxed)
    }
}
