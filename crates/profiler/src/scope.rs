//! The guard that times a region of work on a stream.

use crate::error::Result;
use crate::shared::Shared;
use crate::timed_op::Name;
use crate::timeline::{StartCell, StreamSlot};
use driver::Stream;
use std::sync::Arc;

/// Times the work enqueued on a stream while it is alive
/// ([`StreamProfiler::scope`](crate::StreamProfiler::scope)): from its first
/// work item (after the waits that order that work on other streams) to its
/// end, when it is dropped (or [`ScopeGuard::finish`]ed). Consecutive scopes
/// share boundary events.
///
/// Made while profiling is disabled it is inert and costs nothing.
///
/// ```
/// use cuda_streams_profiler::StreamProfiler;
/// use cuda_streams_profiler::driver::{Context, DeviceBuffer, Stream};
/// # fn main() -> cuda_streams_profiler::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::<u32>::new_async(&stream, 1024)?;
/// let profiler = StreamProfiler::new(&ctx)?;
/// assert!(!profiler.scope(&stream, "unseen")?.is_active()); // disabled: inert
/// profiler.enable();
/// let scope = profiler.scope(&stream, "clear")?;
/// assert!(scope.is_active());
/// stream.memset_u32_async(&mut buf, 0)?;
/// scope.finish()?; // ends it here, returning any failure to record the end
/// let report = profiler.get_stream_report(&stream).unwrap();
/// assert_eq!(report.operation_count, 1);
/// assert_eq!(report.operations["clear"].count, 1);
/// # Ok(())
/// # }
/// ```
#[must_use = "the scope ends when the guard is dropped; bind it: `let _scope = ...`"]
pub struct ScopeGuard<'a> {
    open: Option<Open<'a>>,
}

struct Open<'a> {
    /// The profiler's shared state: CUPTI's clock at the close, and the
    /// count of failures a drop cannot return.
    shared: &'a Shared,
    stream: &'a Stream,
    slot: Arc<StreamSlot>,
    name: Name,
    start: ScopeStart,
    depth: u32,
    /// The scope as an NVTX range (nothing without a tool attached).
    _nvtx: driver::nvtx::Range,
}

/// Where a scope starts, by backend.
pub(crate) enum ScopeStart {
    /// Event backend: the cell its start boundary is set in.
    Events(Arc<StartCell>),
    /// CUPTI backend: CUPTI's clock when it opened.
    Cupti(u64),
}

impl<'a> ScopeGuard<'a> {
    pub(crate) fn inert() -> Self {
        Self { open: None }
    }

    pub(crate) fn open(
        shared: &'a Shared,
        stream: &'a Stream,
        slot: Arc<StreamSlot>,
        name: Name,
        start: ScopeStart,
        depth: u32,
    ) -> Self {
        let nvtx = driver::nvtx::range(&name);
        Self {
            open: Some(Open {
                shared,
                stream,
                slot,
                name,
                start,
                depth,
                _nvtx: nvtx,
            }),
        }
    }

    /// Whether this guard is timing (profiling was enabled when it was made).
    pub fn is_active(&self) -> bool {
        self.open.is_some()
    }

    /// End the scope now, reporting a failure to record its end (dropping the
    /// guard counts such failures in
    /// [`StreamProfiler::error_count`](crate::StreamProfiler::error_count) instead).
    pub fn finish(mut self) -> Result<()> {
        match self.open.take() {
            Some(open) => open.close(),
            None => Ok(()),
        }
    }
}

impl Open<'_> {
    fn close(self) -> Result<()> {
        let Self {
            shared,
            stream,
            slot,
            name,
            start,
            depth,
            _nvtx,
        } = self;
        match start {
            ScopeStart::Events(cell) => slot.close(stream, name, cell, depth),
            ScopeStart::Cupti(opened) => {
                let closed = shared.cupti_now();
                slot.close_cupti(name, opened, closed, depth);
                Ok(())
            }
        }
    }
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            let shared = open.shared;
            if let Err(err) = open.close() {
                shared.note_error(&err);
            }
        }
    }
}
