//! A graph's condition handle as a kernel argument: a parameter of its own
//! kind (`handle: Condition` in `kernel!`, `Param::Condition`), passed only
//! as a `Condition`, and only in a launch captured in the graph that made
//! it. Eager launches, launches in another capture, a `u64` for a condition
//! and a condition for a `u64` are each refused, naming what was refused.

mod support;

use cuda_streams_driver::sys::signature::{Param, Scalar};
use cuda_streams_driver::{
    ArgKind, Condition, Declared, DeclaredKernel, DeviceBuffer, Error, GraphArg, KernelArg,
    LaunchConfig, Module, ModuleImage, Stream, kernel,
};
use kernels::{CountWhileBelow, Spin};
use std::sync::Arc;
use support::ctx;

kernel! {
    /// `data[..n] += 1` and `++*turns`; the loop goes on while `*turns` is
    /// below `limit`. The condition comes first, and a count after it, so
    /// the declaration's parsing is tried off the end of the list.
    struct CountUp: fn count_up(more: Condition, n: u32, data: &mut [u32; n], turns: &mut [u32; 1], limit: u32);
    twin = per_grid(|_, more, _n, data, turns, limit| {
        data.iter_mut().for_each(|x| *x += 1);
        turns[0] += 1;
        cuda_streams_driver::set_conditional(more, u32::from(turns[0] < limit));
    });
}

static IMAGE: [u8; 15] = *b"condition_args\0";

/// `CountUp` from an image only the software driver loads; `None` on a GPU.
fn count_up(stream: &Stream) -> Option<CountUp> {
    if cuda_streams_driver::driver().unwrap().is_gpu() {
        eprintln!("skipped on the GPU: the image is a stand-in only the software driver loads");
        return None;
    }
    // SAFETY: the twin touches the `n` words of `data` and the one of
    // `turns` that the declaration gives it.
    let image = unsafe { ModuleImage::declared(&IMAGE, &[CountUp::DECL]) };
    Some(
        Module::load(stream.context(), image)
            .unwrap()
            .kernel()
            .unwrap(),
    )
}

/// The kernels crate's `count_while_below`, declared `handle: Condition`,
/// on either driver.
fn count_while_below(stream: &Stream) -> CountWhileBelow {
    Module::load(stream.context(), &kernels::SOLVER)
        .unwrap()
        .kernel()
        .unwrap()
}

const ONE: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

#[test]
fn the_declaration_says_condition_and_the_twin_gets_the_handle() {
    assert_eq!(CountUp::DECL.params[0], Param::Condition);
    assert_eq!(CountWhileBelow::DECL.params[2], Param::Condition);
    let stream = Stream::new(&ctx()).unwrap();
    let Some(count) = count_up(&stream) else {
        return;
    };
    const N: u32 = 8;
    let data = Arc::new(DeviceBuffer::from_slice(&stream, &[0u32; N as usize]).unwrap());
    let turns = Arc::new(DeviceBuffer::<u32>::new_async(&stream, 1).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &turns, 0).unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    capture
        .while_loop(&stream, more, |body| {
            let origin = Arc::clone(body.origin());
            let (data, turns) = (GraphArg::write(&data), GraphArg::write(&turns));
            count.launch_captured(body, &origin, ONE, more, N, data, turns, 6)
        })
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(turns.to_vec(&stream).unwrap(), [6], "six turns");
    assert_eq!(data.to_vec(&stream).unwrap(), [6; N as usize]);
    // The condition is 1 again at the next launch: six more turns.
    exec.launch(&stream).unwrap();
    assert_eq!(data.to_vec(&stream).unwrap(), [12; N as usize]);
}

#[test]
fn a_declared_kernel_runs_a_while_loop_in_a_capture() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let count = count_while_below(&stream);
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    capture.memset_u8(&stream, &counter, 0).unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    capture
        .while_loop(&stream, more, |body| {
            let origin = Arc::clone(body.origin());
            count.launch_captured(body, &origin, ONE, GraphArg::write(&counter), 37, more)
        })
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    for _ in 0..2 {
        exec.launch(&stream).unwrap();
        assert_eq!(counter.to_vec(&stream).unwrap(), [37]);
    }
}

/// The error of an eager launch with a condition as argument `index`.
fn assert_eager_refusal(err: &Error, kernel: &str, index: usize) {
    let text = err.to_string();
    assert!(matches!(err, Error::Conditional { .. }), "{err:?}");
    assert!(
        text.contains(&format!(
            "kernel `{kernel}` takes a graph condition as argument {index}"
        )),
        "{text}"
    );
}

