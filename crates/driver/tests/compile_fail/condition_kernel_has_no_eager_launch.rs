// A kernel that takes a graph condition runs only in the capture of the
// condition's graph: its declaration has `launch_captured`, and no launch
// on a stream.
use cuda_streams_driver::{Context, DeviceBuffer, LaunchConfig, Module, Stream};
use kernels::CountWhileBelow;

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let count: CountWhileBelow = Module::load(&ctx, &kernels::SOLVER).unwrap().kernel().unwrap();
    let mut counter = DeviceBuffer::<u32>::new(&ctx, 1).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    let cfg = LaunchConfig::for_num_elems(1);
    count.launch(&stream, cfg, &mut counter, 3, more).unwrap();
}
