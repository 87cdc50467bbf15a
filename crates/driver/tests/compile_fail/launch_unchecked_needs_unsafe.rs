// Rule 3: a launch whose arguments are not checked against a declared
// signature is a promise only the caller can keep.
use cuda_streams_driver::{Context, LaunchConfig, Module, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let spin = Module::load(&ctx, kernels::TIMING.fatbin())
        .unwrap()
        .function("spin")
        .unwrap();
    let cfg = LaunchConfig::for_num_elems(1);
    stream.launch_unchecked(&spin, cfg, &[1u64.into()]).unwrap();
}
