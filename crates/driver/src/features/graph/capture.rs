//! [`Capture`]: the second enqueue API, through which work is recorded into
//! a graph while a stream captures. Its methods take buffers by `Arc` and
//! keep them (see the module `args`). This file is the capture's life:
//! begun, forked and joined, ended or dropped; the nodes it records are in
//! `capture_nodes`.

use super::allocation::GraphAllocation;
use super::args::{HostNode, Resources};
use super::exec::{Graph, GraphOwner};
use crate::enqueue::order::{CaptureOrder, Touches};
use crate::ground::error::{Error, Result};
use crate::objects::stream::Stream;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use sys::{CUgraph, CUstreamCaptureMode};

static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

/// A stream taking part in a capture besides the one that began it.
struct Member {
    stream: Arc<Stream>,
    /// It holds captured work not yet joined back into the origin.
    unjoined: bool,
}

/// A stream capture in progress: work enqueued through it is recorded into
/// a [`Graph`] instead of running ([`Stream::begin_capture`]).
///
/// Work can fork to other streams ([`Capture::fork`]) and must be joined
/// back ([`Capture::join`]) before [`Capture::end`]. The capturing streams'
/// own enqueueing methods, `synchronize` and `query`, and
/// [`Context::synchronize`](crate::Context::synchronize) are refused meanwhile, with the capture left
/// usable. Dropping a capture that was not ended ends it and discards the
/// graph.
///
/// ```
/// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
/// use kernels::ELEMENTWISE;
/// use std::sync::Arc;
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let fill = Module::load(&ctx, &ELEMENTWISE)?.function("fill_f32")?;
/// let out = Arc::new(DeviceBuffer::<f32>::new_async(&stream, 4)?);
///
/// let mut capture = stream.begin_capture()?;
/// let args = [GraphArg::from(4u64), 2.5f32.into(), GraphArg::write(&out)];
/// capture.launch(&stream, &fill, LaunchConfig::for_num_elems(4), &args)?;
/// assert!(stream.synchronize().is_err(), "refused during capture");
/// let graph = capture.end()?;
///
/// let exec = graph.instantiate()?;
/// exec.launch(&stream)?;
/// assert_eq!(out.to_vec(&stream)?, [2.5; 4]);
/// # Ok(())
/// # }
/// ```
#[must_use = "a capture records nothing unless work is enqueued through it and it is ended"]
pub struct Capture {
    pub(super) origin: Arc<Stream>,
    pub(super) id: u64,
    members: Vec<Member>,
    pub(super) resources: Resources,
    pub(super) callbacks: Vec<Arc<HostNode>>,
    pub(super) nodes: usize,
    pub(super) open: bool,
    /// The id of the top-level capture whose graph this one's work goes
    /// into (its own id, but for the body of a conditional node): the
    /// family a [`Condition`](super::Condition) is valid in.
    pub(super) family: u64,
    /// The conditions of this family that already have their conditional
    /// node, shared with the family's body captures: CUDA refuses to
    /// instantiate a graph where one condition serves two nodes.
    pub(super) conditioned: Arc<Mutex<HashSet<u64>>>,
    /// Whether the graph is this capture's own (the body of a conditional
    /// node belongs to its node, and is never destroyed here).
    pub(super) owns_graph: bool,
    /// The graph's own order, checked node by node (`None` when the
    /// context's policy is `Off`).
    pub(super) order: Option<CaptureOrder>,
    /// Its graph buffers, each freed by a node at the end of the graph.
    pub(super) graph_memory: Vec<Arc<GraphAllocation>>,
}

impl Stream {
    /// Begin capturing this stream into a graph. Fails when the stream
    /// already takes part in a capture.
    pub fn begin_capture(&self) -> Result<Capture> {
        self.begin_capture_into(None)
    }

