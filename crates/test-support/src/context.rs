//! The context every test starts from.

use driver::Context;
use std::sync::Arc;

/// The selected driver's device 0 (`CUDA_STREAMS_DRIVER`).
pub fn ctx() -> Arc<Context> {
    Context::new(0).expect("a context on device 0")
}
