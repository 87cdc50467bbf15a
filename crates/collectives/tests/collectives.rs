//! Every collective over two devices with its data checked against a host
//! reference, communicators per rank from one unique id, stream order, and
//! bad input refused before NCCL sees it. Skips, saying why, with fewer
//! than two devices. On the software driver the software NCCL runs them;
//! on GPUs, NCCL (with NCCL_NVLS_ENABLE=0).

use cuda_streams_collectives::driver::{Context, DeviceBuffer, Error as DriverError, Stream};
use cuda_streams_collectives::{Communicator, Error, Group, ReduceOp, UniqueId};
use std::sync::Arc;
use test_support::{Gate, XorShift};

struct Ranks {
    contexts: Vec<Arc<Context>>,
    comms: Vec<Communicator>,
    streams: Vec<Arc<Stream>>,
}

/// Two ranks on devices 0 and 1, or `None` (printed why).
fn two_ranks() -> Option<Ranks> {
    let contexts = Context::all().unwrap();
    if contexts.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            contexts.len()
        );
        return None;
    }
    let contexts = contexts[..2].to_vec();
    let comms = Communicator::all_devices(&contexts).unwrap();
    let streams = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    Some(Ranks {
        contexts,
        comms,
        streams,
    })
}

fn upload<T: cuda_streams_collectives::NcclType>(
    r: &Ranks,
    data: &[Vec<T>],
) -> Vec<DeviceBuffer<T>> {
    r.streams
        .iter()
        .zip(data)
        .map(|(s, d)| DeviceBuffer::from_slice(s, d).unwrap())
        .collect()
}

fn download<T: cuda_streams_collectives::NcclType>(
    r: &Ranks,
    bufs: &[DeviceBuffer<T>],
) -> Vec<Vec<T>> {
    r.streams
        .iter()
        .zip(bufs)
        .map(|(s, b)| b.to_vec(s).unwrap())
        .collect()
}

fn zeros<T: cuda_streams_collectives::NcclType + Default>(
    r: &Ranks,
    len: usize,
) -> Vec<DeviceBuffer<T>> {
    upload(r, &[vec![T::default(); len], vec![T::default(); len]])
}

