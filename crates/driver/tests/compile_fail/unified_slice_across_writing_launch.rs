// Rule 2: a kernel writes a buffer only when it is lent `&mut`, which no
// host slice of it can outlive.
use cuda_streams_driver::{Context, LaunchConfig, Module, Stream, UnifiedBuffer};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let fill = Module::load(&ctx, kernels::ELEMENTWISE.fatbin())
        .unwrap()
        .function("fill_f32")
        .unwrap();
    let cfg = LaunchConfig::for_num_elems(4);
    let mut unified = UnifiedBuffer::<f32>::new(&ctx, 4).unwrap();
    let slice = unified.as_slice().unwrap();
    stream
        .launch(&fill, cfg, &[4u64.into(), 1.0f32.into(), (&mut unified).into()])
        .unwrap();
    println!("{}", slice[0]);
}
