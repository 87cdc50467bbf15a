//! Events: a marker in a stream, its completion and its host timestamp.
//!
//! Each record bumps the event's generation and points it at (stream, ticket).
//! Query, synchronize and wait look at the record that is latest *when they are
//! called*; the worker stamps the time only if the marker it passes still
//! belongs to the latest generation, so re-recording moves the event's point.
//!
//! An event belongs to the device of the context it was created in and is
//! recorded only on that device's streams; any device's stream may wait on
//! it (`cuStreamWaitEvent` across devices), as on a GPU.

use crate::context::require;
use crate::errors::{code, fail, write_out};
use crate::graph::{Capture, CapturedAt};
use crate::handles::{Registry, lock};
use crate::ipc_event::SharedEvent;
use crate::ops::Template;
use crate::stream::{Stream, resolve};
use std::ffi::c_uint;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use sys::{CUevent, CUevent_flags, CUresult, CUstream};

pub(crate) static EVENTS: Registry<Event> = Registry::new();

pub(crate) struct Event {
    timing: bool,
    device: i32,
    inner: Mutex<Inner>,
    /// An interprocess event's state, shared with other processes
    /// (`ipc_event`): its records and waits go through it instead.
    shared: Option<Arc<SharedEvent>>,
}

/// Register an event opened from another process's handle.
pub(crate) fn create_shared(shared: SharedEvent) -> CUevent {
    let event = Arc::new(Event {
        timing: false,
        device: shared.device(),
        inner: Mutex::new(Inner::default()),
        shared: Some(Arc::new(shared)),
    });
    EVENTS.insert(event) as CUevent
}

#[derive(Default)]
struct Inner {
    generation: u64,
    target: Option<(Arc<Stream>, u64)>,
    /// When the worker passed the marker of generation `.0`.
    stamp: Option<(u64, Instant)>,
    /// Set when the latest record was made on a capturing stream: the event
    /// is then an edge of that capture, not a point in any stream.
    captured: Option<CapturedAt>,
}

impl Event {
    /// The interprocess state, for an interprocess event.
    pub(crate) fn shared(&self) -> Option<&Arc<SharedEvent>> {
        self.shared.as_ref()
    }

    /// An event of the driver's own on device `device`, in no registry.
    pub(crate) fn internal(device: i32) -> Arc<Event> {
        Arc::new(Event {
            timing: false,
            device,
            inner: Mutex::new(Inner::default()),
            shared: None,
        })
    }

    /// Point the event at `ticket` on `stream`; returns the new generation.
    pub(crate) fn begin_record(&self, stream: Arc<Stream>, ticket: u64) -> u64 {
        let mut inner = lock(&self.inner);
        inner.generation += 1;
        inner.target = Some((stream, ticket));
        inner.captured = None;
        inner.generation
    }

    /// Record the event on a capturing stream whose frontier is `frontier`.
    pub(crate) fn record_captured(&self, capture: Arc<Capture>, frontier: Vec<usize>) {
        let mut inner = lock(&self.inner);
        inner.generation += 1;
        inner.captured = Some((capture, frontier));
    }

    /// The capture of the latest record, when it was made during one.
    pub(crate) fn captured(&self) -> Option<CapturedAt> {
        lock(&self.inner).captured.clone()
    }

    /// Fail `call`, which a GPU forbids on an event recorded in a capture
    /// (it invalidates that capture while the capture lasts).
    fn refuse_if_captured(&self, call: &str) -> Result<(), CUresult> {
        match self.captured() {
            None => Ok(()),
            Some((capture, _)) => {
                let why = format!("{call} on an event last recorded in a stream capture");
                if !capture.has_ended() {
                    capture.invalidate(why.clone());
                }
                Err(fail(CUresult::CUDA_ERROR_CAPTURED_EVENT, why))
            }
        }
    }

    /// The worker passed the marker of `generation`.
    pub(crate) fn mark(&self, generation: u64) {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        if inner.generation == generation {
            inner.stamp = Some((generation, now));
        }
    }

    /// The latest record's point, `None` when never recorded.
    pub(crate) fn target(&self) -> Option<(Arc<Stream>, u64)> {
        lock(&self.inner).target.clone()
    }

    fn query(&self) -> Result<(), CUresult> {
        if let Some(shared) = &self.shared {
            return match shared.reached(shared.latest()) {
                Ok(true) => Ok(()),
                Ok(false) => Err(CUresult::CUDA_ERROR_NOT_READY),
                Err(why) => Err(fail(CUresult::CUDA_ERROR_LAUNCH_FAILED, why)),
            };
        }
        match self.target() {
            None => Ok(()),
            Some((stream, ticket)) => {
                stream.state().fault_status()?;
                if stream.passed(ticket) {
                    Ok(())
                } else {
                    Err(CUresult::CUDA_ERROR_NOT_READY)
                }
            }
        }
    }

