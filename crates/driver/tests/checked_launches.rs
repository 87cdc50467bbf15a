//! Checked launches refuse what the kernel's signature does not allow (before
//! the driver sees anything, and leaving the stream usable); unchecked ones
//! run what they are given.

mod support;

use cuda_streams_driver::sys::signature::{Access, Extent, Param, Scalar};
use cuda_streams_driver::{
    ArgKind, DeviceBuffer, Error, KernelArg, LaunchConfig, Module, ModuleImage, Stream,
    UnifiedBuffer,
};
use support::{ctx, kernel};

const N: usize = 1000;

#[test]
fn a_buffer_shorter_than_the_count_is_refused_and_nothing_runs() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut out = DeviceBuffer::from_slice(&stream, &[7.0f32; N]).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32 + 1);
    let args = [
        KernelArg::from(N as u64 + 1),
        1.0f32.into(),
        (&mut out).into(),
    ];
    let err = stream.launch(&fill, cfg, &args).unwrap_err();
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
    // In elements only: no bytes in the same sentence.
    assert!(
        err.to_string().ends_with(
            "touches 1001 element(s) of f32 but the buffer holds 1000 element(s) of f32"
        ),
        "{err}"
    );
    // A count that overflows when turned into bytes is refused too.
    let args = [KernelArg::from(u64::MAX), 1.0f32.into(), (&mut out).into()];
    assert!(matches!(
        stream.launch(&fill, cfg, &args),
        Err(Error::ArgumentTooShort { .. })
    ));
    assert_eq!(stream.metrics().kernel_launches, 0);
    // The stream is still usable, and nothing was written.
    let args = [KernelArg::from(N as u64), 2.0f32.into(), (&mut out).into()];
    stream.launch(&fill, cfg, &args).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![2.0; N]);
}

#[test]
fn a_shorter_count_touches_only_that_prefix() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let mut out = DeviceBuffer::from_slice(&stream, &[7u32; N]).unwrap();
    let args = [KernelArg::from(10u64), 1u32.into(), (&mut out).into()];
    stream
        .launch(&fill, LaunchConfig::for_num_elems(10), &args)
        .unwrap();
    let back = out.to_vec(&stream).unwrap();
    assert!(back[..10].iter().all(|&v| v == 1));
    assert!(back[10..].iter().all(|&v| v == 7));
}

#[test]
fn wrong_element_types_and_read_only_loans_are_refused() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let cfg = LaunchConfig::for_num_elems(N as u32);
    // A u32 buffer where the kernel takes f32*.
    let mut words = DeviceBuffer::<u32>::new_async(&stream, N).unwrap();
    let args = [
        KernelArg::from(N as u64),
        1.0f32.into(),
        (&mut words).into(),
    ];
    let err = stream.launch(&fill, cfg, &args).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentMismatch {
                index: 2,
                actual: ArgKind::Buffer {
                    elem: Some(Scalar::U32),
                    writable: true
                },
                ..
            }
        ),
        "{err:?}"
    );
    // A shared borrow of a unified buffer where the kernel writes: a host
    // slice could be alive, so it is refused.
    let unified = UnifiedBuffer::<f32>::new(&ctx, N).unwrap();
    let view = unified.as_slice().unwrap();
    let args = [KernelArg::from(N as u64), 1.0f32.into(), (&unified).into()];
    let err = stream.launch(&fill, cfg, &args).unwrap_err();
    assert!(err.to_string().contains("lent as &"), "{err}");
    assert!(
        view.iter().all(|&v| v == 0.0),
        "nothing wrote behind the slice"
    );
    // A scalar where a buffer goes, and a buffer where a scalar goes.
    let args = [KernelArg::from(N as u64), 1.0f32.into(), 0u64.into()];
    assert!(matches!(
        stream.launch(&fill, cfg, &args),
        Err(Error::ArgumentMismatch { index: 2, .. })
    ));
    let mut out = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    let other = DeviceBuffer::<f32>::new_async(&stream, N).unwrap();
    let args = [KernelArg::from(&other), 1.0f32.into(), (&mut out).into()];
    assert!(matches!(
        stream.launch(&fill, cfg, &args),
        Err(Error::ArgumentMismatch { index: 0, .. })
    ));
    assert_eq!(stream.metrics().kernel_launches, 0);
}

#[test]
fn raw_pointers_need_the_unchecked_launch() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let out = DeviceBuffer::<u32>::new_async(&stream, N).unwrap();
    let cfg = LaunchConfig::for_num_elems(N as u32);
    // SAFETY: the buffer outlives the launch (it is synchronized below).
    let raw = unsafe { KernelArg::raw_pointer(out.as_device_ptr()) };
    let args = [KernelArg::from(N as u64), 5u32.into(), raw];
    let err = stream.launch(&fill, cfg, &args).unwrap_err();
    assert!(err.to_string().contains("a raw pointer"), "{err}");
    assert_eq!(stream.metrics().kernel_launches, 0);
    // SAFETY: fill_u32(n, value, out) with a buffer of n u32s that outlives
    // the kernel (synchronized before it is read or dropped).
    unsafe { stream.launch_unchecked(&fill, cfg, &args) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![5; N]);
}

#[test]
fn a_registered_signature_comes_with_the_function() {
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!(
            "skipped on the GPU: the image below is a stand-in only the software driver loads"
        );
        return;
    }
    static IMAGE: [u8; 11] = *b"registered\0";
    fn nothing(_: &soft_driver::LaunchDims, _: &mut soft_driver::TwinArgs<'_>) {}
    const PARAMS: &[Param] = &[Param::Pointer {
        elem: Scalar::U32,
        access: Access::Write,
        extent: Extent::Elements(1),
    }];
    static KERNELS: &[cuda_streams_driver::KernelDecl] = &[cuda_streams_driver::KernelDecl {
        name: "nothing",
        params: PARAMS,
        twin: Some(nothing),
        grid_dependency_sync: false,
    }];
    // SAFETY: `nothing` touches none of the one u32 it may write.
    let image = unsafe { ModuleImage::declared(&IMAGE, KERNELS) };
    let stream = Stream::new(&ctx).unwrap();
    let kernel = Module::load(&ctx, image)
        .unwrap()
        .function("nothing")
        .unwrap();
    assert_eq!(kernel.signature(), Some(PARAMS));
    let mut one = DeviceBuffer::<u32>::new_async(&stream, 1).unwrap();
    let cfg = LaunchConfig::for_num_elems(1);
    stream.launch(&kernel, cfg, &[(&mut one).into()]).unwrap();
    let err = stream.launch(&kernel, cfg, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentCount {
                expected: 1,
                actual: 0,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn declared_signatures_are_validated() {
    let ctx = ctx();
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    let fill = module.function("fill_f32").unwrap();
    let bad = [
        Param::Scalar(Scalar::F32),
        Param::Pointer {
            elem: Scalar::F32,
            access: Access::Write,
            extent: Extent::Arg(0),
        },
    ];
    // SAFETY: refused before use (the extent names a float).
    let err = unsafe { fill.clone().with_signature(&bad) }.unwrap_err();
    assert!(matches!(err, Error::InvalidSignature { .. }), "{err:?}");
    assert!(err.to_string().contains("fill_f32"), "{err}");
}
