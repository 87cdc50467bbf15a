//! Work that code outside this crate enqueues on one of its streams (an
//! NCCL collective, another library's kernel), given the same ordering and
//! tracking as this crate's own copies and launches.
//!
//! It is the enqueue protocol's external case (`protocol.rs`), immediate
//! ([`Stream::enqueue_external`]) or deferred ([`Stream::prepare_uses`]).
//! The rule that makes it sound is the one every enqueue follows: an
//! operation's step in the stream order is taken when its accesses are
//! checked, and stays *in flight* (left out of every event record, host wait
//! and `auto` wait on the stream) until the driver call that enqueues the
//! work has returned. Work whose enqueue is deferred (NCCL puts a group's
//! collectives on their streams only at `ncclGroupEnd`) keeps its step in
//! flight until then: a [`PreparedWork`] holds it, and
//! [`PreparedWork::enqueued`] lets it land. Were the step visible earlier,
//! an event recorded in between would be taken as covering work that is not
//! on the stream yet, and a stream waiting for that event would be "ordered
//! after" work it runs beside.
//!
//! A step that lands although nothing was enqueued (the work failed, or the
//! guard was dropped) is harmless: a point that covers it is taken after
//! it, when everything the stream really holds up to it is queued, so it
//! orders nothing that did not happen; at worst the step's recorded access
//! makes a later access on another stream a race that was not one.

use crate::enqueue::protocol::{Pending, Use, Work};
use crate::ground::error::{Error, Result};
use crate::objects::memory::{DeviceMemory, DeviceMemoryMut};
use crate::objects::stream::Stream;

/// A buffer that work enqueued outside this crate (an NCCL collective, a
/// library's kernel) uses on a stream, for [`Stream::enqueue_external`]
/// and [`Stream::prepare_uses`]: the same ordering and tracking this
/// crate's own copies and launches get.
///
/// ```
/// use cuda_streams_driver::{BufferUse, Context, DeviceBuffer, DeviceMemory, Error, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let (home, other) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
/// let src = DeviceBuffer::from_slice(&home, &[1u32, 2, 3])?;
/// let mut dst = DeviceBuffer::<u32>::new(&ctx, 3)?;
/// let (src_ptr, dst_ptr) = (src.device_ptr(), dst.device_ptr());
/// let uses = [BufferUse::read(&src), BufferUse::write(&mut dst)];
/// // `other` is ordered after src's allocation, the uses are checked, the
/// // copy is enqueued, then frees and host access wait for it.
/// other.enqueue_external(&uses, || {
///     // SAFETY: both buffers hold 12 bytes, are of `other`'s context
///     // (checked), and stay alive until the copy has run (tracked).
///     let code = unsafe { (ctx.driver().cuMemcpyDtoDAsync)(dst_ptr, src_ptr, 12, other.as_raw()) };
///     assert_eq!(code, cuda_streams_driver::sys::CUresult::CUDA_SUCCESS);
///     Ok::<(), Error>(())
/// })?;
/// drop(uses);
/// assert_eq!(dst.to_vec(&other)?, [1, 2, 3]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct BufferUse<'a>(pub(crate) Use<'a>);

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

/// External work checked and given its step on a stream, whose enqueue is
/// still to come ([`Stream::prepare_uses`]): while this lives the step is in
/// flight (no event recorded on the stream, host wait or `auto` wait covers
/// it) and the stream cannot begin a capture. Once the work is on the
/// stream, [`PreparedWork::enqueued`] lets the step land and tracks the
/// buffers so that frees and host access wait for the work.
///
/// Dropped without `enqueued` (nothing was enqueued), the step lands as it
/// is and no buffer is tracked: only for work that never reached the
/// stream.
///
/// Not `Send`: the step is counted on the thread that took it (a thread
/// with steps in flight does not wait for other threads' steps when it
/// records an event), so it must land on that thread.
///
/// ```
/// use cuda_streams_driver::{BufferUse, Context, DeviceBuffer, DeviceMemory, Stream};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut buf = DeviceBuffer::<u8>::new(&ctx, 16)?;
/// let ptr = buf.device_ptr();
/// let uses = [BufferUse::write(&mut buf)];
/// let work = stream.prepare_uses(&uses)?;
/// // An event recorded now does not cover the work to come.
/// let before = stream.record_event()?;
/// ctx.bind()?;
/// // SAFETY: the buffer holds 16 bytes of `stream`'s context, and stays
/// // alive until the memset has run (tracked by `enqueued`).
/// let code = unsafe { (ctx.driver().cuMemsetD8Async)(ptr, 7, 16, stream.as_raw()) };
/// assert_eq!(code, cuda_streams_driver::sys::CUresult::CUDA_SUCCESS);
/// work.enqueued()?;
/// drop(uses);
/// assert_eq!(buf.to_vec(&stream)?, [7; 16]);
/// # drop(before);
/// # Ok(())
/// # }
/// ```
#[must_use = "the work's step stays in flight until `enqueued()` (or drop, if nothing was enqueued)"]
pub struct PreparedWork<'a> {
    /// The protocol's deferred case (`protocol.rs`): checked, stepped, gated.
    pending: Pending<'a, BufferUses<'a>>,
}

