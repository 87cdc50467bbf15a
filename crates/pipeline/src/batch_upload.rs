//! Uploading batches key by key on persistent streams, as planned once.

use crate::error::{Error, Result};
use crate::planner::{ArraySpec, PlannerConfig, TransferPlan, plan_transfers};
use driver::{Context, DeviceBuffer, Event, PinnedBuffer, Stream};
use std::fmt;
use std::sync::Arc;

struct Key {
    spec: ArraySpec,
    stream: usize,
    staging: PinnedBuffer<u8>,
    device: DeviceBuffer<u8>,
    /// Recorded after the key's upload.
    ready: Event,
    /// The streams that waited for the latest upload ([`BatchUploader::wait_key`]):
    /// they may still read `device`, so the next upload waits for them.
    consumers: Vec<Arc<Stream>>,
}

/// Uploads batches of named arrays: one stacked copy per key from pinned
/// staging, each key on the stream the plan assigned it.
///
/// Everything per-batch was decided in [`new`](Self::new): the
/// [`TransferPlan`] (logged once, as a `tracing` event), the streams (created once and
/// kept), the key-to-stream assignment, and the staging and device buffers.
/// [`upload_batch`](Self::upload_batch) is then a memcpy per sample into
/// staging and one `cuMemcpyHtoDAsync` per key.
///
/// What several streams buy: each key's upload is ordered only after the
/// previous upload *of that key*, and has its own ready event, so a
/// consumer can start on a key as soon as it lands
/// ([`wait_key`](Self::wait_key)) and small keys are not queued behind large
/// ones. They do **not** add bandwidth: copies in one direction share one
/// copy engine, so the batch as a whole takes as long on four streams as on
/// one.
///
/// A stream that reads a key's device buffer declares itself with
/// [`wait_key`](Self::wait_key) or [`wait_all`](Self::wait_all) before it
/// reads. The next upload of that key waits (on the GPU, through an event
/// recorded on the consumer) for everything the consumer had enqueued by then,
/// so it never overwrites a batch still being read. Reads on a stream that did
/// not wait are ordered after nothing and race with the uploads.
///
/// ```
/// use cuda_streams_pipeline::driver::Context;
/// use cuda_streams_pipeline::{ArraySpec, BatchUploader, PlannerConfig};
/// # fn main() -> cuda_streams_pipeline::Result<()> {
/// let ctx = Context::new(0)?;
/// let arrays = [ArraySpec::f32("raw", &[4, 4]), ArraySpec::f32("gt", &[2, 4, 4])];
/// let mut uploader = BatchUploader::new(&ctx, &arrays, 2, PlannerConfig::default())?;
/// assert!(!uploader.plan().use_streams); // 2 samples, 384 bytes: not worth it
/// let raw = [1u8; 64];
/// let gt = [2u8; 128];
/// uploader.upload_batch(&[("raw", &[&raw[..], &raw[..]]), ("gt", &[&gt[..], &gt[..]])])?;
/// uploader.synchronize()?;
/// assert_eq!(uploader.device_buffer("gt").unwrap().len(), 256);
/// # Ok(())
/// # }
/// ```
pub struct BatchUploader {
    plan: TransferPlan,
    streams: Vec<Arc<Stream>>,
    keys: Vec<Key>,
    batches: u64,
}

