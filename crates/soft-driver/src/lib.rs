//! TEMPORARY stubs: every entry point answers CUDA_ERROR_NOT_SUPPORTED until the
//! software driver is implemented.
#![allow(non_snake_case, clippy::missing_safety_doc)]
use sys::*;

unsafe extern "C" fn cuInit(_Flags: ::std::os::raw::c_uint) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDriverGetVersion(_driverVersion: *mut ::std::os::raw::c_int) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceGetCount(_count: *mut ::std::os::raw::c_int) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceGet(
    _device: *mut CUdevice,
    _ordinal: ::std::os::raw::c_int,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceGetName(
    _name: *mut ::std::os::raw::c_char,
    _len: ::std::os::raw::c_int,
    _dev: CUdevice,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceGetAttribute(
    _pi: *mut ::std::os::raw::c_int,
    _attrib: CUdevice_attribute,
    _dev: CUdevice,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceTotalMem(_bytes: *mut usize, _dev: CUdevice) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceCanAccessPeer(
    _canAccessPeer: *mut ::std::os::raw::c_int,
    _dev: CUdevice,
    _peerDev: CUdevice,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDevicePrimaryCtxRetain(_pctx: *mut CUcontext, _dev: CUdevice) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDevicePrimaryCtxRelease(_dev: CUdevice) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuCtxSetCurrent(_ctx: CUcontext) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuCtxGetCurrent(_pctx: *mut CUcontext) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    _leastPriority: *mut ::std::os::raw::c_int,
    _greatestPriority: *mut ::std::os::raw::c_int,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamCreateWithPriority(
    _phStream: *mut CUstream,
    _flags: ::std::os::raw::c_uint,
    _priority: ::std::os::raw::c_int,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamDestroy(_hStream: CUstream) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamQuery(_hStream: CUstream) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamSynchronize(_hStream: CUstream) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamWaitEvent(
    _hStream: CUstream,
    _hEvent: CUevent,
    _Flags: ::std::os::raw::c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamGetPriority(
    _hStream: CUstream,
    _priority: *mut ::std::os::raw::c_int,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamGetFlags(
    _hStream: CUstream,
    _flags: *mut ::std::os::raw::c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuLaunchHostFunc(
    _hStream: CUstream,
    _fn_: CUhostFn,
    _userData: *mut ::std::os::raw::c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuEventCreate(
    _phEvent: *mut CUevent,
    _Flags: ::std::os::raw::c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuEventDestroy(_hEvent: CUevent) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuEventRecord(_hEvent: CUevent, _hStream: CUstream) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuEventQuery(_hEvent: CUevent) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuEventSynchronize(_hEvent: CUevent) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuEventElapsedTime(
    _pMilliseconds: *mut f32,
    _hStart: CUevent,
    _hEnd: CUevent,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemGetInfo(_free: *mut usize, _total: *mut usize) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemAlloc(_dptr: *mut CUdeviceptr, _bytesize: usize) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemFree(_dptr: CUdeviceptr) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemAllocAsync(
    _dptr: *mut CUdeviceptr,
    _bytesize: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemFreeAsync(_dptr: CUdeviceptr, _hStream: CUstream) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemAllocFromPoolAsync(
    _dptr: *mut CUdeviceptr,
    _bytesize: usize,
    _pool: CUmemoryPool,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    _pool_out: *mut CUmemoryPool,
    _dev: CUdevice,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemPoolTrimTo(_pool: CUmemoryPool, _minBytesToKeep: usize) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemPoolSetAttribute(
    _pool: CUmemoryPool,
    _attr: CUmemPool_attribute,
    _value: *mut ::std::os::raw::c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemPoolGetAttribute(
    _pool: CUmemoryPool,
    _attr: CUmemPool_attribute,
    _value: *mut ::std::os::raw::c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemHostAlloc(
    _pp: *mut *mut ::std::os::raw::c_void,
    _bytesize: usize,
    _Flags: ::std::os::raw::c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemFreeHost(_p: *mut ::std::os::raw::c_void) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemAllocManaged(
    _dptr: *mut CUdeviceptr,
    _bytesize: usize,
    _flags: ::std::os::raw::c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemcpyHtoDAsync(
    _dstDevice: CUdeviceptr,
    _srcHost: *const ::std::os::raw::c_void,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemcpyDtoHAsync(
    _dstHost: *mut ::std::os::raw::c_void,
    _srcDevice: CUdeviceptr,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemcpyDtoDAsync(
    _dstDevice: CUdeviceptr,
    _srcDevice: CUdeviceptr,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemcpyPeerAsync(
    _dstDevice: CUdeviceptr,
    _dstContext: CUcontext,
    _srcDevice: CUdeviceptr,
    _srcContext: CUcontext,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemsetD8Async(
    _dstDevice: CUdeviceptr,
    _uc: ::std::os::raw::c_uchar,
    _N: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemsetD32Async(
    _dstDevice: CUdeviceptr,
    _ui: ::std::os::raw::c_uint,
    _N: usize,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuMemPrefetchAsync(
    _devPtr: CUdeviceptr,
    _count: usize,
    _location: CUmemLocation,
    _flags: ::std::os::raw::c_uint,
    _hStream: CUstream,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuModuleLoadData(
    _module: *mut CUmodule,
    _image: *const ::std::os::raw::c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuModuleUnload(_hmod: CUmodule) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuModuleGetFunction(
    _hfunc: *mut CUfunction,
    _hmod: CUmodule,
    _name: *const ::std::os::raw::c_char,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuLaunchKernel(
    _f: CUfunction,
    _gridDimX: ::std::os::raw::c_uint,
    _gridDimY: ::std::os::raw::c_uint,
    _gridDimZ: ::std::os::raw::c_uint,
    _blockDimX: ::std::os::raw::c_uint,
    _blockDimY: ::std::os::raw::c_uint,
    _blockDimZ: ::std::os::raw::c_uint,
    _sharedMemBytes: ::std::os::raw::c_uint,
    _hStream: CUstream,
    _kernelParams: *mut *mut ::std::os::raw::c_void,
    _extra: *mut *mut ::std::os::raw::c_void,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamBeginCapture(
    _hStream: CUstream,
    _mode: CUstreamCaptureMode,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuStreamEndCapture(_hStream: CUstream, _phGraph: *mut CUgraph) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuGraphInstantiate(
    _phGraphExec: *mut CUgraphExec,
    _hGraph: CUgraph,
    _flags: ::std::os::raw::c_ulonglong,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuGraphLaunch(_hGraphExec: CUgraphExec, _hStream: CUstream) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuGraphExecDestroy(_hGraphExec: CUgraphExec) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuGraphDestroy(_hGraph: CUgraph) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuGetErrorName(
    _error: CUresult,
    _pStr: *mut *const ::std::os::raw::c_char,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
unsafe extern "C" fn cuGetErrorString(
    _error: CUresult,
    _pStr: *mut *const ::std::os::raw::c_char,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
/// The software driver's table.
pub fn driver() -> &'static Driver {
    static TABLE: Driver = Driver {
        cuInit,
        cuDriverGetVersion,
        cuDeviceGetCount,
        cuDeviceGet,
        cuDeviceGetName,
        cuDeviceGetAttribute,
        cuDeviceTotalMem,
        cuDeviceCanAccessPeer,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxSynchronize,
        cuCtxGetStreamPriorityRange,
        cuStreamCreateWithPriority,
        cuStreamDestroy,
        cuStreamQuery,
        cuStreamSynchronize,
        cuStreamWaitEvent,
        cuStreamGetPriority,
        cuStreamGetFlags,
        cuLaunchHostFunc,
        cuEventCreate,
        cuEventDestroy,
        cuEventRecord,
        cuEventQuery,
        cuEventSynchronize,
        cuEventElapsedTime,
        cuMemGetInfo,
        cuMemAlloc,
        cuMemFree,
        cuMemAllocAsync,
        cuMemFreeAsync,
        cuMemAllocFromPoolAsync,
        cuDeviceGetDefaultMemPool,
        cuMemPoolTrimTo,
        cuMemPoolSetAttribute,
        cuMemPoolGetAttribute,
        cuMemHostAlloc,
        cuMemFreeHost,
        cuMemAllocManaged,
        cuMemcpyHtoDAsync,
        cuMemcpyDtoHAsync,
        cuMemcpyDtoDAsync,
        cuMemcpyPeerAsync,
        cuMemsetD8Async,
        cuMemsetD32Async,
        cuMemPrefetchAsync,
        cuModuleLoadData,
        cuModuleUnload,
        cuModuleGetFunction,
        cuLaunchKernel,
        cuStreamBeginCapture,
        cuStreamEndCapture,
        cuGraphInstantiate,
        cuGraphLaunch,
        cuGraphExecDestroy,
        cuGraphDestroy,
        cuGetErrorName,
        cuGetErrorString,
    };
    &TABLE
}
