//! Helpers shared by the allocator's integration tests: the context, both
//! backends, the spin and fill kernels, raw copies; the generic ones come
//! from `test_support`.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different subset"
)]

use cuda_streams_allocator::driver::sys::CUdeviceptr;
use cuda_streams_allocator::driver::{
    Context, DeviceBuffer, Kernel, KernelArg, LaunchConfig, Stream,
};
use cuda_streams_allocator::{Allocation, Backend};
use std::sync::Arc;
use std::time::Duration;

// The plain xorshift64 these tests' data was drawn from, seeded directly
// (`XorShift(seed)`).
pub(crate) use test_support::{XorShift64 as XorShift, ctx, serial};

/// Both backends (the driver pool only where the device supports pools).
pub(crate) fn backends(ctx: &Context) -> Vec<Backend> {
    let mut out = vec![Backend::Caching];
    if ctx.info().memory_pools_supported {
        out.push(Backend::driver_pool());
    } else {
        eprintln!("the device has no memory pools: Backend::DriverPool not tested");
    }
    out
}

/// True (and prints why) when the test needs the software driver.
pub(crate) fn skip_on_gpu(ctx: &Context, why: &str) -> bool {
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: {why}");
        true
    } else {
        false
    }
}

pub(crate) struct Kernels {
    spin: Kernel,
    fill: Kernel,
}

impl Kernels {
    pub(crate) fn load(ctx: &Arc<Context>) -> Self {
        Self {
            spin: test_support::spin_kernel(ctx),
            fill: test_support::kernel(ctx, &kernels::ELEMENTWISE, "fill_u32"),
        }
    }

    /// Keep `stream` busy for `time`.
    pub(crate) fn spin(&self, stream: &Stream, time: Duration) {
        test_support::spin(stream, &self.spin, time);
    }

    /// Fill `allocation` (whole u32 words) with `value` on `stream`,
    /// through a view and the checked launch.
    pub(crate) fn fill(&self, stream: &Stream, allocation: &mut Allocation, value: u32) {
        let mut words = allocation.as_device_mut::<u32>().expect("live allocation");
        let n = words.len() as u64;
        stream
            .launch(
                &self.fill,
                LaunchConfig::for_num_elems(n as u32),
                &[n.into(), value.into(), (&mut words).into()],
            )
            .expect("fill launch");
    }
}

/// Enqueue a copy of `allocation` into `dst` on `stream` with a raw driver
/// call (the result layer's), which the allocator cannot see: the tests of
/// `record_stream` and of stream dependencies declare this use themselves.
pub(crate) fn copy_out(stream: &Stream, allocation: &Allocation, dst: &DeviceBuffer<u32>) {
    assert_eq!(dst.size_in_bytes(), allocation.size());
    let src: CUdeviceptr = allocation.device_ptr().expect("live allocation");
    // SAFETY: both regions hold `size` bytes; `dst` is a cuMemAlloc buffer the
    // test keeps until it has synchronised `stream`; the allocation is freed
    // in order on its home stream after this copy, or its use on `stream` is
    // declared with record_stream.
    unsafe {
        cuda_streams_allocator::driver::result::memcpy_dtod_async(
            stream,
            dst.as_device_ptr(),
            src,
            allocation.size(),
        )
    }
    .expect("raw copy");
}
