//! Plain events for operation completion, reused instead of created per operation.

use crate::error::Result;
use driver::{Context, Event};
use std::sync::Arc;

/// How many spare events are kept.
const KEEP: usize = 64;

pub(crate) struct EventRecycler {
    ctx: Arc<Context>,
    free: Vec<Event>,
}

impl EventRecycler {
    pub(crate) fn new(ctx: &Arc<Context>) -> Self {
        Self {
            ctx: Arc::clone(ctx),
            free: Vec::new(),
        }
    }

    /// A plain event; it may carry an old mark, so record it before use.
    pub(crate) fn take(&mut self) -> Result<Event> {
        match self.free.pop() {
            Some(event) => Ok(event),
            None => Ok(Event::plain(&self.ctx)?),
        }
    }

    /// Back for reuse. Re-recording later does not disturb streams that
    /// already waited on its earlier mark (CUDA captures the mark at the wait).
    pub(crate) fn give_back(&mut self, event: Event) {
        if self.free.len() < KEEP {
            self.free.push(event);
        }
    }
}
