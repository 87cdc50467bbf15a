//! Upload, compute and download on three streams, ordered by events.

use crate::error::{Error, Result};
use crate::staging::StagingPool;
use driver::sys::CUdeviceptr;
use driver::{
    CompletionTrail, Context, DeviceBuffer, DeviceCopy, Event, Kernel, KernelArg, LaunchConfig,
    PinnedBuffer, Stream, StreamPriority, TrailSearch,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Identifies one queued operation: the workspace's one operation id. Ids
/// grow from 1 in queueing order; every operation is a node of the
/// coordinator's [`OperationGraph`].
pub use engine::OperationId;
use engine::{Op, OperationGraph, OperationType};
use pool::StreamPurpose;

/// An operation the GPU has finished, as reported by [`AsyncCoordinator::poll`].
///
/// What it was (`op_type`) is the [`StreamPurpose`] of the stream it ran on:
/// `ConfigUpload` for uploads, `KernelExecution` for computes,
/// `TelemetryDownload` for downloads (the seed's names for the pipeline's
/// three roles; `docs/stream-pool.md` maps them to the engine's
/// `OperationType`).
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, DeviceBuffer};
/// use cuda_streams_pipeline::{AsyncCoordinator, CompletedOperation, StreamPurpose};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut coordinator = AsyncCoordinator::new(&ctx)?;
/// let mut buf = DeviceBuffer::<f32>::new(&ctx, 8)?;
/// let upload = coordinator.queue_upload(&[1.0; 8], &mut buf)?;
/// coordinator.wait(upload)?;
/// let done = coordinator.poll()?;
/// assert_eq!(done, [CompletedOperation { op_id: upload, op_type: StreamPurpose::ConfigUpload }]);
/// assert!(coordinator.poll()?.is_empty()); // each operation is reported once
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompletedOperation {
    /// Its id.
    pub op_id: OperationId,
    /// What it was: the purpose of the stream it ran on.
    pub op_type: StreamPurpose,
}

/// An operation not reported by `poll` yet, on its stream's completion trail.
struct Unreported {
    /// Its node in the graph; its event is recorded right after it.
    op: Op,
    /// Staging memory a staged upload reads; returned to the pool once done.
    staging: Option<crate::staging::Staged>,
}

/// The event that completes an unreported operation on its stream.
fn completion_of(entry: &Unreported) -> Option<&Event> {
    Some(entry.op.event())
}

/// What the operations on each trail are (one trail per stream): an
/// operation's kind is its trail's.
const LANES: [StreamPurpose; 3] = [
    StreamPurpose::ConfigUpload,
    StreamPurpose::KernelExecution,
    StreamPurpose::TelemetryDownload,
];

/// The trail that holds the operations of `kind`.
fn lane(kind: StreamPurpose) -> usize {
    match kind {
        StreamPurpose::ConfigUpload => 0,
        StreamPurpose::KernelExecution => 1,
        // The coordinator enqueues on its three streams only.
        _ => 2,
    }
}

