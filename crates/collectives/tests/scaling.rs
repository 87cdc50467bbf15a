//! Tests written for any number of devices: every collective, all-to-all,
//! gather, scatter and a ring of sends and receives over all of them, with
//! the data checked element by element. CI runs them with 2, 4 and 8
//! software devices (`CUDA_STREAMS_SOFT_DEVICES`); on GPUs they use every
//! device there is (`CUDA_STREAMS_TEST_DEVICES=n` takes the first n, and
//! asking for more than exist skips, saying why).
//!
//! Each runs two ways: one thread driving every rank through a group
//! (`Communicator::all_devices`), and one thread per rank, each with its own
//! communicator made from a shared unique id (`init_rank`), as one process
//! per GPU would.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{Communicator, Error, Group, ReduceOp, UniqueId};
use std::sync::Arc;

/// The devices to use, or `None` (printed) when there are too few.
fn devices(min: usize) -> Option<Vec<Arc<Context>>> {
    let all = Context::all().unwrap();
    let wanted = match std::env::var("CUDA_STREAMS_TEST_DEVICES") {
        Ok(n) => n
            .parse::<usize>()
            .expect("CUDA_STREAMS_TEST_DEVICES is a number"),
        Err(_) => all.len(),
    };
    if wanted > all.len() {
        eprintln!(
            "skipped: CUDA_STREAMS_TEST_DEVICES={wanted} but the driver reports {} device(s)",
            all.len()
        );
        return None;
    }
    if wanted < min {
        eprintln!("skipped: needs {min} devices, {wanted} in use");
        return None;
    }
    Some(all.into_iter().take(wanted).collect())
}

/// One communicator per device, made by one thread per rank from one id.
fn comms_by_rank(contexts: &[Arc<Context>]) -> Vec<Communicator> {
    let id = UniqueId::new().unwrap();
    let n = contexts.len();
    std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| s.spawn(move || Communicator::init_rank(ctx, n, &id, rank).unwrap()))
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// What rank `r` holds at element `i` before a collective.
fn value(r: usize, i: usize) -> u64 {
    (r * 1000 + i) as u64
}

fn streams(contexts: &[Arc<Context>]) -> Vec<Arc<Stream>> {
    contexts.iter().map(|c| Stream::new(c).unwrap()).collect()
}