    /// The timestamp of the latest record: INVALID_HANDLE when never recorded,
    /// NOT_READY until the worker passed it.
    fn stamp(&self) -> Result<Instant, CUresult> {
        let (stream, ticket, generation) = {
            let inner = lock(&self.inner);
            let (stream, ticket) = inner
                .target
                .clone()
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            (stream, ticket, inner.generation)
        };
        if !stream.passed(ticket) {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        match lock(&self.inner).stamp {
            Some((stamped, at)) if stamped == generation => Ok(at),
            // Re-recorded since we looked: the new point is not passed yet.
            _ => Err(CUresult::CUDA_ERROR_NOT_READY),
        }
    }
}

pub(crate) unsafe extern "C" fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) -> CUresult {
    code((|| {
        let device = require()?;
        crate::sticky_errors::check_context(device)?;
        let known = CUevent_flags::CU_EVENT_BLOCKING_SYNC.0
            | CUevent_flags::CU_EVENT_DISABLE_TIMING.0
            | CUevent_flags::CU_EVENT_INTERPROCESS.0;
        let no_timing = Flags & CUevent_flags::CU_EVENT_DISABLE_TIMING.0 != 0;
        let interprocess = Flags & CUevent_flags::CU_EVENT_INTERPROCESS.0 != 0;
        // CUDA: interprocess events must also disable timing.
        if Flags & !known != 0 || (interprocess && !no_timing) || phEvent.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let shared = if interprocess {
            Some(Arc::new(SharedEvent::create(device)?))
        } else {
            None
        };
        let event = Arc::new(Event {
            timing: !no_timing,
            device,
            inner: Mutex::new(Inner::default()),
            shared,
        });
        let handle = EVENTS.insert(event);
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phEvent, handle as CUevent) }
    })())
}

pub(crate) unsafe extern "C" fn cuEventDestroy(hEvent: CUevent) -> CUresult {
    // Pending markers keep the event alive until the worker passes them.
    code(EVENTS.remove(hEvent as usize).map(drop))
}

pub(crate) unsafe extern "C" fn cuEventRecord(hEvent: CUevent, hStream: CUstream) -> CUresult {
    code((|| {
        require()?;
        let event = EVENTS.get(hEvent as usize)?;
        let stream = resolve(hStream)?;
        if stream.device != event.device {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "cuEventRecord: the event belongs to device {} but the stream to device {}",
                    event.device, stream.device
                ),
            ));
        }
        if event.shared.is_some() {
            // Another process cannot join this process's capture.
            stream.check_usable()?;
        }
        stream.submit(&[Template::Record(event)])
    })())
}

pub(crate) unsafe extern "C" fn cuEventQuery(hEvent: CUevent) -> CUresult {
    code(EVENTS.get(hEvent as usize).and_then(|event| {
        event.refuse_if_captured("cuEventQuery")?;
        event.query()
    }))
}

pub(crate) unsafe extern "C" fn cuEventSynchronize(hEvent: CUevent) -> CUresult {
    code((|| {
        let event = EVENTS.get(hEvent as usize)?;
        event.refuse_if_captured("cuEventSynchronize")?;
        if let Some(shared) = &event.shared {
            return shared
                .wait(shared.latest())
                .map_err(|why| fail(CUresult::CUDA_ERROR_LAUNCH_FAILED, why));
        }
        if let Some((stream, ticket)) = event.target() {
            stream.wait_for(ticket);
            stream.state().fault_status()?;
        }
        crate::memory::trim_pool_at_sync();
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuEventElapsedTime(
    pMilliseconds: *mut f32,
    hStart: CUevent,
    hEnd: CUevent,
) -> CUresult {
    code((|| {
        let start = EVENTS.get(hStart as usize)?;
        let end = EVENTS.get(hEnd as usize)?;
        if pMilliseconds.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        start.refuse_if_captured("cuEventElapsedTime")?;
        end.refuse_if_captured("cuEventElapsedTime")?;
        if !start.timing || !end.timing {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        // Never recorded -> INVALID_HANDLE before not completed -> NOT_READY,
        // for either event, as cuda.h orders them.
        if start.target().is_none() || end.target().is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let (from, to) = (start.stamp()?, end.stamp()?);
        let ms = if to >= from {
            to.duration_since(from).as_secs_f64() * 1e3
        } else {
            -(from.duration_since(to).as_secs_f64() * 1e3)
        };
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(pMilliseconds, ms as f32) }
    })())
}
