//! Collectives captured into CUDA graphs and replayed, with the data
//! checked after every replay, on any number of devices (one thread per
//! rank, each capturing its own stream, as one process per GPU would).
//! The graphs keep the communicators alive: each rank gives its
//! communicator up before the replays.

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Stream};
use cuda_streams_collectives::{Communicator, Error, ReduceOp, UniqueId};
use std::sync::{Arc, Barrier};

/// Every device, or `None` (printed) when there are fewer than two.
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
            "skipped: needs 2 to {} devices, CUDA_STREAMS_TEST_DEVICES asks {wanted}",
            all.len()
        );
        return None;
    }
    Some(all.into_iter().take(wanted).collect())
}

const REPLAYS: u32 = 5;
const CHUNK: usize = 64;

/// Rank `r`'s element `i` before the first replay.
fn start(r: usize, i: usize) -> u64 {
    (r + 1) as u64 * 1000 + i as u64
}

/// A graph of an in-place AllReduce (sum) and an all-to-all of its result,
/// replayed `REPLAYS` times: after replay `k` every rank's buffer holds
/// `sum_r start(r, i) * n^(k-1)`, and chunk `p` of the all-to-all's output
/// holds chunk `rank` of that.
#[test]
fn all_reduce_and_all_to_all_replayed_with_the_data_checked() {
    let Some(contexts) = devices() else { return };
    let n = contexts.len();
    let id = UniqueId::new().unwrap();
    let captured = Barrier::new(n);
    std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| {
                let captured = &captured;
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, n, &id, rank).unwrap();
                    let stream = Stream::new(ctx).unwrap();
                    let len = CHUNK * n;
                    let init: Vec<u64> = (0..len).map(|i| start(rank, i)).collect();
                    let buffer = Arc::new(DeviceBuffer::from_slice(&stream, &init).unwrap());
                    let out = Arc::new(DeviceBuffer::<u64>::new_async(&stream, len).unwrap());
                    let mut capture = stream.begin_capture().unwrap();
                    {
                        let mut nccl = comm.captured(&mut capture);
                        nccl.all_reduce_in_place(&stream, &buffer, ReduceOp::Sum)
                            .unwrap();
                        nccl.all_to_all(&stream, &buffer, &out).unwrap();
                    }
                    // The eager call stays refused on the capturing stream.
                    let mut eager = DeviceBuffer::<u64>::new(ctx, 4).unwrap();
                    let err = comm
                        .all_reduce_in_place(&stream, &mut eager, ReduceOp::Sum)
                        .unwrap_err();
                    assert!(matches!(err, Error::StreamCapturing { .. }), "{err}");
                    let graph = capture.end().unwrap();
                    let exec = graph.instantiate().unwrap();
                    // Every rank has captured before any communicator goes.
                    captured.wait();
                    let err = comm.abort().unwrap_err();
                    assert!(
                        matches!(err, Error::CommunicatorInGraph { rank: r, holders: 1 } if r == rank),
                        "{err}"
                    );
                    drop(graph);
                    for k in 1..=REPLAYS {
                        exec.launch(&stream).unwrap();
                        let factor = (n as u64).pow(k - 1);
                        let reduced: Vec<u64> = (0..len)
                            .map(|i| (0..n).map(|r| start(r, i)).sum::<u64>() * factor)
                            .collect();
                        assert_eq!(buffer.to_vec(&stream).unwrap(), reduced, "replay {k}, rank {rank}");
                        let exchanged = out.to_vec(&stream).unwrap();
                        for peer in 0..n {
                            for j in 0..CHUNK {
                                assert_eq!(
                                    exchanged[peer * CHUNK + j],
                                    reduced[rank * CHUNK + j],
                                    "replay {k}: rank {rank}'s element {j} from rank {peer}"
                                );
                            }
                        }
                    }
                })
            })
            .collect();
        for join in joins {
            join.join().unwrap();
        }
    });
}

/// A ring of captured sends and receives, replayed: each replay passes
/// every rank's buffer one rank on, so after replay `k` rank `r` holds
/// what rank `r - k` started with.
#[test]
fn send_recv_ring_replayed_with_the_data_checked() {
    let Some(contexts) = devices() else { return };
    let n = contexts.len();
    let id = UniqueId::new().unwrap();
    std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| {
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, n, &id, rank).unwrap();
                    let stream = Stream::new(ctx).unwrap();
                    let init: Vec<u64> = (0..CHUNK).map(|i| start(rank, i)).collect();
                    let held = Arc::new(DeviceBuffer::from_slice(&stream, &init).unwrap());
                    let arrived = Arc::new(DeviceBuffer::<u64>::new(ctx, CHUNK).unwrap());
                    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
                    let mut capture = stream.begin_capture().unwrap();
                    {
                        let mut nccl = comm.captured(&mut capture);
                        // Even ranks send first, odd ranks receive first, so the
                        // pairs are matched in order on every rank.
                        if rank % 2 == 0 {
                            nccl.send(&stream, &held, next).unwrap();
                            nccl.recv(&stream, &arrived, prev).unwrap();
                        } else {
                            nccl.recv(&stream, &arrived, prev).unwrap();
                            nccl.send(&stream, &held, next).unwrap();
                        }
                    }
                    capture.copy(&stream, &held, &arrived).unwrap();
                    let exec = capture.end().unwrap().instantiate().unwrap();
                    for k in 1..=REPLAYS as usize {
                        exec.launch(&stream).unwrap();
                        let from = (rank + n * k - k) % n;
                        let expected: Vec<u64> = (0..CHUNK).map(|i| start(from, i)).collect();
                        assert_eq!(
                            held.to_vec(&stream).unwrap(),
                            expected,
                            "replay {k}, rank {rank}"
                        );
                    }
                    drop(comm);
                })
            })
            .collect();
        for join in joins {
            join.join().unwrap();
        }
    });
}

