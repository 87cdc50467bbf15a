//! Pinned staging memory for uploads from plain slices, reused by type and length.

use crate::error::{Error, Result};
use driver::{Context, DeviceCopy, PinnedBuffer};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// How many free staging buffers of one (type, length) are kept.
const KEEP_PER_SHAPE: usize = 4;

/// One staging buffer, typed at run time.
pub(crate) struct Staged {
    key: (TypeId, usize),
    buffer: Box<dyn Any + Send + Sync>,
}

impl Staged {
    pub(crate) fn buffer<T: DeviceCopy>(&self) -> Result<&PinnedBuffer<T>> {
        self.buffer
            .downcast_ref::<PinnedBuffer<T>>()
            .ok_or_else(|| Error::InvalidConfig("staging buffer of the wrong type".into()))
    }

    pub(crate) fn buffer_mut<T: DeviceCopy>(&mut self) -> Result<&mut PinnedBuffer<T>> {
        self.buffer
            .downcast_mut::<PinnedBuffer<T>>()
            .ok_or_else(|| Error::InvalidConfig("staging buffer of the wrong type".into()))
    }
}

/// Free staging buffers. A buffer comes back only once the copy reading it
/// has finished, so reusing one never waits.
#[derive(Default)]
pub(crate) struct StagingPool {
    free: HashMap<(TypeId, usize), Vec<Staged>>,
}

impl StagingPool {
    pub(crate) fn take<T: DeviceCopy>(&mut self, ctx: &Arc<Context>, len: usize) -> Result<Staged> {
        let key = (TypeId::of::<T>(), len);
        if let Some(staged) = self.free.get_mut(&key).and_then(Vec::pop) {
            return Ok(staged);
        }
        Ok(Staged {
            key,
            buffer: Box::new(PinnedBuffer::<T>::new(ctx, len)?),
        })
    }

    pub(crate) fn give_back(&mut self, staged: Staged) {
        let shelf = self.free.entry(staged.key).or_default();
        if shelf.len() < KEEP_PER_SHAPE {
            shelf.push(staged);
        }
    }
}
