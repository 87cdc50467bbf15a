//! The protocol every operation on buffers follows (copies, memsets,
//! prefetches, kernel launches), so that no buffer is freed, or handed to the
//! host, while a stream may still use it.

use crate::ground::error::Result;
use crate::objects::memory::DeviceUse;
use crate::objects::memory::sealed::HostUse;
use crate::objects::stream::Stream;
use crate::order::{self, OrderPolicy, Touch};
use sys::{CUresult, CUstream, Driver};

/// A buffer an operation uses, and whether the operation may write it.
#[derive(Clone, Copy)]
pub(crate) enum Use<'a> {
    /// Device memory: the stream is ordered after its allocation first.
    Device(&'a dyn DeviceUse, bool),
    /// Device memory that may belong to another device of the same driver
    /// (a peer copy, whose caller has checked the driver); otherwise as
    /// `Device`.
    Peer(&'a dyn DeviceUse, bool),
    /// The host side of a host buffer.
    Host(&'a dyn HostUse, bool),
    /// Device memory of which the operation touches only the first bytes
    /// (a checked launch: the signature's extent), writing them or not (the
    /// signature's access); tracked for frees and host access as `Device`
    /// with the first flag.
    Extent(&'a dyn DeviceUse, bool, usize, bool),
}

impl Use<'_> {
    /// The bytes it touches, for the stream-order tracker.
    #[inline]
    pub(crate) fn touch(self) -> Touch {
        let (ctx, (address, bytes), write) = match self {
            Use::Device(buffer, write) | Use::Peer(buffer, write) => {
                (buffer.use_context_id(), buffer.use_bytes(), write)
            }
            Use::Host(buffer, write) => (buffer.host_context_id(), buffer.host_bytes(), write),
            Use::Extent(buffer, _, bytes, writes) => {
                let (address, whole) = buffer.use_bytes();
                (buffer.use_context_id(), (address, bytes.min(whole)), writes)
            }
        };
        Touch {
            ctx,
            address,
            bytes,
            write,
        }
    }
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
        // this protocol does not do: captures go through `Capture`. The gate
        // keeps a capture from beginning before the uses are tracked.
        let _gate = self.enqueue_gate("enqueueing work (use the Capture's methods)")?;
        self.context().bind()?;
        for used in uses.clone() {
            match used {
                Use::Device(buffer, _) | Use::Extent(buffer, ..) => {
                    // Checked here, not left to each implementation: memory of
                    // another context is never handed to this stream's driver.
                    self.check_context_id("a buffer", buffer.use_context_id())?;
                    buffer.before_use(self)?;
                }
                Use::Peer(buffer, _) => buffer.before_use(self)?,
                Use::Host(..) => {}
            }
        }
        // After the waits above (which order the stream after allocations),
        // before the driver sees the work: the one branch `off` costs.
        let policy = self.context().order.policy();
        let in_flight = if policy == OrderPolicy::Off {
            order::InFlight::NONE
        } else {
            let what = match work {
                Work::KernelLaunch => "kernel launch",
                Work::Operation => "memset",
                Work::Transfer(_)
                    if uses.clone().into_iter().any(|u| matches!(u, Use::Peer(..))) =>
                {
                    "peer copy"
                }
                Work::Transfer(_) => "copy",
            };
            // Pushed one by one: `collect` into a `SmallVec` costs several
            // times more for the one or two uses of most operations.
            let mut touches = order::Touches::new();
            for used in uses.clone() {
                touches.push(used.touch());
            }
            order::before_enqueue(self, what, &touches, policy)?
        };
        // An observer (the profiler) marks where the work itself starts.
        self.before_work();
        self.context()
            .check(call(self.context().driver(), self.as_raw()))?;
        // Queued: the use events recorded below must cover this step.
        drop(in_flight);
        match work {
            Work::Transfer(bytes) => self.counters.transfer(bytes),
            Work::Operation => self.counters.operation(),
            Work::KernelLaunch => self.counters.kernel_launch(),
        }
        let mut result = Ok(());
        for used in uses {
            let tracked = match used {
                Use::Device(buffer, write)
                | Use::Peer(buffer, write)
                | Use::Extent(buffer, write, ..) => buffer.after_use(self, write),
                Use::Host(buffer, write) => buffer.after_host_use(self, write),
            };
            result = result.and(tracked);
        }
        result
    }
}
