//! Stream capture and graphs, as a recorded list of stream operations.
//!
//! A capturing stream records what is submitted to it instead of running it;
//! `cuStreamEndCapture` turns the record into a graph, and launching the
//! instantiated graph submits the recorded operations to a stream as one
//! contiguous batch. Only single-stream capture is modelled: work on other
//! streams is not pulled into the capture (see docs/testing.md).

use crate::context::require;
use crate::errors::{code, fail, write_out};
use crate::handles::Registry;
use crate::ops::Template;
use crate::stream::resolve;
use std::ffi::c_ulonglong;
use std::sync::Arc;
use sys::{CUgraph, CUgraphExec, CUresult, CUstream, CUstreamCaptureMode};

struct Graph {
    templates: Vec<Template>,
}

static GRAPHS: Registry<Graph> = Registry::new();
static EXECS: Registry<Graph> = Registry::new();

pub(crate) unsafe extern "C" fn cuStreamBeginCapture(
    hStream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    code((|| {
        require()?;
        if mode.0 > CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if (hStream as usize) <= 2 {
            return Err(fail(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                "the legacy default stream cannot be captured",
            ));
        }
        let stream = resolve(hStream)?;
        let mut state = stream.state();
        state.fault_status()?;
        if state.capture.is_some() {
            return Err(fail(
                CUresult::CUDA_ERROR_ILLEGAL_STATE,
                format!("stream {:#x} is already capturing", stream.handle),
            ));
        }
        state.capture = Some(Vec::new());
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuStreamEndCapture(
    hStream: CUstream,
    phGraph: *mut CUgraph,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        if phGraph.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let templates = stream.state().capture.take().ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_ILLEGAL_STATE,
                format!("stream {:#x} is not capturing", stream.handle),
            )
        })?;
        let handle = GRAPHS.insert(Arc::new(Graph { templates }));
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phGraph, handle as CUgraph) }
    })())
}

pub(crate) unsafe extern "C" fn cuGraphInstantiate(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    code((|| {
        let graph = GRAPHS.get(hGraph as usize)?;
        if phGraphExec.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // An executable graph is a snapshot: later changes to (or destruction
        // of) the graph do not affect it.
        let handle = EXECS.insert(Arc::new(Graph {
            templates: graph.templates.clone(),
        }));
        // SAFETY: checked non-null; writable per the API.
        unsafe { write_out(phGraphExec, handle as CUgraphExec) }
    })())
}

pub(crate) unsafe extern "C" fn cuGraphLaunch(
    hGraphExec: CUgraphExec,
    hStream: CUstream,
) -> CUresult {
    code((|| {
        require()?;
        let exec = EXECS.get(hGraphExec as usize)?;
        resolve(hStream)?.submit(&exec.templates)
    })())
}

pub(crate) unsafe extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    code(EXECS.remove(hGraphExec as usize).map(drop))
}

pub(crate) unsafe extern "C" fn cuGraphDestroy(hGraph: CUgraph) -> CUresult {
    code(GRAPHS.remove(hGraph as usize).map(drop))
}