/// Upload, compute and download streams with event-based dependencies.
///
/// Host-to-device copies run on the upload stream and device-to-host copies
/// on the download stream: on an H200 the two directions use different copy
/// engines and run at about 98 GB/s together against 55 GB/s each. Two copies
/// in the *same* direction share one engine whatever their streams, so
/// nothing here spreads one direction over several streams for speed.
///
/// Dependencies are events: every operation records an event on its stream,
/// and a dependent operation's stream waits on it (`cuStreamWaitEvent`); the
/// host never blocks to order work. Besides the dependencies passed in, the
/// coordinator adds the ones that keep its own copies correct:
///
/// - a **download** waits for every compute queued before it (downloads read
///   results) and for the last upload into the same buffer;
/// - an **upload** waits for every compute queued before it (a kernel may
///   still read the buffer being overwritten) and for the last download from
///   the same buffer;
/// - a **compute** waits only for the dependencies it is given: list the
///   uploads it reads and, when it overwrites a buffer a download may still
///   be reading, that download.
///
/// So the overlapping order for a triple-buffered step is: upload batch *k*,
/// download batch *k − 2*, then compute batch *k − 1* (queueing the compute
/// before the download would make the download wait for it).
///
/// Host memory: [`queue_upload`](Self::queue_upload) copies the caller's
/// slice into pinned staging memory the coordinator owns (so the slice is free
/// when the call returns); [`queue_upload_pinned`](Self::queue_upload_pinned)
/// and [`queue_download`](Self::queue_download) take [`PinnedBuffer`]s, whose
/// host access waits for the copies that use them.
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, DeviceBuffer, LaunchConfig, Module, PinnedBuffer};
/// use cuda_streams_pipeline::AsyncCoordinator;
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut coordinator = AsyncCoordinator::new(&ctx)?;
/// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
/// let (x, mut y) = (DeviceBuffer::<f32>::new(&ctx, 4)?, DeviceBuffer::<f32>::new(&ctx, 4)?);
/// let mut x = x;
/// let mut out = PinnedBuffer::<f32>::new(&ctx, 4)?;
///
/// let upload = coordinator.queue_upload(&[1.0, 2.0, 3.0, 4.0], &mut x)?;
/// let args = [4u64.into(), 3u32.into(), (&x).into(), (&mut y).into()];
/// let kernel = coordinator.queue_compute(&compute, LaunchConfig::for_num_elems(4), &args, &[upload])?;
/// let download = coordinator.queue_download(&y, &mut out)?; // after the compute
/// coordinator.wait(download)?;
/// assert_eq!(out.as_slice()?, &[1.875, 3.75, 5.625, 7.5]); // 3 steps of v = v/2 + x
/// let done: Vec<_> = coordinator.poll()?.iter().map(|op| op.op_id).collect();
/// assert_eq!(done, [upload, kernel, download]);
/// # Ok(())
/// # }
/// ```
pub struct AsyncCoordinator {
    ctx: Arc<Context>,
    upload: Arc<Stream>,
    compute: Arc<Stream>,
    download: Arc<Stream>,
    staging: StagingPool,
    /// Every operation is a node of this graph, which turns dependencies on
    /// other streams into event waits, knows every id it issued and checks
    /// dependencies.
    graph: OperationGraph,
    /// Per stream (upload, compute, download), the operations `poll` has not
    /// reported yet: the driver's completion trail answers which the GPU
    /// has passed.
    unreported: [CompletionTrail<Unreported>; 3],
    /// The last compute queued, for the implicit copy dependencies.
    last_compute: Option<OperationId>,
    /// Per device address: the last upload into it and the last download from it.
    last_upload: HashMap<CUdeviceptr, OperationId>,
    last_download: HashMap<CUdeviceptr, OperationId>,
}

