//! The seeded race of a collective (issue 29): an all-reduce's output read
//! on a compute stream that never waited for the communication stream. It
//! is refused under `Check` (naming the collective and both streams),
//! repaired under `Auto` (one wait per rank), and silent once ordered. On
//! every device there is (CI runs it with 2, 4 and 8 software devices; on
//! GPUs `CUDA_STREAMS_TEST_DEVICES=n` takes the first n).

use cuda_streams_collectives::driver::{
    Context, DeviceBuffer, Error as DriverError, OrderPolicy, Stream,
};
use cuda_streams_collectives::{Communicator, Group, ReduceOp};
use std::sync::{Arc, Mutex, MutexGuard};
use test_support::Gate;

/// The tests switch the shared contexts' policy: one at a time, put back
/// afterwards.
static POLICY: Mutex<()> = Mutex::new(());

struct Policy {
    contexts: Vec<(Arc<Context>, OrderPolicy)>,
    _turn: MutexGuard<'static, ()>,
}

fn policy(contexts: &[Arc<Context>], policy: OrderPolicy) -> Policy {
    let turn = POLICY.lock().unwrap_or_else(|p| p.into_inner());
    let contexts = contexts
        .iter()
        .map(|ctx| {
            let before = ctx.ordering();
            ctx.set_ordering(policy).unwrap();
            (Arc::clone(ctx), before)
        })
        .collect();
    Policy {
        contexts,
        _turn: turn,
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        for (ctx, before) in &self.contexts {
            // `before` was accepted once; a drop does not panic regardless.
            if let Err(err) = ctx.set_ordering(*before) {
                eprintln!("the policy could not be put back: {err}");
            }
        }
    }
}

/// Every device in use, or `None` (printed why) with fewer than two.
fn devices() -> Option<Vec<Arc<Context>>> {
    let all = Context::all().unwrap();
    let wanted = match std::env::var("CUDA_STREAMS_TEST_DEVICES") {
        Ok(n) => n
            .parse::<usize>()
            .expect("CUDA_STREAMS_TEST_DEVICES is a number"),
        Err(_) => all.len(),
    };
    if wanted > all.len() || wanted < 2 {
        eprintln!(
            "skipped: needs 2 devices or more, {wanted} wanted, the driver reports {}",
            all.len()
        );
        return None;
    }
    Some(all.into_iter().take(wanted).collect())
}

/// An all-reduce (sum) of `[r + 1; len]` over every rank, enqueued on each
/// rank's communication stream; the outputs, those streams and a compute
/// stream per rank that waits for nothing.
struct Reduced {
    outputs: Vec<DeviceBuffer<u32>>,
    comm_streams: Vec<Arc<Stream>>,
    compute: Vec<Arc<Stream>>,
}

const LEN: usize = 1024;

