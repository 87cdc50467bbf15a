//! The protocol every operation on buffers follows (copies, memsets,
//! prefetches, kernel launches), so that no buffer is freed, or handed to the
//! host, while a stream may still use it.

use crate::error::Result;
use crate::memory::DeviceUse;
use crate::memory::sealed::HostUse;
use crate::stream::Stream;
use sys::{CUresult, CUstream, Driver};

/// A buffer an operation uses, and whether the operation may write it.
#[derive(Clone, Copy)]
pub(crate) enum Use<'a> {
    /// Device memory: the stream is ordered after its allocation first.
    Device(&'a dyn DeviceUse, bool),
    /// The host side of a host buffer.
    Host(&'a dyn HostUse, bool),
}

/// What an operation adds to the stream's counters.
#[derive(Clone, Copy)]
pub(crate) enum Work {
    /// A copy or prefetch of this many bytes.
    Transfer(usize),
    /// A memset.
    Operation,
    /// A kernel launch.
    KernelLaunch,
}

impl Stream {
    /// Bind the context, order this stream after the allocation of each device
    /// buffer in `uses`, tell the stream's [`crate::WorkObserver`]s, enqueue with `call` (given the driver table and this
    /// stream's handle) and count it as `work`; then track every use so that
    /// frees and host access wait for the operation.
    ///
    /// Nothing is tracked when enqueueing fails. Every use is tracked even when
    /// an earlier one fails (a failed one has waited for the stream), and the
    /// first failure is returned.
    pub(crate) fn enqueue_tracked<'a>(
        &self,
        uses: impl IntoIterator<Item = Use<'a>> + Clone,
        work: Work,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
    ) -> Result<()> {
        // Captured work must keep its buffers alive for every replay, which
        // this protocol does not do: captures go through `Capture`.
        self.refuse_if_capturing("enqueueing work (use the Capture's methods)")?;
        self.context().bind()?;
        for used in uses.clone() {
            if let Use::Device(buffer, _) = used {
                // Checked here, not left to each implementation: memory of
                // another context is never handed to this stream's driver.
                self.check_context_id("a buffer", buffer.use_context_id())?;
                buffer.before_use(self)?;
            }
        }
        // After the waits above: an observer (the profiler) marks where the
        // work itself starts.
        self.before_work();
        self.context()
            .check(call(self.context().driver(), self.as_raw()))?;
        match work {
            Work::Transfer(bytes) => self.counters.transfer(bytes),
            Work::Operation => self.counters.operation(),
            Work::KernelLaunch => self.counters.kernel_launch(),
        }
        let mut result = Ok(());
        for used in uses {
            let tracked = match used {
                Use::Device(buffer, write) => buffer.after_use(self, write),
                Use::Host(buffer, write) => buffer.after_host_use(self, write),
            };
            result = result.and(tracked);
        }
        result
    }
}
