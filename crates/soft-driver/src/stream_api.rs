//! The stream entry points.

use crate::context::{GREATEST_PRIORITY, LEAST_PRIORITY, require};
use crate::errors::{code, write_out};
use crate::handles::mint;
use crate::ops::{Action, Template};
use crate::stream::{STREAMS, Stream, resolve};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;
use sys::{CUevent, CUhostFn, CUresult, CUstream, CUstream_flags};

pub(crate) unsafe extern "C" fn cuStreamCreateWithPriority(
    phStream: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    code((|| {
        let device = require()?;
        crate::sticky_errors::check_context(device)?;
        if phStream.is_null() || flags & !CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Out-of-range priorities are clamped, as CUDA does.
        let priority = priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY);
        let handle = mint();
        let stream = Stream::spawn(handle, flags, priority, device)?;
        STREAMS.insert_at(handle, stream);
        // SAFETY: checked non-null above; writable per the API.
        unsafe { write_out(phStream, handle as CUstream) }
    })())
}

pub(crate) unsafe extern "C" fn cuStreamDestroy(hStream: CUstream) -> CUresult {
    code((|| {
        if (hStream as usize) <= 2 {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        // Returns at once; the worker finishes what is queued, then exits.
        STREAMS.remove(hStream as usize)?.close();
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuStreamQuery(hStream: CUstream) -> CUresult {
    code(resolve(hStream).and_then(|stream| stream.query()))
}

pub(crate) unsafe extern "C" fn cuStreamSynchronize(hStream: CUstream) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        let status = stream.synchronize();
        crate::memory::trim_pool_at_sync();
        status
    })())
}

pub(crate) unsafe extern "C" fn cuStreamWaitEvent(
    hStream: CUstream,
    hEvent: CUevent,
    Flags: c_uint,
) -> CUresult {
    code((|| {
        require()?;
        let stream = resolve(hStream)?;
        let event = crate::event::EVENTS.get(hEvent as usize)?;
        // CU_EVENT_WAIT_DEFAULT (0) or CU_EVENT_WAIT_EXTERNAL (1), which only
        // matters to graphs.
        if Flags > 1 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if event.shared().is_some() {
            // Another process's record cannot be an edge of this capture.
            stream.check_usable()?;
        }
        stream.submit(&[Template::Wait(event)])
    })())
}

pub(crate) unsafe extern "C" fn cuStreamGetPriority(
    hStream: CUstream,
    priority: *mut c_int,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(priority, stream.priority) }
    })())
}

pub(crate) unsafe extern "C" fn cuStreamGetFlags(
    hStream: CUstream,
    flags: *mut c_uint,
) -> CUresult {
    code((|| {
        let stream = resolve(hStream)?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(flags, stream.flags) }
    })())
}

pub(crate) unsafe extern "C" fn cuLaunchHostFunc(
    hStream: CUstream,
    fn_: CUhostFn,
    userData: *mut c_void,
) -> CUresult {
    code((|| {
        require()?;
        let stream: Arc<Stream> = resolve(hStream)?;
        let f = fn_.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        stream.submit(&[Template::Act(Action::Host {
            f,
            data: userData as usize,
        })])
    })())
}
