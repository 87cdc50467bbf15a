//! The reserve behind exclusive streams: streams apart from the shared ones,
//! kept per priority class and reused once given back.

use crate::error::Result;
use driver::{Context, Stream, StreamPriority};
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

    pub(crate) fn take(&self, priority: StreamPriority) -> Result<Arc<Stream>> {
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

    pub(crate) fn give_back(&self, priority: StreamPriority, stream: Arc<Stream>) {
        // A clone kept past the guard (a buffer's home stream, say) could
        // still enqueue work, so such a stream never goes to another holder.
        if Arc::strong_count(&stream) == 1 {
            self.free[priority as usize]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(stream);
        }
    }

    /// How many streams the reserve has created so far.
    pub(crate) fn created(&self) -> usize {
        self.created.load(Relaxed)
    }
}
