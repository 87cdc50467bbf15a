//! Programmatic dependent launch: eager and captured chains of a kernel
//! that declares `cudaGridDependencySynchronize` compute what plain chains
//! compute, reach the driver as programmatic launches, and are checked by
//! the order tracker as plain launches are; a kernel that does not declare
//! the synchronisation is refused, naming it, before the driver sees it.

mod support;

use cuda_streams_driver::{
    Context, DeclaredKernel, DeviceBuffer, Error, GraphArg, LaunchConfig, Module, OrderPolicy,
    Stream, kernel,
};
use kernels::{ChainStepF32, FillF32};
use std::sync::Arc;
use support::ctx;

const N: usize = 1000;
const STEPS: usize = 200;

fn chain_step(ctx: &Arc<Context>) -> ChainStepF32 {
    Module::load(ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .kernel()
        .expect("the image declares chain_step_f32")
}

/// Launches on `stream` that reached the software driver as programmatic;
/// `None` on a GPU, which does not count them.
fn programmatic_launches(stream: &Stream) -> Option<u64> {
    (!stream.context().is_gpu())
        .then(|| soft_driver::programmatic_launches(stream.as_raw()).unwrap())
}

#[test]
fn an_eager_programmatic_chain_computes_what_a_plain_chain_does() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let step = chain_step(&ctx);
    let mut a = DeviceBuffer::from_slice(&stream, &[0.0f32; N]).unwrap();
    let mut b = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    // a -> b -> a ...: every step reads what the step before it wrote, and
    // overwrites what the step before it read. Every third launch is plain.
    for i in 0..STEPS {
        let (from, to) = if i % 2 == 0 {
            (&a, &mut b)
        } else {
            (&b, &mut a)
        };
        let to: &mut DeviceBuffer<f32> = to;
        if i % 3 == 2 {
            step.launch(&stream, cfg, N as u64, from, to).unwrap();
        } else {
            step.launch_programmatic(&stream, cfg, N as u64, from, to)
                .unwrap();
        }
    }
    assert_eq!(a.to_vec(&stream).unwrap(), vec![STEPS as f32; N]);
    assert_eq!(stream.metrics().kernel_launches, STEPS as u64);
    if let Some(count) = programmatic_launches(&stream) {
        assert_eq!(count, (STEPS - STEPS / 3) as u64);
    }
    // The untyped launch of the same kernel: its image declares the sync.
    let kernel = step.kernel().clone();
    assert!(kernel.declares_grid_dependency_sync());
    let args = [N.into(), (&a).into(), (&mut b).into()];
    stream.launch_programmatic(&kernel, cfg, &args).unwrap();
    assert_eq!(b.to_vec(&stream).unwrap(), vec![STEPS as f32 + 1.0; N]);
}

#[test]
fn a_kernel_that_does_not_declare_the_sync_is_refused_by_name() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = Module::load(&ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .function("fill_f32")
        .unwrap();
    assert!(!fill.declares_grid_dependency_sync());
    let mut out = DeviceBuffer::from_slice(&stream, &[7.0f32; N]).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let args = [N.into(), 1.0f32.into(), (&mut out).into()];
    let err = stream.launch_programmatic(&fill, cfg, &args).unwrap_err();
    assert!(matches!(err, Error::NoGridDependencySync { ref kernel } if kernel == "fill_f32"));
    assert!(
        err.to_string().contains("cudaGridDependencySynchronize"),
        "{err}"
    );
    // In a capture too.
    let out = Arc::new(out);
    let mut capture = stream.begin_capture().unwrap();
    let graph_args = [N.into(), 1.0f32.into(), GraphArg::write(&out)];
    let err = capture
        .launch_programmatic(&stream, &fill, cfg, &graph_args)
        .unwrap_err();
    assert!(matches!(err, Error::NoGridDependencySync { .. }), "{err:?}");
    drop(capture.end().unwrap());
    assert_eq!(stream.metrics().kernel_launches, 0);
    assert_eq!(out.to_vec(&stream).unwrap(), vec![7.0; N]);
}

