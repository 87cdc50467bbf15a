//! Measured workload times change the assignment and the strategy.

mod support;

use cuda_streams_stream_pool::{AllocationStrategy, ConfigChange, StreamPool, WorkloadType};
use std::collections::HashSet;
use std::time::Duration;
use support::{XorShift, ctx, ids};

fn distinct_handed_out(pool: &StreamPool, workload: WorkloadType) -> HashSet<u64> {
    (0..32)
        .map(|_| pool.get_stream_for_workload(workload).id())
        .collect()
}

#[test]
fn averages_are_the_mean_of_what_was_recorded() {
    let pool = StreamPool::new(&ctx(), 4).unwrap();
    assert_eq!(pool.average_workload_time(WorkloadType::Memory), None);
    let mut rng = XorShift::new(0xA11CE);
    let times: Vec<u64> = (0..50).map(|_| 1 + rng.next_u64() % 10_000).collect();
    for &us in &times {
        pool.record_workload_completion(WorkloadType::Memory, Duration::from_micros(us));
    }
    let mean = Duration::from_micros(times.iter().sum::<u64>()) / times.len() as u32;
    assert_eq!(pool.average_workload_time(WorkloadType::Memory), Some(mean));
    assert_eq!(pool.workload_totals(WorkloadType::Memory).0, 50);
    assert_eq!(pool.average_workload_time(WorkloadType::Compute), None);
}

#[test]
fn a_skewed_workload_gets_more_streams_and_load_balancing() {
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 8).unwrap();
    let before = distinct_handed_out(&pool, WorkloadType::Compute);
    assert_eq!(
        before.len(),
        2,
        "by default Compute has the two High streams"
    );
    assert_eq!(
        pool.optimize_configuration().unwrap(),
        [],
        "no data, no change"
    );

    // Compute dominates: 10 ms kernels against microsecond copies.
    for _ in 0..100 {
        pool.record_workload_completion(WorkloadType::Compute, Duration::from_millis(10));
        pool.record_workload_completion(WorkloadType::Memory, Duration::from_micros(100));
    }
    for _ in 0..10 {
        pool.record_workload_completion(WorkloadType::Mixed, Duration::from_micros(200));
        pool.record_workload_completion(WorkloadType::Coordination, Duration::from_micros(5));
    }
    let changes = pool.optimize_configuration().unwrap();
    let compute_change = changes.iter().find_map(|c| match c {
        ConfigChange::WorkloadStreams {
            workload: WorkloadType::Compute,
            before,
            after,
        } => Some((before.clone(), after.clone())),
        _ => None,
    });
    let (was, now) = compute_change.expect("Compute's streams changed");
    assert_eq!(was.len(), 2);
    assert_eq!(
        now.len(),
        5,
        "Compute: 1 + its ~97% share of the 4 spare streams"
    );
    assert!(changes.contains(&ConfigChange::Strategy {
        from: AllocationStrategy::RoundRobin,
        to: AllocationStrategy::LoadBalanced,
    }));
    assert_eq!(pool.strategy(), AllocationStrategy::LoadBalanced);

    // A different assignment afterwards: Compute work now spreads over five
    // streams, starting with the High ones; the others keep one each.
    let after = distinct_handed_out(&pool, WorkloadType::Compute);
    assert_eq!(after, now.iter().copied().collect());
    assert!(before.is_subset(&after));
    for workload in [
        WorkloadType::Memory,
        WorkloadType::Mixed,
        WorkloadType::Coordination,
    ] {
        assert_eq!(pool.workload_streams(workload).len(), 1, "{workload:?}");
    }
    let all: HashSet<u64> = ids(pool.streams()).into_iter().collect();
    let covered: HashSet<u64> = WorkloadType::ALL
        .iter()
        .flat_map(|&w| ids(&pool.workload_streams(w)))
        .collect();
    assert_eq!(covered, all, "every stream serves some workload");

    assert_eq!(
        pool.optimize_configuration().unwrap(),
        [],
        "nothing new: nothing changes"
    );
}

#[test]
fn a_balanced_workload_changes_nothing() {
    let pool = StreamPool::new(&ctx(), 8).unwrap();
    for workload in WorkloadType::ALL {
        for _ in 0..10 {
            pool.record_workload_completion(workload, Duration::from_millis(1));
        }
    }
    assert_eq!(pool.optimize_configuration().unwrap(), []);
    assert_eq!(pool.strategy(), AllocationStrategy::RoundRobin);
}

#[test]
fn getters_keep_working_while_the_configuration_changes() {
    let pool = StreamPool::new(&ctx(), 8).unwrap();
    let valid: HashSet<u64> = ids(pool.streams()).into_iter().collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..5000 {
                    let workload = WorkloadType::ALL[i % 4];
                    assert!(valid.contains(&pool.get_stream_for_workload(workload).id()));
                }
            });
        }
        s.spawn(|| {
            for round in 0..200u64 {
                let heavy = WorkloadType::ALL[(round % 4) as usize];
                pool.record_workload_completion(heavy, Duration::from_millis(50 + round));
                pool.optimize_configuration().unwrap();
            }
        });
    });
}