fn all_reduce(contexts: &[Arc<Context>], comms: &[Communicator]) -> Reduced {
    let comm_streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let compute: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let inputs: Vec<DeviceBuffer<u32>> = comm_streams
        .iter()
        .enumerate()
        .map(|(r, s)| DeviceBuffer::from_slice(s, &[r as u32 + 1; LEN]).unwrap())
        .collect();
    // Not stream-ordered allocations: the first use of one on another
    // stream waits for the allocating stream, which would order the read.
    let mut outputs: Vec<DeviceBuffer<u32>> = contexts
        .iter()
        .map(|c| DeviceBuffer::new(c, LEN).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, out) in outputs.iter_mut().enumerate() {
        group
            .all_reduce(&comms[r], &comm_streams[r], &inputs[r], out, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    Reduced {
        outputs,
        comm_streams,
        compute,
    }
}

fn sum(n: usize) -> u32 {
    (1..=n as u32).sum()
}

#[test]
fn an_all_reduce_output_read_on_a_compute_stream_without_a_wait_is_refused_under_check() {
    let Some(contexts) = devices() else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let _policy = policy(&contexts, OrderPolicy::Check);
    let reduced = all_reduce(&contexts, &comms);
    for (r, out) in reduced.outputs.iter().enumerate() {
        let before = contexts[r].ordering_stats().reports;
        let err = out.to_vec(&reduced.compute[r]).unwrap_err();
        let message = err.to_string();
        let DriverError::UnorderedAccess(race) = err else {
            panic!("rank {r}: expected an unordered access, got {err}");
        };
        assert_eq!(race.earlier.what, "external work", "rank {r}");
        assert!(race.earlier.writes && !race.later.writes);
        assert_eq!(race.earlier.stream, reduced.comm_streams[r].id());
        assert_eq!(race.later.stream, reduced.compute[r].id());
        assert_eq!(race.later.device, r as i32);
        assert_eq!(race.overlap, 0..(LEN * 4) as u64);
        assert!(
            message.contains(&format!(
                "stream {} must wait for an event recorded after the external work on stream {}",
                reduced.compute[r].id(),
                reduced.comm_streams[r].id()
            )),
            "{message}"
        );
        assert_eq!(contexts[r].ordering_stats().reports, before + 1);
        // Once ordered, the same read goes through, silently.
        reduced.compute[r]
            .wait_stream(&reduced.comm_streams[r])
            .unwrap();
        assert_eq!(
            out.to_vec(&reduced.compute[r]).unwrap(),
            [sum(contexts.len()); LEN]
        );
        assert_eq!(contexts[r].ordering_stats().reports, before + 1);
    }
}

#[test]
fn auto_makes_each_compute_stream_wait_for_the_all_reduce() {
    let Some(contexts) = devices() else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let _policy = policy(&contexts, OrderPolicy::Auto);
    let before: Vec<u64> = contexts
        .iter()
        .map(|c| c.ordering_stats().inserted_waits)
        .collect();
    let reduced = all_reduce(&contexts, &comms);
    for (r, out) in reduced.outputs.iter().enumerate() {
        assert_eq!(
            out.to_vec(&reduced.compute[r]).unwrap(),
            [sum(contexts.len()); LEN],
            "rank {r}"
        );
        let waits = contexts[r].ordering_stats().inserted_waits;
        assert_eq!(waits, before[r] + 1, "rank {r}: one event");
        // Ordered now: nothing more is inserted.
        out.to_vec(&reduced.compute[r]).unwrap();
        assert_eq!(contexts[r].ordering_stats().inserted_waits, waits);
    }
}

#[test]
fn an_ordered_all_reduce_and_its_readers_are_silent_under_check() {
    let Some(contexts) = devices() else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let _policy = policy(&contexts, OrderPolicy::Check);
    let before: Vec<u64> = contexts
        .iter()
        .map(|c| c.ordering_stats().reports)
        .collect();
    let reduced = all_reduce(&contexts, &comms);
    for (r, out) in reduced.outputs.iter().enumerate() {
        // The compute stream waits through an event; its result is read on
        // the communication stream itself too.
        let done = reduced.comm_streams[r].record_event().unwrap();
        reduced.compute[r].wait_event(&done).unwrap();
        let expected = [sum(contexts.len()); LEN];
        assert_eq!(out.to_vec(&reduced.compute[r]).unwrap(), expected);
        assert_eq!(out.to_vec(&reduced.comm_streams[r]).unwrap(), expected);
        assert_eq!(contexts[r].ordering_stats().reports, before[r], "rank {r}");
    }
}

/// NCCL puts a group's collectives on their streams only at the group's
/// end (`ncclGroupEnd`). An event recorded on a collective's stream between
/// the group's call and its end is recorded before the collective: a
/// stream that waited for it is not ordered after the collective, and its
/// read of the output is refused, never served the old contents.
#[test]
fn an_event_recorded_before_the_group_ends_does_not_cover_its_collective() {
    let Some(contexts) = devices() else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let _policy = policy(&contexts, OrderPolicy::Check);
    let comm_streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let readers: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let inputs: Vec<DeviceBuffer<u32>> = comm_streams
        .iter()
        .enumerate()
        .map(|(r, s)| DeviceBuffer::from_slice(s, &[r as u32 + 1; LEN]).unwrap())
        .collect();
    let mut outputs: Vec<DeviceBuffer<u32>> = contexts
        .iter()
        .map(|c| DeviceBuffer::new(c, LEN).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, out) in outputs.iter_mut().enumerate() {
        group
            .all_reduce(&comms[r], &comm_streams[r], &inputs[r], out, ReduceOp::Sum)
            .unwrap();
    }
    for (stream, reader) in comm_streams.iter().zip(&readers) {
        let early = stream.record_event().unwrap();
        reader.wait_event(&early).unwrap();
    }
    group.end().unwrap();
    for (r, out) in outputs.iter().enumerate() {
        let err = out.to_vec(&readers[r]).unwrap_err();
        let DriverError::UnorderedAccess(race) = err else {
            panic!("rank {r}: expected an unordered access, got {err}");
        };
        assert_eq!(race.earlier.what, "external work", "rank {r}");
        assert!(race.earlier.writes && !race.later.writes, "rank {r}");
        assert_eq!(race.earlier.stream, comm_streams[r].id());
        assert_eq!(race.later.stream, readers[r].id());
        // A record taken after the group's end covers the collective.
        let done = comm_streams[r].record_event().unwrap();
        readers[r].wait_event(&done).unwrap();
        assert_eq!(out.to_vec(&readers[r]).unwrap(), [sum(contexts.len()); LEN]);
    }
}

/// The same window seen from the send buffer: a stream ordered only after
/// an event recorded before the group's end may not overwrite what the
/// collective still reads. (The collectives are held back behind a gate on
/// their streams, so were the memset let through it would run first and
/// the sum would mix in its value.)
#[test]
fn a_memset_of_a_send_buffer_ordered_only_before_the_group_ends_is_refused() {
    let Some(contexts) = devices() else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let _policy = policy(&contexts, OrderPolicy::Check);
    let comm_streams: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let others: Vec<Arc<Stream>> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    // Not stream-ordered allocations, as in `all_reduce`: the memset's
    // first use of one would wait for its allocating stream.
    let mut inputs: Vec<DeviceBuffer<u32>> = Vec::new();
    for (ctx, stream) in contexts.iter().zip(&comm_streams) {
        let mut input = DeviceBuffer::new(ctx, LEN).unwrap();
        stream.memset_u32_async(&mut input, 7).unwrap();
        inputs.push(input);
    }
    let mut outputs: Vec<DeviceBuffer<u32>> = contexts
        .iter()
        .map(|c| DeviceBuffer::new(c, LEN).unwrap())
        .collect();
    let gates: Vec<Gate> = comm_streams.iter().map(|s| Gate::close(s)).collect();
    let mut group = Group::new();
    for (r, out) in outputs.iter_mut().enumerate() {
        group
            .all_reduce(&comms[r], &comm_streams[r], &inputs[r], out, ReduceOp::Sum)
            .unwrap();
    }
    for (stream, other) in comm_streams.iter().zip(&others) {
        let early = stream.record_event().unwrap();
        other.wait_event(&early).unwrap();
    }
    group.end().unwrap();
    for (r, input) in inputs.iter_mut().enumerate() {
        let err = others[r].memset_u32_async(input, 0xDEAD).unwrap_err();
        let DriverError::UnorderedAccess(race) = err else {
            panic!("rank {r}: expected an unordered access, got {err}");
        };
        assert_eq!(race.earlier.what, "external work", "rank {r}");
        assert!(!race.earlier.writes && race.later.writes, "rank {r}");
        assert_eq!(race.earlier.stream, comm_streams[r].id());
        assert_eq!(race.later.stream, others[r].id());
    }
    drop(gates);
    let n = contexts.len() as u32;
    for (stream, out) in comm_streams.iter().zip(&outputs) {
        assert_eq!(out.to_vec(stream).unwrap(), [7 * n; LEN]);
    }
}

/// A captured collective is a node of the graph like a captured launch:
/// a memset captured on a forked branch that writes its buffer without a
/// join in between races with it at every replay, and the capture's end
/// refuses the graph under `Check`, naming both nodes.
#[test]
fn a_captured_collective_racing_with_a_captured_branch_is_refused_at_the_capture_end() {
    let Some(contexts) = devices() else { return };
    let ctx = &contexts[0];
    let single = Communicator::all_devices(&contexts[..1]).unwrap().remove(0);
    let _policy = policy(&contexts[..1], OrderPolicy::Check);
    let (origin, branch) = (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap());
    let buffer = Arc::new(DeviceBuffer::<u32>::new(ctx, LEN).unwrap());
    let mut capture = origin.begin_capture().unwrap();
    capture.fork(&origin, &[&branch]).unwrap();
    capture.memset_u8(&branch, &buffer, 0).unwrap();
    single
        .captured(&mut capture)
        .all_reduce_in_place(&origin, &buffer, ReduceOp::Sum)
        .unwrap();
    capture.join(&origin, &[&branch]).unwrap();
    let err = capture.end().unwrap_err();
    let DriverError::UnorderedAccess(race) = err else {
        panic!("expected an unordered access, got {err}");
    };
    assert_eq!(race.earlier.what, "memset");
    assert_eq!(race.earlier.stream, branch.id());
    assert_eq!(race.later.what, "external work");
    assert_eq!(race.later.stream, origin.id());
}
