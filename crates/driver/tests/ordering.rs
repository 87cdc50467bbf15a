//! Seeded races between streams: each is refused under `Check` (naming both
//! operations and the missing edge), repaired under `Auto` (the right data,
//! through one inserted wait), and silent once the program orders it.
//! They run on whichever driver is selected (the software driver here; the
//! GPU bundle runs them with `CUDA_STREAMS_DRIVER=cuda`).

mod support;

use cuda_streams_driver::{Context, DeviceBuffer, Error, OrderPolicy, Stream, order};
use std::sync::{Arc, Mutex, MutexGuard};
use support::{GATE_LIMIT, Gate};

/// The tests switch the shared contexts' policy: one at a time, and the
/// policy is put back afterwards.
static POLICY: Mutex<()> = Mutex::new(());

struct Policy {
    contexts: Vec<(Arc<Context>, OrderPolicy)>,
    _turn: MutexGuard<'static, ()>,
}

fn policy(contexts: &[&Arc<Context>], policy: OrderPolicy) -> Policy {
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

fn race(err: Error) -> Box<cuda_streams_driver::Race> {
    match err {
        Error::UnorderedAccess(race) => race,
        other => panic!("expected an unordered access, got {other}"),
    }
}

/// The torchrec pattern: produce on a side stream, consume on the main
/// stream without a wait.
fn produce_on_side(ctx: &Arc<Context>) -> (Arc<Stream>, Arc<Stream>, DeviceBuffer<u32>) {
    let (main, side) = (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap());
    let mut data = DeviceBuffer::from_slice(&main, &[1u32; 256]).unwrap();
    main.synchronize().unwrap();
    order::labelled("fill", || side.memset_u32_async(&mut data, 7)).unwrap();
    (main, side, data)
}

#[test]
fn consuming_on_main_what_a_side_stream_produces_is_refused_under_check() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let (main, side, data) = produce_on_side(&ctx);
    let before = ctx.ordering_stats().reports;
    let err = data.to_vec(&main).unwrap_err();
    let message = err.to_string();
    let race = race(err);
    assert_eq!(race.earlier.stream, side.id());
    assert_eq!(race.later.stream, main.id());
    assert_eq!(race.earlier.label.as_deref(), Some("fill"));
    assert!(race.earlier.writes && !race.later.writes);
    assert_eq!(race.overlap, 0..1024);
    assert_eq!(race.buffer_bytes, 1024);
    assert!(
        message.contains(&format!(
            "stream {} must wait for an event recorded after operation 'fill' on stream {}",
            main.id(),
            side.id()
        )),
        "{message}"
    );
    assert_eq!(ctx.ordering_stats().reports, before + 1);
    // Ordered, the same read goes through.
    main.wait_stream(&side).unwrap();
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
    assert_eq!(
        ctx.ordering_stats().reports,
        before + 1,
        "no report once ordered"
    );
}

#[test]
fn auto_makes_the_consumer_wait_for_the_producer() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Auto);
    let (main, side) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut data = DeviceBuffer::from_slice(&main, &[1u32; 256]).unwrap();
    main.synchronize().unwrap();
    // The producer cannot run until the gate opens: without the inserted
    // wait the consumer's copy would read the old contents.
    let gate = Gate::close_within(&side, GATE_LIMIT);
    side.memset_u32_async(&mut data, 7).unwrap();
    let waits = ctx.ordering_stats().inserted_waits;
    let opener = std::thread::spawn(move || drop(gate));
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
    opener.join().unwrap();
    assert_eq!(ctx.ordering_stats().inserted_waits, waits + 1, "one event");
    // Ordered now: nothing more is inserted.
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
    assert_eq!(ctx.ordering_stats().inserted_waits, waits + 1);
}

