//! The memory of one allocation node of a captured graph, as its nodes'
//! arguments see it (`graph_memory.rs` makes it; the capture keeps it).

use super::args::Kept;
use crate::features::kernel_arg::KernelArg;
use crate::ground::error::Result;
use crate::objects::memory::DeviceUse;
use crate::objects::stream::Stream;
use sys::CUdeviceptr;
use sys::signature::Scalar;

/// One allocation node's memory: where it is and which graph it is valid
/// in. It owns nothing: the graph's free node frees it.
pub(super) struct GraphAllocation {
    pub(super) ptr: CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) elem: Option<Scalar>,
    pub(super) context_id: u64,
    /// The top-level capture whose graph holds the allocation and free
    /// nodes (a [`Capture`]'s family).
    pub(super) family: u64,
}

impl DeviceUse for GraphAllocation {
    fn use_context_id(&self) -> u64 {
        self.context_id
    }
    fn use_bytes(&self) -> (u64, usize) {
        (self.ptr, self.bytes)
    }
    // Its hooks do nothing on any stream, but no one stream is its home.
    fn use_home_stream_id(&self) -> Option<u64> {
        None
    }
    // Used only by nodes of its own graph, which the graph orders; never
    // by eager work, so nothing to track.
    fn before_use(&self, _stream: &Stream) -> Result<()> {
        Ok(())
    }
    fn after_use(&self, _stream: &Stream, _write: bool) -> Result<()> {
        Ok(())
    }
}

impl Kept for GraphAllocation {
    fn as_use(&self) -> &dyn DeviceUse {
        self
    }
    fn arg(&self, writable: bool) -> KernelArg<'_> {
        KernelArg::lend_use(self, writable, self.elem, self.bytes)
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
    fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    fn graph_family(&self) -> Option<u64> {
        Some(self.family)
    }
}
