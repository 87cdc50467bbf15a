//! What an instance of a graph with device nodes keeps for the device-side
//! sets ([`DeviceSets`]): a leaf below the instance (`exec.rs`), which
//! holds one, and the sets (`device_params.rs`), which use it, so that the
//! instance needs nothing of the sets' own code.

use crate::ground::error::Result;
use crate::objects::context::Context;
use crate::objects::memory::DeviceBuffer;
use std::sync::{Arc, Mutex};

/// What an instance of a graph with device nodes keeps for the device-side
/// sets (`device_params.rs`; the nodes are `device_update.rs`'s).
pub(super) struct DeviceSets {
    /// Read by every replay and written by every set: the order tracker
    /// sees a set and a replay as accesses to it, and the instance's drop
    /// waits for its uses.
    pub(super) token: DeviceBuffer<u8>,
    /// Whether the instance has been uploaded for the sets
    /// (`upload_for_device_sets`).
    pub(super) uploaded: Mutex<bool>,
}

impl DeviceSets {
    pub(super) fn new(ctx: &Arc<Context>) -> Result<Self> {
        Ok(Self {
            token: DeviceBuffer::new(ctx, 1)?,
            uploaded: Mutex::new(false),
        })
    }
}
