//! The software NCCL spans the threads of one process. A rank that joins
//! with a unique id made in another process is refused by it
//! (`ncclInvalidUsage`, rather than a wait for ranks it can never meet);
//! this turns that refusal into an error that says so.

use crate::error::Error;
use crate::types::UniqueId;
use driver::{Context, DriverKind};

/// `err`, a failed join of `rank` with `id` on `ctx`, as
/// [`Error::SoftNcclAcrossProcesses`] when the software NCCL refused it
/// because `id` came from another process; otherwise `err` unchanged.
pub(crate) fn explain_join_failure(ctx: &Context, id: &UniqueId, rank: usize, err: Error) -> Error {
    if ctx.kind() != DriverKind::Soft {
        return err;
    }
    match soft_driver::nccl_unique_id_process(&id.to_bytes()) {
        Some(other) if other != std::process::id() => Error::SoftNcclAcrossProcesses {
            rank,
            here: std::process::id(),
            other,
        },
        _ => err,
    }
}
