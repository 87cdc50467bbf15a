// Rule 3: declaring a kernel's signature is a promise only the caller can
// keep (checked launches trust it).
use cuda_streams_driver::sys::signature::{Param, Scalar};
use cuda_streams_driver::{Context, Module};

fn main() {
    let ctx = Context::new(0).unwrap();
    let spin = Module::load(&ctx, kernels::TIMING.fatbin())
        .unwrap()
        .function("spin")
        .unwrap();
    let _spin = spin.with_signature(&[Param::Scalar(Scalar::U64)]).unwrap();
}
