//! A checked launch trusts the signature its image declared when it was
//! loaded, and nothing else: no later registration can change it, and a
//! declaration that cannot be checked is refused at load with an error
//! naming the parameter, instead of a panic at the first launch.
//!
//! The attack these tests keep out: re-registering `fill_f32`'s twin with an
//! extent of one element used to change the signature `Module::function`
//! attached, so a checked `Stream::launch` wrote 512 floats into a buffer of
//! one. Registering is now an `unsafe fn` (safe code cannot even try:
//! `tests/compile_fail/register_image_needs_unsafe.rs`), and even an unsafe
//! caller cannot change a kernel's signature once it is registered.

mod support;

use cuda_streams_driver::sys::signature::{Access, Extent, Param, Scalar};
use cuda_streams_driver::{
    DeviceBuffer, Error, KernelArg, KernelDecl, LaunchConfig, LaunchDims, Module, ModuleImage,
    Stream, TwinSpec,
};
use std::ffi::c_void;
use std::sync::Arc;
use support::ctx;

/// `fill_f32(u64 n, f32 value, f32* out)` as the attack declared it: `out`
/// one element long whatever `n` says.
const ONE_ELEMENT: &[Param] = &[
    Param::Scalar(Scalar::U64),
    Param::Scalar(Scalar::F32),
    Param::Pointer {
        elem: Scalar::F32,
        access: Access::Write,
        extent: Extent::Elements(1),
    },
];

/// A checked launch of `fill_f32` over `n` elements into a buffer of one
/// `7.0`: refused, naming the sizes, with the buffer untouched.
fn fill_512_into_one(module: &Arc<Module>, stream: &Arc<Stream>) {
    let fill = module.function("fill_f32").unwrap();
    assert_eq!(
        fill.signature(),
        kernels::ELEMENTWISE.signature("fill_f32"),
        "the declared signature, not the attacker's"
    );
    let mut one = DeviceBuffer::from_slice(stream, &[7.0f32]).unwrap();
    let cfg = LaunchConfig::for_num_elems(512);
    let args = [KernelArg::from(512u64), 1.0f32.into(), (&mut one).into()];
    let err = stream.launch(&fill, cfg, &args).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentTooShort {
                index: 2,
                elements: 512,
                elem: Scalar::F32,
                bytes: 4,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("fill_f32")
            && message.contains("touches 512 element(s) of f32")
            && message.contains("holds 1 element(s) of f32")
            && !message.contains("bytes"),
        "{message}"
    );
    assert_eq!(stream.metrics().kernel_launches, 0);
    assert_eq!(one.to_vec(stream).unwrap(), [7.0]);
}

#[test]
fn re_registering_fill_f32_cannot_shrink_its_signature() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let real = *kernels::ELEMENTWISE.twin("fill_f32").unwrap();
    /// A raw twin that touches nothing.
    unsafe fn untouched(_: &LaunchDims, _: *mut *mut c_void) {}
    let shrunk = TwinSpec {
        name: "fill_f32",
        params: ONE_ELEMENT,
        run: untouched,
    };
    // The attack, only possible inside `unsafe` (whose contract it breaks),
    // through the raw escape hatch: the registry is no longer where a
    // declared image's kernels come from, so it changes nothing for them.
    // SAFETY: none: the parameters are not fill_f32's; nothing loads these
    // bytes through the registry in this test.
    unsafe { soft_driver::register_image(kernels::ELEMENTWISE.fatbin(), &[shrunk]) }.unwrap();
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    fill_512_into_one(&module, &stream);
    assert_ne!(real.params, ONE_ELEMENT);
}

#[test]
fn a_checked_fill_f32_into_one_float_is_refused_with_the_sizes() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    fill_512_into_one(&module, &stream);
    // The same kernel with a buffer of 512 runs.
    let fill = module.function("fill_f32").unwrap();
    let mut out = DeviceBuffer::<f32>::new_async(&stream, 512).unwrap();
    let cfg = LaunchConfig::for_num_elems(512);
    let args = [KernelArg::from(512u64), 1.0f32.into(), (&mut out).into()];
    stream.launch(&fill, cfg, &args).unwrap();
    assert_eq!(out.to_vec(&stream).unwrap(), vec![1.0; 512]);
}