    /// Begin capturing into `into` (the body graph of a conditional node
    /// and the family of its top-level capture), or into a new graph.
    pub(super) fn begin_capture_into(&self, into: Option<(CUgraph, u64)>) -> Result<Capture> {
        let ctx = self.context();
        ctx.bind()?;
        let id = NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed);
        // Counted before the driver begins it: a context synchronization
        // from then on is refused instead of invalidating the capture.
        ctx.capture_beginning();
        // Exclusively: every eager enqueue in flight finishes first, and
        // none can start until the flag says "capturing".
        let entered = self.enter_capture("Stream::begin_capture", || {
            if self
                .capture
                .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Err(Error::StreamCapturing {
                    operation: "Stream::begin_capture",
                    stream: self.id(),
                });
            }
            self.order.enter_capture();
            // Relaxed: the safe layer refuses the calls CUDA's stricter modes
            // would, with a clear error, and a capture may end on another thread.
            let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            let code = match into {
                // SAFETY: a live stream of the current context.
                None => unsafe { (ctx.driver().cuStreamBeginCapture)(self.as_raw(), mode) },
                // SAFETY: as above; `graph` is a body graph of a live
                // conditional node, with no dependencies given.
                Some((graph, _)) => unsafe {
                    (ctx.driver().cuStreamBeginCaptureToGraph)(
                        self.as_raw(),
                        graph,
                        std::ptr::null(),
                        std::ptr::null(),
                        0,
                        mode,
                    )
                },
            };
            if let Err(err) = ctx.check(code) {
                self.capture.store(0, Ordering::Release);
                self.order.leave_capture();
                return Err(err);
            }
            Ok(())
        });
        if let Err(err) = entered {
            ctx.capture_ended();
            return Err(err);
        }
        tracing::debug!(stream = self.id(), capture = id, "stream capture begun");
        Ok(Capture {
            origin: self.to_arc(),
            id,
            members: Vec::new(),
            resources: Resources {
                capture: id,
                ..Resources::default()
            },
            callbacks: Vec::new(),
            nodes: 0,
            open: true,
            family: into.map_or(id, |(_, family)| family),
            conditioned: Arc::default(),
            owns_graph: into.is_none(),
            order: CaptureOrder::begin(self),
            graph_memory: Vec::new(),
        })
    }
}

impl Capture {
    /// The stream that began the capture.
    pub fn origin(&self) -> &Arc<Stream> {
        &self.origin
    }

