//! Three batches in flight on one coordinator's three streams: the one
//! orchestrator behind [`PipelineStageManager`](crate::PipelineStageManager)
//! and [`ManagedGpuContext`](crate::ManagedGpuContext)'s asynchronous mode.
//!
//! Batches are numbered from 0 in upload order; batch *b* lives in slot
//! *b* mod 3. Step *k* uploads batch *k*, queues the download of batch
//! *k − 2*'s outputs, then the computation of batch *k − 1*, in that order: a
//! download waits for the computes queued before it (the coordinator's
//! implicit dependencies), so it must not follow this step's compute. A
//! compute waits for its batch's uploads and for the downloads still reading
//! its slot's outputs from three batches before; nothing waits on the host.
//!
//! What an upload, a compute and a download *are* (which buffers, which
//! kernels) is the view's ([`SlotWork`]); which batch each slot holds, the
//! operations that last used it and how far each lane has got are kept here
//! only.

use crate::coordinator::{AsyncCoordinator, OperationId};
use crate::error::Result;

/// Batches in flight at once: one uploading, one computing, one
/// downloading (so results lag two steps behind uploads).
pub const PIPELINE_DEPTH: u64 = 3;

/// [`PIPELINE_DEPTH`] as a slot count.
pub(crate) const DEPTH: usize = PIPELINE_DEPTH as usize;

/// The slot that batch `batch` lives in.
pub(crate) fn slot_of(batch: u64) -> usize {
    (batch % PIPELINE_DEPTH) as usize
}

/// What one step of the pipeline queued
/// ([`PipelineStageManager::execute_iteration`](crate::PipelineStageManager::execute_iteration)).
///
/// Batches are numbered from 0 in upload order; computing lags one step
/// behind uploading, downloading two.
///
/// ```
/// use cuda_streams_pipeline::driver::{Context, LaunchConfig, Module};
/// use cuda_streams_pipeline::{AsyncCoordinator, GpuPipelineStage, IterationReport, PipelineStageManager};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
/// let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx)?, 64)?;
/// let cfg = LaunchConfig::for_num_elems(64);
/// let stage = pipeline.add_stage(GpuPipelineStage::compute("c", compute, cfg, 1, 0, 1));
/// pipeline.set_inputs(vec![0]);
/// pipeline.set_order(vec![stage])?;
/// let first = pipeline.execute_iteration()?;
/// assert_eq!(first, IterationReport { uploaded: Some(0), computed: None, downloaded: None });
/// pipeline.execute_iteration()?;
/// let third = pipeline.execute_iteration()?;
/// assert_eq!(third, IterationReport { uploaded: Some(2), computed: Some(1), downloaded: Some(0) });
/// let drained = pipeline.drain()?; // no uploads: finish batches 1 and 2
/// assert_eq!(drained[1], IterationReport { uploaded: None, computed: None, downloaded: Some(2) });
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterationReport {
    /// The batch uploaded in this step (`None` while draining).
    pub uploaded: Option<u64>,
    /// The batch whose stages were queued (one behind the upload).
    pub computed: Option<u64>,
    /// The batch whose outputs were queued for download (two behind);
    /// [`PipelineStageManager::output`](crate::PipelineStageManager::output)
    /// reads them.
    pub downloaded: Option<u64>,
}

/// A view's work on one slot, queued on the rotation's coordinator. Each
/// method pushes the ids of the operations it queued (the rotation keeps
/// them, without allocating, to order the slot's next uses).
pub(crate) trait SlotWork {
    /// Upload the next batch into `slot`.
    fn upload(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        queued: &mut Vec<OperationId>,
    ) -> Result<()>;

    /// Download `slot`'s outputs.
    fn download(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        queued: &mut Vec<OperationId>,
    ) -> Result<()>;

    /// Compute `slot`'s batch after the operations in `after`.
    fn compute(
        &mut self,
        coordinator: &mut AsyncCoordinator,
        slot: usize,
        after: &[OperationId],
    ) -> Result<()>;
}

