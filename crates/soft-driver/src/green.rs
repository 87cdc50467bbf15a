//! SM partitions: green contexts (`cuGreenCtx*`, `cuDevSmResourceSplitByCount`).
//!
//! Each software device has [`SM_COUNT`] SMs, split in steps of
//! [`SM_GRANULARITY`] as a Hopper GPU splits them: a split asks for at least
//! `minCount` SMs per group, and each group gets `minCount` rounded up to the
//! granularity. A resource is a count (the device's, a group's or a
//! remainder's) and, for a split's output, which split made it and its place
//! there. As on a GPU, a split's output (its remainder included) cannot be
//! split again (`CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION`: a GPU asks for a
//! green context made of it first), and a descriptor of several resources
//! takes distinct outputs of one split; a descriptor carries their summed
//! count, and a green context made of it reports that count
//! (`cuGreenCtxGetDevResource`).
//!
//! A green context's streams are ordinary streams of its device, each with
//! its own worker thread, so work in one partition never waits for work in
//! another (nor for the device's other streams) unless an event orders it:
//! on a GPU the partitions' SMs are disjoint, here the workers are. A green
//! context also has a context handle (`cuCtxFromGreenCtx`) that may be made
//! current; it stands for its device, as the primary context does, and
//! `cuCtxSynchronize` there waits for the green context's streams only (in
//! the primary context, for every stream of the device, green contexts'
//! included), as CUDA documents.
//!
//! Context-less kernels (`cuLibrary*`, `cuKernelGetFunction`, `cuFuncLoad`, in the same table because partitions
//! need them on a GPU) fail with `CUDA_ERROR_NOT_SUPPORTED`: kernels here are
//! CPU twins, and a module's function runs on any stream of its device.
//!
//! The SM count here is a model of an H200's, independent of the
//! `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` the device reports (the host's
//! parallelism, which sizes launches).

use crate::context::{GREATEST_PRIORITY, LEAST_PRIORITY};
use crate::device::check_device;
use crate::errors::{Status, code, fail, write_out};
use crate::green_contexts::{GREENS, Green, green_of_stream, note_stream};
use crate::handles::{Registry, mint};
use crate::stream::{STREAMS, Stream};
use std::ffi::{c_char, c_int, c_uint, c_void};
use sys::{
    CUcontext, CUdevResource, CUdevResourceDesc, CUdevResourceType, CUdevSmResource, CUdevice,
    CUfunction, CUgreenCtx, CUgreenCtxCreate_flags, CUjit_option, CUkernel, CUlibrary,
    CUlibraryOption, CUresult, CUstream, CUstream_flags,
};

/// The SMs of each software device: an H200's 132.
pub const SM_COUNT: u32 = 132;
/// The step in which SMs are split (`minSmPartitionSize` and
/// `smCoscheduledAlignment`): 8, as on Hopper.
pub const SM_GRANULARITY: u32 = 8;

/// A descriptor (`cuDevResourceGenerateDesc`): the SMs it describes.
struct Desc {
    sms: u32,
    /// How many split outputs it was made of.
    groups: u32,
}

static DESCS: Registry<Desc> = Registry::new();

/// Where a resource came from: 0 for a device's or a green context's,
/// else the split that made it.
static SPLITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
/// The place of a split's remainder among its outputs.
const REMAINDER_PLACE: u32 = u32::MAX;

/// An SM resource of `sms` SMs, not made by a split.
fn sm_resource(sms: u32) -> CUdevResource {
    split_output(sms, 0, 0)
}

/// An SM resource of `sms` SMs, output `place` of split `split` (0: none),
/// stamped in the resource's opaque padding as a GPU driver keeps its own
/// bookkeeping there.
fn split_output(sms: u32, split: u64, place: u32) -> CUdevResource {
    let mut resource = CUdevResource {
        type_: CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        ..Default::default()
    };
    resource._internal_padding[..8].copy_from_slice(&split.to_le_bytes());
    resource._internal_padding[8..12].copy_from_slice(&place.to_le_bytes());
    resource.__bindgen_anon_1.sm = CUdevSmResource {
        smCount: sms,
        minSmPartitionSize: SM_GRANULARITY,
        smCoscheduledAlignment: SM_GRANULARITY,
    };
    resource
}

