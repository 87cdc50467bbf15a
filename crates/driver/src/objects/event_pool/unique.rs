//! A pooled event behind an `Arc` that nothing else holds: whoever has it
//! knows that no other thread can record it, wait on it, or keep it as a
//! stream's latest mark, so [`Stream::record_latest_unique`] records it
//! without the checks a shared event needs (one atomic read-modify-write
//! fewer), and it becomes shared only when it is handed out as an `Arc`.
//!
//! [`Stream::record_latest_unique`]: crate::Stream::record_latest_unique

use super::PooledEvent;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A [`PooledEvent`] in an `Arc` with no other handle (no other `Arc`, no
/// `Weak`). From [`UniqueEvent::new`], [`UniqueEvent::try_from_arc`], or a
/// [`LocalShelf`](super::LocalShelf).
///
/// ```
/// use cuda_streams_driver::{Context, UniqueEvent};
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let shared = Arc::new(ctx.event_pool().acquire_event(false)?);
/// let copy = Arc::clone(&shared);
/// let shared = UniqueEvent::try_from_arc(shared).expect_err("`copy` still sees it");
/// drop(copy);
/// let unique = UniqueEvent::try_from_arc(shared).expect("the last handle");
/// let _shared_again: Arc<_> = unique.into_arc();
/// # Ok(())
/// # }
/// ```
pub struct UniqueEvent(Arc<PooledEvent>);

impl UniqueEvent {
    /// `event` in a new `Arc`.
    pub fn new(event: PooledEvent) -> Self {
        UniqueEvent(Arc::new(event))
    }

    /// `event` when it is the last handle (std's `Arc::get_mut` check, which
    /// also shuts out a `Weak` upgrading meanwhile); else `event` back.
    pub fn try_from_arc(mut event: Arc<PooledEvent>) -> Result<Self, Arc<PooledEvent>> {
        match Arc::get_mut(&mut event) {
            Some(_) => Ok(UniqueEvent(event)),
            None => Err(event),
        }
    }

    /// The `Arc`, to share.
    pub fn into_arc(self) -> Arc<PooledEvent> {
        self.0
    }
}

impl Deref for UniqueEvent {
    type Target = PooledEvent;

    fn deref(&self) -> &PooledEvent {
        &self.0
    }
}

impl fmt::Debug for UniqueEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UniqueEvent").field(&**self.0).finish()
    }
}