#[test]
fn ordered_programs_are_silent_under_check() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let before = ctx.ordering_stats();
    let (main, side, data) = produce_on_side(&ctx);
    // Each kind of edge orders the read: an event, a fork/join, the host.
    let done = side.record_event().unwrap();
    main.wait_event(&done).unwrap();
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
    let (main, side, data) = produce_on_side(&ctx);
    main.join(&[&side]).unwrap();
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
    let (main, side, data) = produce_on_side(&ctx);
    side.synchronize().unwrap();
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
    // Two readers need no order between them.
    let (main, side, mut data) = produce_on_side(&ctx);
    side.synchronize().unwrap();
    let mut copy = DeviceBuffer::<u32>::new(&ctx, 256).unwrap();
    main.copy_device_to_device_async(&mut copy, &data).unwrap();
    let mut other = DeviceBuffer::<u32>::new(&ctx, 256).unwrap();
    side.copy_device_to_device_async(&mut other, &data).unwrap();
    // ... but a write after both readers does, to each of them.
    let err = side.memset_u32_async(&mut data, 1).unwrap_err();
    assert_eq!(race(err).earlier.stream, main.id());
    side.wait_stream(&main).unwrap();
    side.memset_u32_async(&mut data, 1).unwrap();
    assert_eq!(ctx.ordering_stats().reports, before.reports + 1);
}

/// Device 0's context if it is on a GPU, or `None` (printed why): the
/// software driver refuses `Report`, since the work it lets through would be
/// a data race there (tests/ordering_policy.rs checks the refusal).
fn gpu_for_report() -> Option<Arc<Context>> {
    let ctx = Context::new(0).unwrap();
    if !ctx.is_gpu() {
        eprintln!("skipped: `report` runs only on a GPU; the software driver refuses it");
        return None;
    }
    Some(ctx)
}

#[test]
fn report_lets_the_work_through_and_counts_it() {
    let Some(ctx) = gpu_for_report() else { return };
    let _policy = policy(&[&ctx], OrderPolicy::Report);
    let before = ctx.ordering_stats().reports;
    let (main, side, data) = produce_on_side(&ctx);
    side.synchronize().unwrap(); // so the data is right; the tracker saw the read first
    let _ = data.to_vec(&main).unwrap();
    let (main, _side, data) = produce_on_side(&ctx);
    data.to_vec(&main).unwrap();
    assert_eq!(ctx.ordering_stats().reports, before + 1);
}

/// Devices 0 and 1, or `None` (printed why) with fewer than two.
fn two_devices() -> Option<[Arc<Context>; 2]> {
    let count = Context::device_count().expect("the driver answers");
    if count < 2 {
        eprintln!("skipped: needs two devices, the driver reports {count}");
        return None;
    }
    Some([Context::new(0).unwrap(), Context::new(1).unwrap()])
}

#[test]
fn a_peer_copy_read_on_the_destination_before_a_wait_is_refused_then_repaired() {
    let Some([c0, c1]) = two_devices() else {
        return;
    };
    let _ = c0.enable_peer_access(&c1);
    for policy_now in [OrderPolicy::Check, OrderPolicy::Auto] {
        let _policy = policy(&[&c0, &c1], policy_now);
        let (s0, s1) = (Stream::new(&c0).unwrap(), Stream::new(&c1).unwrap());
        let src = DeviceBuffer::from_slice(&s0, &[5u32; 64]).unwrap();
        let mut dst = DeviceBuffer::from_slice(&s1, &[0u32; 64]).unwrap();
        s1.synchronize().unwrap();
        let gate = Gate::close_within(&s0, GATE_LIMIT);
        s0.copy_peer_async(&mut dst, &src).unwrap();
        let opener = std::thread::spawn(move || drop(gate));
        let read = dst.to_vec(&s1);
        opener.join().unwrap();
        match policy_now {
            OrderPolicy::Check => {
                let race = race(read.unwrap_err());
                assert_eq!((race.earlier.stream, race.earlier.device), (s0.id(), 0));
                assert_eq!((race.later.stream, race.later.device), (s1.id(), 1));
                assert_eq!(race.earlier.what, "peer copy");
                s1.wait_stream(&s0).unwrap();
                assert_eq!(dst.to_vec(&s1).unwrap(), [5; 64], "silent once ordered");
            }
            _ => assert_eq!(read.unwrap(), [5; 64]),
        }
    }
}