/// The SM count of `resource`, which must be an SM resource of at most
/// [`SM_COUNT`] SMs.
///
/// # Safety
/// `resource` is null or valid for a read.
unsafe fn sms_of(resource: *const CUdevResource, call: &str) -> Result<u32, CUresult> {
    if resource.is_null() {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{call}: the resource is null"),
        ));
    }
    // SAFETY: non-null, readable per the caller's contract.
    let resource = unsafe { &*resource };
    if resource.type_ != CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE,
            format!(
                "{call}: resource type {} is not an SM resource",
                resource.type_.0
            ),
        ));
    }
    // SAFETY: an SM resource's union holds `sm`; any bits are a valid u32.
    let sms = unsafe { resource.__bindgen_anon_1.sm.smCount };
    if sms > SM_COUNT {
        return Err(fail(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("{call}: a resource of {sms} SMs, more than a device's {SM_COUNT}"),
        ));
    }
    Ok(sms)
}

/// The split that made `resource` (0: none) and its place among its outputs.
fn origin_of(resource: &CUdevResource) -> (u64, u32) {
    let padding = &resource._internal_padding;
    let split = u64::from_le_bytes(padding[..8].try_into().expect("8 bytes"));
    let place = u32::from_le_bytes(padding[8..12].try_into().expect("4 bytes"));
    (split, place)
}

fn check_type(type_: CUdevResourceType, call: &str) -> Status {
    if type_ == CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM {
        Ok(())
    } else {
        Err(fail(
            CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE,
            format!("{call}: only SM resources exist, not type {}", type_.0),
        ))
    }
}

pub(crate) unsafe extern "C" fn cuDeviceGetDevResource(
    device: CUdevice,
    resource: *mut CUdevResource,
    type_: CUdevResourceType,
) -> CUresult {
    code((|| {
        check_device(device)?;
        check_type(type_, "cuDeviceGetDevResource")?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(resource, sm_resource(SM_COUNT)) }
    })())
}

pub(crate) unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut CUdevResource,
    nbGroups: *mut c_uint,
    input: *const CUdevResource,
    remaining: *mut CUdevResource,
    useFlags: c_uint,
    minCount: c_uint,
) -> CUresult {
    const CALL: &str = "cuDevSmResourceSplitByCount";
    code((|| {
        // SAFETY: null or readable per the API.
        let available = unsafe { sms_of(input, CALL) }?;
        // SAFETY: `sms_of` checked it is non-null and readable.
        let (from_split, _) = origin_of(unsafe { &*input });
        if from_split != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                format!(
                    "{CALL}: the input is an output of split {from_split}; split the \
                     device's resource once, or a green context's"
                ),
            ));
        }
        if nbGroups.is_null() || useFlags > 3 || minCount > available {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{CALL}: minCount {minCount} of {available} SMs, flags {useFlags:#x}, \
                     nbGroups {}",
                    if nbGroups.is_null() { "null" } else { "given" }
                ),
            ));
        }
        // Each group gets minCount rounded up to the granularity (at least one step).
        let per_group = minCount.max(1).div_ceil(SM_GRANULARITY) * SM_GRANULARITY;
        let possible = available / per_group;
        // SAFETY: non-null, readable per the API.
        let asked = unsafe { nbGroups.read() };
        let groups = if result.is_null() {
            possible
        } else {
            asked.min(possible)
        };
        if !result.is_null() && groups == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                format!("{CALL}: no group of {per_group} SMs fits in {available}"),
            ));
        }
        let split = SPLITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !result.is_null() {
            for i in 0..groups {
                // SAFETY: `result` holds `asked` >= `groups` elements per the API.
                unsafe {
                    result
                        .add(i as usize)
                        .write(split_output(per_group, split, i))
                };
            }
        }
        if !remaining.is_null() {
            let rest = split_output(available - groups * per_group, split, REMAINDER_PLACE);
            // SAFETY: non-null, writable per the API.
            unsafe { remaining.write(rest) };
        }
        // SAFETY: non-null, writable per the API.
        unsafe { nbGroups.write(groups) };
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuDevResourceGenerateDesc(
    phDesc: *mut CUdevResourceDesc,
    resources: *mut CUdevResource,
    nbResources: c_uint,
) -> CUresult {
    const CALL: &str = "cuDevResourceGenerateDesc";
    code((|| {
        if nbResources == 0 || resources.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{CALL}: {nbResources} resources at {resources:?}"),
            ));
        }
        let mut sms = 0;
        let mut origins = Vec::with_capacity(nbResources as usize);
        for i in 0..nbResources as usize {
            // SAFETY: `resources` holds `nbResources` elements per the API.
            let resource = unsafe { resources.add(i) };
            // SAFETY: as above.
            sms += unsafe { sms_of(resource, CALL) }?;
            // SAFETY: as above; `sms_of` checked it is an SM resource.
            origins.push(origin_of(unsafe { &*resource }));
        }
        if origins.len() > 1 {
            let split = origins[0].0;
            let mut places: Vec<u32> = origins.iter().map(|&(_, place)| place).collect();
            places.sort_unstable();
            places.dedup();
            if split == 0
                || origins.iter().any(|&(other, _)| other != split)
                || places.len() != origins.len()
            {
                return Err(fail(
                    CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                    format!(
                        "{CALL}: several resources must be distinct outputs of one split, \
                         not (split, place) {origins:?}"
                    ),
                ));
            }
        }
        if sms == 0 || sms > SM_COUNT {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                format!("{CALL}: resources of {sms} SMs in all"),
            ));
        }
        let handle = DESCS.insert(std::sync::Arc::new(Desc {
            sms,
            groups: nbResources,
        }));
        // SAFETY: null or writable per the API.
        unsafe { write_out(phDesc, handle as CUdevResourceDesc) }
    })())
}