/// The rotation: the coordinator, and per slot its batch and the operations
/// that last used it.
pub(crate) struct Rotation {
    coordinator: AsyncCoordinator,
    /// Per slot: the uploads of its current batch, and its last downloads.
    uploads: [Vec<OperationId>; DEPTH],
    downloads: [Vec<OperationId>; DEPTH],
    /// Per slot: the batch whose outputs its host side holds (or will, once
    /// the queued download lands).
    held: [Option<u64>; DEPTH],
    /// A compute's dependencies, gathered here to reuse the storage.
    after: Vec<OperationId>,
    /// Steps taken; batches uploaded, computed and downloaded (queued).
    steps: u64,
    fed: u64,
    computed: u64,
    downloaded: u64,
}

impl Rotation {
    pub(crate) fn new(coordinator: AsyncCoordinator) -> Self {
        Self {
            coordinator,
            uploads: Default::default(),
            downloads: Default::default(),
            held: [None; DEPTH],
            after: Vec::new(),
            steps: 0,
            fed: 0,
            computed: 0,
            downloaded: 0,
        }
    }

    /// One step: with `feed`, upload the next batch; download the oldest
    /// computed batch not yet downloaded; compute the oldest uploaded batch
    /// not yet computed (each only where earlier steps left one ready).
    /// Then the coordinator reports what the GPU finished (never blocks).
    pub(crate) fn step(&mut self, feed: bool, work: &mut impl SlotWork) -> Result<IterationReport> {
        // What earlier steps left ready: uploaded batches to compute,
        // computed batches to download.
        let (fed_before, computed_before) = (self.fed, self.computed);
        let mut report = IterationReport::default();
        if feed {
            let batch = self.fed;
            let slot = slot_of(batch);
            let queued = &mut self.uploads[slot];
            queued.clear();
            work.upload(&mut self.coordinator, slot, queued)?;
            report.uploaded = Some(batch);
            self.fed += 1;
        }
        if self.downloaded < computed_before {
            let batch = self.downloaded;
            let slot = slot_of(batch);
            let queued = &mut self.downloads[slot];
            queued.clear();
            work.download(&mut self.coordinator, slot, queued)?;
            self.held[slot] = Some(batch);
            report.downloaded = Some(batch);
            self.downloaded += 1;
        }
        if self.computed < fed_before {
            let batch = self.computed;
            let slot = slot_of(batch);
            // The batch's uploads, and the downloads still reading this
            // slot's outputs from three batches ago.
            self.after.clear();
            self.after.extend(&self.uploads[slot]);
            self.after.extend(&self.downloads[slot]);
            work.compute(&mut self.coordinator, slot, &self.after)?;
            report.computed = Some(batch);
            self.computed += 1;
        }
        self.steps += 1;
        self.coordinator.poll()?;
        Ok(report)
    }

    /// Whether batches fed in have not all been queued for download yet
    /// (steps without uploads finish them).
    pub(crate) fn in_flight(&self) -> bool {
        self.downloaded < self.fed
    }

    /// Wait until everything queued has finished, and report it.
    pub(crate) fn settle(&mut self) -> Result<()> {
        self.coordinator.synchronize_all()?;
        self.coordinator.poll()?;
        Ok(())
    }

    /// The slots start afresh (their buffers were replaced); the batch
    /// numbers go on.
    pub(crate) fn forget_slots(&mut self) {
        for queued in self.uploads.iter_mut().chain(&mut self.downloads) {
            queued.clear();
        }
        self.held = [None; DEPTH];
    }

    /// The slot whose host side holds (or will hold) batch `batch`'s
    /// outputs, if it still does.
    pub(crate) fn slot_holding(&self, batch: u64) -> Option<usize> {
        let slot = slot_of(batch);
        (self.held[slot] == Some(batch)).then_some(slot)
    }

    /// The slot of the batch most recently queued for download.
    pub(crate) fn last_downloaded(&self) -> Option<usize> {
        self.downloaded.checked_sub(1).map(slot_of)
    }

    /// Batches queued for download so far.
    pub(crate) fn downloaded(&self) -> u64 {
        self.downloaded
    }

    /// Batches uploaded so far.
    pub(crate) fn fed(&self) -> u64 {
        self.fed
    }

    /// Steps taken so far.
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    pub(crate) fn coordinator(&self) -> &AsyncCoordinator {
        &self.coordinator
    }

    pub(crate) fn coordinator_mut(&mut self) -> &mut AsyncCoordinator {
        &mut self.coordinator
    }
}
