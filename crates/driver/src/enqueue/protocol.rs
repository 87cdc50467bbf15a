//! The protocol every piece of work follows onto a stream, written once:
//!
//! 1. the capture gate (`gate.rs`): the stream is held out of captures from
//!    here until the uses are tracked, so eager work never lands in a graph
//!    that keeps none of its resources;
//! 2. the context bind (this crate's own work; external work is bound right
//!    before its enqueue, and deferred work by its caller);
//! 3. the buffers' checks (each of the stream's context) and their
//!    `before_use` (the stream waits for a stream-ordered allocation);
//! 4. the order check and step (`order/`): the work's accesses checked
//!    against the context's policy as one operation, its step kept in
//!    flight until the work is on the stream;
//! 5. the observers (`observers.rs`), right before the driver call;
//! 6. the call;
//! 7. the step lands, the counters count, and every use is tracked so that
//!    frees and host access wait for the work; the gate goes, and with it
//!    the stream's latest mark (`latest_mark.rs`) stops covering the end.
//!
//! [`Stream::prepare_enqueue`] does steps 1 to 4 and returns a [`Pending`];
//! [`Pending::call`] does 5 to 7 around a driver call, and
//! [`Pending::enqueued`] does 7 for work that another library put on the
//! stream (now, or later: a deferred enqueue, such as collectives enqueued
//! at `ncclGroupEnd`, holds the `Pending` until then). Work that its
//! caller must follow up before the stream may begin a capture (a blocking
//! copy's host wait, a copy future's completion) is one call too:
//! [`Stream::enqueue_then`] runs the follow-up after step 7, before the
//! gate goes. An event's record or a stream's wait (a mark: no buffer, no
//! step, no observer) takes the steps that apply to it in
//! [`Stream::enqueue_mark`]. What differs between kinds of work is said
//! once, by [`Work`].

use crate::enqueue::gate::EnqueueGate;
use crate::enqueue::order::{self, InFlight, OrderPolicy, Touch};
use crate::ground::callback_thread::refuse_inside_callback;
use crate::ground::error::Result;
use crate::objects::memory::sealed::HostUse;
use crate::objects::memory::{DeviceMemory, DeviceUse};
use crate::objects::stream::Stream;
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
    /// Device memory lent to a checked launch, of which it touches only the
    /// first bytes (the signature's extent), writing them or not (the
    /// signature's access); tracked for frees and host access as `Device`
    /// with the lending's flag.
    Extent(&'a Lent<'a>, usize, bool),
}

/// Device memory lent to a launch, with what each use of it reads, read
/// once where the memory's type is known (a [`KernelArg`](crate::KernelArg)
/// is made) instead of through the vtable at every step of the protocol.
#[derive(Clone, Copy)]
pub(crate) struct Lent<'a> {
    pub(crate) memory: &'a dyn DeviceUse,
    /// Lent `&mut`: the launch may write it.
    pub(crate) writable: bool,
    /// `DeviceMemory::context_id`.
    context: u64,
    /// `DeviceMemory::home_stream_id`, or 0 for none (stream ids start at 1):
    /// on that stream both hooks do nothing and are not called.
    home: u64,
}

impl<'a> Lent<'a> {
    /// `memory`, lent for writing when `writable`.
    #[inline]
    pub(crate) fn of<M: DeviceMemory>(memory: &'a M, writable: bool) -> Self {
        Self {
            memory,
            writable,
            context: memory.context_id(),
            home: memory.home_stream_id().unwrap_or(0),
        }
    }

    /// Memory known only as a trait object (a graph's own memory).
    pub(crate) fn of_use(memory: &'a dyn DeviceUse, writable: bool) -> Self {
        Self {
            memory,
            writable,
            context: memory.use_context_id(),
            home: memory.use_home_stream_id().unwrap_or(0),
        }
    }

    /// The [`Context::id`](crate::Context::id) of its context.
    pub(crate) fn context(&self) -> u64 {
        self.context
    }

