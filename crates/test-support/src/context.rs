//! The context every test starts from.

use driver::Context;
use std::sync::Arc;

/// The selected driver's device 0 (`CUDA_STREAMS_DRIVER`).
pub fn ctx() -> Arc<Context> {
    Context::new(0).expect("a context on device 0")
}

/// `len` zeroed floats whose home is an idle stream of their own. A buffer
/// orders its first use on another stream after its home stream; homing it
/// on a stream of its own keeps that from ordering the work a test checks
/// the ordering of.
pub fn zeroed_elsewhere(ctx: &Arc<Context>, len: usize) -> driver::DeviceBuffer<f32> {
    let home = driver::Stream::new(ctx).expect("a stream");
    let buffer = driver::DeviceBuffer::<f32>::zeroed_async(&home, len).expect("a zeroed buffer");
    home.synchronize().expect("the zeroing");
    buffer
}