#[test]
fn an_eager_launch_with_a_condition_is_refused_naming_the_kernel_and_argument() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let count = count_while_below(&stream);
    let (origin, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut capture = origin.begin_capture().unwrap();
    let more = capture.condition(&origin, 1).unwrap();
    let mut counter = DeviceBuffer::<u32>::zeroed_async(&other, 1).unwrap();
    fn args(counter: &mut DeviceBuffer<u32>, more: Condition) -> [KernelArg<'_>; 3] {
        [KernelArg::from(counter), 5u32.into(), more.into()]
    }
    let err = other
        .launch(count.kernel(), ONE, &args(&mut counter, more))
        .unwrap_err();
    assert_eager_refusal(&err, "count_while_below", 2);
    // The typed path under the macro's launchers refuses it too.
    let declared = Declared::<CountWhileBelow>::new(count.kernel().clone());
    let err = declared
        .launch(&other, ONE, &args(&mut counter, more))
        .unwrap_err();
    assert_eager_refusal(&err, "count_while_below", 2);
    // And so does the unchecked launch: a handle outside its graph is no
    // contract a caller can keep.
    // SAFETY: the arguments are the kernel's parameters; refused before
    // the driver sees them.
    let err = unsafe { other.launch_unchecked(count.kernel(), ONE, &args(&mut counter, more)) }
        .unwrap_err();
    assert_eager_refusal(&err, "count_while_below", 2);
    assert_eq!(counter.to_vec(&other).unwrap(), [0], "nothing ran");
    capture.end().unwrap();
}

/// The error of a launch in capture `used` with a condition of `made`.
fn assert_foreign(err: &Error, made: u64, used: u64, condition: Condition) {
    let text = err.to_string();
    assert!(matches!(err, Error::Conditional { .. }), "{err:?}");
    assert!(
        text.contains(&format!(
            "condition {:#x} belongs to the graph of capture {made}, not to that of capture \
             {used} where kernel `count_while_below` is captured",
            condition.raw()
        )),
        "{text}"
    );
}

#[test]
fn a_condition_of_another_capture_is_refused_naming_both_captures() {
    let ctx = ctx();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let count = count_while_below(&a);
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let mut first = a.begin_capture().unwrap();
    let foreign = first.condition(&a, 1).unwrap();
    let mut second = b.begin_capture().unwrap();
    let (made, used) = (first.id(), second.id());

    let typed = count.launch_captured(&mut second, &b, ONE, GraphArg::write(&counter), 3, foreign);
    assert_foreign(&typed.unwrap_err(), made, used, foreign);
    let args = [GraphArg::write(&counter), 3u32.into(), foreign.arg()];
    let untyped = second.launch(&b, count.kernel(), ONE, &args);
    assert_foreign(&untyped.unwrap_err(), made, used, foreign);
    assert_eq!(second.node_count(), 0, "nothing was recorded");

    // In a body of the second capture's own loop: refused all the same.
    let own = second.condition(&b, 1).unwrap();
    let err = second
        .while_loop(&b, own, |body| {
            let origin = Arc::clone(body.origin());
            count.launch_captured(body, &origin, ONE, GraphArg::write(&counter), 3, foreign)
        })
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "condition {:#x} belongs to the graph of capture {made}",
            foreign.raw()
        )),
        "{err}"
    );
    drop(second.end());
    // The capture that made it takes it.
    first
        .while_loop(&a, foreign, |body| {
            let origin = Arc::clone(body.origin());
            count.launch_captured(body, &origin, ONE, GraphArg::write(&counter), 3, foreign)
        })
        .unwrap();
    first.end().unwrap();
}

#[test]
fn a_u64_is_no_condition_and_a_condition_is_no_u64() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let count = count_while_below(&stream);
    let spin: Spin = Module::load(&ctx, &kernels::TIMING)
        .unwrap()
        .kernel()
        .unwrap();
    let counter = Arc::new(DeviceBuffer::<u32>::new(&ctx, 1).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let more = capture.condition(&stream, 1).unwrap();
    let mismatch =
        |err: Error, kernel: &str, index: usize, expected: Param, actual: ArgKind| match &err {
            Error::ArgumentMismatch {
                kernel: k,
                index: i,
                expected: e,
                actual: a,
            } => assert_eq!(
                (k.as_str(), *i, *e, *a),
                (kernel, index, expected, actual),
                "{err}"
            ),
            _ => panic!("{err:?}"),
        };
    let u64_kind = ArgKind::Scalar(Scalar::U64);

    // A u64 where the signature has a condition: in a capture, and eagerly.
    let args = [GraphArg::write(&counter), 3u32.into(), GraphArg::from(5u64)];
    let err = capture
        .launch(&stream, count.kernel(), ONE, &args)
        .unwrap_err();
    mismatch(err, "count_while_below", 2, Param::Condition, u64_kind);
    let mut eager = DeviceBuffer::<u32>::new(&ctx, 1).unwrap();
    let args = [KernelArg::from(&mut eager), 3u32.into(), 5u64.into()];
    let err = stream.launch(count.kernel(), ONE, &args).unwrap_err();
    mismatch(err, "count_while_below", 2, Param::Condition, u64_kind);

    // A condition where the signature has a u64: spin's nanoseconds (no
    // count of a buffer, which would refuse it as no count).
    let args = [GraphArg::from(more)];
    let err = capture
        .launch(&stream, spin.kernel(), ONE, &args)
        .unwrap_err();
    let u64_param = Param::Scalar(Scalar::U64);
    mismatch(err, "spin", 0, u64_param, ArgKind::Condition);
    let err = stream
        .launch(spin.kernel(), ONE, &[KernelArg::from(more)])
        .unwrap_err();
    mismatch(err, "spin", 0, u64_param, ArgKind::Condition);
    assert_eq!(capture.node_count(), 0, "nothing was recorded");
    capture.end().unwrap();
}
