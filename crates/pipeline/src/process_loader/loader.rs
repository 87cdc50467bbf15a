//! The GPU process's side: hand slots to workers, upload filled slots in
//! batch order, run the GPU step, keep three batches in flight, and give a
//! slot back to a worker once its upload has completed.

use super::command::WorkerCommand;
use super::plan::{DEPTH, GpuStep, LoaderPlan};
use super::shared_slots::SharedSlots;
use super::slot_returns::Draining;
use super::wire::Job;
use super::workers::{WorkerEvent, WorkerId, WorkerSet};
use crate::error::{Error, Result};
use driver::{Context, DeviceBuffer, HostRegistered, PinnedRegion, Stream};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// One batch on the device, in the order the loader delivers them.
///
/// Its buffer was allocated in stream order on the loader's stream, after
/// which the batch was uploaded and (with a GPU step) transformed there:
/// work on that stream, or on any other (the driver orders a buffer's first
/// use on another stream after its home stream's work), sees the whole batch.
#[derive(Debug)]
#[must_use = "a batch is delivered once; dropping it frees its buffer"]
pub struct LoadedBatch {
    index: u64,
    data: DeviceBuffer<f32>,
}

impl LoadedBatch {
    /// The batch's index, `0, 1, 2, …` in delivery order.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The batch on the device.
    pub fn data(&self) -> &DeviceBuffer<f32> {
        &self.data
    }

    /// The device buffer, kept past the batch.
    pub fn into_data(self) -> DeviceBuffer<f32> {
        self.data
    }
}

/// Loads batches filled by worker processes into device memory: the
/// multi-process loader of `docs/host-memory.md`.
///
/// N worker processes run a [`Fill`](super::Fill) each (registered with
/// [`serve_if_worker`](super::serve_if_worker)), writing batches into slots
/// of one shared host region. The GPU process pins that region once
/// (`cuMemHostRegister`), so every upload runs at pinned speed with no
/// staging copy. Each filled slot is uploaded on the loader's upload
/// stream, the GPU step (a normalisation, say) runs on its stream while the
/// next slot uploads, and the batch waits for the consumer, three at most
/// ahead of it. A slot goes back to a worker once
/// the event recorded after its upload has completed.
///
/// A worker that dies (killed, crashed, a panicking fill) makes
/// [`next_batch`](Self::next_batch) fail with [`Error::WorkerDied`], naming
/// the worker, its pid and the batch it held; a batch that does not arrive
/// within the deadline fails with [`Error::WorkerTimeout`], and so does a
/// wait for a slot whose upload does not complete within it, with
/// [`Error::UploadTimeout`] naming the slot and the stream. Dropping the
/// loader kills and reaps its workers and waits for the uploads still
/// reading the region before it unpins and unmaps it.
///
/// The program must call [`serve_if_worker`](super::serve_if_worker) first
/// thing in `main`: by default the workers are the same executable, run again.
///
/// ```standalone_crate
/// # extern crate kernels as cuda_streams_kernels;
/// use cuda_streams_pipeline::driver::{Context, DeviceBuffer, Stream};
/// use cuda_streams_pipeline::{ProcessLoader, serve_if_worker};
/// use cuda_streams_kernels::typed::Elementwise; // `scale_add`, the normalisation
///
/// /// Runs in the workers: decode, augment, whatever the batch needs.
/// fn ramp(batch: u64, out: &mut [f32]) {
///     for (i, value) in out.iter_mut().enumerate() {
///         *value = (batch * 1000 + i as u64) as f32;
///     }
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     serve_if_worker(&[("ramp", ramp)]); // a worker never returns from here
///
///     let ctx = Context::new(0)?;
///     let len = 1000;
///     let (mean, std) = (512.0f32, 256.0f32); // powers of two: exact in f32
///     let kernels = Elementwise::load(&ctx)?;
///     let setup = Stream::new(&ctx)?;
///     let mut ones = DeviceBuffer::<f32>::new_async(&setup, len)?;
///     kernels.fill_f32(&setup, 1.0, &mut ones)?;
///     setup.synchronize()?;
///     let loader = ProcessLoader::builder("ramp", len)
///         .workers(2)
///         .batches(6)
///         .gpu_step(move |stream, raw, out| {
///             // out = (raw - mean) / std
///             kernels.scale_add(stream, 1.0 / std, raw, -mean / std, &ones, out)
///         })
///         .build(&ctx)?;
///     let stream = loader.stream().clone();
///     for (expected, batch) in (0u64..).zip(loader) {
///         let batch = batch?;
///         assert_eq!(batch.index(), expected);
///         let values = batch.data().to_vec(&stream)?;
///         assert_eq!(values[0], (expected as f32 * 1000.0 - mean) / std);
///     }
///     Ok(())
/// }
/// ```
pub struct ProcessLoader {
    workers: WorkerSet,
    step: Option<GpuStep>,
    ready: VecDeque<LoadedBatch>,
    /// The last batch's upload, read by its GPU step: freed once the next
    /// batch's upload is on the upload stream (see `upload`).
    last_raw: Option<DeviceBuffer<f32>>,
    stream: Arc<Stream>,
    /// With a GPU step, a second stream, so that a batch's upload runs
    /// while the step of the one before runs on `stream`; else `stream`.
    uploads: Arc<Stream>,
    draining: Draining,
    /// The whole region, pinned; dropped (waiting for nothing: the uploads
    /// were tracked on the slots' regions, waited for in `Drop`) before the
    /// mapping below.
    _registration: HostRegistered<'static, f32>,
    region: SharedSlots,
    ctx: Arc<Context>,
    free: Vec<usize>,
    /// Filled slots by batch, waiting for their turn to upload.
    filled: BTreeMap<u64, usize>,
    next_assign: u64,
    next_upload: u64,
    batches: u64,
    batch_len: usize,
    deadline: Duration,
    /// An error met after a batch was ready, returned by the next call.
    deferred: Option<Error>,
    /// The first error, repeated by every later call.
    failed: Option<String>,
    /// Whether the iterator has yielded the first error (it then ends).
    error_yielded: bool,
}

