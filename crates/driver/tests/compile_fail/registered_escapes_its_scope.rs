// A scope's registration cannot leave the scope: past it the memory is
// unregistered and the borrow over, so no copy may use it.
use cuda_streams_driver::{Context, HostRegistered};

fn main() {
    let ctx = Context::new(0).unwrap();
    let mut data = vec![1u32; 4];
    let mut kept = None;
    HostRegistered::scope(&ctx, &mut data, |registered| {
        kept = Some(registered);
    })
    .unwrap();
    drop(kept);
}
