//! `CUDA_STREAMS_POOL_SIZE`. The only test in this binary, so nothing else
//! reads the environment while it is changed.

mod support;

use cuda_streams_stream_pool::{DEFAULT_POOL_SIZE, POOL_SIZE_ENV, StreamPool};

fn set(value: Option<&str>) {
    // SAFETY: this binary's only test runs on one thread and nothing else in
    // the process reads or writes the environment meanwhile.
    unsafe {
        match value {
            Some(value) => std::env::set_var(POOL_SIZE_ENV, value),
            None => std::env::remove_var(POOL_SIZE_ENV),
        }
    }
}

#[test]
fn pool_size_comes_from_the_environment_and_bad_values_are_named() {
    let ctx = support::ctx();
    set(None);
    let pool = StreamPool::builder(&ctx)
        .size_from_env()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(
        pool.len(),
        DEFAULT_POOL_SIZE,
        "unset: the size given (default)"
    );
    let pool = StreamPool::builder(&ctx)
        .size(2)
        .size_from_env()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(pool.len(), 2);

    set(Some("3"));
    let pool = StreamPool::builder(&ctx)
        .size(2)
        .size_from_env()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(pool.len(), 3, "set: the environment wins");

    for bad in ["three", "0", "-1", "2048", ""] {
        set(Some(bad));
        let err = StreamPool::builder(&ctx)
            .size_from_env()
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "environment variable CUDA_STREAMS_POOL_SIZE={bad:?} is invalid"
            )),
            "{err}"
        );
    }
    set(None);
}
