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
