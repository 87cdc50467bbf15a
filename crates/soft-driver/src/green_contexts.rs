//! The live green contexts and the streams made in them: what resolving the
//! current context and synchronizing it need to know of SM partitions.
//!
//! A green context's context handle stands for its device while the green
//! context lives, so the context layer asks here which device a handle that
//! is no primary context's belongs to. How green contexts are made (splits,
//! descriptors, the `cuGreenCtx*` entry points) is `green`'s business.

use crate::handles::{Registry, lock};
use std::collections::HashMap;
use std::sync::Mutex;
use sys::{CUdevice, CUgreenCtx};

/// A green context: its device, its SMs and its context handle.
pub(crate) struct Green {
    pub(crate) device: CUdevice,
    pub(crate) sms: u32,
    /// How many split outputs its descriptor was made of.
    pub(crate) groups: u32,
    pub(crate) context: usize,
}

/// Green contexts by handle.
pub(crate) static GREENS: Registry<Green> = Registry::new();
/// The green context of each stream made by `cuGreenCtxStreamCreate`.
static STREAM_GREEN: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

/// How many outputs of a split the descriptor of green context `green`
/// was made of (`None` for a handle that is no live green context): what
/// a test of how the safe layer splits a device looks at.
pub fn green_context_groups(green: CUgreenCtx) -> Option<u32> {
    GREENS.get(green as usize).ok().map(|green| green.groups)
}

/// The device of a live green context whose context handle is `ctx`.
pub(crate) fn device_of_context(ctx: usize) -> Option<CUdevice> {
    GREENS
        .all()
        .iter()
        .find(|green| green.context == ctx)
        .map(|green| green.device)
}

/// The green context (its handle) whose context handle is `ctx`, or 0 when
/// `ctx` is a primary context's (or none).
pub(crate) fn green_of_context(ctx: usize) -> usize {
    if ctx == 0 {
        return 0;
    }
    GREENS
        .entries()
        .into_iter()
        .find(|(_, green)| green.context == ctx)
        .map_or(0, |(handle, _)| handle)
}

/// Remember that stream `stream` was made in green context `green`.
pub(crate) fn note_stream(stream: usize, green: usize) {
    lock(&STREAM_GREEN)
        .get_or_insert_with(HashMap::new)
        .insert(stream, green);
}

/// The green context (its handle) stream `stream` was made in, or 0.
pub(crate) fn green_of_stream(stream: usize) -> usize {
    lock(&STREAM_GREEN)
        .as_ref()
        .and_then(|map| map.get(&stream).copied())
        .unwrap_or(0)
}
