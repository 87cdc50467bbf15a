//! Registered host memory (`cuMemHostRegister` / `cuMemHostUnregister`).
//!
//! Every host address is reachable by the worker threads that run copies, so
//! registering changes nothing about how copies run. What the software
//! driver keeps is the bookkeeping a GPU driver enforces, so that code which
//! would fail on a GPU fails here too: registrations cover whole pages (two
//! registrations may not share one), unregistering takes the pointer that
//! was registered, and memory from `cuMemHostAlloc` or device memory cannot
//! be registered.
//!
//! The codes are a GPU driver's: `CUDA_ERROR_INVALID_VALUE` for memory from
//! `cuMemHostAlloc` (what an H100 with CUDA 13.0 answers, though the memory
//! is page-locked already) and for device memory;
//! `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` for a range that overlaps a
//! registration, as CUDA documents for a range registered already.

use crate::context::require;
use crate::errors::{code, fail};
use crate::handles::lock;
use crate::memory::{Kind, check_range};
use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void};
use std::sync::Mutex;
use sys::CUresult;

/// The page size registrations are rounded to (a GPU driver pins pages).
const PAGE: usize = 4096;

/// Registrations by the pointer given: (first page, end of the last page).
static REGISTERED: Mutex<BTreeMap<usize, (usize, usize)>> = Mutex::new(BTreeMap::new());

pub(crate) unsafe extern "C" fn cuMemHostRegister(
    p: *mut c_void,
    bytesize: usize,
    Flags: c_uint,
) -> CUresult {
    code((|| {
        require()?;
        let known = sys::CU_MEMHOSTREGISTER_PORTABLE
            | sys::CU_MEMHOSTREGISTER_DEVICEMAP
            | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        if Flags & !known != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuMemHostRegister: unknown flags {Flags:#x}"),
            ));
        }
        let base = p as usize;
        let end = base
            .checked_add(bytesize)
            .filter(|_| base != 0 && bytesize != 0);
        let Some(end) = end else {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("cuMemHostRegister: {bytesize} bytes at {base:#x}"),
            ));
        };
        match check_range(base, 1) {
            Ok(Kind::Pinned) => {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "cuMemHostRegister: {base:#x} is pinned memory from cuMemHostAlloc, \
                         which needs no registration"
                    ),
                ));
            }
            Ok(_) => {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("cuMemHostRegister: {base:#x} is device memory"),
                ));
            }
            Err(_) => {}
        }
        let pages = (base / PAGE * PAGE, end.div_ceil(PAGE) * PAGE);
        let mut registered = lock(&REGISTERED);
        if let Some((&other, _)) = registered
            .iter()
            .find(|(_, (first, last))| *first < pages.1 && pages.0 < *last)
        {
            return Err(fail(
                CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                format!(
                    "cuMemHostRegister: {bytesize} bytes at {base:#x} share a page with the registration at {other:#x}"
                ),
            ));
        }
        registered.insert(base, pages);
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    code((|| {
        require()?;
        let base = p as usize;
        if lock(&REGISTERED).remove(&base).is_none() {
            return Err(fail(
                CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                format!("cuMemHostUnregister: nothing was registered at {base:#x}"),
            ));
        }
        Ok(())
    })())
}
