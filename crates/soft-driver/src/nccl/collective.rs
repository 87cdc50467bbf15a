//! Collectives: each rank's worker arrives at the clique's round, the last
//! to arrive does the work for all.

use super::reduce::reduce;
use super::*;

/// What a collective is, as the ranks must agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    kind: Kind,
    /// Elements per rank as the call counts them.
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
}

#[derive(Clone, Copy)]
struct Arrival {
    shape: Shape,
    send: usize,
    recv: usize,
    device: i32,
    faulted: bool,
}

#[derive(Default)]
pub(super) struct Round {
    arrivals: Vec<Option<Arrival>>,
    arrived: usize,
    /// Set by the last arrival: `Some(None)` done, `Some(Some(why))` failed.
    outcome: Option<Option<String>>,
    left: usize,
}

/// Enqueue `shape` for `comm` on `stream`: the checks NCCL makes at the call,
/// then the ordered work.
fn enqueue(
    comm: ncclComm_t,
    stream: cudaStream_t,
    shape: Shape,
    send: *const c_void,
    recv: *mut c_void,
) -> R {
    code((|| {
        let comm = self::comm(comm)?;
        if !lock(&comm.clique.state).joined.iter().all(|&j| j) {
            return Err(fail(
                R::ncclInvalidUsage,
                "the communicator is still being made (ncclCommGetAsyncError says \
                 ncclInProgress): not every rank has joined",
            ));
        }
        let size = elem_size(shape.dtype)?;
        if shape.op.0 >= ncclRedOp_t::ncclNumOps.0 {
            return Err(fail(
                R::ncclInvalidArgument,
                format!("reduction operation {} is not one NCCL defines", shape.op.0),
            ));
        }
        let nranks = comm.clique.nranks;
        if matches!(shape.kind, Kind::Broadcast | Kind::Reduce)
            && !(0..nranks as c_int).contains(&shape.root)
        {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "root {} is not a rank of this {nranks}-rank communicator",
                    shape.root
                ),
            ));
        }
        let stream = crate::stream::resolve(stream)
            .map_err(|_| fail(R::ncclInvalidArgument, "the stream is not a live stream"))?;
        if stream.device != comm.device {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "rank {} of the communicator is on device {}, but the stream on device {}",
                    comm.rank, comm.device, stream.device
                ),
            ));
        }
        let bytes = shape.count.checked_mul(size).ok_or_else(|| {
            fail(
                R::ncclInvalidArgument,
                format!("{} elements overflow", shape.count),
            )
        })?;
        let whole = bytes.saturating_mul(nranks);
        let (send_len, recv_len) = match shape.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce => (bytes, bytes),
            Kind::AllGather => (bytes, whole),
            Kind::ReduceScatter => (whole, bytes),
        };
        let is_root = shape.root as usize == comm.rank;
        let needs_send = !matches!(shape.kind, Kind::Broadcast) || is_root;
        let needs_recv = !matches!(shape.kind, Kind::Reduce) || is_root;
        for (needed, ptr, len, what) in [
            (needs_send, send as usize, send_len, "send buffer"),
            (needs_recv, recv as usize, recv_len, "receive buffer"),
        ] {
            if needed && len > 0 {
                check_buffer(ptr, len, comm.device, what)?;
            }
        }
        let arrival = Arrival {
            shape,
            send: send as usize,
            recv: recv as usize,
            device: comm.device,
            faulted: false,
        };
        // Numbered when enqueued: eagerly now, captured at each launch of
        // the graph (a replay is a new collective of the communicator).
        let make = move || {
            let seq = comm.next.fetch_add(1, Ordering::AcqRel);
            let (clique, rank) = (Arc::clone(&comm.clique), comm.rank);
            let call = move |_device: i32, faulted: bool| {
                arrive(&clique, seq, rank, Arrival { faulted, ..arrival })
            };
            Action::Call(Arc::new(call))
        };
        submit(&stream, Arc::new(make))
    })())
}

/// A rank's worker reached collective `seq`: wait for every rank, and the
/// last to arrive does the work for all.
fn arrive(clique: &Clique, seq: u64, rank: usize, arrival: Arrival) -> Option<Fault> {
    let mut state = lock(&clique.state);
    let nranks = clique.nranks;
    let round = state.rounds.entry(seq).or_insert_with(|| Round {
        arrivals: vec![None; nranks],
        ..Round::default()
    });
    round.arrivals[rank] = Some(arrival);
    round.arrived += 1;
    if round.arrived == nranks {
        let arrivals: Vec<Arrival> = round.arrivals.iter().flatten().copied().collect();
        let failure = run(&arrivals).err();
        let failed = failure.is_some();
        round.outcome = Some(failure);
        state.failed |= failed;
        clique.changed.notify_all();
    }
    loop {
        let aborted = state.aborted;
        let round = state.rounds.get_mut(&seq)?;
        if let Some(outcome) = round.outcome.clone() {
            round.left += 1;
            if round.left == nranks {
                state.rounds.remove(&seq);
            }
            return outcome.map(|why| Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: format!("software NCCL collective {seq}: {why}"),
            });
        }
        if aborted {
            return Some(Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: format!(
                    "software NCCL collective {seq}: the communicator was aborted while rank \
                     {rank} waited for the others"
                ),
            });
        }
        state = clique
            .changed
            .wait(state)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Every rank has arrived: move the data as rank 0's call describes it.
