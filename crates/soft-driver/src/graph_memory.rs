//! Graph memory nodes: `cuMemAllocAsync` and `cuMemFreeAsync` on a
//! capturing stream record an allocation node and a free node, as CUDA 11.4
//! and later do, and the device's graph memory backs them at launch.
//!
//! **Addresses.** The allocation's address is fixed when it is captured and
//! kept for the life of the graph and its executable instance (a
//! [`GraphAllocation`], shared by the nodes that name it). It is usable only
//! while a launch runs between the allocation's node and its free node: the
//! allocation node maps it and the free node unmaps it, so work that touches
//! it outside that span faults with an illegal address, as memcheck reports
//! on a GPU.
//!
//! **Physical memory: the reuse rule.** A launch needs its graph's
//! *footprint* (the bytes of its allocation nodes). The memory behind a
//! launch stays with the stream it was launched into, and graphs launched
//! into the same stream reuse it, since they never run at once: a stream
//! keeps the largest footprint launched into it, not the sum. Graphs
//! launched into different streams may run at once and each keep their own.
//! What every stream keeps is the graph memory *in use*
//! (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`); what is *reserved* stays at its
//! high mark until `cuDeviceGraphMemTrim` gives back what no graph still in
//! flight holds. Both count against the device's capacity.
//!
//! **Instances.** A graph with allocation nodes has at most one executable
//! instance at a time (`CUDA_ERROR_NOT_SUPPORTED` for a second, as on a
//! GPU), and each launch of an instance runs after its previous launches,
//! whatever the stream, so that two launches never share the addresses at
//! once. Conditional bodies hold no memory nodes (`conditional`).

use crate::context::require;
use crate::device::check_device;
use crate::errors::{code, fail, write_out};
use crate::handles::lock;
use crate::memory::{self, Kind};
use crate::ops::{Action, Template};
use crate::sticky_errors::Fault;
use crate::stream::Stream;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use sys::{CUdevice, CUdeviceptr, CUgraphMem_attribute, CUresult};

/// One graph's allocation: its address, kept while any node naming it lives.
pub(crate) struct GraphAllocation {
    pub(crate) base: usize,
    /// Its size rounded to the allocation granularity.
    pub(crate) rounded: usize,
    /// Set when a free node was captured for it.
    freed: AtomicBool,
}

impl Drop for GraphAllocation {
    fn drop(&mut self) {
        // The last node naming it is gone: no launch can reach it again.
        let _ = memory::free(self.base, &[Kind::Graph]);
    }
}

/// A device's graph memory, kept in its accounting (`memory`).
#[derive(Default, Debug)]
pub(crate) struct GraphStats {
    /// The largest footprint launched into each stream, by handle.
    backing: HashMap<usize, usize>,
    used_high: usize,
    pub(crate) reserved: usize,
    reserved_high: usize,
}

impl GraphStats {
    fn used(&self) -> usize {
        self.backing.values().sum()
    }

    fn note_highs(&mut self) {
        let used = self.used();
        self.reserved = self.reserved.max(used);
        self.used_high = self.used_high.max(used);
        self.reserved_high = self.reserved_high.max(self.reserved);
    }
}

/// `cuMemAllocAsync` on `stream`, which captures: a new allocation node.
///
/// # Safety
/// `out` is null or writable.
pub(crate) unsafe fn allocate_in_capture(
    out: *mut CUdeviceptr,
    size: usize,
    stream: &Arc<Stream>,
    device: i32,
) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let base = memory::allocate(size, Kind::Graph, device)?;
    let allocation = Arc::new(GraphAllocation {
        base,
        rounded: size.next_multiple_of(memory::ALIGNMENT),
        freed: AtomicBool::new(false),
    });
    {
        // Under the stream's lock: the capture cannot end in between.
        let mut state = stream.state();
        state.fault_status()?;
        let capturing = state
            .capture
            .as_mut()
            .ok_or(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
        capturing.record(&[Template::Act(Action::GraphAlloc(Arc::clone(&allocation)))])?;
        lock(&capturing.capture.graph().allocations).push(allocation);
    }
    // SAFETY: non-null; writable per the caller's contract.
    unsafe { write_out(out, base as CUdeviceptr) }
}

/// `cuMemFreeAsync` of `base` on `stream`, which captures: a free node for
/// an allocation node of the same graph.
pub(crate) fn free_in_capture(base: usize, stream: &Arc<Stream>) -> Result<(), CUresult> {
    let mut state = stream.state();
    state.fault_status()?;
    let capturing = state
        .capture
        .as_mut()
        .ok_or(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
    let allocation = lock(&capturing.capture.graph().allocations)
        .iter()
        .find(|a| a.base == base)
        .cloned()
        .ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{base:#x} was not allocated in this capture: a captured free node frees an \
                     allocation node of its own graph"
                ),
            )
        })?;
    if allocation.freed.swap(true, Ordering::AcqRel) {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("graph allocation {base:#x} already has its free node (double free)"),
        ));
    }
    capturing
        .record(&[Template::Act(Action::GraphFree(Arc::clone(&allocation)))])
        .inspect_err(|_| allocation.freed.store(false, Ordering::Release))
}