#[test]
fn a_declaration_cannot_claim_the_sync_for_an_image_kernel_that_does_not() {
    kernel! {
        /// `fill_f32`, claimed to synchronise: its image does not say so.
        struct ClaimedFill: fn fill_f32(n: u64, value: f32, out: &mut [f32; n]);
        twin = per_grid(|_, _n, value, out| out.fill(value));
        calls cudaGridDependencySynchronize;
    }
    const { assert!(ClaimedFill::DECL.grid_dependency_sync && !FillF32::DECL.grid_dependency_sync) };
    let ctx = ctx();
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    let err = module.kernel::<ClaimedFill>().unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeclarationMismatch {
                kernel: "fill_f32",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("cudaGridDependencySynchronize"),
        "{err}"
    );
}

#[test]
fn a_captured_programmatic_chain_replays_in_order() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let step = chain_step(&ctx);
    let kernel = step.kernel();
    let a = Arc::new(DeviceBuffer::from_slice(&stream, &[0.0f32; N]).unwrap());
    let b = Arc::new(DeviceBuffer::<f32>::new_async(&stream, N).unwrap());
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let before = programmatic_launches(&stream);
    let mut capture = stream.begin_capture().unwrap();
    for i in 0..STEPS {
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        if i % 4 < 2 {
            let args = [N.into(), GraphArg::read(from), GraphArg::write(to)];
            capture
                .launch_programmatic(&stream, kernel, cfg, &args)
                .unwrap();
        } else {
            // The declaration's typed launcher, the same launch.
            let (read, write) = (GraphArg::read(from), GraphArg::write(to));
            step.launch_captured_programmatic(&mut capture, &stream, cfg, N as u64, read, write)
                .unwrap();
        }
    }
    let exec = capture.end().unwrap().instantiate().unwrap();
    if let (Some(before), Some(after)) = (before, programmatic_launches(&stream)) {
        assert_eq!(
            after - before,
            STEPS as u64,
            "captured as programmatic launches"
        );
    }
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
    }
    assert_eq!(a.to_vec(&stream).unwrap(), vec![3.0 * STEPS as f32; N]);
}

/// A chain of `steps` programmatic launches over `a` and `b`, captured.
fn captured_chain(
    stream: &Arc<Stream>,
    kernel: &cuda_streams_driver::Kernel,
    (a, b): (&Arc<DeviceBuffer<f32>>, &Arc<DeviceBuffer<f32>>),
    steps: usize,
) -> cuda_streams_driver::Graph {
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let mut capture = stream.begin_capture().unwrap();
    for i in 0..steps {
        let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
        let args = [N.into(), GraphArg::read(from), GraphArg::write(to)];
        capture
            .launch_programmatic(stream, kernel, cfg, &args)
            .unwrap();
    }
    capture.end().unwrap()
}

#[test]
fn a_programmatic_chain_takes_new_buffers_by_update() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let step = chain_step(&ctx);
    let zeros = || Arc::new(DeviceBuffer::from_slice(&stream, &[0.0f32; N]).unwrap());
    let (a, b, c, d) = (zeros(), zeros(), zeros(), zeros());
    let mut exec = captured_chain(&stream, step.kernel(), (&a, &b), 10)
        .instantiate()
        .unwrap();
    exec.launch(&stream).unwrap();
    exec.update(&captured_chain(&stream, step.kernel(), (&c, &d), 10))
        .unwrap();
    exec.launch(&stream).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(a.to_vec(&stream).unwrap(), vec![10.0; N]);
    assert_eq!(c.to_vec(&stream).unwrap(), vec![20.0; N]);
    // A chain of another length is another topology: refused.
    let err = exec
        .update(&captured_chain(&stream, step.kernel(), (&c, &d), 12))
        .unwrap_err();
    assert!(matches!(err, Error::GraphUpdate { .. }), "{err:?}");
}