pub(crate) unsafe extern "C" fn cuGreenCtxCreate(
    phCtx: *mut CUgreenCtx,
    desc: CUdevResourceDesc,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    code((|| {
        crate::context::not_in_host_function("cuGreenCtxCreate")?;
        check_device(dev)?;
        if flags != CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM.0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "cuGreenCtxCreate: flags {flags:#x}; CU_GREEN_CTX_DEFAULT_STREAM is required"
                ),
            ));
        }
        let desc = DESCS.get(desc as usize)?;
        let green = Green {
            device: dev,
            sms: desc.sms,
            groups: desc.groups,
            context: mint(),
        };
        let handle = GREENS.insert(std::sync::Arc::new(green));
        // SAFETY: null or writable per the API.
        unsafe { write_out(phCtx, handle as CUgreenCtx) }
    })())
}

pub(crate) unsafe extern "C" fn cuGreenCtxDestroy(hCtx: CUgreenCtx) -> CUresult {
    code((|| {
        crate::context::not_in_host_function("cuGreenCtxDestroy")?;
        GREENS.remove(hCtx as usize)?;
        Ok(())
    })())
}

pub(crate) unsafe extern "C" fn cuCtxFromGreenCtx(
    pContext: *mut CUcontext,
    hCtx: CUgreenCtx,
) -> CUresult {
    code((|| {
        let green = GREENS.get(hCtx as usize)?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(pContext, green.context as CUcontext) }
    })())
}

pub(crate) unsafe extern "C" fn cuGreenCtxGetDevResource(
    hCtx: CUgreenCtx,
    resource: *mut CUdevResource,
    type_: CUdevResourceType,
) -> CUresult {
    code((|| {
        let green = GREENS.get(hCtx as usize)?;
        check_type(type_, "cuGreenCtxGetDevResource")?;
        // SAFETY: null or writable per the API.
        unsafe { write_out(resource, sm_resource(green.sms)) }
    })())
}

pub(crate) unsafe extern "C" fn cuGreenCtxStreamCreate(
    phStream: *mut CUstream,
    greenCtx: CUgreenCtx,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    code((|| {
        crate::context::not_in_host_function("cuGreenCtxStreamCreate")?;
        let green = GREENS.get(greenCtx as usize)?;
        crate::sticky_errors::check_context(green.device)?;
        if phStream.is_null() || flags != CUstream_flags::CU_STREAM_NON_BLOCKING.0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "cuGreenCtxStreamCreate: flags {flags:#x}; CU_STREAM_NON_BLOCKING is required"
                ),
            ));
        }
        // Out-of-range priorities are clamped, as CUDA does.
        let priority = priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY);
        let handle = mint();
        let stream = Stream::spawn(handle, flags, priority, green.device)?;
        STREAMS.insert_at(handle, stream);
        note_stream(handle, greenCtx as usize);
        // SAFETY: checked non-null above; writable per the API.
        unsafe { write_out(phStream, handle as CUstream) }
    })())
}

