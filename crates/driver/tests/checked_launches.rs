//! Checked launches refuse what the kernel's signature does not allow (before
//! the driver sees anything, and leaving the stream usable); unchecked ones
//! run what they are given.

mod support;

use cuda_streams_driver::sys::CUdeviceptr;
use cuda_streams_driver::sys::signature::{Access, Extent, Param, Scalar};
use cuda_streams_driver::{
    ArgKind, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Error, KernelArg, LaunchConfig, Module,
    ModuleImage, Stream, UnifiedBuffer,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// A window onto a whole buffer whose hooks count their calls before
/// forwarding them, and which names `home` as the stream its hooks may be
/// skipped on.
struct Counted<'a> {
    buffer: &'a mut DeviceBuffer<f32>,
    home: Option<u64>,
    before: AtomicUsize,
    after: AtomicUsize,
}

// SAFETY: the buffer's own memory, borrowed mutably for the window's life;
// the hooks forward to the buffer, which tracks the uses. Where `home`
// names the buffer's home stream, the buffer's hooks do nothing there, so
// skipping the window's (which only count) changes nothing for the memory.
unsafe impl DeviceMemory for Counted<'_> {
    type Elem = f32;
    fn device_ptr(&self) -> CUdeviceptr {
        self.buffer.device_ptr()
    }
    fn device_len(&self) -> usize {
        self.buffer.len()
    }
    fn context_id(&self) -> u64 {
        self.buffer.context().id()
    }
    fn before_device_use(&self, stream: &Stream) -> cuda_streams_driver::Result<()> {
        self.before.fetch_add(1, Ordering::Relaxed);
        self.buffer.before_device_use(stream)
    }
    fn after_device_use(&self, stream: &Stream, write: bool) -> cuda_streams_driver::Result<()> {
        self.after.fetch_add(1, Ordering::Relaxed);
        self.buffer.after_device_use(stream, write)
    }
    fn home_stream_id(&self) -> Option<u64> {
        self.home
    }
}

// SAFETY: it holds the buffer's only mutable borrow.
unsafe impl DeviceMemoryMut for Counted<'_> {}

#[test]
fn a_checked_launch_skips_the_hooks_only_on_the_stream_the_memory_names_as_home() {
    let ctx = ctx();
    let (home, other) = (
        Arc::new(Stream::new(&ctx).unwrap()),
        Stream::new(&ctx).unwrap(),
    );
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let mut buffer = DeviceBuffer::<f32>::zeroed_async(&home, 4).unwrap();
    assert_eq!(buffer.home_stream_id(), Some(home.id()));
    assert_eq!(
        buffer.slice(1..3).unwrap().home_stream_id(),
        Some(home.id())
    );
    let cfg = LaunchConfig::for_num_elems(4);
    // (stream, the home the window names, hook calls expected per launch)
    let cases: [(&Stream, Option<u64>, usize); 4] = [
        (&home, Some(home.id()), 0),
        (&home, None, 1),
        (&other, Some(home.id()), 1),
        (&other, None, 1),
    ];
    for (round, (stream, named, calls)) in cases.into_iter().enumerate() {
        let mut window = Counted {
            buffer: &mut buffer,
            home: named,
            before: AtomicUsize::new(0),
            after: AtomicUsize::new(0),
        };
        let value = round as f32 + 1.0;
        let args = [KernelArg::from(4u64), value.into(), (&mut window).into()];
        stream.launch(&fill, cfg, &args).unwrap();
        let counts = (window.before.into_inner(), window.after.into_inner());
        assert_eq!(counts, (calls, calls), "round {round}: (before, after)");
        // Each launch ran, after the one before it (read back on its own
        // stream, which waits for it).
        assert_eq!(buffer.to_vec(stream).unwrap(), [value; 4], "round {round}");
    }
    // The launches on the other stream were tracked by the buffer itself.
    assert_eq!(buffer.foreign_stream_count(), 1);
}
