//! An iterative solver as one graph: Jacobi sweeps of `tridiag(-1, 4, -1) x
//! = b` repeat in a WHILE node on the device until the largest change of a
//! turn falls under a tolerance; no round trip to the host per turn. Between
//! replays the tolerance, then the size, change by updating the executable
//! graph in place (no new instantiation). Each result is checked, bit for
//! bit, against a CPU reference.
//!
//! `cargo run -p cuda-streams-driver --example jacobi_while`
//! (`CUDA_STREAMS_DRIVER=soft` to run it without a GPU)

use cuda_streams_driver::{
    Context, DeviceBuffer, Graph, GraphArg, Kernel, LaunchConfig, Module, Stream,
};
// `kernels` is `cuda_streams_kernels` (this crate's dev-dependency name).
use kernels::reference;
use std::sync::Arc;

/// The buffers of one system of size n.
struct System {
    b: Arc<DeviceBuffer<f32>>,
    x: Arc<DeviceBuffer<f32>>,
    y: Arc<DeviceBuffer<f32>>,
    delta: Arc<DeviceBuffer<f32>>,
    b_host: Vec<f32>,
}

impl System {
    fn new(stream: &Arc<Stream>, n: usize) -> cuda_streams_driver::Result<Self> {
        let b_host: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.25).collect();
        let upload = |v: &[f32]| DeviceBuffer::from_slice(stream, v).map(Arc::new);
        Ok(System {
            b: upload(&b_host)?,
            x: upload(&vec![0.0; n])?,
            y: upload(&vec![0.0; n])?,
            delta: upload(&[0.0])?,
            b_host,
        })
    }

    /// What the graph computes, on the CPU: from x = 0, turns of two sweeps
    /// (x to y, y to x) while the turn's largest change is above `tol`.
    /// Returns x and the number of turns.
    fn reference(&self, tol: f32) -> (Vec<f32>, usize) {
        let n = self.b_host.len();
        let (mut x, mut y) = (vec![0.0; n], vec![0.0; n]);
        let mut turns = 0;
        loop {
            turns += 1;
            let first = reference::jacobi_sweep(&self.b_host, &x, &mut y);
            let second = reference::jacobi_sweep(&self.b_host, &y, &mut x);
            if first.max(second) <= tol {
                return (x, turns);
            }
        }
    }
}

/// Capture the solver over `system`: zero x, then WHILE (condition, 1 at
/// each launch) { delta = 0; sweep x to y; sweep y to x; condition =
/// delta > tol }.
fn capture(
    stream: &Arc<Stream>,
    sweep: &Kernel,
    set: &Kernel,
    system: &System,
    tol: f32,
) -> cuda_streams_driver::Result<Graph> {
    let n = system.x.len();
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let mut capture = stream.begin_capture()?;
    capture.memset_u8(stream, &system.x, 0)?;
    let more = capture.condition(stream, 1)?;
    capture.while_loop(stream, more, |body| {
        let s = Arc::clone(body.origin());
        body.memset_u8(&s, &system.delta, 0)?;
        for (from, to) in [(&system.x, &system.y), (&system.y, &system.x)] {
            let args = [
                GraphArg::from(n as u64),
                GraphArg::read(&system.b),
                GraphArg::read(from),
                GraphArg::write(to),
                GraphArg::write(&system.delta),
            ];
            body.launch(&s, sweep, cfg, &args)?;
        }
        let args = [GraphArg::read(&system.delta), tol.into(), more.arg()];
        body.launch(&s, set, LaunchConfig::for_num_elems(1), &args)
    })?;
    capture.end()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let stream = Stream::new(&ctx)?;
    let solver = Module::load(&ctx, &kernels::SOLVER)?;
    let (sweep, set) = (
        solver.function("jacobi_sweep")?,
        solver.function("set_while_f32_above")?,
    );

    let mut system = System::new(&stream, 1000)?;
    let mut exec = capture(&stream, &sweep, &set, &system, 1e-2)?.instantiate()?;
    for (n, tol) in [(1000, 1e-2), (1000, 1e-6), (4000, 1e-5)] {
        if n != system.x.len() {
            // New buffers: the update swaps them in; the old ones stay alive
            // until the replays that use them are done.
            system = System::new(&stream, n)?;
        }
        // Same shape, new arguments: updated in place.
        exec.update(&capture(&stream, &sweep, &set, &system, tol)?)?;
        exec.launch(&stream)?;
        let x = system.x.to_vec(&stream)?;
        let (expected, turns) = system.reference(tol);
        assert_eq!(
            x, expected,
            "n = {n}, tol = {tol}: the device's x is the CPU's"
        );
        println!(
            "n = {n:5}, tol = {tol:.0e}: converged in {turns} turns on the device, x matches the CPU reference"
        );
    }
    Ok(())
}
