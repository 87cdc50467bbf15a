//! Sends and receives: each call's side posted when its rank's worker
//! reaches it, the pair copied once both sides are there.

use super::*;

/// One side of a send/recv pair, as its rank's worker reaches it.
#[derive(Clone, Copy)]
struct Half {
    ptr: usize,
    count: usize,
    dtype: ncclDataType_t,
    bytes: usize,
    device: i32,
    faulted: bool,
}

/// The `seq`-th send from one rank to another and the `seq`-th receive of
/// the other from the one: NCCL matches them in order.
#[derive(Default)]
pub(super) struct Pair {
    send: Option<Half>,
    recv: Option<Half>,
    /// Set by the later side: `Some(None)` done, `Some(Some(why))` failed.
    outcome: Option<Option<String>>,
    left: usize,
}

/// `(from, to, seq)`.
pub(super) type PairKey = (usize, usize, u64);

/// A send or receive as its call made it.
#[derive(Clone, Copy)]
struct P2p {
    send: bool,
    peer: usize,
    half: Half,
}

/// A send or receive made inside a group, enqueued at the group's end
/// together with the others of its stream: a rank's sends and receives of
/// one group proceed together, as NCCL's do, so a ring of them cannot
/// deadlock.
pub(super) struct Grouped {
    stream: Arc<crate::stream::Stream>,
    comm: Arc<Comm>,
    p2p: P2p,
}

/// The group's sends and receives, one piece of work per stream and
/// communicator.
pub(super) fn enqueue_grouped(mut grouped: Vec<Grouped>) -> Result<(), R> {
    let mut result = Ok(());
    while let Some(first) = grouped.first() {
        let (stream, comm) = (Arc::clone(&first.stream), Arc::clone(&first.comm));
        let (mine, rest): (Vec<_>, Vec<_>) = grouped.into_iter().partition(|g| {
            Arc::ptr_eq(&g.stream, &stream) && Arc::ptr_eq(&g.comm.clique, &comm.clique)
        });
        grouped = rest;
        let ops: Vec<(Arc<Comm>, P2p)> = mine.into_iter().map(|g| (g.comm, g.p2p)).collect();
        result = result.and(submit(&stream, exchange_maker(ops)));
    }
    result
}

/// Work that numbers `ops` when enqueued and exchanges them when the
/// worker reaches it.
fn exchange_maker(ops: Vec<(Arc<Comm>, P2p)>) -> Arc<dyn Fn() -> Action + Send + Sync> {
    Arc::new(move || {
        let Some(clique) = ops.first().map(|(comm, _)| Arc::clone(&comm.clique)) else {
            return Action::Nop;
        };
        let halves: Vec<(bool, PairKey, Half)> = ops
            .iter()
            .map(|(comm, op)| {
                let key = if op.send {
                    let seq = comm.sends[op.peer].fetch_add(1, Ordering::AcqRel);
                    (comm.rank, op.peer, seq)
                } else {
                    let seq = comm.recvs[op.peer].fetch_add(1, Ordering::AcqRel);
                    (op.peer, comm.rank, seq)
                };
                (op.send, key, op.half)
            })
            .collect();
        Action::Call(Arc::new(move |_device: i32, faulted: bool| {
            exchange(&clique, &halves, faulted)
        }))
    })
}