#[test]
fn all_reduce_combines_every_rank_with_each_operation() {
    let Some(r) = two_ranks() else { return };
    let mut rng = XorShift::new(5);
    let len = 10_007;
    let data: Vec<Vec<f64>> = (0..2)
        .map(|_| (0..len).map(|_| rng.next_f32() as f64).collect())
        .collect();
    let send = upload(&r, &data);
    for (op, f) in [
        (ReduceOp::Sum, (|a, b| a + b) as fn(f64, f64) -> f64),
        (ReduceOp::Prod, |a, b| a * b),
        (ReduceOp::Max, f64::max),
        (ReduceOp::Min, f64::min),
        (ReduceOp::Avg, |a, b| (a + b) / 2.0),
    ] {
        let mut recv = zeros::<f64>(&r, len);
        let mut group = Group::new();
        for (i, out) in recv.iter_mut().enumerate() {
            group
                .all_reduce(&r.comms[i], &r.streams[i], &send[i], out, op)
                .unwrap();
        }
        group.end().unwrap();
        let expected: Vec<f64> = (0..len).map(|i| f(data[0][i], data[1][i])).collect();
        for got in download(&r, &recv) {
            for (g, e) in got.iter().zip(&expected) {
                assert!(
                    (g - e).abs() <= 1e-12 * e.abs().max(1.0),
                    "{op:?}: {g} vs {e}"
                );
            }
        }
    }
    // Integers, in place.
    let ints = [vec![3i32, -4, 7], vec![10, 20, -30]];
    let mut bufs = upload(&r, &ints);
    let mut group = Group::new();
    for ((comm, stream), buf) in r.comms.iter().zip(&r.streams).zip(&mut bufs) {
        group
            .all_reduce_in_place(comm, stream, buf, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    assert_eq!(download(&r, &bufs), [vec![13, 16, -23], vec![13, 16, -23]]);
}

#[test]
fn broadcast_copies_the_roots_data_to_every_rank() {
    let Some(r) = two_ranks() else { return };
    for root in 0..2 {
        let data = [vec![1u64, 2, 3, 4], vec![50, 60, 70, 80]];
        let send = upload(&r, &data);
        let mut recv = zeros::<u64>(&r, 4);
        let mut group = Group::new();
        for (i, out) in recv.iter_mut().enumerate() {
            group
                .broadcast(&r.comms[i], &r.streams[i], &send[i], out, root)
                .unwrap();
        }
        group.end().unwrap();
        assert_eq!(
            download(&r, &recv),
            [data[root].clone(), data[root].clone()]
        );
        let mut bufs = upload(&r, &data);
        let mut group = Group::new();
        for ((comm, stream), buf) in r.comms.iter().zip(&r.streams).zip(&mut bufs) {
            group.broadcast_in_place(comm, stream, buf, root).unwrap();
        }
        group.end().unwrap();
        assert_eq!(
            download(&r, &bufs),
            [data[root].clone(), data[root].clone()]
        );
    }
}

#[test]
fn reduce_writes_the_root_only() {
    let Some(r) = two_ranks() else { return };
    let data = [vec![1u32, 2, 3], vec![10, 20, 30]];
    let send = upload(&r, &data);
    let mut recv = upload(&r, &[vec![7u32; 3], vec![7; 3]]);
    let mut group = Group::new();
    for (i, out) in recv.iter_mut().enumerate() {
        group
            .reduce(&r.comms[i], &r.streams[i], &send[i], out, ReduceOp::Max, 1)
            .unwrap();
    }
    group.end().unwrap();
    assert_eq!(download(&r, &recv), [vec![7, 7, 7], vec![10, 20, 30]]);
}

#[test]
fn all_gather_puts_the_ranks_side_by_side() {
    let Some(r) = two_ranks() else { return };
    let data = [vec![1i64, 2, 3], vec![-4, -5, -6]];
    let send = upload(&r, &data);
    let mut recv = zeros::<i64>(&r, 6);
    let mut group = Group::new();
    for (i, out) in recv.iter_mut().enumerate() {
        group
            .all_gather(&r.comms[i], &r.streams[i], &send[i], out)
            .unwrap();
    }
    group.end().unwrap();
    let all = vec![1, 2, 3, -4, -5, -6];
    assert_eq!(download(&r, &recv), [all.clone(), all]);
}

#[test]
fn reduce_scatter_gives_each_rank_its_slice() {
    let Some(r) = two_ranks() else { return };
    let data = [vec![1.0f32, 2.0, 3.0, 4.0], vec![10.0, 20.0, 30.0, 40.0]];
    let send = upload(&r, &data);
    let mut recv = zeros::<f32>(&r, 2);
    let mut group = Group::new();
    for (i, out) in recv.iter_mut().enumerate() {
        group
            .reduce_scatter(&r.comms[i], &r.streams[i], &send[i], out, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    assert_eq!(download(&r, &recv), [vec![11.0, 22.0], vec![33.0, 44.0]]);
}

#[test]
fn ranks_made_one_by_one_from_a_unique_id_all_reduce_in_their_threads() {
    let contexts = Context::all().unwrap();
    if contexts.len() < 2 {
        eprintln!(
            "skipped: needs two devices, the driver reports {}",
            contexts.len()
        );
        return;
    }
    let id = UniqueId::new().unwrap();
    // The id as another process would receive it.
    let id = UniqueId::from_bytes(&id.to_bytes()).unwrap();
    let results: Vec<Vec<u32>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..2)
            .map(|rank| {
                let ctx = &contexts[rank];
                s.spawn(move || {
                    let comm = Communicator::init_rank(ctx, 2, &id, rank).unwrap();
                    assert_eq!((comm.rank(), comm.size()), (rank, 2));
                    let stream = Stream::new(ctx).unwrap();
                    let mut buf =
                        DeviceBuffer::from_slice(&stream, &[rank as u32 + 1; 1000]).unwrap();
                    comm.all_reduce_in_place(&stream, &mut buf, ReduceOp::Sum)
                        .unwrap();
                    let out = buf.to_vec(&stream).unwrap();
                    comm.async_error().unwrap();
                    out
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert_eq!(results, [vec![3; 1000], vec![3; 1000]]);
}

#[test]
fn a_collective_runs_in_its_streams_order() {
    let Some(r) = two_ranks() else { return };
    let mut bufs = upload(&r, &[vec![1u32; 256], vec![2; 256]]);
    // Rank 0's stream is held: rank 1's part cannot finish without it.
    let gate = Gate::close(&r.streams[0]);
    let mut group = Group::new();
    for ((comm, stream), buf) in r.comms.iter().zip(&r.streams).zip(&mut bufs) {
        group
            .all_reduce_in_place(comm, stream, buf, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    let done = r.streams[1].record_event().unwrap();
    if gate.still_held() {
        assert!(
            !done.query().unwrap(),
            "rank 1 finished while rank 0 was held"
        );
    }
    gate.open();
    assert_eq!(download(&r, &bufs), [vec![3; 256], vec![3; 256]]);
}

#[test]
fn buffers_dropped_after_the_group_outlive_the_collective() {
    let Some(r) = two_ranks() else { return };
    let mut recv = zeros::<u32>(&r, 5000);
    let gates: Vec<Gate> = r.streams.iter().map(|s| Gate::close(s)).collect();
    let data: Vec<Vec<u32>> = (0..2)
        .map(|k| (0..5000).map(|i| i * (k + 1)).collect())
        .collect();
    // Uploaded on other streams, so the send buffers' home is not the
    // collective's stream.
    let homes: Vec<Arc<Stream>> = r.contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let send: Vec<DeviceBuffer<u32>> = homes
        .iter()
        .zip(&data)
        .map(|(s, d)| DeviceBuffer::from_slice(s, d).unwrap())
        .collect();
    let mut group = Group::new();
    for (i, out) in recv.iter_mut().enumerate() {
        group
            .all_reduce(&r.comms[i], &r.streams[i], &send[i], out, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    drop(send); // freed on their home streams after the held collectives
    drop(gates);
    let expected: Vec<u32> = (0..5000).map(|i| i * 3).collect();
    assert_eq!(download(&r, &recv), [expected.clone(), expected]);
}

#[test]
fn bad_input_is_refused_before_nccl_sees_it() {
    let Some(r) = two_ranks() else { return };
    let (c0, s0, s1) = (&r.comms[0], &r.streams[0], &r.streams[1]);
    let send = DeviceBuffer::from_slice(s0, &[1.0f32; 8]).unwrap();
    // Lengths that do not fit the collective.
    let mut short = DeviceBuffer::<f32>::new_async(s0, 8).unwrap();
    match c0.all_gather(s0, &send, &mut short) {
        Err(
            e @ Error::CountMismatch {
                expected: 16,
                actual: 8,
                ..
            },
        ) => {
            assert!(
                e.to_string().contains("16") && e.to_string().contains("all_gather"),
                "{e}"
            )
        }
        other => panic!("expected CountMismatch, got {other:?}"),
    }
    match c0.reduce_scatter(s0, &send, &mut short, ReduceOp::Sum) {
        Err(Error::CountMismatch {
            expected: 16,
            actual: 8,
            ..
        }) => {}
        other => panic!("expected CountMismatch, got {other:?}"),
    }
    // A stream of the other device.
    match c0.all_reduce(s1, &send, &mut short, ReduceOp::Sum) {
        Err(
            e @ Error::WrongStream {
                comm_device: 0,
                stream_device: 1,
                ..
            },
        ) => {
            assert!(
                e.to_string().contains("device 0") && e.to_string().contains("device 1"),
                "{e}"
            )
        }
        other => panic!("expected WrongStream, got {other:?}"),
    }
    // A buffer of the other device.
    let mut on1 = DeviceBuffer::<f32>::new_async(s1, 8).unwrap();
    match c0.all_reduce(s0, &send, &mut on1, ReduceOp::Sum) {
        Err(Error::Driver(e @ DriverError::DeviceMismatch { .. })) => {
            assert!(
                e.to_string().contains("device 1") && e.to_string().contains("device 0"),
                "{e}"
            )
        }
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
    // A root that is not a rank.
    match c0.broadcast_in_place(s0, &mut short, 2) {
        Err(Error::InvalidRoot { root: 2, nranks: 2 }) => {}
        other => panic!("expected InvalidRoot, got {other:?}"),
    }
    // Ranks that disagree: count, then type, then a rank left out.
    let mut a = DeviceBuffer::<f32>::new_async(s0, 8).unwrap();
    let mut b = DeviceBuffer::<f32>::new_async(s1, 4).unwrap();
    let mut group = Group::new();
    group
        .all_reduce_in_place(c0, s0, &mut a, ReduceOp::Sum)
        .unwrap();
    group
        .all_reduce_in_place(&r.comms[1], s1, &mut b, ReduceOp::Sum)
        .unwrap();
    let err = group.end().unwrap_err();
    assert!(
        matches!(err, Error::RanksDisagree { index: 0, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("8 element") && err.to_string().contains("4 element"),
        "{err}"
    );
    let mut ints = DeviceBuffer::<i32>::new_async(s1, 8).unwrap();
    let mut group = Group::new();
    group
        .all_reduce_in_place(c0, s0, &mut a, ReduceOp::Sum)
        .unwrap();
    group
        .all_reduce_in_place(&r.comms[1], s1, &mut ints, ReduceOp::Sum)
        .unwrap();
    assert!(matches!(group.end(), Err(Error::RanksDisagree { .. })));
    let mut group = Group::new();
    group
        .all_reduce_in_place(c0, s0, &mut a, ReduceOp::Sum)
        .unwrap();
    match group.end() {
        Err(
            e @ Error::MissingRank {
                other_rank: 1,
                calls_there: 0,
                ..
            },
        ) => {
            assert!(e.to_string().contains("rank 1"), "{e}")
        }
        other => panic!("expected MissingRank, got {other:?}"),
    }
    // Communicators that cannot be made.
    let twice = [r.contexts[0].clone(), r.contexts[0].clone()];
    assert!(matches!(
        Communicator::all_devices(&twice),
        Err(Error::DuplicateDevice { ordinal: 0 })
    ));
    let id = UniqueId::new().unwrap();
    assert!(matches!(
        Communicator::init_rank(&r.contexts[0], 2, &id, 2),
        Err(Error::InvalidRank { rank: 2, nranks: 2 })
    ));
    // Nothing above reached NCCL: the communicators still work.
    let mut group = Group::new();
    group
        .all_reduce_in_place(c0, s0, &mut a, ReduceOp::Sum)
        .unwrap();
    let mut b8 = DeviceBuffer::<f32>::from_slice(s1, &[1.0; 8]).unwrap();
    group
        .all_reduce_in_place(&r.comms[1], s1, &mut b8, ReduceOp::Sum)
        .unwrap();
    group.end().unwrap();
    for comm in &r.comms {
        comm.async_error().unwrap();
    }
}

#[test]
fn a_rank_that_never_joins_times_out_and_leaves_the_others_usable() {
    let Some(r) = two_ranks() else { return };
    let id = UniqueId::new().unwrap();
    let limit = std::time::Duration::from_millis(300);
    let started = std::time::Instant::now();
    match Communicator::init_rank_within(&r.contexts[0], 2, &id, 0, limit) {
        Err(
            e @ Error::JoinTimeout {
                rank: 0,
                nranks: 2,
                waited,
            },
        ) => {
            assert!(waited >= limit && started.elapsed() >= limit, "{e}");
            assert!(e.to_string().contains("ncclCommAbort"), "{e}");
        }
        other => panic!("expected JoinTimeout, got {other:?}"),
    }
    // The communicators made before still work.
    let mut bufs = upload(&r, &[vec![1u8; 64], vec![2; 64]]);
    let mut group = Group::new();
    for ((comm, stream), buf) in r.comms.iter().zip(&r.streams).zip(&mut bufs) {
        group
            .all_reduce_in_place(comm, stream, buf, ReduceOp::Sum)
            .unwrap();
    }
    group.end().unwrap();
    assert_eq!(download(&r, &bufs), [vec![3; 64], vec![3; 64]]);
}

#[test]
fn ranks_with_a_deadline_that_all_join_make_a_working_communicator() {
    let Some(r) = two_ranks() else { return };
    let id = UniqueId::new().unwrap();
    let limit = std::time::Duration::from_secs(60);
    let sums: Vec<Vec<i64>> = std::thread::scope(|s| {
        let joins: Vec<_> = r
            .contexts
            .iter()
            .enumerate()
            .map(|(rank, ctx)| {
                s.spawn(move || {
                    let comm = Communicator::init_rank_within(ctx, 2, &id, rank, limit).unwrap();
                    let stream = Stream::new(ctx).unwrap();
                    let send = DeviceBuffer::from_slice(&stream, &[rank as i64 + 5; 32]).unwrap();
                    let mut recv = DeviceBuffer::<i64>::new_async(&stream, 64).unwrap();
                    comm.all_gather(&stream, &send, &mut recv).unwrap();
                    recv.to_vec(&stream).unwrap()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let expected: Vec<i64> = [vec![5; 32], vec![6; 32]].concat();
    assert_eq!(sums, [expected.clone(), expected]);
}