impl BatchUploader {
    /// Plan once with `config` and set up the streams and buffers; logs the
    /// decision once (a `tracing` info event).
    pub fn new(
        ctx: &Arc<Context>,
        arrays: &[ArraySpec],
        batch_size: usize,
        config: PlannerConfig,
    ) -> Result<Self> {
        if arrays.is_empty() || batch_size == 0 {
            return Err(Error::InvalidConfig(format!(
                "a batch upload needs at least one array and one sample (got {} array(s), batch size {batch_size})",
                arrays.len()
            )));
        }
        let plan = plan_transfers(arrays, batch_size, &config);
        tracing::info!("{plan}");
        let streams = (0..plan.streams)
            .map(|_| Stream::new(ctx))
            .collect::<driver::Result<Vec<_>>>()?;
        let keys = arrays
            .iter()
            .map(|spec| {
                let bytes = (spec.sample_bytes() * batch_size as u64) as usize;
                Ok(Key {
                    spec: spec.clone(),
                    stream: plan.stream_of(&spec.name).unwrap_or(0),
                    staging: PinnedBuffer::new(ctx, bytes)?,
                    device: DeviceBuffer::new(ctx, bytes)?,
                    ready: Event::plain(ctx)?,
                    consumers: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            plan,
            streams,
            keys,
            batches: 0,
        })
    }

    /// [`new`](Self::new) with the thresholds from the environment.
    pub fn from_env(ctx: &Arc<Context>, arrays: &[ArraySpec], batch_size: usize) -> Result<Self> {
        Self::new(ctx, arrays, batch_size, PlannerConfig::from_env()?)
    }

    /// Stack each key's samples into its staging buffer and upload it with
    /// one copy on its stream. Every key must be given, with `batch_size`
    /// samples of the array's sample size. Waits only when a key's staging
    /// buffer is still being read by the previous batch's upload. Each key's
    /// copy is ordered (on the GPU) after the work enqueued so far on the
    /// streams that waited for its previous upload.
    pub fn upload_batch(&mut self, batch: &[(&str, &[&[u8]])]) -> Result<()> {
        for key in &self.keys {
            let (_, samples) = batch
                .iter()
                .find(|(name, _)| *name == key.spec.name)
                .ok_or_else(|| mismatch(&key.spec.name, "missing from the batch".into()))?;
            if samples.len() != self.plan.batch_size {
                return Err(mismatch(
                    &key.spec.name,
                    format!(
                        "{} sample(s), expected {}",
                        samples.len(),
                        self.plan.batch_size
                    ),
                ));
            }
            let want = key.spec.sample_bytes() as usize;
            if let Some(bad) = samples.iter().find(|s| s.len() != want) {
                return Err(mismatch(
                    &key.spec.name,
                    format!("a sample of {} bytes, expected {want}", bad.len()),
                ));
            }
        }
        if let Some((name, _)) = batch
            .iter()
            .find(|(name, _)| !self.keys.iter().any(|k| k.spec.name == *name))
        {
            return Err(mismatch(name, "not one of the planned arrays".into()));
        }
        for key in &mut self.keys {
            let (_, samples) = batch
                .iter()
                .find(|(name, _)| *name == key.spec.name)
                .expect("checked above");
            let staging = key.staging.as_mut_slice()?;
            for (chunk, sample) in staging.chunks_exact_mut(sample_len(samples)).zip(*samples) {
                chunk.copy_from_slice(sample);
            }
            let stream = &self.streams[key.stream];
            // The consumers of the previous batch may still read `device`.
            for consumer in key.consumers.drain(..) {
                if consumer.id() != stream.id() {
                    stream.wait_event(&consumer.record_event()?)?;
                }
            }
            stream.copy_from_host_async(&mut key.device, &key.staging)?;
            key.ready.record(stream)?;
        }
        self.batches += 1;
        Ok(())
    }

    /// Make `consumer` wait (on the GPU) until `key`'s latest upload has
    /// landed, and declare it a reader of that upload: the next upload of
    /// `key` waits for the work enqueued on `consumer` until then.
    pub fn wait_key(&mut self, key: &str, consumer: &Arc<Stream>) -> Result<()> {
        let index = self.index_of(key)?;
        Self::consume(&mut self.keys[index], consumer)
    }

    /// [`wait_key`](Self::wait_key) for every key.
    pub fn wait_all(&mut self, consumer: &Arc<Stream>) -> Result<()> {
        for key in &mut self.keys {
            Self::consume(key, consumer)?;
        }
        Ok(())
    }

    fn consume(key: &mut Key, consumer: &Arc<Stream>) -> Result<()> {
        consumer.wait_event(&key.ready)?;
        if !key.consumers.iter().any(|c| c.id() == consumer.id()) {
            key.consumers.push(Arc::clone(consumer));
        }
        Ok(())
    }

    /// Block the host until every upload has finished.
    pub fn synchronize(&self) -> Result<()> {
        for stream in &self.streams {
            stream.synchronize()?;
        }
        Ok(())
    }

    /// The device buffer (the whole batch, stacked) of `key`.
    pub fn device_buffer(&self, key: &str) -> Option<&DeviceBuffer<u8>> {
        self.keys
            .iter()
            .find(|k| k.spec.name == key)
            .map(|k| &k.device)
    }

    /// The plan made at construction.
    pub fn plan(&self) -> &TransferPlan {
        &self.plan
    }

    /// The persistent streams, by index.
    pub fn streams(&self) -> &[Arc<Stream>] {
        &self.streams
    }

    /// The stream `key` uploads on.
    pub fn stream_of(&self, key: &str) -> Option<&Arc<Stream>> {
        self.keys
            .iter()
            .find(|k| k.spec.name == key)
            .map(|k| &self.streams[k.stream])
    }

    /// Batches uploaded so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    fn index_of(&self, key: &str) -> Result<usize> {
        self.keys
            .iter()
            .position(|k| k.spec.name == key)
            .ok_or_else(|| mismatch(key, "not one of the planned arrays".into()))
    }
}

impl fmt::Debug for BatchUploader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchUploader")
            .field("plan", &self.plan)
            .field("batches", &self.batches)
            .finish()
    }
}

fn sample_len(samples: &[&[u8]]) -> usize {
    samples.first().map_or(1, |s| s.len().max(1))
}

fn mismatch(key: &str, reason: String) -> Error {
    Error::BatchMismatch {
        key: key.to_string(),
        reason,
    }
}
