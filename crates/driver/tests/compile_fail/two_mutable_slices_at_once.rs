// Rule 4 for views: two writable views of one buffer cannot coexist, even
// of disjoint ranges (no `split_at_mut` yet).
use cuda_streams_driver::{Context, DeviceBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stream, 8).unwrap();
    let mut first = device.slice_mut(0..4).unwrap();
    let mut second = device.slice_mut(4..8).unwrap();
    stream.memset_u32_async(&mut first, 1).unwrap();
    stream.memset_u32_async(&mut second, 2).unwrap();
}