/// One rank captures what another runs eagerly: both are refused before
/// NCCL sees either call, naming the captured one.
#[test]
fn captured_and_eager_calls_of_one_step_disagree() {
    let Some(contexts) = devices() else { return };
    let contexts = &contexts[..2];
    let id = UniqueId::new().unwrap();
    let outcomes: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| {
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, 2, &id, rank).unwrap();
                    let stream = Stream::new(ctx).unwrap();
                    let mut buffer = DeviceBuffer::from_slice(&stream, &[1.0f32; 16]).unwrap();
                    let outcome = if rank == 0 {
                        let buffer = Arc::new(buffer);
                        let mut capture = stream.begin_capture().unwrap();
                        let outcome = comm.captured(&mut capture).all_reduce_in_place(
                            &stream,
                            &buffer,
                            ReduceOp::Sum,
                        );
                        drop(capture);
                        outcome
                    } else {
                        comm.all_reduce_in_place(&stream, &mut buffer, ReduceOp::Sum)
                    };
                    // Aborted, not destroyed: were the calls let through, the
                    // eager one would wait forever for a partner.
                    if let Err(err) = comm.abort() {
                        assert!(matches!(err, Error::CommunicatorInGraph { .. }), "{err}");
                    }
                    outcome
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for outcome in &outcomes {
        let Err(err) = outcome else {
            panic!("a captured and an eager call of one step were let through")
        };
        assert!(matches!(err, Error::RanksDisagree { .. }), "{err}");
        assert!(err.to_string().contains("captured into a graph"), "{err}");
    }
}

/// Through the engine's capture (`OperationGraph::capture`): an AllReduce
/// operation after a fill, replayed, the data checked after each replay.
#[test]
fn operation_graph_capture_takes_a_collective() {
    use cuda_streams_collectives::engine::OperationGraph;
    let Some(contexts) = devices() else { return };
    let n = contexts.len();
    let id = UniqueId::new().unwrap();
    std::thread::scope(|s| {
        let joins: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| {
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, n, &id, rank).unwrap();
                    let (stream, other) = (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap());
                    let grads = Arc::new(DeviceBuffer::<u8>::new(ctx, 256).unwrap());
                    let graph = OperationGraph::for_context(ctx);
                    let mut capture = graph.capture(&stream).unwrap();
                    let fill = capture
                        .op(&other)
                        .label("gradients")
                        .run(|c, s| c.memset_u8(s, &grads, rank as u8 + 1))
                        .unwrap();
                    capture
                        .op(&stream)
                        .after(&[fill])
                        .label("all-reduce")
                        .run_with(|c, s| {
                            comm.captured(c)
                                .all_reduce_in_place(s, &grads, ReduceOp::Sum)
                        })
                        .unwrap();
                    let replay = capture.finish().unwrap();
                    let sum = (1..=n as u8).sum::<u8>();
                    for k in 1..=REPLAYS {
                        replay.replay(&stream, 1).unwrap();
                        assert_eq!(grads.to_vec(&stream).unwrap(), vec![sum; 256], "replay {k}");
                    }
                })
            })
            .collect();
        for join in joins {
            join.join().unwrap();
        }
    });
}

/// A collective captured on a stream outside the capture is refused before
/// it meets the other ranks, which therefore do not go on without it.
#[test]
fn a_stream_outside_the_capture_is_refused_before_the_meeting() {
    let Some(contexts) = devices() else { return };
    let contexts = &contexts[..2];
    let mut comms = Communicator::all_devices(contexts).unwrap();
    // Rank 1 is gone: a call that reached the meeting would be refused for
    // that (`RankGone`) rather than wait.
    drop(comms.pop());
    let stream = Stream::new(&contexts[0]).unwrap();
    let outside = Stream::new(&contexts[0]).unwrap();
    let buffer = Arc::new(DeviceBuffer::from_slice(&stream, &[1u32; 4]).unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let err = comms[0]
        .captured(&mut capture)
        .all_reduce_in_place(&outside, &buffer, ReduceOp::Sum)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("does not take part in the capture"),
        "{err}"
    );
    assert_eq!(capture.end().unwrap().node_count(), 0);
}
