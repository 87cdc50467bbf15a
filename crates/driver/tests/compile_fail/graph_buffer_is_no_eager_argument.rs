// A graph's memory exists only while its graph replays: no eager work may
// take it, so it is no DeviceMemory and no KernelArg.
use cuda_streams_driver::{Context, KernelArg, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let scratch = capture.graph_buffer::<f32>(&stream, 4).unwrap();
    drop(capture.end());
    let _arg = KernelArg::from(&scratch);
}