impl ProcessLoader {
    pub(super) fn start(
        config: LoaderPlan,
        ctx: &Arc<Context>,
        slots: usize,
        command: &WorkerCommand,
    ) -> Result<Self> {
        let io_error = |what: &str| {
            let what = what.to_owned();
            move |source| Error::LoaderIo { what, source }
        };
        let region = SharedSlots::create(slots, config.batch_len)
            .map_err(io_error("creating the shared region"))?;
        let (base, len) = region.whole();
        // SAFETY: the mapping holds `len` initialised `f32`s (zeroed by the
        // kernel, written since only with `f32`s) and lives in `region`,
        // which is declared after `registration` and so dropped after it.
        // The slice serves only as the registration's address and length:
        // the loader never reads or writes memory through the registration,
        // only through one slot's region at a time.
        let whole: &'static mut [f32] =
            unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), len) };
        // SAFETY: the registration is a field of the loader, never leaked
        // or swapped; it is dropped (with the loader) before the mapping.
        let registration = unsafe { HostRegistered::new(ctx, whole)? };
        let stream = Stream::new(ctx)?;
        let uploads = match config.step {
            Some(_) => Stream::new(ctx)?,
            None => Arc::clone(&stream),
        };
        let workers = WorkerSet::spawn(
            command,
            &config.fill,
            config.workers,
            region.raw_fd(),
            slots,
            config.batch_len,
        )?;
        let mut loader = Self {
            workers,
            step: config.step,
            ready: VecDeque::with_capacity(DEPTH),
            last_raw: None,
            stream,
            uploads,
            draining: Draining::default(),
            _registration: registration,
            region,
            ctx: Arc::clone(ctx),
            free: (0..slots).rev().collect(),
            filled: BTreeMap::new(),
            next_assign: 0,
            next_upload: 0,
            batches: config.batches,
            batch_len: config.batch_len,
            deadline: config.deadline,
            deferred: None,
            failed: None,
            error_yielded: false,
        };
        loader.pump()?;
        Ok(loader)
    }

    /// The stream the GPU step runs on and each batch's buffer is
    /// allocated on (the uploads too, without a step).
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The stream the uploads run on. With a GPU step it is a stream of its
    /// own: the copy engine uploads the next batch while the step of this
    /// one runs, instead of waiting for it (which cost 8% of the line rate
    /// on an H100 for a normalisation of 64 MiB batches). Without a step it
    /// is [`stream`](Self::stream). A slot goes back to a worker once its
    /// upload has completed on this stream.
    pub fn upload_stream(&self) -> &Arc<Stream> {
        &self.uploads
    }

    /// The workers: index and pid of each.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.workers.ids()
    }

    /// The worker holding the job of `batch` (handed out, not yet filled).
    pub fn worker_holding(&self, batch: u64) -> Option<WorkerId> {
        self.workers.holder_of(batch)
    }

    /// How many jobs (batches) have been handed to workers so far. A slot
    /// goes back to a worker only once its upload has completed, so this
    /// stays at the slot count while the first uploads wait on the GPU.
    pub fn batches_handed_out(&self) -> u64 {
        self.next_assign
    }

    /// Elements per batch.
    pub fn batch_len(&self) -> usize {
        self.batch_len
    }

    /// The next batch in order, or `None` after the last. Waits at most the
    /// deadline for it. After an error every call fails again, with
    /// [`Error::LoaderFailed`] repeating the first error's message.
    pub fn next_batch(&mut self) -> Result<Option<LoadedBatch>> {
        if let Some(first) = &self.failed {
            return Err(Error::LoaderFailed(first.clone()));
        }
        let next = match self.deferred.take() {
            Some(err) => Err(err),
            None => self.advance(),
        };
        if let Err(err) = &next {
            self.failed = Some(err.to_string());
        }
        next
    }

    fn advance(&mut self) -> Result<Option<LoadedBatch>> {
        let delivered = self.next_upload - self.ready.len() as u64;
        if delivered >= self.batches {
            return Ok(None);
        }
        let deadline = Instant::now() + self.deadline;
        loop {
            self.pump()?;
            if let Some(batch) = self.ready.pop_front() {
                // Keep three in flight behind the one handed out. The batch
                // is whole whatever happens next: a failure here is the next
                // call's error.
                if let Err(err) = self.pump() {
                    self.deferred = Some(err);
                }
                return Ok(Some(batch));
            }
            self.wait_for_progress(deadline)?;
        }
    }

    /// Everything that can be done without waiting: take the workers'
    /// reports, take back slots whose uploads have completed, hand free
    /// slots out in batch order, upload filled batches in batch order.
    fn pump(&mut self) -> Result<()> {
        while let Some(event) = self.workers.try_recv() {
            self.on_event(event)?;
        }
        let completed = self.draining.completed()?;
        self.free.extend(completed);
        while self.next_assign < self.batches {
            let Some(slot) = self.free.pop() else { break };
            let job = Job {
                slot: slot as u32,
                batch: self.next_assign,
            };
            self.workers.assign(job)?;
            self.next_assign += 1;
        }
        while self.ready.len() < DEPTH {
            let Some(slot) = self.filled.remove(&self.next_upload) else {
                break;
            };
            self.upload(slot)?;
        }
        Ok(())
    }

    fn on_event(&mut self, event: WorkerEvent) -> Result<()> {
        match event {
            WorkerEvent::Filled { worker, job } => {
                self.workers.filled(worker, job)?;
                self.filled.insert(job.batch, job.slot as usize);
                Ok(())
            }
            WorkerEvent::Gone { worker } => Err(self.workers.died(worker)),
        }
    }

    /// Block until something moves: the worker holding the next batch
    /// reports (until `deadline`), or, when no worker holds it because
    /// every slot waits for its upload, the oldest upload completes.
    fn wait_for_progress(&mut self, deadline: Instant) -> Result<()> {
        let wanted = self.next_upload;
        if let Some(holder) = self.workers.holder_of(wanted) {
            let left = deadline.saturating_duration_since(Instant::now());
            return match self.workers.recv(left) {
                Ok(event) => self.on_event(event),
                Err(RecvTimeoutError::Timeout) => Err(Error::WorkerTimeout {
                    worker: holder.index,
                    pid: holder.pid,
                    batch: wanted,
                    waited: self.deadline,
                }),
                Err(RecvTimeoutError::Disconnected) => Err(self.workers.died(holder.index)),
            };
        }
        // Every slot is behind an upload: the one deadline holds here too.
        match self.draining.wait_oldest(wanted, deadline, self.deadline)? {
            Some(slot) => {
                self.free.push(slot);
                Ok(())
            }
            None => Err(Error::InvalidConfig(format!(
                "process loader: batch {wanted} is neither filled, nor held by a worker, nor \
                 behind an upload ({} free slot(s))",
                self.free.len()
            ))),
        }
    }

    /// Upload slot `slot` (batch `next_upload`), run the step, queue the batch.
    fn upload(&mut self, slot: usize) -> Result<()> {
        let index = self.next_upload;
        // SAFETY: the slot lies in the registered (page-locked) region of
        // `ctx`, page-aligned, holding `batch_len` initialised `f32`s. Every
        // earlier upload of it has completed (a slot is handed to a worker
        // only once its region's events have, `Draining::completed` and
        // `wait_oldest`). The worker that filled it has replied and holds no
        // job for it, so nothing else touches it until the region is dropped
        // below and handed back to `draining`, which keeps the slot out of
        // use until the events it is handed have completed.
        let region = unsafe {
            PinnedRegion::from_raw_parts(
                Arc::clone(&self.ctx),
                self.region.slot_ptr(slot),
                self.batch_len,
                self.draining.owner(),
                slot as u64,
            )
        };
        let mut out = DeviceBuffer::<f32>::new_async(&self.stream, self.batch_len)?;
        match &mut self.step {
            Some(step) => {
                let mut raw = DeviceBuffer::<f32>::new_async(&self.uploads, self.batch_len)?;
                self.uploads.copy_from_host_async(&mut raw, &region)?;
                drop(region);
                // The last batch's upload is freed now that this one is on
                // the upload stream: its free waits there for the step that
                // reads it, which by the time this copy ends has long run.
                // Freed before this copy, it would hold the copy behind the
                // step, and the copy engine would idle while the step runs.
                self.last_raw = None;
                // The step's first use of `raw` on `stream` waits for the
                // upload stream's work so far, the copy above included.
                step(&self.stream, &raw, &mut out)?;
                self.last_raw = Some(raw);
            }
            None => {
                self.stream.copy_from_host_async(&mut out, &region)?;
                drop(region);
            }
        }
        self.next_upload += 1;
        self.ready.push_back(LoadedBatch { index, data: out });
        Ok(())
    }
}

impl Iterator for ProcessLoader {
    type Item = Result<LoadedBatch>;

    /// [`ProcessLoader::next_batch`], ending after the first error.
    fn next(&mut self) -> Option<Self::Item> {
        if self.error_yielded {
            return None;
        }
        let next = self.next_batch().transpose();
        self.error_yielded = matches!(next, Some(Err(_)));
        next
    }
}

impl Drop for ProcessLoader {
    fn drop(&mut self) {
        self.workers.shutdown();
        // The registration and the mapping go next (field order): no upload
        // may still read them.
        self.draining.wait_all();
    }
}

impl std::fmt::Debug for ProcessLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessLoader")
            .field("workers", &self.workers.ids())
            .field("batch_len", &self.batch_len)
            .field("slots", &self.region.slots())
            .field("next_upload", &self.next_upload)
            .field("ready", &self.ready.len())
            .finish()
    }
}