    /// Its `before_use` hook for a use on `stream`, skipped on its home
    /// stream (where the hooks do nothing).
    #[inline]
    fn before_use(&self, stream: &Stream) -> Result<()> {
        match self.home == stream.id() {
            true => Ok(()),
            false => self.memory.before_use(stream),
        }
    }

    /// Its `after_use` hook for a use on `stream`, skipped likewise.
    #[inline]
    fn after_use(&self, stream: &Stream) -> Result<()> {
        match self.home == stream.id() {
            true => Ok(()),
            false => self.memory.after_use(stream, self.writable),
        }
    }
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
            Use::Extent(lent, bytes, writes) => {
                let (address, whole) = lent.memory.use_bytes();
                (lent.context, (address, bytes.min(whole)), writes)
            }
        };
        Touch {
            ctx,
            address,
            bytes,
            write,
        }
    }

    /// Remember the use on `stream`, just enqueued, so that frees and host
    /// access wait for it.
    #[inline]
    fn track(self, stream: &Stream) -> Result<()> {
        match self {
            Use::Device(buffer, write) | Use::Peer(buffer, write) => {
                buffer.after_use(stream, write)
            }
            Use::Extent(lent, ..) => lent.after_use(stream),
            Use::Host(buffer, write) => buffer.after_host_use(stream, write),
        }
    }
}

/// What a piece of work is to the protocol: everything the kinds of work
/// do differently is answered here.
#[derive(Clone, Copy)]
pub(crate) enum Work {
    /// A copy or prefetch of this many bytes.
    Transfer(usize),
    /// A memset.
    Operation,
    /// A kernel launch.
    KernelLaunch,
    /// A host callback: no buffers, so no step of its own.
    Callback,
    /// A replay of an executable graph of this many nodes: one step with
    /// the graph's whole access set. Its host buffers are checked to be of
    /// the stream's context too.
    GraphLaunch(usize),
    /// A graph's upload: it runs none of the graph's work, so no step, no
    /// count and nothing tracked; the stream is still ordered after the
    /// buffers' allocations.
    GraphUpload,
    /// Work made outside this crate (an NCCL collective, another library's
    /// kernel): not counted, no observer told. Its context is made current
    /// right before it is enqueued (or by whoever enqueues it later), not
    /// here: several may be prepared at once, on several devices.
    External,
    /// A raw call that uses no buffer of this crate's (`raw.rs`): a
    /// stream-ordered allocation or free, a copy between raw addresses, an
    /// event record or wait shared with another library. No step, not
    /// counted, no observer told; refused as the operation named while the
    /// stream captures, where the driver would make it part of the graph.
    Raw(&'static str),
    /// An event's record on the stream (`event_marks.rs`): it passes the
    /// gate without holding it (in a capture it is an edge of the graph),
    /// takes no step (the order tracker learns the record itself), is not
    /// counted or observed, and leaves the stream's latest mark standing.
    Record,
    /// The stream's wait for an event (`event_marks.rs`): as a record,
    /// except that it counts as an operation and ends the latest mark.
    Wait,
}

impl Work {
    /// Named in the refusal while the stream captures.
    fn refused_as(self) -> &'static str {
        match self {
            Work::Callback => "Stream::add_callback",
            Work::GraphLaunch(_) => "GraphExec::launch",
            Work::GraphUpload => "GraphExec::upload",
            Work::External => "external work",
            Work::Raw(operation) => operation,
            // Never refused (`Stream::enqueue_mark`); named for completeness.
            Work::Record => "Event::record",
            Work::Wait => "Stream::wait_event",
            Work::Transfer(_) | Work::Operation | Work::KernelLaunch => {
                "enqueueing work (use the Capture's methods)"
            }
        }
    }

