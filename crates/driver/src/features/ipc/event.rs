//! Events shared between processes: created with `CU_EVENT_INTERPROCESS`,
//! handed over as a `cuIpcGetEventHandle` handle, opened with
//! `cuIpcOpenEventHandle`.
//!
//! Not a [`crate::Event`]: that type remembers what this process saw of
//! its own records (a host wait that saw the latest record complete stands
//! until the next record *here*), and another process's records would make
//! that memory wrong. A shared event asks the driver every time.

use super::buffer::ipc_of;
use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use std::fmt;
use std::sync::Arc;
use sys::{CUevent, CUevent_flags, CUipcEventHandle, Ipc};

/// An event that orders work across processes: one process records it on
/// a stream, another makes its own stream wait for that record (or waits
/// on the host). Sent over an [`IpcChannel`](crate::IpcChannel) and opened
/// there as a `SharedEvent` too; either side may record and wait.
///
/// As for any CUDA event, a wait takes the latest record *when the wait is
/// made*: the recording process tells the waiting one that it has recorded
/// (a [signal](crate::IpcChannel::send_signal) on the channel) before the
/// waiter waits.
///
/// The stream-order checker of each process sees that process's streams
/// only: a record here is a record, and a wait here teaches nothing about
/// this process's streams (what it waits for was done elsewhere).
///
/// ```
/// use cuda_streams_driver::{Context, SharedEvent, Stream};
/// let ctx = Context::new(0).unwrap();
/// let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
/// let event = SharedEvent::new(&ctx).unwrap();
/// event.record(&a).unwrap();
/// event.wait_on(&b).unwrap(); // b's later work runs after a's work so far
/// event.synchronize().unwrap();
/// assert!(event.query().unwrap());
/// ```
pub struct SharedEvent {
    ctx: Arc<Context>,
    ipc: &'static Ipc,
    raw: CUevent,
    /// The process it was opened from.
    exporter: Option<u32>,
}

// SAFETY: CUDA event handles may be used from any thread.
unsafe impl Send for SharedEvent {}
// SAFETY: as above; every method takes `&self` and the driver's event calls
// are thread-safe.
unsafe impl Sync for SharedEvent {}

