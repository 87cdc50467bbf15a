//! The memory timeline: allocations and frees of the allocators a profiler
//! tracks, stamped with the host's clock and placed on the GPU timeline in
//! the trace.

use allocator::{MemoryEvent, MemoryObserver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// What the profiler keeps: every event while enabled, with when it happened.
#[derive(Default)]
pub(crate) struct MemoryLog {
    pub(crate) enabled: AtomicBool,
    /// Whether an allocator was ever given to `track_memory`.
    pub(crate) tracking: AtomicBool,
    events: Mutex<Vec<(Instant, MemoryEvent)>>,
}

impl MemoryLog {
    /// The report of the events so far, `None` when no allocator is tracked.
    pub(crate) fn report(&self) -> Option<crate::memory_report::MemoryReport> {
        if !self.tracking.load(Ordering::Relaxed) {
            return None;
        }
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        Some(crate::memory_report::MemoryReport::build(
            events.iter().map(|(_, event)| event),
        ))
    }

    /// The events so far, in the order they were logged.
    pub(crate) fn events(&self) -> Vec<(Instant, MemoryEvent)> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The observer an allocator holds: it forwards while the profiler
    /// lives, and does nothing after (an allocator outliving the profiler
    /// does not keep its log growing).
    pub(crate) fn observer(self: &Arc<Self>) -> Arc<dyn MemoryObserver> {
        Arc::new(Forward(Arc::downgrade(self)))
    }
}

struct Forward(Weak<MemoryLog>);

impl MemoryObserver for Forward {
    fn on_memory_event(&self, event: &MemoryEvent) {
        let Some(log) = self.0.upgrade() else {
            return;
        };
        if log.enabled.load(Ordering::Relaxed) {
            let now = Instant::now();
            log.events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((now, *event));
        }
    }
}

/// One memory event on the GPU timeline (ns after the base event).
pub(crate) struct MemorySample {
    pub(crate) ns: u64,
    pub(crate) event: MemoryEvent,
}