/// What [`two_branch_graph`] made: the result of ending the capture, its
/// streams (origin, left, right) and the buffer.
struct TwoBranches {
    graph: Result<cuda_streams_driver::Graph, Error>,
    streams: [Arc<Stream>; 3],
    data: Arc<DeviceBuffer<u32>>,
}

/// A graph whose two branches each write every byte of one buffer ("left"
/// sets 1, "right" sets 2); with `ordered`, "right" is joined after "left"
/// first.
fn two_branch_graph(ctx: &Arc<Context>, ordered: bool) -> TwoBranches {
    let origin = Stream::new(ctx).unwrap();
    let (left, right) = (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap());
    let data = Arc::new(DeviceBuffer::from_slice(&origin, &[0u32; 64]).unwrap());
    origin.synchronize().unwrap();
    let mut capture = origin.begin_capture().unwrap();
    capture.fork(&origin, &[&left, &right]).unwrap();
    order::labelled("left", || capture.memset_u8(&left, &data, 1)).unwrap();
    if ordered {
        capture.join(&right, &[&left]).unwrap();
    }
    // Refused at the end, not here: the node is captured.
    order::labelled("right", || capture.memset_u8(&right, &data, 2)).unwrap();
    capture.join(&origin, &[&left, &right]).unwrap();
    TwoBranches {
        graph: capture.end(),
        streams: [origin, left, right],
        data,
    }
}

#[test]
fn a_graph_with_two_unordered_branches_writing_one_buffer_is_refused_at_end_capture() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let before = ctx.ordering_stats().reports;
    let TwoBranches {
        graph,
        streams: [origin, left, right],
        data,
    } = two_branch_graph(&ctx, false);
    let err = graph.unwrap_err();
    let message = err.to_string();
    let race = race(err);
    assert_eq!(race.earlier.label.as_deref(), Some("left"));
    assert_eq!(race.later.label.as_deref(), Some("right"));
    assert_eq!(
        (race.earlier.stream, race.later.stream),
        (left.id(), right.id())
    );
    assert!(race.earlier.writes && race.later.writes);
    assert_eq!(race.overlap, 0..256);
    assert_eq!(
        race.buffer,
        cuda_streams_driver::DeviceMemory::device_ptr(&*data)
    );
    assert!(message.contains("operation 'left'"), "{message}");
    assert_eq!(ctx.ordering_stats().reports, before + 1);
    // The capture is over and the graph discarded: every stream works.
    for stream in [&origin, &left, &right] {
        assert!(!stream.is_capturing());
        stream.synchronize().unwrap();
    }
    assert_eq!(data.to_vec(&origin).unwrap(), [0; 64]);
}

#[test]
fn auto_orders_the_branches_of_a_graph_and_an_ordered_graph_is_silent() {
    let ctx = Context::new(0).unwrap();
    for (policy_now, ordered, waits) in [
        (OrderPolicy::Auto, false, 1),
        (OrderPolicy::Check, true, 0),
        (OrderPolicy::Auto, true, 0),
    ] {
        let _policy = policy(&[&ctx], policy_now);
        let before = ctx.ordering_stats();
        let TwoBranches {
            graph,
            streams: [origin, ..],
            data,
        } = two_branch_graph(&ctx, ordered);
        let exec = graph.unwrap().instantiate().unwrap();
        for _ in 0..8 {
            exec.launch(&origin).unwrap();
            assert_eq!(data.to_vec(&origin).unwrap(), [0x0202_0202; 64]);
        }
        let after = ctx.ordering_stats();
        assert_eq!(after.inserted_waits, before.inserted_waits + waits);
        assert_eq!(after.reports, before.reports + waits, "{policy_now:?}");
    }
}

#[test]
fn report_keeps_a_graph_with_racing_branches_and_counts_the_race() {
    let Some(ctx) = gpu_for_report() else { return };
    let _policy = policy(&[&ctx], OrderPolicy::Report);
    let before = ctx.ordering_stats().reports;
    assert!(two_branch_graph(&ctx, false).graph.is_ok());
    assert_eq!(ctx.ordering_stats().reports, before + 1);
}

