// Rule 4 for views: a view from `slice` (a shared borrow) lends the range
// for reading only; writing it needs `slice_mut`.
use cuda_streams_driver::{Context, DeviceBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::<u32>::new_async(&stream, 8).unwrap();
    let mut view = device.slice(0..4).unwrap();
    stream.memset_u32_async(&mut view, 1).unwrap();
}
