// Rule 4: device memory is written only through `&mut`; a shared borrow
// (which the host or another reader may hold) cannot be written.
use cuda_streams_driver::{Context, DeviceBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::<u32>::new_async(&stream, 4).unwrap();
    let reader = &device;
    stream.memset_u32_async(reader, 0).unwrap();
}
