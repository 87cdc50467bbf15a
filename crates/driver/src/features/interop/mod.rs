//! Working with other Rust CUDA libraries in the same process.
//!
//! Both libraries talk to the same `libcuda.so.1` (each loads it at run
//! time), so their handles mean the same thing to the driver: what this
//! module adds is the ownership and ordering rules that make sharing them
//! safe. Interop needs NVIDIA's driver: the software driver is ours alone,
//! and every conversion from a [`Context`](crate::Context) running on it is
//! refused with [`Error::Interop`](crate::Error::Interop).

#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub mod cudarc;
#[cfg(feature = "cust")]
#[cfg_attr(docsrs, doc(cfg(feature = "cust")))]
pub mod cust;

// What both interop modules share: the refusal of the software driver, the
// error, the per-thread stream's handle and stream-to-stream ordering on raw
// handles (the other library's streams are not ours, so `Stream::wait_stream`
// cannot take them).
#[cfg(any(feature = "cudarc", feature = "cust"))]
mod shared {
    use crate::ground::error::{Error, Result};
    use crate::objects::context::Context;
    use crate::objects::event::Event;
    use crate::objects::stream::Stream;
    use sys::{CUresult, CUstream, Driver};

    /// The handle both libraries use for the per-thread default stream.
    pub(super) const PER_THREAD_STREAM: usize = 0x2;

    pub(super) fn interop(reason: String) -> Error {
        Error::Interop { reason }
    }

    /// `Ok` when `ctx` runs on NVIDIA's driver, which `library` uses.
    pub(super) fn require_gpu(ctx: &Context, library: &str, what: &str) -> Result<()> {
        if ctx.is_gpu() {
            return Ok(());
        }
        Err(interop(format!(
            "{what}: {library} uses NVIDIA's driver, and context {} runs on the software driver \
             (CUDA_STREAMS_DRIVER=soft, or no GPU answered)",
            ctx.id()
        )))
    }

    /// Make our `stream` wait until the other library's `foreign` stream
    /// has done the work enqueued on it so far (null is the legacy default
    /// stream): one pooled event recorded on `foreign`, waited on by
    /// `stream`, enqueued through the protocol as raw work on `stream`
    /// named `operation` (refused while `stream` captures: the foreign
    /// stream is outside the capture).
    pub(super) fn wait_for_foreign(
        stream: &Stream,
        foreign: CUstream,
        operation: &'static str,
    ) -> Result<()> {
        if stream.as_raw() == foreign {
            return Ok(());
        }
        let event = stream.context().event_pool().acquire_event(false)?;
        stream.enqueue_raw(operation, |driver, ours| {
            record_then_wait(driver, &event, foreign, ours)
        })
    }

    /// Make the other library's `foreign` stream wait until our `stream`
    /// has done the work enqueued on it so far: one pooled event recorded on
    /// `stream` through the protocol (raw work named `operation`, refused
    /// while `stream` captures: a record there would pull `foreign` into
    /// the capture), waited on by `foreign`.
    pub(super) fn foreign_waits_for(
        foreign: CUstream,
        stream: &Stream,
        operation: &'static str,
    ) -> Result<()> {
        if stream.as_raw() == foreign {
            return Ok(());
        }
        let event = stream.context().event_pool().acquire_event(false)?;
        stream.enqueue_raw(operation, |driver, ours| {
            record_then_wait(driver, &event, ours, foreign)
        })
    }

    /// Record `event` on `signaller` and make `waiter` wait for it (both
    /// raw handles of the current context); the first failure's code. The
    /// event may go back to its pool right after: a wait takes the event's
    /// state when it is enqueued.
    fn record_then_wait(
        driver: &Driver,
        event: &Event,
        signaller: CUstream,
        waiter: CUstream,
    ) -> CUresult {
        // SAFETY: the event is ours and alive; both streams are valid
        // handles of the current context (the callers hold the objects that
        // own them).
        let recorded = unsafe { (driver.cuEventRecord)(event.as_raw(), signaller) };
        // Counted even when the call failed, as the event's own records
        // are: its state is unknown then.
        event.count_raw_record();
        if recorded != CUresult::CUDA_SUCCESS {
            return recorded;
        }
        // SAFETY: as above; the event was just recorded.
        unsafe { (driver.cuStreamWaitEvent)(waiter, event.as_raw(), 0) }
    }
}