    /// Nodes captured so far (launches, copies, memsets, callbacks).
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// A process-unique id of this capture (never 0): what
    /// [`HostSlot`](super::HostSlot)s and the engine's captured operation ids
    /// name.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub(super) fn check_open(&self) -> Result<()> {
        if self.open {
            Ok(())
        } else {
            Err(Error::CaptureEnded {
                origin: self.origin.id(),
            })
        }
    }

    /// `Ok` when `stream` takes part in this capture.
    pub(super) fn check_member(&self, stream: &Stream) -> Result<()> {
        self.check_open()?;
        if stream.capture_id() == self.id {
            Ok(())
        } else {
            Err(Error::CaptureIsolation {
                reason: format!(
                    "stream {} does not take part in the capture begun on stream {}; fork it in \
                     with Capture::fork",
                    stream.id(),
                    self.origin.id()
                ),
            })
        }
    }

    /// Captured work was added on `stream`.
    pub(super) fn worked_on(&mut self, stream: &Stream) {
        self.nodes += 1;
        if let Some(member) = self
            .members
            .iter_mut()
            .find(|m| m.stream.id() == stream.id())
        {
            member.unjoined = true;
        }
    }

    /// Capture one node with `node`, checked within the graph's own order
    /// first: the bytes it touches (`touches`, computed only while the
    /// policy is not `Off`) against the nodes captured before it.
    pub(super) fn ordered_node(
        &mut self,
        stream: &Stream,
        what: &'static str,
        touches: impl FnOnce() -> Touches,
        node: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let Some(mut order) = self.order.take() else {
            return node(self);
        };
        let touches = touches();
        let captured = order
            .check(stream, what, &touches)
            .and_then(|races| node(self).map(|()| races));
        let result = captured.map(|races| order.record(stream, what, &touches, races));
        self.order = Some(order);
        result
    }

    /// Fork `branches` into the capture: work captured on each of them from
    /// now on runs after the work captured on `from` so far. Each branch
    /// must be joined back ([`Capture::join`]) before [`Capture::end`].
    ///
    /// `fork` and `join` take the same slice, `&[&Stream]`, as
    /// [`Stream::fork`] and [`Stream::join`] do; an `&Arc<Stream>` in an
    /// array literal coerces to it.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, Stream};
    /// use std::sync::Arc;
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let (origin, left, right) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    /// let (a, b) = (Arc::new(DeviceBuffer::<u8>::new(&ctx, 64)?), Arc::new(DeviceBuffer::<u8>::new(&ctx, 64)?));
    /// let mut capture = origin.begin_capture()?;
    /// let branches: [&Stream; 2] = [&left, &right];
    /// capture.fork(&origin, &branches)?;
    /// capture.memset_u8(&left, &a, 1)?;
    /// capture.memset_u8(&right, &b, 2)?;
    /// capture.join(&origin, &branches)?;
    /// let graph = capture.end()?;
    /// graph.instantiate()?.launch(&origin)?;
    /// assert_eq!((a.to_vec(&origin)?[0], b.to_vec(&origin)?[0]), (1, 2));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fork(&mut self, from: &Stream, branches: &[&Stream]) -> Result<()> {
        self.check_member(from)?;
        for branch in branches {
            from.check_context("a forked stream", branch.context())?;
            if branch.is_capturing() {
                return Err(Error::StreamCapturing {
                    operation: "Capture::fork",
                    stream: branch.id(),
                });
            }
        }
        let event = from.mark()?;
        for branch in branches {
            // Marked first, so the wait is one inside the capture; under the
            // branch's gate, so no eager work of another thread slips in.
            branch.enter_capture("Capture::fork", || {
                branch
                    .capture
                    .compare_exchange(0, self.id, Ordering::AcqRel, Ordering::Acquire)
                    .map(|_| branch.order.enter_capture())
                    .map_err(|_| Error::StreamCapturing {
                        operation: "Capture::fork",
                        stream: branch.id(),
                    })
            })?;
            if let Err(err) = branch.wait_event(&event) {
                branch.capture.store(0, Ordering::Release);
                branch.order.leave_capture();
                return Err(err);
            }
            self.members.push(Member {
                stream: branch.to_arc(),
                unjoined: true,
            });
        }
        Ok(())
    }

    /// Join `branches` back into `into`: work captured on `into` from now on
    /// runs after the work captured on each branch so far.
    pub fn join(&mut self, into: &Stream, branches: &[&Stream]) -> Result<()> {
        self.check_member(into)?;
        for branch in branches {
            self.check_member(branch)?;
        }
        into.join(branches)?;
        let into_origin = into.id() == self.origin.id();
        let mut carried = false;
        for member in &mut self.members {
            if branches.iter().any(|b| b.id() == member.stream.id()) && member.unjoined {
                member.unjoined = false;
                carried = true;
            }
        }
        if carried
            && !into_origin
            && let Some(member) = self.members.iter_mut().find(|m| m.stream.id() == into.id())
        {
            member.unjoined = true;
        }
        Ok(())
    }

    /// End the capture and return the graph. Fails, leaving the capture
    /// open and usable, while a forked stream has work not joined back into
    /// the origin ([`Error::CaptureUnjoined`]).
    ///
    /// The nodes are checked within the graph's own order (its forks and
    /// joins) as they are captured: under [`crate::OrderPolicy::Check`] two
    /// nodes on different branches that touch the same bytes, one writing,
    /// with no path between them, end the capture with
    /// [`Error::UnorderedAccess`] naming both (the graph is discarded, every
    /// stream leaves the capture); `Report` logs them and returns the graph;
    /// `Auto` captured a wait between the branches when the later node was
    /// captured, so there is nothing left to tell.
    pub fn end(&mut self) -> Result<Graph> {
        self.check_open()?;
        if !self.owns_graph {
            return Err(Error::Conditional {
                reason: format!(
                    "capture {} is the body of a conditional node: it ends when its closure \
                     returns, not with Capture::end",
                    self.id
                ),
            });
        }
        if let Some(member) = self.members.iter().find(|m| m.unjoined) {
            return Err(Error::CaptureUnjoined {
                stream: member.stream.id(),
                origin: self.origin.id(),
            });
        }
        self.free_graph_memory()?;
        let order = self.order.take();
        let raw = self.close()?;
        if let Some(order) = order
            && let Err(err) = order.end(&self.origin)
        {
            let ctx = self.origin.context();
            ctx.release_in_drop(format_args!("a refused graph"), "destroying", |driver| {
                // SAFETY: the graph was just made, never handed out, and is
                // destroyed once.
                unsafe { (driver.cuGraphDestroy)(raw) }
            });
            return Err(err);
        }
        self.resources.callbacks = Arc::new(std::mem::take(&mut self.callbacks));
        Ok(Graph {
            ctx: Arc::clone(self.origin.context()),
            raw,
            owner: Arc::new(GraphOwner {
                ctx: Arc::clone(self.origin.context()),
                raw,
            }),
            turns: Mutex::default(),
            resources: Arc::new(std::mem::take(&mut self.resources)),
            nodes: self.nodes,
        })
    }

    /// End the capture at the driver; every stream leaves it.
    pub(super) fn close(&mut self) -> Result<CUgraph> {
        self.open = false;
        let ctx = self.origin.context();
        let mut raw: CUgraph = std::ptr::null_mut();
        let ended = ctx.bind().and_then(|()| {
            // SAFETY: the origin is live and capturing; valid out-pointer.
            ctx.check(unsafe { (ctx.driver().cuStreamEndCapture)(self.origin.as_raw(), &mut raw) })
        });
        self.origin.order.leave_capture();
        self.origin.capture.store(0, Ordering::Release);
        for member in &self.members {
            member.stream.order.leave_capture();
            member.stream.capture.store(0, Ordering::Release);
        }
        ctx.capture_ended();
        tracing::debug!(
            stream = self.origin.id(),
            capture = self.id,
            nodes = self.nodes,
            "stream capture ended"
        );
        ended.map(|()| raw)
    }
}

