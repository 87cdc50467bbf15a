// A condition handle is valid only in the graph that made it, so a kernel's
// condition parameter takes a `Condition`, never a number that may be one,
// and a `u64` parameter never takes a `Condition`.
use cuda_streams_driver::{Capture, Condition, LaunchConfig, Stream, kernel};

kernel! {
    struct Count: fn count_while_below(counter: &mut [u32; 1], limit: u32, more: Condition);
}

kernel! {
    struct Spin: fn spin(nanoseconds: u64);
}

fn capture(count: &Count, spin: &Spin, capture: &mut Capture, stream: &Stream, more: Condition) {
    let cfg = LaunchConfig::for_num_elems(1);
    let counter = cuda_streams_driver::GraphArg::from(0u32);
    let _ = count.launch_captured(capture, stream, cfg, counter, 3, more.raw());
    let _ = spin.launch_captured(capture, stream, cfg, more);
}

fn main() {}