pub(crate) unsafe extern "C" fn cuStreamGetGreenCtx(
    hStream: CUstream,
    phCtx: *mut CUgreenCtx,
) -> CUresult {
    code((|| {
        let stream = crate::stream::resolve(hStream)?;
        let green = green_of_stream(stream.handle);
        // SAFETY: null or writable per the API.
        unsafe { write_out(phCtx, green as CUgreenCtx) }
    })())
}

/// Why the library calls fail here: kernels are CPU twins, registered with
/// their module in the device's one context, and a green context's stream
/// runs them as it is (the driver crate loads no library on this driver).
const NO_LIBRARIES: &str = "the software driver runs kernels as CPU twins of their module and \
                            loads no libraries (cuLibrary*); launch the module's function on \
                            the green context's stream";

pub(crate) unsafe extern "C" fn cuLibraryLoadData(
    _library: *mut CUlibrary,
    _code: *const c_void,
    _jitOptions: *mut CUjit_option,
    _jitOptionsValues: *mut *mut c_void,
    _numJitOptions: c_uint,
    _libraryOptions: *mut CUlibraryOption,
    _libraryOptionValues: *mut *mut c_void,
    _numLibraryOptions: c_uint,
) -> CUresult {
    fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, NO_LIBRARIES)
}

pub(crate) unsafe extern "C" fn cuLibraryGetKernel(
    _pKernel: *mut CUkernel,
    _library: CUlibrary,
    _name: *const c_char,
) -> CUresult {
    fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, NO_LIBRARIES)
}

pub(crate) unsafe extern "C" fn cuLibraryUnload(_library: CUlibrary) -> CUresult {
    fail(CUresult::CUDA_ERROR_INVALID_HANDLE, NO_LIBRARIES)
}

pub(crate) unsafe extern "C" fn cuKernelGetFunction(
    _pFunc: *mut CUfunction,
    _kernel: CUkernel,
) -> CUresult {
    fail(CUresult::CUDA_ERROR_INVALID_HANDLE, NO_LIBRARIES)
}

pub(crate) unsafe extern "C" fn cuFuncLoad(_function: CUfunction) -> CUresult {
    fail(CUresult::CUDA_ERROR_INVALID_HANDLE, NO_LIBRARIES)
}

