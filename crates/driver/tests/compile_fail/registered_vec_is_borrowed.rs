// A registered Vec stays borrowed while the registration lives: it cannot
// grow (and move) while a copy may still read it.
use cuda_streams_driver::{Context, DeviceBuffer, HostRegistered, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut data = vec![1.0f32; 4];
    let mut device = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
    // SAFETY: dropped below, never leaked.
    let registered = unsafe { HostRegistered::new(&ctx, &mut data) }.unwrap();
    stream.copy_from_host_async(&mut device, &registered).unwrap();
    data.push(2.0);
    drop(registered);
}