/// Twin of a kernel that does nothing, for the stand-in images below.
unsafe fn nothing(_: &LaunchDims, _: *mut *mut c_void) {}

#[test]
fn registered_twins_give_bare_bytes_no_signature() {
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!(
            "skipped on the GPU: the image below is a stand-in only the software driver loads"
        );
        return;
    }
    static IMAGE: [u8; 5] = *b"bare\0";
    // SAFETY: `nothing` touches none of the element it may write.
    unsafe {
        soft_driver::register_image(
            &IMAGE,
            &[TwinSpec {
                name: "fill",
                params: &ONE_ELEMENT[2..],
                run: nothing,
            }],
        )
    }
    .unwrap();
    // The registry serves the software driver only; the safe layer asks the
    // image, and bare bytes declare nothing.
    let kernel = Module::load(&ctx, &IMAGE)
        .unwrap()
        .function("fill")
        .unwrap();
    assert_eq!(kernel.signature(), None);
    let stream = Stream::new(&ctx).unwrap();
    let mut one = DeviceBuffer::<f32>::new_async(&stream, 1).unwrap();
    let err = stream
        .launch(
            &kernel,
            LaunchConfig::for_num_elems(1),
            &[(&mut one).into()],
        )
        .unwrap_err();
    assert!(matches!(err, Error::UncheckedKernel { .. }), "{err:?}");
}

#[test]
fn an_extent_naming_a_missing_parameter_is_an_error_naming_it() {
    let ctx = ctx();
    static IMAGE: [u8; 8] = *b"extent\0\0";
    const PAST_THE_END: &[Param] = &[
        Param::Scalar(Scalar::U64),
        Param::Pointer {
            elem: Scalar::F32,
            access: Access::Write,
            extent: Extent::Arg(5),
        },
    ];
    static KERNELS: &[KernelDecl] = &[KernelDecl {
        name: "past_the_end",
        params: PAST_THE_END,
        twin: None,
        grid_dependency_sync: false,
    }];
    // SAFETY: refused at load, before any launch could trust it (and the
    // twin touches nothing).
    let image = unsafe { ModuleImage::declared(&IMAGE, KERNELS) };
    // Validated before the bytes reach either driver: the same error on a GPU.
    let err = Module::load(&ctx, image).unwrap_err();
    match &err {
        Error::InvalidSignature { kernel, source } => {
            assert_eq!(kernel, "past_the_end");
            assert_eq!(source.param, 1);
        }
        other => panic!("expected InvalidSignature, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("past_the_end")
            && message.contains("parameter 5")
            && message.contains("2 parameter(s)"),
        "{message}"
    );
}

#[test]
fn an_extent_naming_a_pointer_is_an_error_naming_it() {
    let ctx = ctx();
    static IMAGE: [u8; 8] = *b"pointer\0";
    const COUNTED_BY_A_POINTER: &[Param] = &[
        Param::Pointer {
            elem: Scalar::U32,
            access: Access::Read,
            extent: Extent::Elements(1),
        },
        Param::Pointer {
            elem: Scalar::F32,
            access: Access::Write,
            extent: Extent::Arg(0),
        },
    ];
    static KERNELS: &[KernelDecl] = &[KernelDecl {
        name: "by_pointer",
        params: COUNTED_BY_A_POINTER,
        twin: None,
        grid_dependency_sync: false,
    }];
    // SAFETY: refused at load; the twin touches nothing.
    let image = unsafe { ModuleImage::declared(&IMAGE, KERNELS) };
    let err = Module::load(&ctx, image).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSignature { kernel, .. } if kernel == "by_pointer"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("parameter 0") && message.contains("not an integer"),
        "{message}"
    );
}