    /// The operation the order tracker names in a race; `None`: no step.
    fn step<'a>(self, mut uses: impl Iterator<Item = Use<'a>>) -> Option<&'static str> {
        let label = self.step_label()?;
        let peer = matches!(self, Work::Transfer(_)) && uses.any(|u| matches!(u, Use::Peer(..)));
        Some(if peer { "peer copy" } else { label })
    }

    /// Whether [`Work::step`] may give it a step (`false`: it never does).
    #[inline]
    fn takes_steps(self) -> bool {
        self.step_label().is_some()
    }

    /// Its step's name, before a copy between devices is told apart; `None`
    /// for the kinds that take no step (one list, for both of the above).
    #[inline]
    fn step_label(self) -> Option<&'static str> {
        Some(match self {
            Work::KernelLaunch => "kernel launch",
            Work::Operation => "memset",
            Work::Transfer(_) => "copy",
            Work::GraphLaunch(_) => "graph launch",
            Work::External => "external work",
            Work::Callback | Work::GraphUpload | Work::Raw(_) | Work::Record | Work::Wait => {
                return None;
            }
        })
    }

    /// Whether it is this crate's own work, bound before its buffers are
    /// checked (external work is bound by whoever enqueues it).
    fn binds(self) -> bool {
        !matches!(self, Work::External)
    }

    /// Whether the stream's observers are told before its driver call.
    fn observed(self) -> bool {
        !matches!(
            self,
            Work::External | Work::GraphUpload | Work::Raw(_) | Work::Record | Work::Wait
        )
    }

    /// Whether it is a mark ([`Stream::enqueue_mark`]): an event's record
    /// or wait, which passes the capture gate without holding it.
    fn is_mark(self) -> bool {
        matches!(self, Work::Record | Work::Wait)
    }

    /// Whether its uses are tracked once it is on the stream.
    fn tracks(self) -> bool {
        !matches!(self, Work::GraphUpload)
    }

    /// Count it in the stream's metrics, once it is on the stream.
    #[inline]
    fn count(self, stream: &Stream) {
        let counters = &stream.counters;
        match self {
            Work::Transfer(bytes) => counters.transfer(bytes),
            Work::Operation => counters.operation(),
            Work::KernelLaunch => counters.kernel_launch(),
            Work::Callback => counters.callback(),
            Work::GraphLaunch(nodes) => counters.graph_launch(nodes),
            Work::Wait => counters.operation(),
            Work::GraphUpload | Work::External | Work::Raw(_) | Work::Record => {}
        }
    }
}

/// Work checked and given its step on a stream, whose enqueue is to come:
/// while this lives the stream cannot begin a capture and the step is in
/// flight (no event recorded on the stream, host wait or `auto` wait covers
/// it). [`Pending::call`] or [`Pending::enqueued`] finishes it; dropped
/// without either (nothing was enqueued), the step lands as it is and no
/// buffer is tracked.
pub(crate) struct Pending<'s, U> {
    stream: &'s Stream,
    uses: U,
    work: Work,
    // Declared before the gate: the step lands before the stream may begin
    // a capture.
    in_flight: InFlight<'s>,
    // Held from the check through the tracking; also what makes this
    // `!Send` (the step is counted on the thread that took it).
    _gate: EnqueueGate<'s>,
}

