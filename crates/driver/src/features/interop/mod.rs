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
    use std::sync::Arc;
    use sys::CUstream;

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

    /// Make `waiter` wait until `signaller` has done the work enqueued on it
    /// so far: one pooled event recorded on `signaller`, waited on by
    /// `waiter` (both raw handles of `ctx`; null is the legacy default
    /// stream). The event goes back to the pool at once: a wait takes its
    /// state when it is enqueued.
    pub(super) fn order(ctx: &Arc<Context>, waiter: CUstream, signaller: CUstream) -> Result<()> {
        if waiter == signaller {
            return Ok(());
        }
        ctx.bind()?;
        let event = ctx.event_pool().acquire_event(false)?;
        let driver = ctx.driver();
        // SAFETY: the event is ours and alive; both streams are valid handles
        // of `ctx` (the callers hold the objects that own them) and it is
        // current.
        let recorded = unsafe { (driver.cuEventRecord)(event.as_raw(), signaller) };
        // Counted even when the call failed, as the event's own records are:
        // its state is unknown then.
        event.count_raw_record();
        ctx.check(recorded)?;
        // SAFETY: as above; the event was just recorded.
        ctx.check(unsafe { (driver.cuStreamWaitEvent)(waiter, event.as_raw(), 0) })
    }
}
