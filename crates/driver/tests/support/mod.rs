//! Helpers shared by the safe-layer tests (the raw-table tests use `common/`):
//! the generic ones from `test_support`, and what only these tests need.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test file uses a different subset"
)]

use cuda_streams_driver::{DeviceBuffer, Kernel, KernelArg, LaunchConfig, Stream};
use std::time::Duration;

pub(crate) use test_support::{Gate, HANG, XorShift, ctx, kernel, serial, spin};

/// How long a [`Gate`] holds its stream at most in these tests
/// ([`Gate::close_within`]). Normally the test opens it within milliseconds;
/// under a sanitizer that makes launches behind the gate block the host, the
/// gate opens itself after this long.
pub(crate) const GATE_LIMIT: Duration = Duration::from_secs(3);

/// `checksum(n, data, out)` on `stream`; `out` must be zeroed before.
pub(crate) fn checksum(
    stream: &Stream,
    kernel: &Kernel,
    data: &DeviceBuffer<u32>,
    out: &mut DeviceBuffer<u64>,
) {
    let n = data.len() as u64;
    let args = [KernelArg::from(n), data.into(), out.into()];
    stream
        .launch(
            kernel,
            LaunchConfig::for_num_elems(data.len() as u32),
            &args,
        )
        .expect("checksum launches");
}
