// Programmatic dependent launch lets a kernel start before the kernel ahead
// of it has finished: only a kernel declared to call
// cudaGridDependencySynchronize first may be launched so. fill_f32's
// declaration does not say it does.
use cuda_streams_driver::{Context, Declared, DeviceBuffer, LaunchConfig, Module, Stream};
use kernels::FillF32;

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    let fill: FillF32 = module.kernel().unwrap();
    let mut out = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    let cfg = LaunchConfig::for_num_elems(4);
    // The typed launcher has no programmatic launch.
    fill.launch_programmatic(&stream, cfg, 4, 1.0, &mut out).unwrap();
    // Nor does the declared kernel under it.
    let declared = Declared::<FillF32>::new(module.function("fill_f32").unwrap());
    declared
        .launch_programmatic(&stream, cfg, &[4u64.into(), 1.0f32.into(), (&mut out).into()])
        .unwrap();
}