///
/// Whether the ranks agree (collective, count, type, operation, root) is
/// checked once, by the collectives crate before any rank reaches NCCL
/// (`crates/collectives/src/meeting.rs`, which serves NCCL on a GPU too;
/// the software NCCL's ranks all live in one process, so it sees every
/// one). Not again here: this driver's own memory safety needs only that
/// every read and write below is checked against live memory for the
/// lengths it uses, which it is, so ranks that disagree anyway (raw calls
/// through the table) fail naming a buffer, never touch memory they were
/// not lent.
fn run(arrivals: &[Arrival]) -> Result<(), String> {
    let first = arrivals[0].shape;
    for (rank, arrival) in arrivals.iter().enumerate() {
        if arrival.faulted {
            return Err(format!("rank {rank}'s stream has a sticky error"));
        }
    }
    let size = elem_size(first.dtype).map_err(|_| "unsupported type".to_string())?;
    let nranks = arrivals.len();
    let bytes = first.count * size;
    let root = first.root as usize;
    // What each rank reads and writes, checked as memcheck would now that
    // the work runs.
    let check = |ptr: usize, len: usize, device: i32, what: &str| {
        if len == 0 {
            return Ok(());
        }
        crate::memory::check_access(ptr, len, device)
            .map(drop)
            .map_err(|why| format!("{what}: {why}"))
    };
    let read = |ptr: usize, len: usize| -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: `[ptr, ptr + len)` was checked live just before; every
        // rank's worker is held in this collective, so nothing else writes it.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), len) };
        out
    };
    let write = |ptr: usize, data: &[u8]| {
        // SAFETY: as for `read`; the destination was checked for `data.len()`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
    };
    match first.kind {
        Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter => {
            let in_len = if first.kind == Kind::ReduceScatter {
                bytes * nranks
            } else {
                bytes
            };
            for (rank, a) in arrivals.iter().enumerate() {
                check(
                    a.send,
                    in_len,
                    a.device,
                    &format!("rank {rank}'s send buffer"),
                )?;
                let writes = first.kind != Kind::Reduce || rank == root;
                if writes {
                    check(
                        a.recv,
                        bytes,
                        a.device,
                        &format!("rank {rank}'s receive buffer"),
                    )?;
                }
            }
            let inputs: Vec<Vec<u8>> = arrivals.iter().map(|a| read(a.send, in_len)).collect();
            let result = reduce(first.dtype, first.op, &inputs)?;
            for (rank, a) in arrivals.iter().enumerate() {
                match first.kind {
                    Kind::AllReduce => write(a.recv, &result),
                    Kind::Reduce if rank == root => write(a.recv, &result),
                    Kind::ReduceScatter => write(a.recv, &result[rank * bytes..(rank + 1) * bytes]),
                    _ => {}
                }
            }
        }
        Kind::Broadcast => {
            let source = &arrivals[root];
            check(source.send, bytes, source.device, "the root's send buffer")?;
            for (rank, a) in arrivals.iter().enumerate() {
                check(
                    a.recv,
                    bytes,
                    a.device,
                    &format!("rank {rank}'s receive buffer"),
                )?;
            }
            let data = read(source.send, bytes);
            for a in arrivals {
                write(a.recv, &data);
            }
        }
        Kind::AllGather => {
            for (rank, a) in arrivals.iter().enumerate() {
                check(
                    a.send,
                    bytes,
                    a.device,
                    &format!("rank {rank}'s send buffer"),
                )?;
                check(
                    a.recv,
                    bytes * nranks,
                    a.device,
                    &format!("rank {rank}'s receive buffer"),
                )?;
            }
            let gathered: Vec<u8> = arrivals.iter().flat_map(|a| read(a.send, bytes)).collect();
            for a in arrivals {
                write(a.recv, &gathered);
            }
        }
    }
    Ok(())
}

pub(super) unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::AllReduce,
        count,
        dtype: datatype,
        op,
        root: 0,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

pub(super) unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::Broadcast,
        count,
        dtype: datatype,
        op: ncclRedOp_t::ncclSum,
        root,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

pub(super) unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::Reduce,
        count,
        dtype: datatype,
        op,
        root,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

pub(super) unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::AllGather,
        count: sendcount,
        dtype: datatype,
        op: ncclRedOp_t::ncclSum,
        root: 0,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}

pub(super) unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    let shape = Shape {
        kind: Kind::ReduceScatter,
        count: recvcount,
        dtype: datatype,
        op,
        root: 0,
    };
    enqueue(comm, stream, shape, sendbuff, recvbuff)
}