/// Run an allocation node (`mapped`) or a free node at a launch.
pub(crate) fn run_node(allocation: &GraphAllocation, mapped: bool, faulted: bool) -> Option<Fault> {
    match memory::map_graph_memory(allocation.base, mapped) {
        // A faulted stream skipped work before: its nodes may not match.
        Err(_) if faulted => None,
        Err(detail) => Some(Fault {
            code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            detail,
        }),
        Ok(()) => None,
    }
}

/// The bytes a launch of a graph with `nodes` needs (its top-level
/// allocation nodes: conditional bodies hold none).
pub(crate) fn footprint(nodes: &[crate::graph::Node]) -> usize {
    nodes
        .iter()
        .map(|node| match &node.action {
            Action::GraphAlloc(allocation) => allocation.rounded,
            _ => 0,
        })
        .sum()
}

/// A launch of a graph needing `footprint` bytes into `stream`: the stream
/// keeps at least that much (reused by the next launches into it). Fails
/// with `CUDA_ERROR_OUT_OF_MEMORY` when the device has no room for it.
pub(crate) fn launched(stream: &Stream, footprint: usize) -> Result<(), CUresult> {
    if footprint == 0 {
        return Ok(());
    }
    memory::with_graph_memory(stream.device, |graph, others, capacity| {
        let kept = graph.backing.get(&stream.handle).copied().unwrap_or(0);
        if footprint <= kept {
            return Ok(());
        }
        let used = graph.used() - kept + footprint;
        if others + graph.reserved.max(used) > capacity {
            return Err(fail(
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "a graph launch needs {footprint} bytes of graph memory on stream {:#x}: \
                     software device {} has {} of {capacity} bytes in use",
                    stream.handle,
                    stream.device,
                    others + graph.reserved
                ),
            ));
        }
        graph.backing.insert(stream.handle, footprint);
        graph.note_highs();
        Ok(())
    })
}

/// `cuDeviceGetGraphMemAttribute`.
pub(crate) unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    code((|| {
        check_device(device)?;
        require()?;
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = memory::with_graph_memory(device, |graph, _, _| {
            use CUgraphMem_attribute as A;
            match attr {
                A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => Ok(graph.used()),
                A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => Ok(graph.used_high),
                A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => Ok(graph.reserved),
                A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => Ok(graph.reserved_high),
                other => Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("graph memory attribute {} does not exist", other.0),
                )),
            }
        })?;
        // SAFETY: non-null; a `cuuint64_t` per the API.
        unsafe { write_out(value.cast::<u64>(), bytes as u64) }
    })())
}

/// `cuDeviceSetGraphMemAttribute`: only the high marks, only to 0 (which
/// sets them to the current figures, as on a GPU).
pub(crate) unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    device: CUdevice,
    attr: CUgraphMem_attribute,
    value: *mut c_void,
) -> CUresult {
    code((|| {
        check_device(device)?;
        require()?;
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; a readable `cuuint64_t` per the API.
        let new = unsafe { value.cast::<u64>().read_unaligned() };
        if new != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("a graph memory high mark can only be reset to 0, not {new}"),
            ));
        }
        memory::with_graph_memory(device, |graph, _, _| {
            use CUgraphMem_attribute as A;
            match attr {
                A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => graph.used_high = graph.used(),
                A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => graph.reserved_high = graph.reserved,
                other => {
                    return Err(fail(
                        CUresult::CUDA_ERROR_INVALID_VALUE,
                        format!("graph memory attribute {} cannot be set", other.0),
                    ));
                }
            }
            Ok(())
        })
    })())
}

/// `cuDeviceGraphMemTrim`: streams with no work in flight give their graph
/// memory back, and the reservation shrinks to what is still in use.
pub(crate) unsafe extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    code((|| {
        check_device(device)?;
        require()?;
        let streams: Vec<usize> = memory::with_graph_memory(device, |graph, _, _| {
            graph.backing.keys().copied().collect()
        });
        // Asked outside the memory lock: a stream's lock is taken first
        // elsewhere.
        let busy: Vec<usize> = streams
            .iter()
            .copied()
            .filter(|&handle| {
                crate::stream::resolve(handle as sys::CUstream).is_ok_and(|s| !s.is_idle())
            })
            .collect();
        memory::with_graph_memory(device, |graph, _, _| {
            // A stream first launched meanwhile keeps its memory too.
            graph
                .backing
                .retain(|handle, _| busy.contains(handle) || !streams.contains(handle));
            graph.reserved = graph.used();
        });
        Ok(())
    })())
}
