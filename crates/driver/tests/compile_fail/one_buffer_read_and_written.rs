// Rule 2: a buffer lent to a kernel for writing cannot also be lent for
// reading, by the same launch or by anyone else, while the loan lasts.
use cuda_streams_driver::{Context, DeviceBuffer, LaunchConfig, Module, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let saxpy = Module::load(&ctx, kernels::ELEMENTWISE.fatbin())
        .unwrap()
        .function("saxpy")
        .unwrap();
    let cfg = LaunchConfig::for_num_elems(4);
    let mut data = DeviceBuffer::<f32>::zeroed_async(&stream, 4).unwrap();
    let args = [4u64.into(), 2.0f32.into(), (&data).into(), (&mut data).into()];
    stream.launch(&saxpy, cfg, &args).unwrap();
}
