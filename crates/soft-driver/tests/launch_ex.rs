//! `cuLaunchKernelEx` on the software driver: the programmatic stream
//! serialization attribute is accepted and the kernel runs in stream order
//! after the work ahead of it; any other attribute is refused, naming it.

use cuda_streams_soft_driver::sys::signature::{Param, Scalar};
use cuda_streams_soft_driver::sys::{
    CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig, CUresult, CUstream,
};
use cuda_streams_soft_driver::{self as soft, LaunchDims, TwinSpec, register_image};
use std::ffi::c_void;
use std::sync::Mutex;

static IMAGE: [u8; 6] = *b"chain\0";
/// What the twins saw, in the order they ran.
static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Twin of `push(u32 value)`: appends its value.
unsafe fn push(_: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: params[0] points at a copy of the one 4-byte argument.
    let value = unsafe { *(*params).cast::<u32>() };
    SEEN.lock().unwrap().push(value);
}

fn config(stream: CUstream, attrs: &mut [CUlaunchAttribute]) -> CUlaunchConfig {
    CUlaunchConfig {
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    }
}

fn programmatic() -> CUlaunchAttribute {
    let mut attr = CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        ..Default::default()
    };
    attr.value.programmaticStreamSerializationAllowed = 1;
    attr
}

#[test]
fn a_programmatic_launch_runs_in_stream_order_and_other_attributes_are_refused() {
    let table = soft::driver();
    // SAFETY: `push` reads one u32 argument and touches no device memory.
    unsafe {
        register_image(
            &IMAGE,
            &[TwinSpec {
                name: "push",
                params: &[Param::Scalar(Scalar::U32)],
                run: push,
            }],
        )
    }
    .unwrap();
    let (mut dev, mut ctx) = (0, std::ptr::null_mut());
    let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointers; a registered image.
    unsafe {
        (table.cuDeviceGet)(&mut dev, 0).result().unwrap();
        (table.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
            .result()
            .unwrap();
        (table.cuCtxSetCurrent)(ctx).result().unwrap();
        (table.cuStreamCreateWithPriority)(&mut stream, 0, 0)
            .result()
            .unwrap();
        (table.cuModuleLoadData)(&mut module, IMAGE.as_ptr().cast())
            .result()
            .unwrap();
        (table.cuModuleGetFunction)(&mut function, module, c"push".as_ptr())
            .result()
            .unwrap();
    }
    for value in 0..100u32 {
        let mut value = value;
        let mut params = [(&raw mut value).cast::<c_void>()];
        let mut attrs = [programmatic()];
        // Alternate plain and programmatic launches on one stream.
        let attrs: &mut [CUlaunchAttribute] = if value % 2 == 0 { &mut attrs } else { &mut [] };
        let cfg = config(stream, attrs);
        // SAFETY: a live function taking one u32, a live stream.
        let code = unsafe {
            (table.cuLaunchKernelEx)(&cfg, function, params.as_mut_ptr(), std::ptr::null_mut())
        };
        assert_eq!(code, CUresult::CUDA_SUCCESS);
    }
    // SAFETY: a live stream.
    unsafe { (table.cuStreamSynchronize)(stream) }
        .result()
        .unwrap();
    assert_eq!(*SEEN.lock().unwrap(), (0..100).collect::<Vec<_>>());
    assert_eq!(soft::programmatic_launches(stream).unwrap(), 50);

    let mut attrs = [CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        ..Default::default()
    }];
    let cfg = config(stream, &mut attrs);
    let mut value = 1u32;
    let mut params = [(&raw mut value).cast::<c_void>()];
    // SAFETY: as above.
    let code = unsafe {
        (table.cuLaunchKernelEx)(&cfg, function, params.as_mut_ptr(), std::ptr::null_mut())
    };
    assert_eq!(code, CUresult::CUDA_ERROR_NOT_SUPPORTED);
    let detail = soft::last_error_detail().unwrap_or_default();
    assert!(detail.contains("attrs[0]"), "{detail}");
    // SAFETY: a null configuration is refused, not read.
    let code = unsafe {
        (table.cuLaunchKernelEx)(
            std::ptr::null(),
            function,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(soft::programmatic_launches(stream).unwrap(), 50);
    // SAFETY: a live stream, destroyed once.
    unsafe { (table.cuStreamDestroy)(stream) }.result().unwrap();
    assert_eq!(SEEN.lock().unwrap().len(), 100, "a refused launch ran");
    assert!(soft::programmatic_launches(stream).is_err());
}
