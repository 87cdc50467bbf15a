//! Exclusive streams: a guard over a stream taken from the pool's reserve,
//! one holder at a time.

use crate::error::Result;
use crate::pool::StreamPool;
use crate::reserve::Reserve;
use driver::{Stream, StreamPriority};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

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
        self.reserve.created()
    }
}