#[test]
fn a_fork_inside_a_capture_does_not_order_eager_work() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let (main, side, data) = produce_on_side(&ctx);
    // The capture's fork and join are edges of the graph, which never runs
    // here: the main stream's eager read is still unordered with the fill.
    let mut capture = side.begin_capture().unwrap();
    capture.fork(&side, &[&main]).unwrap();
    capture.join(&side, &[&main]).unwrap();
    drop(capture.end().unwrap());
    let race = race(data.to_vec(&main).unwrap_err());
    assert_eq!(race.earlier.label.as_deref(), Some("fill"));
    side.synchronize().unwrap();
    assert_eq!(data.to_vec(&main).unwrap(), [7; 256]);
}

#[test]
fn host_access_that_waited_for_a_copy_orders_later_writes_on_other_streams() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut src = DeviceBuffer::from_slice(&a, &[3u32; 256]).unwrap();
    a.synchronize().unwrap();
    let mut host = cuda_streams_driver::PinnedBuffer::<u32>::new(&ctx, 256).unwrap();
    for round in 0..4u32 {
        // The copy is still running when the host asks for its result.
        let gate = Gate::close_within(&b, GATE_LIMIT);
        b.copy_to_host_async(&mut host, &src).unwrap();
        let opener = std::thread::spawn(move || drop(gate));
        // The host waits for the copy (the buffer's use event): the copy's
        // read of `src` is then in the past of what `a` enqueues next.
        assert_eq!(host.as_slice().unwrap(), [3 + round; 256]);
        opener.join().unwrap();
        a.memset_u32_async(&mut src, 4 + round).unwrap();
        a.synchronize().unwrap();
    }
}

#[test]
fn a_checked_launch_counts_the_bytes_and_the_access_its_signature_declares() {
    use cuda_streams_driver::{LaunchConfig, Module};
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let module = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap();
    let (fill, saxpy) = (
        module.function("fill_f32").unwrap(),
        module.function("saxpy").unwrap(),
    );
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut data = DeviceBuffer::<f32>::new(&ctx, 512).unwrap();
    // `fill_f32(n, value, out)` writes out[0..n]: the first 1 KiB only.
    let n256 = LaunchConfig::for_num_elems(256);
    order::labelled("half", || {
        fill.launch(
            &a,
            n256,
            &[256u64.into(), 1.0f32.into(), (&mut data).into()],
        )
    })
    .unwrap();
    let all = LaunchConfig::for_num_elems(512);
    let err = fill
        .launch(&b, all, &[512u64.into(), 2.0f32.into(), (&mut data).into()])
        .unwrap_err();
    let race = race(err);
    assert_eq!(race.earlier.label.as_deref(), Some("half"));
    assert_eq!(
        race.overlap,
        0..1024,
        "the signature's extent, not the buffer"
    );
    a.synchronize().unwrap();
    // `saxpy(n, a, const x, y)` only reads x, even lent mutably: two
    // streams reading it need no order.
    let mut x = DeviceBuffer::from_slice(&a, &[1.0f32; 512]).unwrap();
    let (mut y1, mut y2) = (
        DeviceBuffer::from_slice(&a, &[0.0f32; 512]).unwrap(),
        DeviceBuffer::from_slice(&b, &[0.0f32; 512]).unwrap(),
    );
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let (n, three) = (512u64, 3.0f32);
    saxpy
        .launch(
            &a,
            all,
            &[n.into(), three.into(), (&mut x).into(), (&mut y1).into()],
        )
        .unwrap();
    saxpy
        .launch(
            &b,
            all,
            &[n.into(), three.into(), (&x).into(), (&mut y2).into()],
        )
        .unwrap();
    assert_eq!(y1.to_vec(&a).unwrap(), [3.0; 512]);
    assert_eq!(y2.to_vec(&b).unwrap(), [3.0; 512]);
}