impl AsyncCoordinator {
    /// A coordinator with three new streams: compute at the device's greatest
    /// priority, the copy streams at normal priority.
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        let upload = Stream::new_with_priority(ctx, StreamPriority::Normal)?;
        let compute = Stream::new_with_priority(ctx, StreamPriority::High)?;
        let download = Stream::new_with_priority(ctx, StreamPriority::Normal)?;
        Self::with_streams(upload, compute, download)
    }

    /// A coordinator over streams the caller provides (e.g. from a stream
    /// pool). They must be three different streams of one context.
    pub fn with_streams(
        upload: Arc<Stream>,
        compute: Arc<Stream>,
        download: Arc<Stream>,
    ) -> Result<Self> {
        let ids = [upload.id(), compute.id(), download.id()];
        if ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2] {
            return Err(Error::InvalidConfig(format!(
                "the upload, compute and download streams must differ (got stream ids {ids:?})"
            )));
        }
        let ctx = Arc::clone(upload.context());
        for stream in [&compute, &download] {
            if stream.context().id() != ctx.id() {
                return Err(Error::InvalidConfig(format!(
                    "stream {} belongs to context {}, not {}",
                    stream.id(),
                    stream.context().id(),
                    ctx.id()
                )));
            }
        }
        Ok(Self {
            staging: StagingPool::default(),
            graph: OperationGraph::for_context(&ctx),
            ctx,
            upload,
            compute,
            download,
            unreported: Default::default(),
            last_compute: None,
            last_upload: HashMap::new(),
            last_download: HashMap::new(),
        })
    }

    /// Copy `host` into pinned staging memory, then into `dst` asynchronously
    /// on the upload stream. `host` is free again when this returns.
    pub fn queue_upload<T: DeviceCopy>(
        &mut self,
        host: &[T],
        dst: &mut DeviceBuffer<T>,
    ) -> Result<OperationId> {
        let mut staged = self.staging.take::<T>(&self.ctx, host.len())?;
        staged
            .buffer_mut::<T>()?
            .as_mut_slice()?
            .copy_from_slice(host);
        let id = self.upload_from(staged.buffer::<T>()?, dst, &[])?;
        if let Some(entry) = self.unreported[lane(StreamPurpose::ConfigUpload)].back_mut() {
            entry.staging = Some(staged);
        }
        Ok(id)
    }

    /// Upload from a pinned buffer, without staging, after `deps` (and the
    /// implicit dependencies above). The pinned buffer's host writes and its
    /// drop wait for this copy.
    pub fn queue_upload_pinned<T: DeviceCopy>(
        &mut self,
        host: &PinnedBuffer<T>,
        dst: &mut DeviceBuffer<T>,
        deps: &[OperationId],
    ) -> Result<OperationId> {
        self.upload_from(host, dst, deps)
    }

    fn upload_from<T: DeviceCopy>(
        &mut self,
        host: &PinnedBuffer<T>,
        dst: &mut DeviceBuffer<T>,
        deps: &[OperationId],
    ) -> Result<OperationId> {
        let ptr = dst.as_device_ptr();
        let implicit = [self.last_compute, self.last_download.get(&ptr).copied()];
        let stream = Arc::clone(&self.upload);
        let id = self.enqueue(StreamPurpose::ConfigUpload, &stream, deps, &implicit, |s| {
            s.copy_from_host_async(dst, host)
        })?;
        self.last_upload.insert(ptr, id);
        Ok(id)
    }

    /// Launch `kernel` on the compute stream after the operations in `deps`.
    pub fn queue_compute(
        &mut self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
        deps: &[OperationId],
    ) -> Result<OperationId> {
        self.queue_compute_with(deps, |s| s.launch(kernel, config, args))
    }

    /// Enqueue `work` (kernel launches, timing events) on the compute stream
    /// as one operation, after the operations in `deps`.
    pub fn queue_compute_with(
        &mut self,
        deps: &[OperationId],
        work: impl FnOnce(&Stream) -> driver::Result<()>,
    ) -> Result<OperationId> {
        let stream = Arc::clone(&self.compute);
        let id = self.enqueue(StreamPurpose::KernelExecution, &stream, deps, &[], work)?;
        self.last_compute = Some(id);
        Ok(id)
    }

    /// Copy `src` into `host` asynchronously on the download stream, after
    /// every compute queued so far and the last upload into `src`. Reading
    /// `host` (`as_slice`) waits for the copy.
    pub fn queue_download<T: DeviceCopy>(
        &mut self,
        src: &DeviceBuffer<T>,
        host: &mut PinnedBuffer<T>,
    ) -> Result<OperationId> {
        self.queue_download_after(src, host, &[])
    }

    /// [`queue_download`](Self::queue_download) with extra dependencies.
    pub fn queue_download_after<T: DeviceCopy>(
        &mut self,
        src: &DeviceBuffer<T>,
        host: &mut PinnedBuffer<T>,
        deps: &[OperationId],
    ) -> Result<OperationId> {
        let ptr = src.as_device_ptr();
        let implicit = [self.last_compute, self.last_upload.get(&ptr).copied()];
        let stream = Arc::clone(&self.download);
        let id = self.enqueue(
            StreamPurpose::TelemetryDownload,
            &stream,
            deps,
            &implicit,
            |s| s.copy_to_host_async(host, src),
        )?;
        self.last_download.insert(ptr, id);
        Ok(id)
    }

    /// Make `stream` wait for `deps`, run `op` on it, record the op's event.
    /// The graph checks the dependencies (an id it never issued is
    /// [`engine::Error::UnknownDependency`]) and orders after the live ones
    /// only (a retired operation is finished); operations already reported
    /// by `poll` are left out, as the GPU has passed them.
    fn enqueue(
        &mut self,
        kind: StreamPurpose,
        stream: &Arc<Stream>,
        deps: &[OperationId],
        implicit: &[Option<OperationId>],
        op: impl FnOnce(&Stream) -> driver::Result<()>,
    ) -> Result<OperationId> {
        let mut after: Vec<OperationId> = Vec::with_capacity(deps.len() + implicit.len());
        for &dep in deps.iter().chain(implicit.iter().flatten()) {
            // One `poll` reported is finished on the GPU: no edge (the graph
            // may not have retired it yet, and would wait on its event).
            // An id the graph never issued goes on, for the graph's check.
            let reported = self.find(dep).is_none() && self.graph.state(dep).is_some();
            if !reported && !after.contains(&dep) {
                after.push(dep);
            }
        }
        let kind_type = OperationType::from(kind);
        let result = self
            .graph
            .op(stream)
            .after(&after)
            .kind(kind_type)
            .label(kind.to_string())
            .run(op);
        let op = match result {
            Ok(op) => op,
            // Completed in the graph all the same; nothing to report. The
            // driver's error (a length mismatch, say) is the one to see.
            Err(engine::Error::OperationFailed { source, .. }) => {
                // This crate's own error, carried out by `?`, is itself again.
                return Err(source.downcast::<Error>().unwrap_or_else(Error::from));
            }
            Err(err) => return Err(err.into()),
        };
        let id = op.id();
        self.unreported[lane(kind)].push(Unreported { op, staging: None });
        Ok(id)
    }

    /// `Err` naming `id` when the graph never issued it.
    fn check_known(&self, id: OperationId) -> Result<()> {
        match self.graph.state(id) {
            Some(_) => Ok(()),
            None => Err(Error::UnknownOperation {
                id,
                next: self.graph.next_id(),
            }),
        }
    }

    /// Where `id` waits to be reported: its trail and its place on it.
    fn find(&self, id: OperationId) -> Option<(usize, usize)> {
        self.unreported
            .iter()
            .enumerate()
            .find_map(|(lane, trail)| {
                // Ids are issued in order, so each trail is sorted by id.
                trail
                    .entries()
                    .binary_search_by_key(&id, |entry| entry.op.id())
                    .ok()
                    .map(|at| (lane, at))
            })
    }

    /// The operations the GPU has finished since the last poll, in id order.
    /// Each is reported once; nothing unfinished is reported (each answer comes
    /// from the operation's event, `cuEventQuery`). Never blocks.
    pub fn poll(&mut self) -> Result<Vec<CompletedOperation>> {
        let mut finished = Vec::new();
        for (trail, &kind) in self.unreported.iter_mut().zip(&LANES) {
            let passed = trail.passed(TrailSearch::Exact, completion_of)?;
            for entry in trail.take_front(passed) {
                if let Some(staged) = entry.staging {
                    self.staging.give_back(staged);
                }
                finished.push(CompletedOperation {
                    op_id: entry.op.id(),
                    op_type: kind,
                });
            }
        }
        finished.sort_unstable_by_key(|done| done.op_id);
        Ok(finished)
    }

    /// Block until operation `id` has finished on the GPU (its event). Ids
    /// already reported by [`poll`](Self::poll) return at once.
    pub fn wait(&mut self, id: OperationId) -> Result<()> {
        self.check_known(id)?;
        if let Some((lane, at)) = self.find(id) {
            // Through the reactor; everything before it on its stream is done too.
            self.unreported[lane].wait_for(at, completion_of)?;
            for entry in self.unreported[lane].iter_mut().take(at + 1) {
                if let Some(staged) = entry.staging.take() {
                    self.staging.give_back(staged);
                }
            }
        }
        Ok(())
    }

    /// Whether operation `id` has finished (without blocking).
    pub fn is_complete(&self, id: OperationId) -> Result<bool> {
        self.check_known(id)?;
        match self.find(id) {
            Some((lane, at)) => {
                let entry = self.unreported[lane].get(at).expect("found above");
                Ok(entry.op.is_done()?)
            }
            None => Ok(true),
        }
    }

    /// Block until all three streams are idle; every queued operation is
    /// then complete (and reported by the next poll).
    pub fn synchronize_all(&mut self) -> Result<()> {
        for stream in [&self.upload, &self.compute, &self.download] {
            stream.synchronize()?;
        }
        for entry in self
            .unreported
            .iter_mut()
            .flat_map(|trail| trail.iter_mut())
        {
            if let Some(staged) = entry.staging.take() {
                self.staging.give_back(staged);
            }
        }
        Ok(())
    }

    /// How many operations have not been reported by `poll` yet.
    pub fn pending_count(&self) -> usize {
        self.unreported.iter().map(CompletionTrail::len).sum()
    }

    /// The event recorded after operation `id`, while it is unreported
    /// (for making other streams wait on it).
    pub fn event_of(&self, id: OperationId) -> Option<&Event> {
        let (lane, at) = self.find(id)?;
        self.unreported[lane].get(at).map(|entry| entry.op.event())
    }

    /// The compute stream.
    pub fn compute_stream(&self) -> &Arc<Stream> {
        &self.compute
    }

    /// The upload (host-to-device) stream.
    pub fn upload_stream(&self) -> &Arc<Stream> {
        &self.upload
    }

    /// The download (device-to-host) stream.
    pub fn download_stream(&self) -> &Arc<Stream> {
        &self.download
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl fmt::Debug for AsyncCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncCoordinator")
            .field("upload", &self.upload.id())
            .field("compute", &self.compute.id())
            .field("download", &self.download.id())
            .field("pending", &self.pending_count())
            .field("next_id", &self.graph.next_id())
            .finish()
    }
}
