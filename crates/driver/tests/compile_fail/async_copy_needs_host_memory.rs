// Rule 1: an asynchronous copy takes host memory only as `HostMemory`, whose
// drop waits for the copy. A `Vec` is refused: dropping it right after the
// enqueue would free memory the copy engine may still read.
use cuda_streams_driver::{Context, DeviceBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    let host = vec![1.0f32; 4];
    stream.copy_from_host_async(&mut device, &host).unwrap();
    drop(host);
}