#[test]
fn uploading_a_graph_touches_no_memory_and_launching_it_is_one_operation() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Check);
    let (origin, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let data = Arc::new(DeviceBuffer::from_slice(&origin, &[0u32; 64]).unwrap());
    origin.synchronize().unwrap();
    let mut capture = origin.begin_capture().unwrap();
    capture.memset_u8(&origin, &data, 1).unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    exec.upload(&origin).unwrap();
    // The upload ran nothing: another stream may read the buffer.
    assert_eq!(data.to_vec(&other).unwrap(), [0; 64]);
    exec.launch(&origin).unwrap();
    let race = race(data.to_vec(&other).unwrap_err());
    assert_eq!(race.earlier.what, "graph launch");
    assert_eq!(race.earlier.stream, origin.id());
    other.wait_stream(&origin).unwrap();
    assert_eq!(data.to_vec(&other).unwrap(), [0x0101_0101; 64]);
}

/// Threads sharing one stream, each writing a buffer of its own there and
/// forking it to a stream of its own to read it back: every fork orders its
/// thread's write, whatever the other threads' enqueues on the shared
/// stream are doing meanwhile, so `Check` refuses none of them. A point
/// taken while another thread's enqueue was still in its driver call used
/// to leave out the thread's own write (a point is a prefix of the
/// stream's steps) and refused the read as unordered.
#[test]
fn threads_forking_their_own_writes_off_a_shared_stream_are_ordered() {
    let ctx = support::ctx();
    let _check = policy(&[&ctx], OrderPolicy::Check);
    let shared = Stream::new(&ctx).unwrap();
    const THREADS: u32 = 4;
    const ROUNDS: u32 = 100;
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (ctx, shared) = (&ctx, &shared);
            scope.spawn(move || {
                let branch = Stream::new(ctx).unwrap();
                let mut buf = DeviceBuffer::<u32>::new(ctx, 1024).unwrap();
                let mut host = cuda_streams_driver::PinnedBuffer::<u32>::new(ctx, 1024).unwrap();
                for round in 0..ROUNDS {
                    let value = t * ROUNDS + round + 1;
                    shared.memset_u32_async(&mut buf, value).unwrap();
                    shared.fork(&[&branch]).unwrap();
                    if let Err(err) = branch.copy_to_host_async(&mut host, &buf) {
                        panic!("thread {t}, round {round}: the fork's order was lost: {err}");
                    }
                    branch.synchronize().unwrap();
                    assert!(host.as_slice().unwrap().iter().all(|&v| v == value));
                }
            });
        }
    });
    shared.synchronize().unwrap();
}

/// A conditional node's accesses are known only once its body is captured,
/// after the node is in the graph: under `Auto` the repair must make the
/// node itself follow the writer, not the work captured after it. The
/// repaired graph has the topology of one ordered by hand (an update from
/// one to the other is accepted), and the body's write lands last.
#[test]
fn auto_orders_a_conditional_node_after_the_writer_its_body_races_with() {
    let ctx = Context::new(0).unwrap();
    let _policy = policy(&[&ctx], OrderPolicy::Auto);
    let (main, side) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let data = Arc::new(DeviceBuffer::from_slice(&main, &[0u32; 256]).unwrap());
    main.synchronize().unwrap();
    let capture = |by_hand: bool| {
        let mut capture = main.begin_capture().unwrap();
        capture.fork(&main, &[&side]).unwrap();
        capture.memset_u8(&side, &data, 1).unwrap();
        if by_hand {
            capture.join(&main, &[&side]).unwrap();
        }
        let once = capture.condition(&main, 1).unwrap();
        capture
            .if_then(&main, once, |body| {
                let origin = Arc::clone(body.origin());
                body.memset_u8(&origin, &data, 2)
            })
            .unwrap();
        if !by_hand {
            capture.join(&main, &[&side]).unwrap();
        }
        capture.end().unwrap()
    };
    let waits = ctx.ordering_stats().inserted_waits;
    let repaired = capture(false);
    assert_eq!(
        ctx.ordering_stats().inserted_waits,
        waits + 1,
        "the race was repaired"
    );
    let ordered = capture(true);
    assert_eq!(ctx.ordering_stats().inserted_waits, waits + 1);
    let mut exec = repaired.instantiate().unwrap();
    exec.update(&ordered)
        .expect("the repaired node depends on the writer, as the ordered one does");
    exec.launch(&main).unwrap();
    assert_eq!(data.to_vec(&main).unwrap(), [0x0202_0202; 256]);
}