/// The uses of external work, as the protocol takes them.
#[derive(Clone, Copy)]
struct BufferUses<'a>(&'a [BufferUse<'a>]);

impl<'a> IntoIterator for BufferUses<'a> {
    type Item = Use<'a>;
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, BufferUse<'a>>, fn(&BufferUse<'a>) -> Use<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|used| used.0)
    }
}

impl PreparedWork<'_> {
    /// The work is on the stream (the driver or library call that enqueues
    /// it has returned): its step lands, so records taken from now on cover
    /// it, and every buffer is tracked so that frees and host access wait
    /// for it. Every use is tracked even when one fails (that one waits for
    /// the stream first); the first failure is returned.
    pub fn enqueued(self) -> Result<()> {
        self.pending.enqueued()
    }

    /// The stream the work goes on.
    pub fn stream(&self) -> &Stream {
        self.pending.stream()
    }
}

impl std::fmt::Debug for PreparedWork<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedWork")
            .field("stream", &self.stream().id())
            .field("uses", &self.pending.uses().0.len())
            .finish()
    }
}

impl Stream {
    /// Enqueue work made outside this crate that uses `uses`, with
    /// `enqueue` (which makes the library or raw driver calls on
    /// [`Stream::as_raw`]), as this crate's own operations are: the stream
    /// is held out of captures, its context made current, every buffer
    /// checked to belong to it ([`Error::DeviceMismatch`] otherwise) and
    /// the stream ordered after whatever made it valid (a stream-ordered
    /// allocation on another stream); the uses are checked against the
    /// context's [`OrderPolicy`](crate::OrderPolicy) as one operation
    /// ("external work": with `Check` an unordered conflicting use is
    /// refused before `enqueue` runs, with `Auto` the stream is made to
    /// wait). The work's step in the stream order stays in flight until
    /// `enqueue` returns; then the buffers are tracked so that frees and
    /// host access wait for it.
    ///
    /// The buffers are tracked even when `enqueue` fails (it may have
    /// enqueued part of its work: an unneeded wait costs less than a free
    /// that overtakes the work); its error is returned.
    ///
    /// See [`BufferUse`] for an example.
    pub fn enqueue_external<R, E: From<Error>>(
        &self,
        uses: &[BufferUse<'_>],
        enqueue: impl FnOnce() -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        let prepared = self.prepare_uses(uses)?;
        self.context().bind()?;
        let enqueued = enqueue();
        let tracked = prepared.enqueued();
        let value = enqueued?;
        tracked?;
        Ok(value)
    }

    /// [`Stream::enqueue_external`] for work whose enqueue comes later than
    /// one closure can hold (collectives in an NCCL group, enqueued at
    /// `ncclGroupEnd`): everything it does before `enqueue`, now. The
    /// returned guard holds the stream out of captures and the work's step
    /// in flight; call [`PreparedWork::enqueued`] once the work is on the
    /// stream. Several may be held at once, on streams of several devices
    /// (one thread preparing every rank of a group); the context is not
    /// made current (the waits this makes bind for themselves).
    ///
    /// Other work enqueued on the stream while the guard lives is ordered
    /// before this work in the tracker's view too: a record taken after it
    /// covers neither until this work lands. Beginning a capture on the
    /// stream while holding the guard on the same thread waits forever (as
    /// with [`Stream::enqueue_gate`]); keep it only from the check to the
    /// enqueue.
    pub fn prepare_uses<'a>(&'a self, uses: &'a [BufferUse<'a>]) -> Result<PreparedWork<'a>> {
        let pending = self.prepare_enqueue(BufferUses(uses), Work::External)?;
        Ok(PreparedWork { pending })
    }

    /// `Ok` when every buffer of `uses` belongs to this stream's context;
    /// otherwise an error naming both devices ([`Error::DeviceMismatch`]),
    /// or both contexts. Enqueues nothing: for callers that refuse bad
    /// arguments early, long before [`Stream::prepare_uses`] (a collective
    /// added to a group).
    pub fn check_uses(&self, uses: &[BufferUse<'_>]) -> Result<()> {
        for used in uses {
            match used.0 {
                Use::Device(buffer, _) => {
                    self.check_context_id("a buffer", buffer.use_context_id())?
                }
                Use::Extent(lent, ..) => self.check_context_id("a buffer", lent.context())?,
                Use::Peer(..) | Use::Host(..) => {}
            }
        }
        Ok(())
    }
}
