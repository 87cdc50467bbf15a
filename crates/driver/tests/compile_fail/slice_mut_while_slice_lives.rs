// Rule 4 for views: a writable view of a buffer excludes every other view
// of it, as `&mut [T]` does; here a read view is still in use.
use cuda_streams_driver::{Context, DeviceBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u32>::new_async(&stream, 8).unwrap();
    let reader = device.slice(0..4).unwrap();
    let mut writer = device.slice_mut(4..8).unwrap();
    stream.memset_u32_async(&mut writer, 1).unwrap();
    let mut host = [0u32; 4];
    stream.copy_to_host(&mut host, &reader).unwrap();
}
