//! The protocol's raw case: a driver call on a stream that uses no buffer
//! of this crate's, so nothing is checked, stepped or tracked, but which
//! still puts work on the stream: a stream-ordered allocation or free, a
//! copy between raw addresses, an event record or wait shared with another
//! library. It still passes the capture gate (the driver would make it part
//! of a graph being captured), binds the context, and ends the stream's
//! latest mark, as every enqueue does.

use crate::enqueue::protocol::{Use, Work};
use crate::ground::error::Result;
use crate::objects::stream::Stream;
use sys::{CUdeviceptr, CUresult, CUstream, Driver};

impl Stream {
    /// Enqueue `call` (given the driver table and this stream's handle)
    /// through the protocol as raw work: refused with
    /// [`Error::StreamCapturing`](crate::Error::StreamCapturing), naming
    /// `operation`, while the stream captures. A failed call is returned as
    /// the crate's error. Safe: `call` is what may do harm, and making one
    /// is `unsafe` for its writer.
    #[inline]
    pub(crate) fn enqueue_raw(
        &self,
        operation: &'static str,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
    ) -> Result<()> {
        self.prepare_enqueue(std::iter::empty::<Use<'_>>(), Work::Raw(operation))?
            .call(call)
    }

    /// [`Stream::enqueue_raw`], with `first` run once the stream is held
    /// out of captures and before `call`: for raw work that must be ordered
    /// after other work first (a free after its buffer's uses, which the
    /// stream waits for), so that no capture can begin between the two and
    /// take the call into its graph. `first` returning `false` enqueues
    /// nothing and returns `Ok(false)`.
    pub(crate) fn enqueue_raw_after(
        &self,
        operation: &'static str,
        first: impl FnOnce() -> bool,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
    ) -> Result<bool> {
        let pending = self.prepare_enqueue(std::iter::empty::<Use<'_>>(), Work::Raw(operation))?;
        if !first() {
            return Ok(false);
        }
        pending.call(call).map(|()| true)
    }

    /// `bytes` of device memory from the device's default pool, in stream
    /// order on this stream (`cuMemAllocAsync`), as raw work named
    /// `operation` (refused while the stream captures: the allocation would
    /// become a node of the graph).
    pub(crate) fn allocate_raw(
        &self,
        bytes: usize,
        operation: &'static str,
    ) -> Result<CUdeviceptr> {
        let mut ptr: CUdeviceptr = 0;
        self.enqueue_raw(operation, |driver, stream| {
            // SAFETY: writes one device pointer through a valid pointer; the
            // stream is live and of the current context (bound by the
            // protocol).
            unsafe { (driver.cuMemAllocAsync)(&mut ptr, bytes, stream) }
        })?;
        Ok(ptr)
    }
}