/// A rank's worker reached its sends and receives: post each side, do the
/// pairs whose other side is there, and wait until every pair is done.
fn exchange(clique: &Clique, halves: &[(bool, PairKey, Half)], faulted: bool) -> Option<Fault> {
    let mut state = lock(&clique.state);
    for &(send, key, half) in halves {
        let pair = state.pairs.entry(key).or_default();
        let half = Half { faulted, ..half };
        if send {
            pair.send = Some(half);
        } else {
            pair.recv = Some(half);
        }
        if let (Some(s), Some(r)) = (pair.send, pair.recv) {
            let failure = transfer(key, s, r).err();
            let failed = failure.is_some();
            pair.outcome = Some(failure);
            state.failed |= failed;
            clique.changed.notify_all();
        }
    }
    loop {
        let done = halves
            .iter()
            .all(|(_, key, _)| state.pairs.get(key).is_some_and(|p| p.outcome.is_some()));
        if done {
            let mut fault = None;
            for (_, key, _) in halves {
                let Some(pair) = state.pairs.get_mut(key) else {
                    continue;
                };
                if let Some(Some(why)) = &pair.outcome {
                    fault.get_or_insert_with(|| Fault {
                        code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                        detail: format!("software NCCL send/recv: {why}"),
                    });
                }
                pair.left += 1;
                if pair.left == 2 {
                    state.pairs.remove(key);
                }
            }
            return fault;
        }
        if state.aborted {
            return Some(Fault {
                code: CUresult::CUDA_ERROR_LAUNCH_FAILED,
                detail: "software NCCL send/recv: the communicator was aborted while a rank \
                         waited for its peer"
                    .to_string(),
            });
        }
        state = clique
            .changed
            .wait(state)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Both sides of a pair are here: copy.
///
/// Whether the two sides agree on count and type is checked once, by the
/// collectives crate before either reaches NCCL (`meeting.rs`, which
/// serves both drivers). Kept here only what this driver's memory safety
/// needs: the copy moves the send's bytes, so the receive must span as
/// many (a larger send would write past the receive buffer).
fn transfer((from, to, seq): PairKey, send: Half, recv: Half) -> Result<(), String> {
    for (rank, half) in [(from, send), (to, recv)] {
        if half.faulted {
            return Err(format!("rank {rank}'s stream has a sticky error"));
        }
    }
    if send.bytes != recv.bytes {
        return Err(format!(
            "send {seq} from rank {from} to rank {to} is {} byte(s) ({} element(s) of NCCL \
             type {}), but rank {to} receives {} byte(s) ({} element(s) of NCCL type {})",
            send.bytes, send.count, send.dtype.0, recv.bytes, recv.count, recv.dtype.0
        ));
    }
    if send.bytes == 0 {
        return Ok(());
    }
    crate::memory::check_access(send.ptr, send.bytes, send.device)
        .map_err(|why| format!("rank {from}'s send buffer: {why}"))?;
    crate::memory::check_access(recv.ptr, recv.bytes, recv.device)
        .map_err(|why| format!("rank {to}'s receive buffer: {why}"))?;
    // SAFETY: both ranges were checked live just now; both workers are held
    // in this exchange, so nothing else on their streams touches them.
    // `copy` (memmove): a send to oneself may overlap.
    unsafe { std::ptr::copy(send.ptr as *const u8, recv.ptr as *mut u8, send.bytes) };
    Ok(())
}

/// A send (`send`) or receive of `count` elements at `ptr` with `peer`:
/// the checks NCCL makes at the call, then the work, at once or at the
/// group's end.
fn enqueue_p2p(
    comm: ncclComm_t,
    stream: cudaStream_t,
    send: bool,
    ptr: usize,
    count: usize,
    dtype: ncclDataType_t,
    peer: c_int,
) -> R {
    let call = if send { "ncclSend" } else { "ncclRecv" };
    code((|| {
        let comm = self::comm(comm)?;
        if !lock(&comm.clique.state).joined.iter().all(|&j| j) {
            return Err(fail(
                R::ncclInvalidUsage,
                format!("{call}: the communicator is still being made: not every rank has joined"),
            ));
        }
        let size = elem_size(dtype)?;
        let nranks = comm.clique.nranks;
        if !(0..nranks as c_int).contains(&peer) {
            return Err(fail(
                R::ncclInvalidArgument,
                format!("{call}: peer {peer} is not a rank of this {nranks}-rank communicator"),
            ));
        }
        let stream = crate::stream::resolve(stream)
            .map_err(|_| fail(R::ncclInvalidArgument, "the stream is not a live stream"))?;
        if stream.device != comm.device {
            return Err(fail(
                R::ncclInvalidArgument,
                format!(
                    "{call}: rank {} of the communicator is on device {}, but the stream on \
                     device {}",
                    comm.rank, comm.device, stream.device
                ),
            ));
        }
        let bytes = count.checked_mul(size).ok_or_else(|| {
            fail(
                R::ncclInvalidArgument,
                format!("{call}: {count} elements overflow"),
            )
        })?;
        if bytes > 0 {
            let what = if send {
                "send buffer"
            } else {
                "receive buffer"
            };
            check_buffer(ptr, bytes, comm.device, what)?;
        }
        let p2p = P2p {
            send,
            peer: peer as usize,
            half: Half {
                ptr,
                count,
                dtype,
                bytes,
                device: comm.device,
                faulted: false,
            },
        };
        if GROUP_DEPTH.with(Cell::get) > 0 {
            GROUPED.with(|g| g.borrow_mut().push(Grouped { stream, comm, p2p }));
            return Ok(());
        }
        submit(&stream, exchange_maker(vec![(comm, p2p)]))
    })())
}

pub(super) unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    enqueue_p2p(comm, stream, true, sendbuff as usize, count, datatype, peer)
}

pub(super) unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> R {
    enqueue_p2p(
        comm,
        stream,
        false,
        recvbuff as usize,
        count,
        datatype,
        peer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Kind, allocate, free};

    /// `count` `f32`s of live device memory on device 0, each `value`.
    fn floats(count: usize, value: f32) -> Half {
        let bytes = count * 4;
        let ptr = allocate(bytes, Kind::Device, 0).unwrap();
        let values = vec![value; count];
        // SAFETY: `ptr` was just allocated with room for `bytes` bytes (the
        // software device's memory is host memory), and nothing else has it.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), ptr as *mut f32, count) };
        Half {
            ptr,
            count,
            dtype: ncclDataType_t::ncclFloat32,
            bytes,
            device: 0,
            faulted: false,
        }
    }

    fn read(half: &Half, count: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; count];
        // SAFETY: `half` is live for `count` `f32`s (checked by the caller's
        // allocation) and no work runs on it here.
        unsafe { std::ptr::copy_nonoverlapping(half.ptr as *const f32, out.as_mut_ptr(), count) };
        out
    }

    /// The one check left to the software NCCL (the collectives crate checks
    /// that the sides agree): a send larger than its receive is refused,
    /// naming both sizes, before anything is copied (copied, the send would
    /// write past the receive buffer); a pair of one size goes through.
    #[test]
    fn a_send_larger_than_its_receive_is_refused_and_writes_nothing() {
        let (send, recv) = (floats(8, 1.0), floats(6, 0.0));
        let why = transfer((0, 1, 0), send, recv).unwrap_err();
        assert!(
            why.contains("32 byte(s)") && why.contains("24 byte(s)"),
            "{why}"
        );
        assert_eq!(read(&recv, 6), [0.0; 6]);
        let (same_size, into) = (floats(6, 2.0), floats(6, 0.0));
        transfer((0, 1, 1), same_size, into).unwrap();
        assert_eq!(read(&into, 6), [2.0; 6]);
        for half in [send, recv, same_size, into] {
            free(half.ptr, &[Kind::Device]).unwrap();
        }
    }
}
