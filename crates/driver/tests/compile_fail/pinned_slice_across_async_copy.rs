// Rule 1: a copy that writes host memory takes it `&mut`, so no slice of it
// can be held while the copy is enqueued (the copy engine would write what
// the slice shows).
use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::<u32>::zeroed_async(&stream, 4).unwrap();
    let mut host = PinnedBuffer::<u32>::new(&ctx, 4).unwrap();
    let slice = host.as_slice().unwrap();
    stream.copy_to_host_async(&mut host, &device).unwrap();
    println!("{}", slice[0]);
}
