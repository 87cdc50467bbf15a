//! What a loader starts from, below both the builder that fills it in and
//! the loader that runs it: the GPU step's type, the depth of uploads kept
//! ahead, and the checked settings the builder hands over.

use driver::{DeviceBuffer, Stream};
use std::time::Duration;

/// What the GPU process runs on each uploaded batch, on the loader's
/// stream: read the raw batch (`raw`), write the batch handed on (`out`),
/// both `batch_len` elements.
pub type GpuStep = Box<
    dyn FnMut(&Stream, &DeviceBuffer<f32>, &mut DeviceBuffer<f32>) -> driver::Result<()> + Send,
>;

/// How many batches are uploaded ahead of the consumer.
pub(crate) const DEPTH: usize = 3;

/// The builder's settings, checked, as the loader's start takes them.
pub(super) struct LoaderPlan {
    pub(super) fill: String,
    pub(super) batch_len: usize,
    pub(super) workers: usize,
    pub(super) batches: u64,
    pub(super) deadline: Duration,
    pub(super) step: Option<GpuStep>,
}