/// Every collective and exchange, once, driven by one thread in groups.
fn every_kind_grouped(contexts: &[Arc<Context>], comms: &[Communicator]) {
    let n = comms.len();
    let streams = streams(contexts);
    let chunk = 5;
    let len = n * chunk;
    let input: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .enumerate()
        .map(|(r, s)| {
            DeviceBuffer::from_slice(s, &(0..len).map(|i| value(r, i)).collect::<Vec<_>>()).unwrap()
        })
        .collect();
    // AllReduce.
    let mut out: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .map(|s| DeviceBuffer::new_async(s, len).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, o) in out.iter_mut().enumerate() {
        group
            .all_reduce(&comms[r], &streams[r], &input[r], o, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    for (s, o) in streams.iter().zip(&out) {
        let expected: Vec<u64> = (0..len)
            .map(|i| (0..n).map(|r| value(r, i)).sum())
            .collect();
        assert_eq!(o.to_vec(s).unwrap(), expected, "all_reduce");
    }
    // AllGather of each rank's first chunk.
    let mut gathered: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .map(|s| DeviceBuffer::new_async(s, len).unwrap())
        .collect();
    let firsts: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .enumerate()
        .map(|(r, s)| {
            DeviceBuffer::from_slice(s, &(0..chunk).map(|i| value(r, i)).collect::<Vec<_>>())
                .unwrap()
        })
        .collect();
    let mut group = Group::new();
    for (r, g) in gathered.iter_mut().enumerate() {
        group
            .all_gather(&comms[r], &streams[r], &firsts[r], g)
            .unwrap();
    }
    group.end().unwrap();
    let expected: Vec<u64> = (0..n)
        .flat_map(|r| (0..chunk).map(move |i| value(r, i)))
        .collect();
    for (s, g) in streams.iter().zip(&gathered) {
        assert_eq!(g.to_vec(s).unwrap(), expected, "all_gather");
    }
    // ReduceScatter.
    let mut scattered: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .map(|s| DeviceBuffer::new_async(s, chunk).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, o) in scattered.iter_mut().enumerate() {
        group
            .reduce_scatter(&comms[r], &streams[r], &input[r], o, ReduceOp::Max)
            .unwrap();
    }
    group.end().unwrap();
    for (p, (s, o)) in streams.iter().zip(&scattered).enumerate() {
        let expected: Vec<u64> = (0..chunk).map(|i| value(n - 1, p * chunk + i)).collect();
        assert_eq!(o.to_vec(s).unwrap(), expected, "reduce_scatter");
    }
    // All-to-all: rank p's chunk r comes from rank r's chunk p.
    let mut exchanged: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .map(|s| DeviceBuffer::new_async(s, len).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, o) in exchanged.iter_mut().enumerate() {
        group
            .all_to_all(&comms[r], &streams[r], &input[r], o)
            .unwrap();
    }
    group.end().unwrap();
    for (p, (s, o)) in streams.iter().zip(&exchanged).enumerate() {
        let got = o.to_vec(s).unwrap();
        for r in 0..n {
            for i in 0..chunk {
                assert_eq!(
                    got[r * chunk + i],
                    value(r, p * chunk + i),
                    "all_to_all: rank {p}, chunk {r}, element {i}"
                );
            }
        }
    }
    // A ring: rank r sends its input to r + 1 and receives from r - 1.
    let mut ring: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .map(|s| DeviceBuffer::new_async(s, len).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, o) in ring.iter_mut().enumerate() {
        group
            .send(&comms[r], &streams[r], &input[r], (r + 1) % n)
            .unwrap();
        group
            .recv(&comms[r], &streams[r], o, (r + n - 1) % n)
            .unwrap();
    }
    group.end().unwrap();
    for (r, (s, o)) in streams.iter().zip(&ring).enumerate() {
        let from = (r + n - 1) % n;
        assert_eq!(
            o.to_vec(s).unwrap(),
            (0..len).map(|i| value(from, i)).collect::<Vec<_>>(),
            "ring into rank {r}"
        );
    }
    // Gather to the last rank, then scatter from it.
    let root = n - 1;
    let mut whole = DeviceBuffer::<u64>::new_async(&streams[root], len).unwrap();
    let mut group = Group::new();
    let mut whole_slot = Some(&mut whole);
    for r in 0..n {
        let recv = if r == root { whole_slot.take() } else { None };
        group
            .gather(&comms[r], &streams[r], &firsts[r], recv, root)
            .unwrap();
    }
    group.end().unwrap();
    assert_eq!(whole.to_vec(&streams[root]).unwrap(), expected, "gather");
    let mut parts: Vec<DeviceBuffer<u64>> = streams
        .iter()
        .map(|s| DeviceBuffer::new_async(s, chunk).unwrap())
        .collect();
    let mut group = Group::new();
    for (r, part) in parts.iter_mut().enumerate() {
        let send = if r == root { Some(&input[root]) } else { None };
        group
            .scatter(&comms[r], &streams[r], send, part, root)
            .unwrap();
    }
    group.end().unwrap();
    for (p, (s, part)) in streams.iter().zip(&parts).enumerate() {
        let expected: Vec<u64> = (0..chunk).map(|i| value(root, p * chunk + i)).collect();
        assert_eq!(part.to_vec(s).unwrap(), expected, "scatter to rank {p}");
    }
}

#[test]
fn every_kind_over_all_devices_from_one_thread() {
    let Some(contexts) = devices(1) else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    every_kind_grouped(&contexts, &comms);
}

/// One thread per rank, each making its own calls alone (no group): the
/// ring and the exchange still complete, and every result is checked.
#[test]
fn every_rank_on_its_own_thread() {
    let Some(contexts) = devices(1) else { return };
    let comms = comms_by_rank(&contexts);
    let n = comms.len();
    let chunk = 3;
    let len = n * chunk;
    std::thread::scope(|s| {
        for (r, comm) in comms.into_iter().enumerate() {
            let ctx = &contexts[r];
            s.spawn(move || {
                let stream = Stream::new(ctx).unwrap();
                let input = DeviceBuffer::from_slice(
                    &stream,
                    &(0..len).map(|i| value(r, i)).collect::<Vec<_>>(),
                )
                .unwrap();
                let mut sum = DeviceBuffer::<u64>::new_async(&stream, len).unwrap();
                comm.all_reduce(&stream, &input, &mut sum, ReduceOp::Sum)
                    .unwrap();
                let expected: Vec<u64> = (0..len)
                    .map(|i| (0..n).map(|q| value(q, i)).sum())
                    .collect();
                assert_eq!(sum.to_vec(&stream).unwrap(), expected);
                let mut exchanged = DeviceBuffer::<u64>::new_async(&stream, len).unwrap();
                comm.all_to_all(&stream, &input, &mut exchanged).unwrap();
                let got = exchanged.to_vec(&stream).unwrap();
                for q in 0..n {
                    for i in 0..chunk {
                        assert_eq!(
                            got[q * chunk + i],
                            value(q, r * chunk + i),
                            "rank {r}: chunk {q}"
                        );
                    }
                }
                // A pipeline: rank 0 starts, each rank adds its number and
                // passes it on; alone calls, in pipeline order.
                let mut carried = DeviceBuffer::<u64>::from_slice(&stream, &[0; 4]).unwrap();
                if r > 0 {
                    comm.recv(&stream, &mut carried, r - 1).unwrap();
                }
                let mut host = carried.to_vec(&stream).unwrap();
                assert_eq!(
                    host,
                    vec![(0..r as u64).sum::<u64>(); 4],
                    "rank {r} received"
                );
                host.iter_mut().for_each(|x| *x += r as u64);
                let next = DeviceBuffer::from_slice(&stream, &host).unwrap();
                if r + 1 < n {
                    comm.send(&stream, &next, r + 1).unwrap();
                }
                stream.synchronize().unwrap();
                comm.async_error().unwrap();
            });
        }
    });
}

#[test]
fn every_kind_over_all_devices_with_communicators_made_by_rank() {
    let Some(contexts) = devices(1) else { return };
    let comms = comms_by_rank(&contexts);
    every_kind_grouped(&contexts, &comms);
}

#[test]
fn a_send_and_its_receive_that_disagree_are_refused_on_both_ranks() {
    let Some(contexts) = devices(2) else { return };
    let comms = comms_by_rank(&contexts[..2]);
    let (comms, errors): (Vec<Communicator>, Vec<Error>) = std::thread::scope(|s| {
        let joins: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, comm)| {
                let ctx = &contexts[r];
                s.spawn(move || {
                    let stream = Stream::new(ctx).unwrap();
                    if r == 0 {
                        let data = DeviceBuffer::from_slice(&stream, &[1.0f32; 8]).unwrap();
                        let err = comm.send(&stream, &data, 1).unwrap_err();
                        (comm, err)
                    } else {
                        let mut data = DeviceBuffer::<f32>::new_async(&stream, 6).unwrap();
                        let err = comm.recv(&stream, &mut data, 0).unwrap_err();
                        (comm, err)
                    }
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for err in &errors {
        assert!(
            matches!(err, Error::PeerMismatch { from: 0, to: 1, .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("8 element(s) of f32") && text.contains("6 element(s) of f32"),
            "{text}"
        );
    }
    // Both communicators stay usable: a matching pair goes through.
    let streams = streams(&contexts[..2]);
    let data = DeviceBuffer::from_slice(&streams[0], &[2u32; 3]).unwrap();
    let mut into = DeviceBuffer::<u32>::new_async(&streams[1], 3).unwrap();
    let mut group = Group::new();
    group.send(&comms[0], &streams[0], &data, 1).unwrap();
    group.recv(&comms[1], &streams[1], &mut into, 0).unwrap();
    group.end().unwrap();
    assert_eq!(into.to_vec(&streams[1]).unwrap(), [2; 3]);
}

#[test]
fn types_that_differ_between_send_and_receive_are_refused() {
    let Some(contexts) = devices(2) else { return };
    let comms = Communicator::all_devices(&contexts[..2]).unwrap();
    let streams = streams(&contexts[..2]);
    let data = DeviceBuffer::from_slice(&streams[0], &[1u32; 4]).unwrap();
    let mut into = DeviceBuffer::<i32>::new_async(&streams[1], 4).unwrap();
    let mut group = Group::new();
    group.send(&comms[0], &streams[0], &data, 1).unwrap();
    group.recv(&comms[1], &streams[1], &mut into, 0).unwrap();
    let err = group.end().unwrap_err();
    assert!(matches!(err, Error::PeerMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("u32") && err.to_string().contains("i32"),
        "{err}"
    );
}

#[test]
fn a_peer_out_of_range_is_refused_naming_it() {
    let Some(contexts) = devices(1) else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let n = comms.len();
    let stream = Stream::new(&contexts[0]).unwrap();
    let data = DeviceBuffer::from_slice(&stream, &[1u8; 4]).unwrap();
    let err = comms[0].send(&stream, &data, n).unwrap_err();
    assert!(
        matches!(err, Error::InvalidPeer { peer, nranks, .. } if peer == n && nranks == n),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("peer {n}")), "{err}");
}

#[test]
fn a_group_driving_both_ranks_without_the_receive_is_refused() {
    let Some(contexts) = devices(2) else { return };
    let comms = Communicator::all_devices(&contexts).unwrap();
    let stream = Stream::new(&contexts[0]).unwrap();
    let data = DeviceBuffer::from_slice(&stream, &[1u8; 4]).unwrap();
    let mut group = Group::new();
    group.send(&comms[0], &stream, &data, 1).unwrap();
    let err = group.end().unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnmatchedPeer {
                from: 0,
                to: 1,
                sends: 1,
                recvs: 0
            }
        ),
        "{err}"
    );
}

/// Many rounds of grouped exchanges among all ranks, each checked: the
/// meeting's pairs are matched in order and forgotten once read.
#[test]
fn repeated_exchanges_stay_matched() {
    let Some(contexts) = devices(2) else { return };
    let comms = comms_by_rank(&contexts);
    let n = comms.len();
    std::thread::scope(|s| {
        for (r, comm) in comms.into_iter().enumerate() {
            let ctx = &contexts[r];
            s.spawn(move || {
                let stream = Stream::new(ctx).unwrap();
                for step in 0..20u32 {
                    let send =
                        DeviceBuffer::from_slice(&stream, &vec![step * 100 + r as u32; n * 2])
                            .unwrap();
                    let mut recv = DeviceBuffer::<u32>::new_async(&stream, n * 2).unwrap();
                    comm.all_to_all(&stream, &send, &mut recv).unwrap();
                    let expected: Vec<u32> =
                        (0..n).flat_map(|q| [step * 100 + q as u32; 2]).collect();
                    assert_eq!(
                        recv.to_vec(&stream).unwrap(),
                        expected,
                        "rank {r}, step {step}"
                    );
                }
            });
        }
    });
}

/// One thread driving every rank (judged without the meeting): a send and
/// its receive that differ in count are refused before NCCL sees either.
#[test]
fn counts_that_differ_in_a_group_of_every_rank_are_refused() {
    let Some(contexts) = devices(2) else { return };
    let comms = Communicator::all_devices(&contexts[..2]).unwrap();
    let streams = streams(&contexts[..2]);
    let data = DeviceBuffer::from_slice(&streams[0], &[1u32; 8]).unwrap();
    let mut into = DeviceBuffer::<u32>::new_async(&streams[1], 6).unwrap();
    let mut group = Group::new();
    group.send(&comms[0], &streams[0], &data, 1).unwrap();
    group.recv(&comms[1], &streams[1], &mut into, 0).unwrap();
    let err = group.end().unwrap_err();
    assert!(
        matches!(err, Error::PeerMismatch { from: 0, to: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("8 element(s) of u32"), "{err}");
}
