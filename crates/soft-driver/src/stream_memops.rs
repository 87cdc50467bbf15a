//! Stream memory operations (`cuStreamWriteValue32`) and the device address of
//! mapped pinned memory (`cuMemHostGetDevicePointer`).
//!
//! A flag write is ordered work: it happens when the stream's worker reaches
//! it, after everything enqueued before it, and it is skipped once the stream
//! has a sticky error (a faulted GPU context writes nothing more). The write
//! is an atomic release store, so a host thread that reads the flag with an
//! acquire load also sees everything the stream did before it, as a flag in
//! mapped memory written after a kernel shows its results on a GPU.
//!
//! Pinned memory is mapped as on a 64-bit GPU with unified addressing: its
//! device pointer is its host address.

use crate::context::require;
use crate::errors::{code, fail, write_out};
use crate::memory::{Kind, check_range};
use crate::ops::{Action, Template};
use crate::stream::resolve;
use std::ffi::{c_uint, c_void};
use sys::{CUdeviceptr, CUresult, CUstream, CUstreamWriteValue_flags, cuuint32_t};

pub(crate) unsafe extern "C" fn cuStreamWriteValue32(
    stream: CUstream,
    addr: CUdeviceptr,
    value: cuuint32_t,
    flags: c_uint,
) -> CUresult {
    code((|| {
        require()?;
        let stream = resolve(stream)?;
        let known = CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER.0;
        if flags & !known != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuStreamWriteValue32: unknown flags {flags:#x}"),
            ));
        }
        let dst = addr as usize;
        if !dst.is_multiple_of(4) {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuStreamWriteValue32: address {dst:#x} is not 4-byte aligned"),
            ));
        }
        check_range(dst, 4).map_err(|why| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuStreamWriteValue32: {why}"),
            )
        })?;
        stream.submit(&[Template::Act(Action::Write32 { dst, value })])
    })())
}

pub(crate) unsafe extern "C" fn cuMemHostGetDevicePointer(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    Flags: c_uint,
) -> CUresult {
    code((|| {
        require()?;
        if Flags != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuMemHostGetDevicePointer: flags must be 0, not {Flags}"),
            ));
        }
        let host = p as usize;
        match check_range(host, 1) {
            Ok(Kind::Pinned) => {}
            Ok(_) => {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "cuMemHostGetDevicePointer: {host:#x} is device memory, not pinned host memory"
                    ),
                ));
            }
            Err(why) => {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("cuMemHostGetDevicePointer: {why}"),
                ));
            }
        }
        // SAFETY: null or writable per the API.
        unsafe { write_out(pdptr, host as CUdeviceptr) }
    })())
}
