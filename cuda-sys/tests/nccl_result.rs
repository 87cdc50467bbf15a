//! NCCL's result layer against the software NCCL: every wrapper the
//! collectives use passes its arguments in NCCL's order, returns what NCCL
//! wrote, and names its call (with NCCL's detail) when it fails.

use cuda_streams_sys::nccl::{
    NCCL_VERSION_CODE, Progress, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t,
    ncclResult_t, result,
};
use cuda_streams_sys::{CUcontext, CUdeviceptr, CUresult, CUstream, Driver};
use soft_driver as soft;
use std::ffi::c_void;

fn ok(code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS);
}

/// Device `ordinal`'s primary context, made current on this thread.
fn context(driver: &Driver, ordinal: i32) -> CUcontext {
    let (mut device, mut ctx) = (0, std::ptr::null_mut());
    // SAFETY: plain calls with valid out-pointers.
    unsafe {
        ok((driver.cuInit)(0));
        ok((driver.cuDeviceGet)(&mut device, ordinal));
        ok((driver.cuDevicePrimaryCtxRetain)(&mut ctx, device));
        ok((driver.cuCtxSetCurrent)(ctx));
    }
    ctx
}

/// A rank's buffers and stream on device `ordinal` (made current).
struct Rank {
    send: CUdeviceptr,
    recv: CUdeviceptr,
    stream: CUstream,
}

const N: usize = 4;

fn rank(driver: &Driver, ordinal: i32, values: [f32; N]) -> Rank {
    context(driver, ordinal);
    let (mut send, mut recv, mut stream) = (0, 0, std::ptr::null_mut());
    // SAFETY: valid out-pointers; the copy reads `values`, alive until the
    // stream is synchronised below.
    unsafe {
        ok((driver.cuMemAlloc)(&mut send, N * 4));
        ok((driver.cuMemAlloc)(&mut recv, N * 4));
        ok((driver.cuStreamCreateWithPriority)(&mut stream, 0, 0));
        ok((driver.cuMemcpyHtoDAsync)(
            send,
            values.as_ptr().cast(),
            N * 4,
            stream,
        ));
        ok((driver.cuStreamSynchronize)(stream));
    }
    Rank { send, recv, stream }
}

fn read(driver: &Driver, ordinal: i32, rank: &Rank) -> [f32; N] {
    context(driver, ordinal);
    let mut out = [0f32; N];
    // SAFETY: `out` holds N floats and outlives the synchronised copy.
    unsafe {
        ok((driver.cuMemcpyDtoHAsync)(
            out.as_mut_ptr().cast(),
            rank.recv,
            N * 4,
            rank.stream,
        ));
        ok((driver.cuStreamSynchronize)(rank.stream));
    }
    out
}

#[test]
fn a_grouped_all_reduce_over_two_devices_sums_both_ranks() {
    let (driver, nccl) = (soft::driver(), soft::nccl());
    let mut devices = 0;
    // SAFETY: cuInit takes flags; cuDeviceGetCount writes one int.
    unsafe {
        ok((driver.cuInit)(0));
        ok((driver.cuDeviceGetCount)(&mut devices));
    }
    if devices < 2 {
        eprintln!(
            "skipped: the software driver has {devices} device(s) (CUDA_STREAMS_SOFT_DEVICES); this test needs 2"
        );
        return;
    }
    let ranks = [
        rank(driver, 0, [1.0, 2.0, 3.0, 4.0]),
        rank(driver, 1, [10.0, 20.0, 30.0, 40.0]),
    ];
    context(driver, 0);
    let comms = result::comm_init_all(nccl, &[0, 1]).unwrap();
    assert_eq!(comms.len(), 2);
    assert!(comms.iter().all(|comm| !comm.is_null()));
    result::group_start(nccl).unwrap();
    for (rank, &comm) in ranks.iter().zip(&comms) {
        // SAFETY: each rank's buffers hold N floats on its communicator's
        // device and stay alive until its stream is synchronised in `read`.
        let issued = unsafe {
            result::all_reduce(
                nccl,
                rank.send as *const c_void,
                rank.recv as *mut c_void,
                N,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                comm,
                rank.stream,
            )
        };
        assert_eq!(issued, Ok(Progress::Done(())));
    }
    assert_eq!(result::group_end(nccl), Ok(Progress::Done(())));
    for (ordinal, rank) in ranks.iter().enumerate() {
        assert_eq!(read(driver, ordinal as i32, rank), [11.0, 22.0, 33.0, 44.0]);
    }
    for comm in comms {
        // SAFETY: live, destroyed once, its work synchronised above.
        unsafe { result::comm_get_async_error(nccl, comm) }
            .unwrap()
            .result()
            .unwrap();
        // SAFETY: as above.
        unsafe { result::comm_destroy(nccl, comm) }.unwrap();
    }
}

#[test]
fn a_failed_call_is_named_with_nccls_detail() {
    let nccl = soft::nccl();
    context(soft::driver(), 0);
    let err = result::comm_init_all(nccl, &[99]).unwrap_err();
    assert_eq!(err.code(), ncclResult_t::ncclInvalidArgument);
    assert_eq!(err.call(), Some("ncclCommInitAll"));
    let detail = err.detail().expect("the software NCCL says why");
    assert!(detail.contains("device 99 does not exist"), "{detail}");
    assert_eq!(
        err.to_string(),
        format!("ncclCommInitAll failed: ncclInvalidArgument (4) ({detail})")
    );
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
fn nonblocking_config() -> ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: NCCL_VERSION_CODE,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

#[test]
fn a_nonblocking_rank_is_in_progress_until_the_other_joins() {
    let (driver, nccl) = (soft::driver(), soft::nccl());
    let id = result::get_unique_id(nccl).unwrap();
    context(driver, 0);
    let mut config = nonblocking_config();
    // SAFETY: initialised as NCCL_CONFIG_INITIALIZER does; no strings.
    let made = unsafe { result::comm_init_rank_config(nccl, 2, id, 0, &mut config) }.unwrap();
    // libnccl answers ncclInProgress here, the software NCCL ncclSuccess:
    // both return at once with the communicator, whose state says the rest.
    let first: ncclComm_t = made.into_inner();
    assert!(!first.is_null());
    // SAFETY: the communicator NCCL handed back, live.
    let state = unsafe { result::comm_get_async_error(nccl, first) }.unwrap();
    assert_eq!(state, ncclResult_t::ncclInProgress, "rank 1 has not joined");
    // Rank 1 joins, blocking, on a thread of its own.
    let second = std::thread::spawn(move || {
        context(driver, 1);
        result::comm_init_rank(nccl, 2, id, 1).map(|comm| comm as usize)
    })
    .join()
    .unwrap()
    .unwrap() as ncclComm_t;
    // Rank 1 returned once both had joined, so rank 0 is ready now.
    // SAFETY: live.
    let state = unsafe { result::comm_get_async_error(nccl, first) }.unwrap();
    assert_eq!(state, ncclResult_t::ncclSuccess);
    for comm in [first, second] {
        // SAFETY: live, destroyed once, no work on it.
        unsafe { result::comm_destroy(nccl, comm) }.unwrap();
    }
}
