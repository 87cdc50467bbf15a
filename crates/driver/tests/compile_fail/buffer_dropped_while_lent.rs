// Rule 2: a buffer lent to a kernel's argument list cannot be freed before
// the launch that uses it.
use cuda_streams_driver::{Context, DeviceBuffer, KernelArg, LaunchConfig, Module, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let fill = Module::load(&ctx, kernels::ELEMENTWISE.fatbin())
        .unwrap()
        .function("fill_f32")
        .unwrap();
    let cfg = LaunchConfig::for_num_elems(4);
    let mut data = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    let args = [KernelArg::from(4u64), 1.0f32.into(), (&mut data).into()];
    drop(data);
    stream.launch(&fill, cfg, &args).unwrap();
}
