//! The one place collectives reach NCCL: prepared on their streams, met with
//! the other ranks in this process, issued, then tracked.

use crate::error::{Error, Result};
use crate::meeting::Meeting;
use crate::rank_call::RankCall;
use crate::shape::Shape;
use driver::{Capture, Context, GraphArg, PreparedWork};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::sync::Arc;
use sys::nccl::{Progress, result};

/// Whether `issue` meets the other ranks in this process before the calls
/// (`No`: the caller has established that they agree).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meet {
    Yes,
    No,
}

/// Whether NCCL took each op of a call (most calls hold a few).
type Handed = SmallVec<[bool; 8]>;

/// Whether `issue` wraps its calls in `ncclGroupStart`/`ncclGroupEnd`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    Alone,
    Grouped,
}

/// The one place collectives reach NCCL: every op prepared (capture check,
/// stream order check, step taken and held in flight), the meeting with the
/// other ranks in this process, the calls (one alone, or a group), then
/// every step landed and every call handed to NCCL tracked, whatever failed
/// after it (a tracked use that did not run costs a wait; an untracked one
/// that did would let a free or host access overtake the collective).
/// Returns the first error.
///
/// The steps are taken before the meeting, so that a refused call meets no
/// one (a rank that meets the others and then makes no NCCL call would
/// leave theirs unmatched), and land only once NCCL has enqueued the work
/// (inside a group, at `ncclGroupEnd`): an event recorded on a stream in
/// between does not cover its collective. Work another thread enqueues on
/// one of these streams meanwhile goes before the collective, as the
/// tracker sees it too (a record covers neither until the collective's
/// step lands).
///
/// `rebind` makes the first op's context current again after NCCL, which
/// switches devices as it launches (`Context::force_bind`).
pub(crate) fn issue(
    ops: &[RankCall<'_>],
    grouping: Grouping,
    meet_first: Meet,
    rebind: impl FnOnce(&Context) -> driver::Result<()>,
) -> Result<()> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    if ops
        .iter()
        .any(|op| op.comm.context().kind() != first.comm.context().kind())
    {
        return Err(Error::MixedDrivers);
    }
    // Every stream before any call, so a refused group issues nothing; the
    // gates never wait, so holding several cannot deadlock. Dropped on an
    // error before the calls, the steps land with nothing enqueued, which
    // orders nothing that did not happen (`PreparedWork`).
    let mut prepared: SmallVec<[PreparedWork<'_>; 8]> = SmallVec::with_capacity(ops.len());
    for op in ops {
        prepared.push(op.prepare()?);
    }
    if meet_first == Meet::Yes {
        meet(ops)?;
    }
    let (handed, result) = issue_all(ops, grouping)?;
    // Not `?`: the calls are enqueued, and must be tracked first.
    let mut result = result;
    let rebound = rebind(first.comm.context()).map_err(Error::from);
    // Ops after a failed call in a group were never handed to NCCL: their
    // steps land untracked when the rest of `prepared` drops.
    for ((op, work), &took) in ops.iter().zip(prepared).zip(&handed) {
        let tracked = op.finish(work, took);
        result = result.and(tracked);
    }
    result.and(rebound)
}

/// The NCCL calls of `ops` (one alone, or a group): whether NCCL took
/// each op handed to it, and the first error. `Err` only when the group
/// could not be opened (nothing was handed over).
fn issue_all(ops: &[RankCall<'_>], grouping: Grouping) -> Result<(Handed, Result<()>)> {
    let Some(first) = ops.first() else {
        return Ok((Handed::new(), Ok(())));
    };
    let nccl = first.comm.nccl();
    // Each op handed to NCCL, and whether NCCL took it.
    let mut handed = Handed::with_capacity(ops.len());
    let mut outcome = Ok(());
    match grouping {
        Grouping::Alone => {
            for op in ops {
                let issued = op.issue(false);
                handed.push(issued.is_ok());
                outcome = outcome.and(issued);
            }
        }
        Grouping::Grouped => {
            result::group_start(nccl)?;
            for op in ops {
                let issued = op.issue(true);
                handed.push(issued.is_ok());
                if issued.is_err() {
                    outcome = issued;
                    break;
                }
            }
            // Closes the group opened above, whatever failed inside it.
            let ended = match result::group_end(nccl) {
                Ok(Progress::Done(())) => Ok(()),
                // Non-blocking communicators finish the group's launches in
                // the background: wait until each has.
                Ok(Progress::InProgress(())) => ops
                    .iter()
                    .zip(&handed)
                    .filter(|(_, took)| **took)
                    .try_for_each(|(op, _)| op.comm.settle()),
                Err(err) => Err(Error::from(err)),
            };
            outcome = outcome.and(ended);
        }
    }
    Ok((handed, outcome))
}

/// Capture `ops`, all of one rank and stream, into `capture` (one NCCL
/// group when there are several): once the capture has checked the stream,
/// checked against the other ranks in this process, then recorded with `args`' buffers and the communicator
/// kept alive by the graph. Nothing is tracked now: each replay orders the
/// buffers.
pub(crate) fn record(ops: &[RankCall<'_>], capture: &mut Capture, args: &[GraphArg]) -> Result<()> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    debug_assert!(
        ops.iter()
            .all(|op| std::ptr::eq(op.comm, first.comm) && op.stream.id() == first.stream.id())
    );
    let grouping = if ops.len() > 1 {
        Grouping::Grouped
    } else {
        Grouping::Alone
    };
    // SAFETY: NCCL enqueues the calls on the ops' one stream, which the
    // capture checks is in it; they touch the buffers the ops' pointers
    // come from, which are `args` (send buffers read, receive buffers lent
    // with `GraphArg::write`), and the communicator `keep_alive` holds.
    unsafe {
        capture.record_external(first.stream, args, first.comm.keep_alive(), || {
            // Met only once the capture has taken the stream: a call that
            // meets the other ranks and then makes no NCCL call would leave
            // theirs unmatched.
            meet(ops)?;
            let (_, result) = issue_all(ops, grouping)?;
            let rebound = first.comm.context().force_bind().map_err(Error::from);
            result.and(rebound)
        })
    }
}

/// The common case of one thread driving every rank of a communicator made
/// by `all_devices`, one collective each (a data-parallel step): `true`
/// when the ops are exactly that and every rank's shape is the first's,
/// which is all the general checks (`Group::check_ranks`, `meet`) would
/// establish, at the cost of one comparison per rank, with no lock and no
/// allocation. No other thread can hold these ranks (the group borrows
/// each, and a `Communicator` is not `Sync`), so there is no one to meet.
/// `false` sends the ops down the general path, which also names any
/// disagreement.
pub(crate) fn whole_round_agrees(ops: &[RankCall<'_>]) -> bool {
    let Some(first) = ops.first() else {
        return false;
    };
    let n = first.comm.size();
    if ops.len() != n || n > 64 {
        return false;
    }
    let mut seen = 0u64;
    for op in ops {
        if !op.comm.made_together
            || !Arc::ptr_eq(op.comm.meeting(), first.comm.meeting())
            || op.shape != first.shape
            || op.shape.kind.is_p2p()
        {
            return false;
        }
        seen |= 1 << op.comm.rank();
    }
    seen.count_ones() as usize == n
}

/// Post the ops' shapes, per communicator and rank, to the meetings of the
/// ranks in this process, and wait for every verdict. Every meeting is
/// posted to before any is waited on, so calls that each hold ranks of
/// several communicators cannot wait for each other in a circle.
fn meet(ops: &[RankCall<'_>]) -> Result<()> {
    // The common case of one rank per process costs one branch per op: no
    // lock, no allocation.
    if ops.iter().all(|op| op.comm.alone_here) {
        return Ok(());
    }
    /// Each rank's collectives, in call order.
    type Calls = BTreeMap<usize, Vec<Shape>>;
    let mut meetings: Vec<(&Arc<Meeting>, Calls)> = Vec::new();
    for op in ops.iter().filter(|op| !op.comm.alone_here) {
        let meeting = op.comm.meeting();
        let calls = match meetings.iter_mut().find(|(m, _)| Arc::ptr_eq(m, meeting)) {
            Some((_, calls)) => calls,
            None => {
                meetings.push((meeting, BTreeMap::new()));
                &mut meetings.last_mut().unwrap_or_else(|| unreachable!()).1
            }
        };
        calls.entry(op.comm.rank()).or_default().push(op.shape);
    }
    // Every post first (a refusal of one call posts nothing anywhere).
    for (meeting, calls) in &meetings {
        meeting.check_pairs_within(calls)?;
    }
    // A communicator driven whole by this call (every rank of one made by
    // `all_devices`) is judged here: no other thread can hold its ranks.
    let whole = |meeting: &Arc<Meeting>, calls: &Calls| {
        ops.iter()
            .filter(|op| Arc::ptr_eq(op.comm.meeting(), meeting))
            .all(|op| op.comm.made_together && calls.len() == op.comm.size())
    };
    for (meeting, calls) in &meetings {
        if whole(meeting, calls) {
            meeting.judge_whole(calls)?;
        }
    }
    let tickets: Vec<_> = meetings
        .into_iter()
        .filter(|(meeting, calls)| !whole(meeting, calls))
        .filter_map(|(meeting, calls)| meeting.post(calls.into_iter().collect()))
        .collect();
    // Every ticket waited for, so each round's verdict is collected.
    let mut result = Ok(());
    for ticket in tickets {
        result = result.and(ticket.wait().map_err(Error::from));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Communicator, Group, ReduceOp};
    use driver::{DeviceBuffer, Stream};
    use test_support::Gate;

    /// The lock-free path is what one thread driving a whole `all_devices`
    /// communicator takes for one collective per rank, and only then.
    #[test]
    fn a_whole_matching_round_skips_the_meeting_and_nothing_else_does() {
        let contexts = Context::all().unwrap();
        if contexts.len() < 2 {
            eprintln!(
                "skipped: needs two devices, the driver reports {}",
                contexts.len()
            );
            return;
        }
        let comms = Communicator::all_devices(&contexts).unwrap();
        let streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
        let mut bufs: Vec<DeviceBuffer<f32>> = streams
            .iter()
            .enumerate()
            .map(|(r, s)| DeviceBuffer::from_slice(s, &vec![1.0; 8 + r % 2]).unwrap())
            .collect();
        let n = comms.len();
        let round = |bufs: &mut [DeviceBuffer<f32>], ranks: usize| {
            let mut group = Group::new();
            for ((comm, stream), buf) in comms.iter().zip(&streams).zip(bufs).take(ranks) {
                group
                    .all_reduce_in_place(comm, stream, buf, ReduceOp::Sum)
                    .unwrap();
            }
            whole_round_agrees(&group.ops)
        };
        // Rank 1's buffer is one longer: the general path names it.
        assert!(!round(&mut bufs, n));
        let mut same: Vec<DeviceBuffer<f32>> = streams
            .iter()
            .map(|s| DeviceBuffer::from_slice(s, &[1.0; 8]).unwrap())
            .collect();
        assert!(round(&mut same, n));
        assert!(!round(&mut same, n - 1), "a rank left out");
    }

    /// A failure after NCCL has the calls still tracks each of them: send
    /// buffers dropped at once on their home streams are freed only after
    /// the held collectives read them. The failure is injected into
    /// `issue`'s rebinding: on the software driver `cuCtxSetCurrent` fails
    /// only inside a stream callback (where `bind` refuses first) or for a
    /// context no longer alive (the communicator holds its context), so no
    /// public call provokes it.
    #[test]
    fn calls_handed_to_nccl_are_tracked_when_rebinding_fails() {
        let contexts = Context::all().unwrap();
        if contexts.len() < 2 {
            eprintln!(
                "skipped: needs two devices, the driver reports {}",
                contexts.len()
            );
            return;
        }
        let contexts = &contexts[..2];
        let comms = Communicator::all_devices(contexts).unwrap();
        let streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
        // Uploaded on other streams, whose frees the collectives' streams
        // must hold back.
        let homes: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
        let send: Vec<DeviceBuffer<u32>> = homes
            .iter()
            .enumerate()
            .map(|(r, s)| DeviceBuffer::from_slice(s, &[r as u32 + 1; 4096]).unwrap())
            .collect();
        let mut recv: Vec<DeviceBuffer<u32>> = streams
            .iter()
            .map(|s| DeviceBuffer::from_slice(s, &[0; 4096]).unwrap())
            .collect();
        let gates: Vec<Gate> = streams.iter().map(|s| Gate::close(s)).collect();
        let mut group = Group::new();
        for (i, out) in recv.iter_mut().enumerate() {
            group
                .all_reduce(&comms[i], &streams[i], &send[i], out, ReduceOp::Sum)
                .unwrap();
        }
        let injected = |_: &Context| {
            Err(driver::Error::InsideCallback {
                operation: "rebinding (injected)",
            })
        };
        let err = issue(&group.ops, Grouping::Grouped, Meet::No, injected).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        drop(group);
        drop(send);
        drop(gates);
        for (stream, out) in streams.iter().zip(&recv) {
            assert_eq!(out.to_vec(stream).unwrap(), vec![3; 4096]);
        }
    }
}
