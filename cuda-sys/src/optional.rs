//! Driver entry points the workspace uses only where the driver has them.
//!
//! The generated table ([`Driver`](crate::Driver)) holds what every driver
//! the workspace supports exports, and loading fails without them. The entry
//! points here are newer: each is looked up by name in libcuda the first time
//! it is asked for, and is `None` where the library lacks it (or there is no
//! libcuda: the software driver never has them). Callers use one only with
//! handles of the real driver, whose library this is.

use crate::bindings::{CUfunction, CUresult};
use std::ffi::c_void;
use std::sync::OnceLock;

/// `cuFuncGetParamInfo` (CUDA 12.4 and later): the offset and size of a
/// kernel's parameter `paramIndex`; `CUDA_ERROR_INVALID_VALUE` past the last
/// one. The signature is cuda.h's:
/// `CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize)`.
pub type FuncGetParamInfo = unsafe extern "C" fn(
    func: CUfunction,
    param_index: usize,
    param_offset: *mut usize,
    param_size: *mut usize,
) -> CUresult;

/// `cuFuncGetParamInfo` from libcuda, where the driver has it.
///
/// ```
/// // On the software driver's machines there may be no libcuda at all.
/// let info = cuda_streams_sys::optional::func_get_param_info();
/// if cuda_streams_sys::Driver::load().is_err() {
///     assert!(info.is_none());
/// }
/// ```
pub fn func_get_param_info() -> Option<FuncGetParamInfo> {
    static RESOLVED: OnceLock<Option<FuncGetParamInfo>> = OnceLock::new();
    *RESOLVED.get_or_init(|| {
        // SAFETY: as in `Driver::load`: opening libcuda runs its initialisers,
        // which are designed to run in any process that dlopens it (and it is
        // already open where the driver is in use).
        let (_, library) = unsafe { crate::LIBCUDA.open(crate::LIBCUDA.candidates()) }.ok()?;
        let address = crate::load::symbol_address(&library, "cuFuncGetParamInfo");
        // Never unloaded, as `Driver::load` never unloads it.
        std::mem::forget(library);
        if address.is_null() {
            return None;
        }
        // SAFETY: the symbol is cuda.h's `cuFuncGetParamInfo`, whose signature
        // `FuncGetParamInfo` copies; the library is never unloaded, so the
        // address stays valid.
        Some(unsafe { std::mem::transmute::<*const c_void, FuncGetParamInfo>(address) })
    })
}
