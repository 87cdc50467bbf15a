//! Which NCCL runs a context's collectives: the software NCCL on the software
//! driver, `libnccl.so.2` on a GPU (loaded once).

use crate::error::{Error, Result};
use driver::{Context, DriverKind};
use std::ffi::CStr;
use std::sync::OnceLock;
use sys::nccl::{Nccl, ncclComm_t, ncclResult_t};

/// The NCCL table for contexts of `kind`.
pub(crate) fn nccl(kind: DriverKind) -> Result<&'static Nccl> {
    match kind {
        DriverKind::Soft => Ok(soft_driver::nccl()),
        DriverKind::Cuda => {
            static LOADED: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
            LOADED
                .get_or_init(|| {
                    disable_nvls();
                    Nccl::load().map_err(|err| err.to_string())
                })
                .as_ref()
                .map_err(|err| Error::Load(err.clone()))
        }
    }
}

/// The NCCL table for `ctx`.
pub(crate) fn for_context(ctx: &Context) -> Result<&'static Nccl> {
    nccl(ctx.kind())
}

/// NVLink SHARP (multicast objects) stays off: set `NCCL_NVLS_ENABLE=0`
/// before NCCL first reads its environment, unless the user set it.
fn disable_nvls() {
    const VAR: &str = "NCCL_NVLS_ENABLE";
    if std::env::var_os(VAR).is_none() {
        // SAFETY: runs once, before libnccl is loaded (so NCCL cannot be
        // reading its environment); Rust code reading the environment takes
        // std's environment lock, which set_var takes too. C code on other
        // threads calling getenv at this moment could race, the hazard that
        // makes set_var unsafe: this crate's loading happens on the first
        // communicator's creation, before the collectives that start NCCL's
        // own threads.
        unsafe { std::env::set_var(VAR, "0") };
        tracing::info!("{VAR}=0 set before loading NCCL (NVLink SHARP off)");
    }
}

/// `ncclResult_t` to this crate's error, with `ncclGetLastError` as detail.
pub(crate) fn check(
    nccl: &Nccl,
    call: &'static str,
    comm: ncclComm_t,
    code: ncclResult_t,
) -> Result<()> {
    code.result().map_err(|source| {
        // SAFETY: ncclGetLastError takes any communicator (or null) and
        // returns a NUL-terminated string owned by NCCL, or null.
        let text = unsafe { (nccl.ncclGetLastError)(comm) };
        let detail = if text.is_null() {
            None
        } else {
            // SAFETY: non-null, NUL-terminated, valid until NCCL's next call.
            let text = unsafe { CStr::from_ptr(text) };
            Some(text.to_string_lossy().into_owned()).filter(|d| !d.is_empty())
        };
        Error::Nccl {
            call,
            source,
            detail,
        }
    })
}