impl Stream {
    /// Steps 1 to 4 of the protocol (see the module's docs) for `work` using
    /// `uses`: the gate, the bind, the buffers' checks and `before_use`,
    /// the order check and step.
    ///
    /// Every buffer's context is checked before any `before_use` enqueues a
    /// wait, so refused work leaves nothing on the stream.
    #[inline]
    pub(crate) fn prepare_enqueue<'s, 'u, U>(
        &'s self,
        uses: U,
        work: Work,
    ) -> Result<Pending<'s, U>>
    where
        U: IntoIterator<Item = Use<'u>> + Clone,
    {
        if !work.binds() {
            // Nothing below binds first, and a callback may not call the
            // driver at all.
            refuse_inside_callback()?;
        }
        let gate = self.enqueue_gate(work.refused_as())?;
        if work.binds() {
            self.context().bind()?;
        }
        let check_hosts = matches!(work, Work::GraphLaunch(_) | Work::GraphUpload);
        for used in uses.clone() {
            match used {
                // Checked here, not left to each implementation: memory of
                // another context is never handed to this stream's driver.
                Use::Device(buffer, _) => {
                    self.check_context_id("a buffer", buffer.use_context_id())?
                }
                Use::Extent(lent, ..) => self.check_context_id("a buffer", lent.context)?,
                Use::Host(buffer, _) if check_hosts => {
                    self.check_context_id("a host buffer", buffer.host_context_id())?
                }
                Use::Peer(..) | Use::Host(..) => {}
            }
        }
        for used in uses.clone() {
            match used {
                Use::Device(buffer, _) | Use::Peer(buffer, _) => buffer.before_use(self)?,
                Use::Extent(lent, ..) => lent.before_use(self)?,
                Use::Host(..) => {}
            }
        }
        // After the waits above (which order the stream after allocations),
        // before the driver sees the work: the one branch `off` costs. Work
        // that never takes a step (known where the kind is) reads no policy.
        let policy = match work.takes_steps() {
            true => self.context().order.policy(),
            false => OrderPolicy::Off,
        };
        let step = match policy {
            OrderPolicy::Off => None,
            _ => work.step(uses.clone().into_iter()),
        };
        let in_flight = match step {
            Some(what) => {
                // Pushed one by one: `collect` into a `SmallVec` costs several
                // times more for the one or two uses of most operations.
                let mut touches = order::Touches::new();
                for used in uses.clone() {
                    touches.push(used.touch());
                }
                order::before_enqueue(self, what, &touches, policy)?
            }
            None => InFlight::NONE,
        };
        Ok(Pending {
            stream: self,
            uses,
            work,
            in_flight,
            _gate: gate,
        })
    }

    /// The whole protocol for one of this crate's operations: prepared
    /// ([`Stream::prepare_enqueue`]), then enqueued with `call` (given the
    /// driver table and this stream's handle) ([`Pending::call`]).
    ///
    /// Nothing is tracked when enqueueing fails. Every use is tracked even
    /// when an earlier one fails (a failed one has waited for the stream),
    /// and the first failure is returned.
    #[inline]
    pub(crate) fn enqueue_tracked<'u>(
        &self,
        uses: impl IntoIterator<Item = Use<'u>> + Clone,
        work: Work,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
    ) -> Result<()> {
        self.prepare_enqueue(uses, work)?.call(call)
    }

    /// The protocol for a mark ([`Work::Record`], [`Work::Wait`]), with
    /// `call` given the driver table and this stream's handle, then `then`
    /// once the mark is on the stream. Of the protocol's steps, a mark takes
    /// those that apply to it: the gate passed without holding it (a capture
    /// takes records and waits as edges of its graph), the bind, the call,
    /// the count and the end of the latest mark (a wait's, even when the
    /// call fails). It uses no buffer, takes no step of the order tracker's
    /// (the tracker learns records and waits itself, around this call) and
    /// tells no observer, so those steps are left out rather than run
    /// empty: every fork and every cross-stream edge records and waits.
    #[inline]
    pub(crate) fn enqueue_mark<R>(
        &self,
        work: Work,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        debug_assert!(work.is_mark(), "not a mark: {}", work.refused_as());
        let _passed = self.pass_gate_for_mark(matches!(work, Work::Wait));
        let ctx = self.context();
        ctx.bind()?;
        ctx.check(call(ctx.driver(), self.as_raw()))?;
        work.count(self);
        then()
    }

    /// [`Stream::enqueue_tracked`], then `then` before the gate goes: for
    /// work whose caller must follow it with more before the stream may
    /// begin a capture (a blocking copy's host wait for the copy, a copy
    /// future's completion watching this very copy). A capture beginning in
    /// between would refuse the follow-up and leave the work touching host
    /// memory nobody waits for. `then` runs only once the work is on the
    /// stream and every use is tracked; its result is returned.
    #[inline]
    pub(crate) fn enqueue_then<'u, R>(
        &self,
        uses: impl IntoIterator<Item = Use<'u>> + Clone,
        work: Work,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        self.prepare_enqueue(uses, work)?.call_then(call, then)
    }
}

