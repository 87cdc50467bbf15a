//! The protocol every operation on buffers follows (copies, memsets,
//! prefetches, kernel launches), so that no buffer is freed, or handed to the
//! host, while a stream may still use it.

use crate::error::Result;
use crate::memory::sealed::HostUse;
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceUse};
use crate::order::{self, OrderPolicy, Touch};
use crate::stream::Stream;
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

/// A buffer that work enqueued outside this crate (an NCCL collective, a
/// library's kernel) uses on a stream, for [`Stream::prepare_uses`] and
/// [`Stream::track_uses`]: the same ordering and tracking this crate's own
/// copies and launches get.
///
/// ```
/// use cuda_streams_driver::{BufferUse, Context, DeviceBuffer, DeviceMemory, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let (home, other) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let src = DeviceBuffer::from_slice(&home, &[1u32, 2, 3])?;
/// let mut dst = DeviceBuffer::<u32>::new(&ctx, 3)?;
/// let (src_ptr, dst_ptr) = (src.device_ptr(), dst.device_ptr());
/// let uses = [BufferUse::read(&src), BufferUse::write(&mut dst)];
/// other.prepare_uses(&uses)?; // `other` now runs after src's allocation
/// // SAFETY: both buffers hold 12 bytes and are tracked below.
/// unsafe {
///     ctx.bind()?;
///     let code = (ctx.driver().cuMemcpyDtoDAsync)(dst_ptr, src_ptr, 12, other.as_raw());
///     assert_eq!(code, cuda_streams_driver::sys::CUresult::CUDA_SUCCESS);
/// }
/// other.track_uses(&uses)?; // frees and host access now wait for the copy
/// drop(uses);
/// assert_eq!(dst.to_vec(&other)?, [1, 2, 3]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct BufferUse<'a>(Use<'a>);

impl<'a> BufferUse<'a> {
    /// `memory` is read by the work.
    pub fn read<M: DeviceMemory>(memory: &'a M) -> Self {
        Self(Use::Device(memory, false))
    }

    /// `memory` is written (and maybe read) by the work; the borrow proves
    /// no host view of it exists meanwhile.
    pub fn write<M: DeviceMemoryMut>(memory: &'a mut M) -> Self {
        Self(Use::Device(&*memory, true))
    }
}

impl Stream {
    /// Before enqueueing work made outside this crate that uses `uses`:
    /// check every buffer belongs to this stream's context (an error naming
    /// both devices otherwise, [`crate::Error::DeviceMismatch`]) and order
    /// this stream after whatever made each valid (a stream-ordered
    /// allocation on another stream).
    ///
    /// The uses are checked against the context's [`OrderPolicy`] here, as
    /// one operation ("external work"): with `Check` an unordered conflicting
    /// use is refused before the work is enqueued; with `Auto` this stream is
    /// made to wait.
    pub fn prepare_uses(&self, uses: &[BufferUse<'_>]) -> Result<()> {
        // Not `bind`: the waits below bind for themselves when they are
        // needed, and one thread preparing the ranks of several devices in
        // turn would otherwise switch the current context at every call.
        crate::context::refuse_inside_callback()?;
        for used in uses {
            if let Use::Device(buffer, _) | Use::Extent(buffer, ..) = used.0 {
                self.check_context_id("a buffer", buffer.use_context_id())?;
                buffer.before_use(self)?;
            }
        }
        let policy = self.context().order.policy();
        if policy != OrderPolicy::Off {
            let touches: order::Touches = uses.iter().map(|u| u.0.touch()).collect();
            // The work itself is enqueued after this returns, outside this
            // crate: the step is not held in flight until then (see
            // docs/ordering.md, "What is not checked").
            drop(order::before_enqueue(
                self,
                "external work",
                &touches,
                policy,
            )?);
        }
        Ok(())
    }

    /// After enqueueing that work: remember each use so that frees and host
    /// access wait for it. Every use is tracked even when one fails (that
    /// one waits for the stream first); the first failure is returned.
    pub fn track_uses(&self, uses: &[BufferUse<'_>]) -> Result<()> {
        let mut result = Ok(());
        for used in uses {
            let tracked = match used.0 {
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
