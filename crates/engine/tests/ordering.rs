//! The README's DAG with its `after(&[fill.id()])` left out: refused under
//! `Check` (the report names the engine's labels), right under `Auto` (the
//! data implies the edge), silent with the edge written.

use cuda_streams_engine::OperationGraph;
use cuda_streams_engine::driver::{Context, DeviceBuffer, OrderPolicy, PinnedBuffer, Stream};
use std::sync::{Arc, Mutex};

/// The tests switch the shared context's policy: one at a time.
static POLICY: Mutex<()> = Mutex::new(());

/// The README's example; `explicit`: with its `after`.
fn dag(ctx: &Arc<Context>, explicit: bool) -> Result<Vec<u32>, String> {
    let (copies, compute) = (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap());
    let graph = OperationGraph::for_context(ctx);
    let mut data = DeviceBuffer::<u32>::new(ctx, 1024).unwrap();
    let mut host = PinnedBuffer::<u32>::new(ctx, 1024).unwrap();
    // Hold the producer back so that a missing order shows as wrong data.
    let gate = test_support::Gate::close(&copies);
    let fill = graph
        .op(&copies)
        .label("fill")
        .run(|s| s.memset_u32_async(&mut data, 9))
        .map_err(|e| e.to_string())?;
    let after = if explicit { vec![fill.id()] } else { vec![] };
    let opener = std::thread::spawn(move || drop(gate));
    let read = graph
        .op(&compute)
        .after(&after)
        .label("read")
        .run(|s| s.copy_to_host_async(&mut host, &data));
    opener.join().unwrap();
    read.map_err(|e| e.to_string())?
        .wait()
        .map_err(|e| e.to_string())?;
    Ok(host.as_slice().unwrap().to_vec())
}

fn with_policy<R>(policy: OrderPolicy, f: impl FnOnce(&Arc<Context>) -> R) -> R {
    let _turn = POLICY.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = Context::new(0).unwrap();
    let before = ctx.ordering();
    ctx.set_ordering(policy).unwrap();
    let result = f(&ctx);
    ctx.set_ordering(before).unwrap();
    result
}

#[test]
fn the_readme_dag_without_its_edge_is_refused_under_check() {
    let err = with_policy(OrderPolicy::Check, |ctx| dag(ctx, false)).unwrap_err();
    assert!(err.contains("unordered access"), "{err}");
    assert!(
        err.contains("copy 'read' (writes)") || err.contains("copy 'read' (reads)"),
        "{err}"
    );
    // Inside the graph the fix is a dependency, named as the graph spells it,
    // with the policy that found the race.
    assert!(
        err.contains("build 'read' with `.after(&[id])`, where id is the `Op::id` of 'fill'"),
        "{err}"
    );
    assert!(err.contains("found by ordering policy check"), "{err}");
    assert!(!err.contains("Event::record"), "{err}");
}

#[test]
fn under_auto_the_data_implies_the_edge() {
    let (data, stats) = with_policy(OrderPolicy::Auto, |ctx| {
        let before = ctx.ordering_stats().inserted_waits;
        let data = dag(ctx, false).unwrap();
        (data, ctx.ordering_stats().inserted_waits - before)
    });
    assert!(data.iter().all(|&v| v == 9));
    assert_eq!(stats, 1, "one inserted wait");
}

#[test]
fn with_the_edge_written_nothing_is_reported_or_inserted() {
    for policy in [OrderPolicy::Check, OrderPolicy::Auto] {
        let (data, stats) = with_policy(policy, |ctx| {
            let before = ctx.ordering_stats();
            let data = dag(ctx, true).unwrap();
            let after = ctx.ordering_stats();
            (
                data,
                (
                    after.reports - before.reports,
                    after.inserted_waits - before.inserted_waits,
                ),
            )
        });
        assert!(data.iter().all(|&v| v == 9));
        assert_eq!(stats, (0, 0), "{policy:?}");
    }
}