impl<'s, 'u, U> Pending<'s, U>
where
    U: IntoIterator<Item = Use<'u>> + Clone,
{
    /// Steps 5 to 7: tell the observers, enqueue with `call`, then
    /// [`Pending::enqueued`]. When the call fails, the step lands, nothing
    /// is counted or tracked, and its error is returned.
    #[inline]
    pub(crate) fn call(self, call: impl FnOnce(&Driver, CUstream) -> CUresult) -> Result<()> {
        self.call_then(call, || Ok(()))
    }

    /// [`Pending::call`], then `then` while the gate is still held, once
    /// the work is on the stream and tracked ([`Stream::enqueue_then`]).
    #[inline]
    pub(crate) fn call_then<R>(
        self,
        call: impl FnOnce(&Driver, CUstream) -> CUresult,
        then: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let Pending {
            stream,
            uses,
            work,
            in_flight,
            _gate: gate,
        } = self;
        if work.observed() {
            // An observer (the profiler) marks where the work itself starts.
            stream.before_work();
        }
        let ctx = stream.context();
        if let Err(failed) = ctx.check(call(ctx.driver(), stream.as_raw())) {
            // In the struct's order: the step lands before the gate goes.
            drop(in_flight);
            drop(gate);
            return Err(failed);
        }
        land_count_track(stream, uses, work, in_flight, gate, then)
    }

    /// Step 7, for work now on the stream: the step lands (records taken
    /// from now on cover it), the work is counted, and every use is
    /// tracked so that frees and host access wait for it. Every use is
    /// tracked even when one fails (that one waits for the stream first);
    /// the first failure is returned.
    #[inline]
    pub(crate) fn enqueued(self) -> Result<()> {
        let Pending {
            stream,
            uses,
            work,
            in_flight,
            _gate: gate,
        } = self;
        land_count_track(stream, uses, work, in_flight, gate, || Ok(()))
    }

    /// The stream the work goes on.
    pub(crate) fn stream(&self) -> &'s Stream {
        self.stream
    }

    /// The uses it will track.
    pub(crate) fn uses(&self) -> &U {
        &self.uses
    }
}

/// Step 7 ([`Pending::enqueued`]) on a `Pending` taken apart: its fields
/// as locals, not a struct in memory, so that the compiler still knows
/// the work's kind and each buffer's type at the tracking after the
/// driver call (an escaped struct would be reloaded field by field, and
/// each use tracked through its vtable: ~60 instructions per enqueue).
/// When every use is tracked, `then` runs before the gate goes.
#[inline]
fn land_count_track<'s, 'u, U, R>(
    stream: &'s Stream,
    uses: U,
    work: Work,
    in_flight: InFlight<'s>,
    _gate: EnqueueGate<'s>,
    then: impl FnOnce() -> Result<R>,
) -> Result<R>
where
    U: IntoIterator<Item = Use<'u>>,
{
    // Landed before the tracking: the use events recorded below must
    // cover this step.
    drop(in_flight);
    work.count(stream);
    // The first failure, kept aside: folding each use's `Result` into one
    // with `and` moved the 72-byte `Result` twice per use on every enqueue.
    let mut first_failure = None;
    if work.tracks() {
        for used in uses {
            if let Err(err) = used.track(stream) {
                first_failure.get_or_insert(err);
            }
        }
    }
    match first_failure {
        Some(err) => Err(err),
        None => then(),
    }
}
