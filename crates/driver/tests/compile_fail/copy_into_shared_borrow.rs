// Rule 4: a copy writes device memory only through `&mut`.
use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::<u32>::new_async(&stream, 4).unwrap();
    let host = PinnedBuffer::from_slice(&ctx, &[1u32, 2, 3, 4]).unwrap();
    stream.copy_from_host_async(&device, &host).unwrap();
}
