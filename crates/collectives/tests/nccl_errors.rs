//! An NCCL call that fails reaches the user as [`Error::Nccl`], naming the
//! call, NCCL's result and what `ncclGetLastError` said about it.

use cuda_streams_collectives::driver::{Context, DriverKind};
use cuda_streams_collectives::{Communicator, Error, UniqueId};
use std::time::Duration;

/// A rank that joins a communicator it has joined already: the software
/// NCCL refuses the second join at once. (Real NCCL would wait for the
/// missing rank instead, so the test runs on the software driver only.)
#[test]
fn a_failed_nccl_call_is_named_with_its_result_and_detail() {
    let ctx = Context::new(0).unwrap();
    if ctx.kind() != DriverKind::Soft {
        eprintln!("skipped: provokes a failure only the software NCCL reports at once");
        return;
    }
    let id = UniqueId::new().unwrap();
    // Rank 1 never comes: rank 0 gives up, and stays joined in NCCL's eyes.
    let timeout = Communicator::init_rank_within(&ctx, 2, &id, 0, Duration::from_millis(1));
    assert!(
        matches!(timeout, Err(Error::JoinTimeout { rank: 0, .. })),
        "{timeout:?}"
    );
    let err = Communicator::init_rank(&ctx, 2, &id, 0).unwrap_err();
    let Error::Nccl(nccl) = &err else {
        panic!("not an NCCL error: {err:?}");
    };
    assert_eq!(nccl.call(), Some("ncclCommInitRank"));
    assert_eq!(
        err.to_string(),
        "ncclCommInitRank failed: ncclInvalidUsage (5) (ncclCommInitRank: rank 0 joined this \
         communicator twice)"
    );
}
