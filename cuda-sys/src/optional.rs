//! Driver entry points the workspace uses only where the driver has them.
//!
//! The generated table ([`Driver`](crate::Driver)) holds what every driver
//! the workspace supports exports, and loading fails without them. The entry
//! points here are newer: each is looked up by name in libcuda the first time
//! it is asked for, and is `None` where the library lacks it (or there is no
//! libcuda: the software driver never has them). Callers use one only with
//! handles of the real driver, whose library this is.

use crate::GreenContexts;
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
        let symbols = [("cuFuncGetParamInfo", "cuFuncGetParamInfo")];
        from_libcuda(&symbols, |resolve| {
            let address = resolve("cuFuncGetParamInfo");
            if address.is_null() {
                return Err(Vec::new());
            }
            // SAFETY: the symbol is cuda.h's `cuFuncGetParamInfo`, whose
            // signature `FuncGetParamInfo` copies; the library is never
            // unloaded, so the address stays valid.
            Ok(unsafe { std::mem::transmute::<*const c_void, FuncGetParamInfo>(address) })
        })
        .ok()
    })
}

/// The CUDA version whose driver first has every entry point of
/// [`GreenContexts`] (SM partitions), as `cuDriverGetVersion` numbers it.
pub const GREEN_CONTEXTS_SINCE: i32 = 12040;

/// The green-context entry points of libcuda, where the driver has all of
/// them; otherwise the symbols it lacks (every one when there is no libcuda).
/// Loaded once, together: a driver with some of them is treated as one
/// without, so no call can reach a missing entry point.
///
/// ```
/// let green = cuda_streams_sys::optional::green_contexts();
/// if cuda_streams_sys::Driver::load().is_err() {
///     // No libcuda here: every symbol is missing, and named.
///     assert!(green.err().unwrap().contains(&"cuGreenCtxCreate"));
/// }
/// ```
pub fn green_contexts() -> Result<&'static GreenContexts, &'static [&'static str]> {
    static RESOLVED: Loaded<GreenContexts> = OnceLock::new();
    // SAFETY: every symbol resolved is the cuda.h function of that name,
    // whose signature the generated table copies.
    load_once(&RESOLVED, &crate::GREEN_SYMBOLS, |resolve| unsafe {
        GreenContexts::from_resolver(resolve)
    })
}

/// The entry points that share device memory and events between processes
/// ([`Ipc`](crate::Ipc)), where libcuda has every one; otherwise the symbols
/// it lacks (every one when there is no libcuda). Loaded once, together, as
/// [`green_contexts`] is.
///
/// ```
/// let ipc = cuda_streams_sys::optional::ipc();
/// if cuda_streams_sys::Driver::load().is_err() {
///     // No libcuda here: every symbol is missing, and named.
///     assert!(ipc.err().unwrap().contains(&"cuMemExportToShareableHandle"));
/// }
/// ```
pub fn ipc() -> Result<&'static crate::Ipc, &'static [&'static str]> {
    static RESOLVED: Loaded<crate::Ipc> = OnceLock::new();
    // SAFETY: every symbol resolved is the cuda.h function of that name,
    // whose signature the generated table copies.
    load_once(&RESOLVED, &crate::IPC_SYMBOLS, |resolve| unsafe {
        crate::Ipc::from_resolver(resolve)
    })
}

/// The CUDA version whose driver first makes memory pools of host memory
/// (`cuMemPoolCreate` with a `CU_MEM_LOCATION_TYPE_HOST` location), as
/// `cuDriverGetVersion` numbers it. Older drivers export the entry points of
/// [`HostPools`](crate::HostPools) (CUDA 11.2) but refuse such a pool.
pub const HOST_POOLS_SINCE: i32 = 12020;

/// The entry points that make memory pools of one's own
/// ([`HostPools`](crate::HostPools)), where libcuda has every one; otherwise
/// the symbols it lacks (every one when there is no libcuda). Loaded once,
/// together, as [`green_contexts`] is. Whether the driver makes pools of
/// host memory with them is a question of its version
/// ([`HOST_POOLS_SINCE`]).
///
/// ```
/// let pools = cuda_streams_sys::optional::host_pools();
/// if cuda_streams_sys::Driver::load().is_err() {
///     // No libcuda here: every symbol is missing, and named.
///     assert!(pools.err().unwrap().contains(&"cuMemPoolCreate"));
/// }
/// ```
pub fn host_pools() -> Result<&'static crate::HostPools, &'static [&'static str]> {
    static RESOLVED: Loaded<crate::HostPools> = OnceLock::new();
    // SAFETY: every symbol resolved is the cuda.h function of that name,
    // whose signature the generated table copies.
    load_once(&RESOLVED, &crate::HOST_POOL_SYMBOLS, |resolve| unsafe {
        crate::HostPools::from_resolver(resolve)
    })
}

/// An optional table, loaded once: the table, or the symbols it lacks.
type Loaded<T> = OnceLock<Result<T, Vec<&'static str>>>;

/// The table `cell` holds, made by [`from_libcuda`] on first use.
fn load_once<T>(
    cell: &'static Loaded<T>,
    symbols: &[(&'static str, &'static str)],
    table: impl FnOnce(&dyn Fn(&str) -> *const std::ffi::c_void) -> Result<T, Vec<&'static str>>,
) -> Result<&'static T, &'static [&'static str]> {
    cell.get_or_init(|| from_libcuda(symbols, table))
        .as_ref()
        .map_err(Vec::as_slice)
}

/// One optional table of libcuda, made by `table` from a resolver of its
/// symbols; every one of `symbols` is missing when there is no libcuda.
/// The library is never unloaded, as `Driver::load` never unloads it, so
/// the addresses stay valid.
fn from_libcuda<T>(
    symbols: &[(&'static str, &'static str)],
    table: impl FnOnce(&dyn Fn(&str) -> *const std::ffi::c_void) -> Result<T, Vec<&'static str>>,
) -> Result<T, Vec<&'static str>> {
    // SAFETY: as in `Driver::load`: opening libcuda runs its initialisers,
    // which are designed to run in any process that dlopens it.
    let Ok((_, library)) = (unsafe { crate::LIBCUDA.open(crate::LIBCUDA.candidates()) }) else {
        return Err(symbols.iter().map(|&(_, symbol)| symbol).collect());
    };
    let made = table(&|symbol| crate::load::symbol_address(&library, symbol));
    std::mem::forget(library);
    made
}
