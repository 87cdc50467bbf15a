//! What a profiler shares with its stream slots and its scopes: the event
//! pool the boundaries come from, the timeline's clock, the CUPTI backend,
//! and the count of failures that could not be returned. Kept apart from the
//! clock so the clock need not know the backends, and from the profiler so
//! a scope can close without reaching back up to it.

use crate::clock::GpuTimebase;
use crate::cupti::CuptiBackend;
use crate::error::{Error, Result};
use driver::EventPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What the profiler, every stream slot and every open scope share: the
/// event pool, the clock, started when first needed, the CUPTI backend when
/// in use, and the failures met where they could not be returned.
pub(crate) struct Shared {
    pub(crate) pool: Arc<EventPool>,
    /// Times come from CUPTI's records instead of events when set.
    pub(crate) cupti: Option<CuptiBackend>,
    clock: OnceLock<GpuTimebase>,
    clock_init: Mutex<()>,
    /// Failures met where they could not be returned (a scope guard's drop).
    errors: AtomicU64,
}

impl Shared {
    pub(crate) fn new(pool: Arc<EventPool>, cupti: Option<CuptiBackend>) -> Self {
        Self {
            pool,
            cupti,
            clock: OnceLock::new(),
            clock_init: Mutex::new(()),
            errors: AtomicU64::new(0),
        }
    }

    /// The clock, if something started it.
    pub(crate) fn started_clock(&self) -> Option<&GpuTimebase> {
        self.clock.get()
    }

    /// The base of the timeline, recorded when first needed.
    pub(crate) fn clock(&self) -> Result<&GpuTimebase> {
        if let Some(clock) = self.clock.get() {
            return Ok(clock);
        }
        let _once = self.clock_init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(clock) = self.clock.get() {
            return Ok(clock);
        }
        let clock = GpuTimebase::start(self.pool.context())?;
        Ok(self.clock.get_or_init(|| clock))
    }

    /// CUPTI's clock now (0 with events).
    pub(crate) fn cupti_now(&self) -> u64 {
        self.cupti.as_ref().map_or(0, CuptiBackend::now)
    }

    /// Count a failure that cannot be returned; the first is also logged (a
    /// `tracing` warning).
    pub(crate) fn note_error(&self, err: &Error) {
        if self.errors.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!("{err} (further errors are only counted)");
        }
    }

    /// Failures counted by [`note_error`](Self::note_error).
    pub(crate) fn error_count(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}