impl SharedEvent {
    /// A new interprocess event (`CU_EVENT_INTERPROCESS`, without timing, as
    /// CUDA requires).
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        let ipc = ipc_of(ctx)?;
        ctx.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        let flags =
            CUevent_flags::CU_EVENT_INTERPROCESS.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        // SAFETY: writes one event handle through a valid pointer; the context is current.
        ctx.check(unsafe { (ctx.driver().cuEventCreate)(&mut raw, flags) })?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            ipc,
            raw,
            exporter: None,
        })
    }

    /// The handle another process opens (`cuIpcGetEventHandle`).
    pub(super) fn handle(&self) -> Result<CUipcEventHandle> {
        self.ctx.bind()?;
        let mut handle = CUipcEventHandle::default();
        // SAFETY: writes one handle through a valid pointer; the event is live.
        let code = unsafe { (self.ipc.cuIpcGetEventHandle)(&mut handle, self.raw) };
        self.ctx.check(code)?;
        Ok(handle)
    }

    /// The event another process's `handle` names, opened in `ctx`.
    pub(super) fn open(
        ctx: &Arc<Context>,
        handle: CUipcEventHandle,
        exporter: u32,
    ) -> Result<Self> {
        let ipc = ipc_of(ctx)?;
        ctx.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle through a valid pointer; the context is current.
        ctx.check(unsafe { (ipc.cuIpcOpenEventHandle)(&mut raw, handle) })
            .map_err(|err| crate::Error::Ipc {
                reason: format!(
                    "opening the event of process {exporter}: {err} (a stale or forged handle, or \
                     the exporter exited)"
                ),
            })?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            ipc,
            raw,
            exporter: Some(exporter),
        })
    }

    /// Mark the current end of `stream` (of this event's context): waits
    /// made after this, in any process, wait for the work enqueued on
    /// `stream` so far. Refused while `stream` captures: another process
    /// cannot take part in this process's graph.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.check_context("the shared event", &self.ctx)?;
        let raw = self.raw;
        stream.enqueue_raw("recording a shared event", |driver, on| {
            // SAFETY: both handles are live (owned by `self` and `stream`);
            // the protocol made the context current.
            unsafe { (driver.cuEventRecord)(raw, on) }
        })
    }

    /// Make `stream`'s later work wait for the event's latest record (made
    /// in this process or another). Refused while `stream` captures.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        stream.check_driver("the shared event", &self.ctx)?;
        let raw = self.raw;
        stream.enqueue_raw("waiting for a shared event", |driver, on| {
            // SAFETY: both handles are live; flags 0 is CU_EVENT_WAIT_DEFAULT.
            unsafe { (driver.cuStreamWaitEvent)(on, raw, 0) }
        })
    }

    /// Block the calling thread until the latest record has completed. On
    /// the software driver a record whose process exits before it completes
    /// is an error, not a hang.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the handle is live; the context is current.
        let code = unsafe { (self.ctx.driver().cuEventSynchronize)(self.raw) };
        self.ctx.check(code)
    }

    /// [`synchronize`](Self::synchronize), giving up after `deadline`: for
    /// a record made by another process, which may die before its work is
    /// done (CUDA says nothing of what a wait does then). The event is
    /// asked again and again, spinning at first, then sleeping up to a
    /// millisecond between questions. The error names the process and the
    /// deadline; the event stays usable.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, SharedEvent, Stream};
    /// use std::time::Duration;
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let event = SharedEvent::new(&ctx).unwrap();
    /// let (open, gate) = std::sync::mpsc::channel::<()>();
    /// stream.add_callback(move || gate.recv().unwrap()).unwrap();
    /// event.record(&stream).unwrap();
    /// let err = event.synchronize_within(Duration::from_millis(20)).unwrap_err();
    /// assert!(err.to_string().contains("not complete within 20ms"), "{err}");
    /// open.send(()).unwrap();
    /// event.synchronize_within(Duration::from_secs(30)).unwrap();
    /// ```
    pub fn synchronize_within(&self, deadline: std::time::Duration) -> Result<()> {
        let start = std::time::Instant::now();
        let mut rounds = 0u32;
        while !self.query()? {
            if start.elapsed() >= deadline {
                let whose = match self.exporter {
                    Some(pid) => format!("the event opened from process {pid}"),
                    None => "the event".to_string(),
                };
                return Err(crate::Error::Ipc {
                    reason: format!("{whose} was not complete within {deadline:?}"),
                });
            }
            rounds += 1;
            if rounds < 64 {
                std::hint::spin_loop();
            } else if rounds < 128 {
                std::thread::yield_now();
            } else {
                let micros = u64::from((rounds - 128).min(50)) * 20;
                std::thread::sleep(std::time::Duration::from_micros(micros.max(20)));
            }
        }
        Ok(())
    }

    /// Whether the latest record has completed (`true` for a never-recorded
    /// event, as in CUDA).
    pub fn query(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the handle is live; the context is current.
        let code = unsafe { (self.ctx.driver().cuEventQuery)(self.raw) };
        self.ctx.check_ready(code)
    }

    /// The process it was opened from; `None` for the exporter's own.
    pub fn exporter_pid(&self) -> Option<u32> {
        self.exporter
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw handle (for interop). It stays owned by this value.
    pub fn as_raw(&self) -> CUevent {
        self.raw
    }
}

impl Drop for SharedEvent {
    fn drop(&mut self) {
        let raw = self.raw;
        self.ctx.release_in_drop(
            format_args!("shared event {raw:p}"),
            "destroying",
            |driver| {
                // SAFETY: the handle is live and destroyed once.
                unsafe { (driver.cuEventDestroy)(raw) }
            },
        );
    }
}

impl fmt::Debug for SharedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedEvent")
            .field("raw", &self.raw)
            .field("exporter", &self.exporter)
            .finish()
    }
}