#[test]
fn under_check_an_unordered_programmatic_launch_is_refused_as_a_plain_one_is() {
    let ctx = ctx();
    let before = ctx.ordering();
    ctx.set_ordering(OrderPolicy::Check).unwrap();
    let step = chain_step(&ctx);
    let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    // At home on s2, so s2's launch below makes s2 wait for nothing of s1.
    let x = DeviceBuffer::from_slice(&s2, &[1.0f32; N]).unwrap();
    s2.synchronize().unwrap();
    let mut y = DeviceBuffer::<f32>::new(&ctx, N).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    step.launch_programmatic(&s1, cfg, N as u64, &x, &mut y)
        .unwrap();
    // Programmatic on another stream, with no order between the two: the
    // attribute orders a launch after its own stream's work only.
    let err = step
        .launch_programmatic(&s2, cfg, N as u64, &x, &mut y)
        .unwrap_err();
    s1.synchronize().unwrap();
    ctx.set_ordering(before).unwrap();
    let Error::UnorderedAccess(race) = err else {
        panic!("expected an unordered access, got {err:?}");
    };
    assert_eq!(race.later.kernel.as_deref(), Some("chain_step_f32"));
    assert_eq!(race.later.argument, Some(2));
    assert_eq!(s2.metrics().kernel_launches, 0);
}

/// Set by [`the_policy_comes_from_the_environment`] for its child processes.
const CHILD: &str = "PROGRAMMATIC_LAUNCH_TEST_CHILD";

/// `CUDA_STREAMS_PDL` is read once per process, so each value is tried in a
/// process of its own: this test binary again, running
/// [`child_launches_under_the_environments_policy`].
#[test]
fn the_policy_comes_from_the_environment() {
    let exe = std::env::current_exe().unwrap();
    for value in ["off", "opt-in", "declared", "sometimes"] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "child_launches_under_the_environments_policy",
                "--ignored",
                "--nocapture",
            ])
            .env("CUDA_STREAMS_PDL", value)
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        // A child that ran no test would exit 0 too.
        assert!(
            out.status.success()
                && stdout.contains("child_launches_under_the_environments_policy ... ok"),
            "CUDA_STREAMS_PDL={value:?}: the child failed\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
#[ignore = "run in a child process by the_policy_comes_from_the_environment"]
fn child_launches_under_the_environments_policy() {
    assert!(
        std::env::var_os(CHILD).is_some(),
        "run by the_policy_comes_from_the_environment"
    );
    let value = std::env::var("CUDA_STREAMS_PDL").unwrap();
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let step = chain_step(&ctx);
    let mut a = DeviceBuffer::from_slice(&stream, &[0.0f32; N]).unwrap();
    let mut b = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let Ok(policy) = cuda_streams_driver::PdlPolicy::parse(&value) else {
        // A bad value is an error naming it, at every launch that needs it.
        let err = step.launch(&stream, cfg, N as u64, &a, &mut b).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("CUDA_STREAMS_PDL=\"{value}\" is invalid")),
            "{err}"
        );
        assert!(cuda_streams_driver::check_env().is_err());
        return;
    };
    for _ in 0..2 {
        step.launch(&stream, cfg, N as u64, &a, &mut b).unwrap();
        step.launch_programmatic(&stream, cfg, N as u64, &b, &mut a)
            .unwrap();
    }
    assert_eq!(a.to_vec(&stream).unwrap(), vec![4.0; N]);
    let expected = match policy {
        cuda_streams_driver::PdlPolicy::Off => 0,
        cuda_streams_driver::PdlPolicy::OptIn => 2,
        cuda_streams_driver::PdlPolicy::Declared => 4,
    };
    if let Some(count) = programmatic_launches(&stream) {
        assert_eq!(count, expected, "CUDA_STREAMS_PDL={value}");
    }
}
