//! A declared kernel's typed launcher (`kernel!`) keeps every check of a
//! checked launch: its fast path checks the arguments against the
//! declaration only where the kernel's signature is the declaration, and
//! still refuses short buffers, buffers of another device, a kernel of
//! another signature and, under `Check`, unordered accesses.

mod support;

use cuda_streams_driver::sys::signature::Scalar;
use cuda_streams_driver::{
    Context, DeclaredKernel, DeviceBuffer, Error, LaunchConfig, Module, OrderPolicy, Stream, order,
};
use kernels::{FillF32, Saxpy};
use support::ctx;

const N: usize = 1000;

fn fill_f32(ctx: &std::sync::Arc<Context>) -> FillF32 {
    Module::load(ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .kernel()
        .expect("the image declares fill_f32")
}

#[test]
fn a_buffer_shorter_than_the_declared_count_is_refused_and_nothing_runs() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = fill_f32(&ctx);
    let mut out = DeviceBuffer::from_slice(&stream, &[7.0f32; N]).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32 + 1);
    let err = fill
        .launch(&stream, cfg, N as u64 + 1, 1.0, &mut out)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentTooShort {
                index: 2,
                elements: 1001,
                elem: Scalar::F32,
                bytes: 4000,
                ..
            }
        ),
        "{err:?}"
    );
    // A count that overflows when turned into bytes is refused too.
    let err = fill
        .launch(&stream, cfg, u64::MAX, 1.0, &mut out)
        .unwrap_err();
    assert!(matches!(err, Error::ArgumentTooShort { .. }), "{err:?}");
    // The read-only operand of saxpy is checked as well as the written one.
    let saxpy: Saxpy = Module::load(&ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .kernel()
        .unwrap();
    let short = DeviceBuffer::from_slice(&stream, &[1.0f32; N - 1]).unwrap();
    let err = saxpy
        .launch(&stream, cfg, N as u64, 2.0, &short, &mut out)
        .unwrap_err();
    assert!(
        matches!(err, Error::ArgumentTooShort { index: 2, .. }),
        "{err:?}"
    );
    assert_eq!(stream.metrics().kernel_launches, 0);
    // The stream is still usable, and nothing was written.
    assert_eq!(out.to_vec(&stream).unwrap(), vec![7.0; N]);
    fill.launch(&stream, cfg, N as u64, 2.0, &mut out).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![2.0; N]);
}

#[test]
fn a_declared_type_around_a_kernel_of_another_signature_refuses_to_launch() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    // fill_u32(u64, u32, u32*) wrapped as fill_f32(u64, f32, f32*): the
    // launcher's f32 arguments do not match the kernel's own signature.
    let wrong = FillF32::from_kernel(module.function("fill_u32").unwrap());
    let mut out = DeviceBuffer::from_slice(&stream, &[7.0f32; N]).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let err = wrong
        .launch(&stream, cfg, N as u64, 2.5, &mut out)
        .unwrap_err();
    assert!(
        matches!(err, Error::ArgumentMismatch { index: 1, .. }),
        "{err:?}"
    );
    assert_eq!(stream.metrics().kernel_launches, 0);
    assert_eq!(out.to_vec(&stream).unwrap(), vec![7.0; N]);
    // The right kernel under the same type launches.
    let right = FillF32::from_kernel(module.function("fill_f32").unwrap());
    right.launch(&stream, cfg, N as u64, 2.5, &mut out).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![2.5; N]);
}

#[test]
fn a_buffer_of_another_device_is_refused() {
    let count = Context::device_count().expect("the driver answers");
    if count < 2 {
        eprintln!("skipped: needs two devices, the driver reports {count}");
        return;
    }
    let (c0, c1) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let stream = Stream::new(&c0).unwrap();
    let fill = fill_f32(&c0);
    let other = Stream::new(&c1).unwrap();
    let mut out = DeviceBuffer::from_slice(&other, &[7.0f32; N]).unwrap();
    other.synchronize().unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let err = fill
        .launch(&stream, cfg, N as u64, 2.0, &mut out)
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err:?}");
    // The hint says where the memory lives and how to reach it from here.
    let text = err.to_string();
    assert!(
        text.contains("a stream of device 1") && text.contains("a buffer of device 0"),
        "{text}"
    );
    assert_eq!(stream.metrics().kernel_launches, 0);
    assert_eq!(out.to_vec(&other).unwrap(), vec![7.0; N]);
}

#[test]
fn a_kernel_of_another_device_is_refused_with_a_hint_to_load_it_there() {
    let count = Context::device_count().expect("the driver answers");
    if count < 2 {
        eprintln!("skipped: needs two devices, the driver reports {count}");
        return;
    }
    let (c0, c1) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let stream = Stream::new(&c0).unwrap();
    let fill_on_1 = fill_f32(&c1);
    let mut out = DeviceBuffer::from_slice(&stream, &[7.0f32; N]).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let err = fill_on_1
        .launch(&stream, cfg, N as u64, 2.0, &mut out)
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err:?}");
    // A kernel is not data: the fix is to load it on the stream's device,
    // not a peer copy.
    let text = err.to_string();
    assert!(
        text.contains("the kernel belongs to device 1")
            && text.contains("module in a context of device 0")
            && !text.contains("copy_peer_async"),
        "{text}"
    );
    assert_eq!(stream.metrics().kernel_launches, 0);
    assert_eq!(out.to_vec(&stream).unwrap(), vec![7.0; N]);
}

#[test]
fn under_check_an_unordered_declared_launch_is_refused_over_its_declared_extent() {
    let ctx = ctx();
    let before = ctx.ordering();
    ctx.set_ordering(OrderPolicy::Check).unwrap();
    let fill = fill_f32(&ctx);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut data = DeviceBuffer::<f32>::new(&ctx, 512).unwrap();
    // fill_f32 writes out[0..n]: the first 1 KiB of the buffer only.
    let half = LaunchConfig::for_num_elems(256);
    order::labelled("half", || fill.launch(&a, half, 256, 1.0, &mut data)).unwrap();
    let all = LaunchConfig::for_num_elems(512);
    let err = fill.launch(&b, all, 512, 2.0, &mut data).unwrap_err();
    a.synchronize().unwrap();
    ctx.set_ordering(before).unwrap();
    let Error::UnorderedAccess(race) = err else {
        panic!("expected an unordered access, got {err:?}");
    };
    assert_eq!(race.earlier.label.as_deref(), Some("half"));
    assert_eq!(race.overlap, 0..1024, "the declared extent, not the buffer");
    // The report names the kernel, the argument and the policy that found it.
    assert_eq!(race.later.kernel.as_deref(), Some("fill_f32"));
    assert_eq!(race.later.argument, Some(2));
    assert_eq!((race.policy, race.on_gpu), ("check", ctx.is_gpu()));
    let text = race.to_string();
    assert!(
        text.contains("kernel launch of kernel `fill_f32` through argument 2 (writes)")
            && text.contains("found by ordering policy check"),
        "{text}"
    );
    assert_eq!(
        text.contains("on a GPU this check is off unless CUDA_STREAMS_ORDERING"),
        ctx.is_gpu(),
        "{text}"
    );
    assert_eq!(b.metrics().kernel_launches, 0);
}
