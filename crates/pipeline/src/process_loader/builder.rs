//! Configuring a [`ProcessLoader`]: the fill, the batch size, the workers,
//! the slots, the deadline and the GPU step.

use super::command::WorkerCommand;
use super::loader::ProcessLoader;
use super::plan::{DEPTH, GpuStep, LoaderPlan};
use crate::error::{Error, Result};
use driver::{Context, DeviceBuffer, Stream};
use std::sync::Arc;
use std::time::Duration;

impl ProcessLoader {
    /// A loader whose workers run the fill named `fill` (see
    /// [`serve_if_worker`](super::serve_if_worker)) into batches of
    /// `batch_len` `f32`s.
    pub fn builder(fill: &str, batch_len: usize) -> ProcessLoaderBuilder {
        ProcessLoaderBuilder::new(fill, batch_len)
    }
}

/// Builds a [`ProcessLoader`]; made by [`ProcessLoader::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct ProcessLoaderBuilder {
    pub(super) fill: String,
    pub(super) batch_len: usize,
    pub(super) workers: usize,
    pub(super) batches: u64,
    pub(super) slots: Option<usize>,
    pub(super) deadline: Duration,
    pub(super) command: Option<WorkerCommand>,
    pub(super) step: Option<GpuStep>,
}

/// How long a wait for one batch may take by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

impl ProcessLoaderBuilder {
    pub(super) fn new(fill: &str, batch_len: usize) -> Self {
        Self {
            fill: fill.to_owned(),
            batch_len,
            workers: 2,
            batches: u64::MAX,
            slots: None,
            deadline: DEFAULT_DEADLINE,
            command: None,
            step: None,
        }
    }

    /// How many worker processes fill batches (default 2).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// How many batches the loader delivers, `0..batches` (default: no end).
    pub fn batches(mut self, batches: u64) -> Self {
        self.batches = batches;
        self
    }

    /// How many slots the shared region holds (default `2 * workers + 4`:
    /// two per worker, so none waits for its next job, and room for the
    /// three uploads in flight). At least one.
    pub fn slots(mut self, slots: usize) -> Self {
        self.slots = Some(slots);
        self
    }

    /// The longest [`ProcessLoader::next_batch`] waits for the batch it
    /// delivers (default [`DEFAULT_DEADLINE`]); past it, the error names the
    /// worker holding the batch, or, when every slot waits for its upload,
    /// the slot and the stream of the upload waited for.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The program run as each worker (default:
    /// [`WorkerCommand::current_exe`] with no arguments).
    pub fn command(mut self, command: WorkerCommand) -> Self {
        self.command = Some(command);
        self
    }

    /// The GPU step run on each uploaded batch (default: none, the batch is
    /// handed on as uploaded). For a normalisation, launch a kernel:
    /// see [`ProcessLoader`]'s example.
    pub fn gpu_step(
        mut self,
        step: impl FnMut(&Stream, &DeviceBuffer<f32>, &mut DeviceBuffer<f32>) -> driver::Result<()>
        + Send
        + 'static,
    ) -> Self {
        self.step = Some(Box::new(step));
        self
    }

    /// Map the shared region and pin it (`cuMemHostRegister`, once), create
    /// the loader's stream, start the workers and hand them their first jobs.
    pub fn build(self, ctx: &Arc<Context>) -> Result<ProcessLoader> {
        if self.batch_len == 0 {
            return Err(Error::InvalidConfig(
                "a batch of 0 elements would be empty: zero-length buffers are refused \
                 (docs/architecture.md#empty-buffers)"
                    .into(),
            ));
        }
        if self.workers == 0 {
            return Err(Error::InvalidConfig(
                "a process loader of 0 workers would fill no batch: ask for at least 1".into(),
            ));
        }
        let slots = self.slots.unwrap_or(2 * self.workers + DEPTH + 1);
        if slots == 0 {
            return Err(Error::InvalidConfig(
                "a process loader of 0 slots has nowhere to fill a batch: ask for at least 1"
                    .into(),
            ));
        }
        let command = match self.command.clone() {
            Some(command) => command,
            None => WorkerCommand::current_exe().map_err(|source| Error::LoaderIo {
                what: "finding the current executable to run as the workers".into(),
                source,
            })?,
        };
        let plan = LoaderPlan {
            fill: self.fill,
            batch_len: self.batch_len,
            workers: self.workers,
            batches: self.batches,
            deadline: self.deadline,
            step: self.step,
        };
        ProcessLoader::start(plan, ctx, slots, &command)
    }
}
