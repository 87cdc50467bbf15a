// Rule 2 for views: a view borrows its buffer, so the buffer cannot be
// dropped (freed) while the view can still be lent to the GPU.
use cuda_streams_driver::{Context, DeviceBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::<u32>::new_async(&stream, 8).unwrap();
    let view = device.slice(0..4).unwrap();
    drop(device);
    let mut host = [0u32; 4];
    stream.copy_to_host(&mut host, &view).unwrap();
}