impl Capture {
    /// End the capture of a conditional node's body: its graph stays with
    /// the node. Refused while a fork is not joined back, or when its
    /// nodes race within the body's own order.
    pub(super) fn end_body(&mut self) -> Result<()> {
        self.check_open()?;
        if let Some(member) = self.members.iter().find(|m| m.unjoined) {
            return Err(Error::CaptureUnjoined {
                stream: member.stream.id(),
                origin: self.origin.id(),
            });
        }
        let order = self.order.take();
        self.close()?;
        match order {
            Some(order) => order.end(&self.origin),
            None => Ok(()),
        }
    }

    /// End the capture and discard its graph (what dropping an open
    /// capture does).
    pub(super) fn discard(&mut self) {
        if !self.open {
            return;
        }
        // Joined first, so the driver ends the capture of every stream (an
        // unjoined fork could otherwise leave a stream capturing on a GPU).
        let unjoined: Vec<Arc<Stream>> = self
            .members
            .iter()
            .filter(|m| m.unjoined)
            .map(|m| Arc::clone(&m.stream))
            .collect();
        let branches: Vec<&Stream> = unjoined.iter().map(|s| &**s).collect();
        if !branches.is_empty()
            && let Err(err) = self.origin.join(&branches)
        {
            tracing::warn!("joining the forks of a dropped capture: {err}");
        }
        match self.close() {
            Ok(_) if !self.owns_graph => {}
            Ok(raw) => {
                let ctx = self.origin.context();
                ctx.release_in_drop(format_args!("a discarded graph"), "destroying", |driver| {
                    // SAFETY: the graph was just made and is destroyed once.
                    unsafe { (driver.cuGraphDestroy)(raw) }
                });
            }
            Err(err) => tracing::warn!("ending a dropped capture: {err}"),
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.discard();
    }
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("origin", &self.origin.id())
            .field("id", &self.id)
            .field("nodes", &self.nodes)
            .field("open", &self.open)
            .finish()
    }
}
