//! Helpers shared by the stream-pool tests: the generic ones from
//! `test_support`, and what only these tests need.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test file uses a different subset"
)]

use cuda_streams_stream_pool::driver::Stream;
use std::sync::Arc;

// `serial()`: a file that asserts which streams are busy runs its tests one at
// a time. On a GPU, a neighbouring test's stream or module teardown can hold
// the calling thread inside the driver until the whole device is idle, which
// would let "busy" spin kernels finish before the pool looks at them.
pub(crate) use test_support::{
    Gate, HANG, XorShift, ctx, fill, kernel, saxpy, serial, spin, spin_kernel,
};

/// Ids of a list of streams.
pub(crate) fn ids<'a>(streams: impl IntoIterator<Item = &'a Arc<Stream>>) -> Vec<u64> {
    streams.into_iter().map(|s| s.id()).collect()
}