/// The software driver's green-context table: every entry point of
/// [`sys::GreenContexts`], on the software devices.
pub(crate) static TABLE: sys::GreenContexts = sys::GreenContexts {
    cuDeviceGetDevResource,
    cuDevSmResourceSplitByCount,
    cuDevResourceGenerateDesc,
    cuGreenCtxCreate,
    cuGreenCtxDestroy,
    cuCtxFromGreenCtx,
    cuGreenCtxGetDevResource,
    cuGreenCtxStreamCreate,
    cuStreamGetGreenCtx,
    cuLibraryLoadData,
    cuLibraryGetKernel,
    cuLibraryUnload,
    cuKernelGetFunction,
    cuFuncLoad,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn split(input: &CUdevResource, min: u32) -> Result<(u32, u32), CUresult> {
        let (mut part, mut rest, mut groups) =
            (CUdevResource::default(), CUdevResource::default(), 1);
        // SAFETY: every pointer is a valid local.
        let result = unsafe {
            cuDevSmResourceSplitByCount(&mut part, &mut groups, input, &mut rest, 0, min)
        };
        if result != CUresult::CUDA_SUCCESS {
            return Err(result);
        }
        // SAFETY: both are SM resources written by the split.
        Ok(unsafe {
            (
                part.__bindgen_anon_1.sm.smCount,
                rest.__bindgen_anon_1.sm.smCount,
            )
        })
    }

    #[test]
    fn splits_round_up_to_the_granularity_and_refuse_what_does_not_fit() {
        let all = sm_resource(SM_COUNT);
        assert_eq!(split(&all, 1), Ok((8, 124)));
        assert_eq!(split(&all, 8), Ok((8, 124)));
        assert_eq!(split(&all, 9), Ok((16, 116)));
        assert_eq!(
            split(&all, 132),
            Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
        );
        assert_eq!(split(&all, 133), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        // A split's output, its remainder included, does not split again,
        // as on a GPU; a green context's resource does.
        let (mut part, mut rest, mut groups) =
            (CUdevResource::default(), CUdevResource::default(), 1);
        // SAFETY: every pointer is a valid local.
        let made =
            unsafe { cuDevSmResourceSplitByCount(&mut part, &mut groups, &all, &mut rest, 0, 8) };
        assert_eq!(made, CUresult::CUDA_SUCCESS);
        for output in [&part, &rest] {
            assert_eq!(
                split(output, 8),
                Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
            );
        }
        assert_eq!(split(&sm_resource(124), 32), Ok((32, 92)));
    }

    #[test]
    fn a_descriptor_takes_distinct_outputs_of_one_split_and_sums_their_sms() {
        let all = sm_resource(SM_COUNT);
        let mut outputs = [CUdevResource::default(); 3];
        let (mut rest, mut groups) = (CUdevResource::default(), 3);
        let mut other = [CUdevResource::default(); 1];
        let (mut other_rest, mut one) = (CUdevResource::default(), 1);
        // SAFETY: every pointer is a valid local with room for the groups asked.
        unsafe {
            let first = cuDevSmResourceSplitByCount(
                outputs.as_mut_ptr(),
                &mut groups,
                &all,
                &mut rest,
                0,
                8,
            );
            assert_eq!(first, CUresult::CUDA_SUCCESS);
            let second = cuDevSmResourceSplitByCount(
                other.as_mut_ptr(),
                &mut one,
                &all,
                &mut other_rest,
                0,
                8,
            );
            assert_eq!(second, CUresult::CUDA_SUCCESS);
        }
        let desc_of = |resources: &mut [CUdevResource]| {
            let mut desc = std::ptr::null_mut();
            // SAFETY: `resources` is a valid local slice; writes one handle.
            let result = unsafe {
                cuDevResourceGenerateDesc(&mut desc, resources.as_mut_ptr(), resources.len() as u32)
            };
            (result == CUresult::CUDA_SUCCESS)
                .then(|| DESCS.get(desc as usize).expect("a live descriptor").sms)
                .ok_or(result)
        };
        assert_eq!(desc_of(&mut outputs[..2]), Ok(16));
        assert_eq!(desc_of(&mut [outputs[2], rest]), Ok(SM_COUNT - 16));
        let refused = Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        assert_eq!(desc_of(&mut [outputs[0], other[0]]), refused, "two splits");
        assert_eq!(
            desc_of(&mut [outputs[0], outputs[0]]),
            refused,
            "one output twice"
        );
        assert_eq!(desc_of(&mut [all, all]), refused, "not outputs of a split");
    }

    #[test]
    fn a_green_context_reports_its_sms_and_owns_its_streams_until_destroyed() {
        let sm = CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
        let mut resource = sm_resource(24);
        let (mut desc, mut green, mut stream) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mut found = CUdevResource::default();
        let mut owner = std::ptr::null_mut();
        let non_blocking = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        let default_stream = CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM.0;
        // SAFETY: every pointer is a valid local; handles come from the calls.
        unsafe {
            assert_eq!(
                cuDevResourceGenerateDesc(&mut desc, &mut resource, 1),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                cuGreenCtxCreate(&mut green, desc, 0, 0),
                CUresult::CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                cuGreenCtxCreate(&mut green, desc, 0, default_stream),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                cuGreenCtxGetDevResource(green, &mut found, sm),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(found.__bindgen_anon_1.sm.smCount, 24);
            assert_eq!(
                cuGreenCtxStreamCreate(&mut stream, green, 0, 0),
                CUresult::CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                cuGreenCtxStreamCreate(&mut stream, green, non_blocking, -9),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                cuStreamGetGreenCtx(stream, &mut owner),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(owner, green);
            assert_eq!(
                crate::stream::resolve(stream).unwrap().priority,
                GREATEST_PRIORITY
            );
            let mut context = std::ptr::null_mut();
            assert_eq!(
                cuCtxFromGreenCtx(&mut context, green),
                CUresult::CUDA_SUCCESS
            );
            assert_eq!(crate::context::check_context(context), Ok(0));
            assert_eq!(cuGreenCtxDestroy(green), CUresult::CUDA_SUCCESS);
            assert!(crate::context::check_context(context).is_err());
            assert_eq!(
                cuGreenCtxStreamCreate(&mut stream, green, non_blocking, 0),
                CUresult::CUDA_ERROR_INVALID_HANDLE
            );
            assert_eq!(
                cuGreenCtxDestroy(green),
                CUresult::CUDA_ERROR_INVALID_HANDLE
            );
        }
    }
}
