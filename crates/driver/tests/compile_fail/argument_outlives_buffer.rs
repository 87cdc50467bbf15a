// Rule 2: a kernel argument borrows its buffer, so it cannot outlive it: no
// launch can be handed a pointer to memory that is gone.
use cuda_streams_driver::{Context, DeviceBuffer, KernelArg, LaunchConfig, Module, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let fill = Module::load(&ctx, kernels::ELEMENTWISE.fatbin())
        .unwrap()
        .function("fill_f32")
        .unwrap();
    let cfg = LaunchConfig::for_num_elems(4);
    let out: KernelArg<'_>;
    {
        let mut data = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
        out = (&mut data).into();
    }
    stream
        .launch(&fill, cfg, &[4u64.into(), 1.0f32.into(), out])
        .unwrap();
}
