//! Priorities come from the driver; each strategy picks as documented;
//! LoadBalanced looks at the GPU; purposes and exclusive streams.

mod support;

use cuda_streams_stream_pool::{
    AllocationStrategy, ClassSplit, Error, StreamPool, StreamPriority, StreamPurpose, WorkloadType,
};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use support::{ctx, ids, serial, spin, spin_kernel};

/// Long enough that every check below runs while the stream is still busy.
const BUSY: Duration = Duration::from_millis(600);

#[test]
fn priorities_are_read_back_from_the_driver() {
    let _serial = serial();
    let ctx = ctx();
    let range = ctx.priority_range();
    let pool = StreamPool::new(&ctx, 8).unwrap();
    assert_eq!(
        pool.class_split(),
        ClassSplit {
            high: 2,
            normal: 4,
            low: 2
        }
    );
    let mut seen = HashMap::new();
    for stream in pool.streams() {
        let class = pool.class_of(stream).unwrap();
        let raw = stream.priority().unwrap();
        assert_eq!(
            raw,
            range.value(class),
            "stream {} of class {class:?}",
            stream.id()
        );
        *seen.entry(class).or_insert(0) += 1;
        assert!(stream.is_non_blocking().unwrap());
    }
    assert_eq!(seen[&StreamPriority::High], 2);
    for class in StreamPriority::ALL {
        for _ in 0..4 {
            let stream = pool.get_priority_stream(class);
            assert_eq!(stream.priority().unwrap(), range.value(class));
        }
    }
    if range.greatest != range.least {
        let high = pool
            .get_priority_stream(StreamPriority::High)
            .priority()
            .unwrap();
        let low = pool
            .get_priority_stream(StreamPriority::Low)
            .priority()
            .unwrap();
        assert!(high < low, "High ({high}) is more urgent than Low ({low})");
        assert_eq!((high, low), (range.greatest, range.least));
    }
}

#[test]
fn a_pool_of_zero_streams_and_a_bad_split_are_errors() {
    let _serial = serial();
    let ctx = ctx();
    let err = StreamPool::new(&ctx, 0).unwrap_err();
    assert!(matches!(err, Error::EmptyPool), "{err}");
    let err = StreamPool::builder(&ctx)
        .size(4)
        .class_split(ClassSplit {
            high: 1,
            normal: 1,
            low: 1,
        })
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "class split 1 high + 1 normal + 1 low = 3 streams, but the pool has 4"
    );
}

#[test]
fn round_robin_hands_out_every_stream_in_turn() {
    let _serial = serial();
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 5).unwrap();
    let order = ids(pool.streams());
    let handed: Vec<u64> = (0..15).map(|_| pool.get_stream().id()).collect();
    assert_eq!(handed, order.repeat(3));
    // Within a class or a workload: that class's streams, in turn.
    let high: Vec<u64> = (0..4)
        .map(|_| pool.get_priority_stream(StreamPriority::High).id())
        .collect();
    let high_ids = ids(&pool.priority_streams(StreamPriority::High));
    assert_eq!(
        high,
        high_ids.iter().cycle().take(4).copied().collect::<Vec<_>>()
    );
}

#[test]
fn round_robin_is_exact_under_many_threads() {
    let _serial = serial();
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 8).unwrap();
    const THREADS: usize = 8;
    const EACH: usize = 2000;
    let counts: Vec<HashMap<u64, usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut counts = HashMap::new();
                    for _ in 0..EACH {
                        *counts.entry(pool.get_stream().id()).or_insert(0) += 1;
                    }
                    counts
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total: HashMap<u64, usize> = HashMap::new();
    for map in counts {
        for (id, n) in map {
            *total.entry(id).or_insert(0) += n;
        }
    }
    assert_eq!(total.len(), 8);
    // One shared atomic cursor: every stream exactly its share, whatever the interleaving.
    assert!(
        total.values().all(|&n| n == THREADS * EACH / 8),
        "{total:?}"
    );
}

#[test]
fn workload_strategy_routes_by_type_to_the_documented_classes() {
    let _serial = serial();
    let ctx = ctx();
    let pool = StreamPool::new_with_strategy(&ctx, 8, AllocationStrategy::Workload).unwrap();
    let class_ids = |class| ids(&pool.priority_streams(class));
    let normal = class_ids(StreamPriority::Normal);
    assert_eq!(
        ids(&pool.workload_streams(WorkloadType::Compute)),
        class_ids(StreamPriority::High)
    );
    assert_eq!(
        ids(&pool.workload_streams(WorkloadType::Memory)),
        normal[..2]
    );
    assert_eq!(
        ids(&pool.workload_streams(WorkloadType::Mixed)),
        normal[2..]
    );
    assert_eq!(
        ids(&pool.workload_streams(WorkloadType::Coordination)),
        class_ids(StreamPriority::Low)
    );
    for workload in WorkloadType::ALL {
        let allowed: HashSet<u64> = ids(&pool.workload_streams(workload)).into_iter().collect();
        let got: HashSet<u64> = (0..8)
            .map(|_| pool.get_stream_for_workload(workload).id())
            .collect();
        assert_eq!(
            got, allowed,
            "{workload:?} uses all of its streams and only those"
        );
        let class = pool
            .class_of(&pool.get_stream_for_workload(workload))
            .unwrap();
        assert_eq!(class, workload.default_class());
    }
    // get_stream() under Workload serves Mixed.
    let mixed: HashSet<u64> = normal[2..].iter().copied().collect();
    assert!((0..8).all(|_| mixed.contains(&pool.get_stream().id())));
}

#[test]
fn purposes_get_fixed_distinct_streams_of_their_class() {
    let _serial = serial();
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 8).unwrap();
    let first: Vec<u64> = StreamPurpose::ALL
        .iter()
        .map(|&p| pool.get_stream_for_purpose(p).id())
        .collect();
    let distinct: HashSet<_> = first.iter().collect();
    assert_eq!(distinct.len(), 5, "five purposes, five streams: {first:?}");
    for (&purpose, &id) in StreamPurpose::ALL.iter().zip(&first) {
        for _ in 0..3 {
            assert_eq!(
                pool.get_stream_for_purpose(purpose).id(),
                id,
                "{purpose:?} is stable"
            );
        }
        let stream = pool.get_stream_for_purpose(purpose);
        assert_eq!(
            pool.class_of(&stream),
            Some(purpose.preferred_class()),
            "{purpose:?}"
        );
    }
    // A pool of one serves every purpose with its one stream.
    let one = StreamPool::new(&ctx, 1).unwrap();
    let only = one.streams().next().unwrap().id();
    assert!(
        StreamPurpose::ALL
            .iter()
            .all(|&p| one.get_stream_for_purpose(p).id() == only)
    );
}

#[test]
fn load_balanced_avoids_streams_busy_with_a_spin_kernel() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new_with_strategy(&ctx, 4, AllocationStrategy::LoadBalanced).unwrap();
    let streams: Vec<_> = pool.streams().cloned().collect();
    for busy in &streams[..3] {
        spin(busy, &spinner, BUSY);
    }
    let idle = streams[3].id();
    for _ in 0..20 {
        assert_eq!(pool.get_stream().id(), idle, "the only idle stream wins");
    }
    // Round-robin, by contrast, would hand the busy ones out.
    pool.set_strategy(AllocationStrategy::RoundRobin);
    let handed: HashSet<u64> = (0..4).map(|_| pool.get_stream().id()).collect();
    assert_eq!(handed.len(), 4);
    pool.set_strategy(AllocationStrategy::LoadBalanced);

    // All busy: the fewest operations not yet passed wins. Stream 3 gets one
    // long kernel and five more queued behind it; stream 0 has only its one.
    spin(&streams[3], &spinner, BUSY);
    for _ in 0..5 {
        spin(&streams[3], &spinner, Duration::from_millis(1));
    }
    spin(&streams[1], &spinner, Duration::from_millis(1));
    spin(&streams[2], &spinner, Duration::from_millis(1));
    let picked = pool.get_stream().id();
    assert_eq!(
        picked,
        streams[0].id(),
        "stream 0 holds the least live work"
    );
    for stream in &streams {
        stream.synchronize().unwrap();
    }
    // Once everything has passed, nothing counts as load any more.
    let all: HashSet<u64> = (0..8).map(|_| pool.get_stream().id()).collect();
    assert_eq!(all.len(), 4, "idle streams take turns");
}

#[test]
fn priority_strategy_prefers_the_most_urgent_idle_class() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let split = ClassSplit {
        high: 1,
        normal: 2,
        low: 1,
    };
    let pool = StreamPool::builder(&ctx)
        .size(4)
        .class_split(split)
        .strategy(AllocationStrategy::Priority)
        .build()
        .unwrap();
    let class_of = |s: std::sync::Arc<_>| pool.class_of(&s).unwrap();
    assert_eq!(class_of(pool.get_stream()), StreamPriority::High);
    let high = pool.priority_streams(StreamPriority::High);
    spin(&high[0], &spinner, BUSY);
    assert_eq!(
        class_of(pool.get_stream()),
        StreamPriority::Normal,
        "High is busy"
    );
    for normal in pool.priority_streams(StreamPriority::Normal) {
        spin(&normal, &spinner, BUSY);
    }
    assert_eq!(
        class_of(pool.get_stream()),
        StreamPriority::Low,
        "High and Normal are busy"
    );
    spin(
        &pool.priority_streams(StreamPriority::Low)[0],
        &spinner,
        BUSY,
    );
    assert_eq!(
        class_of(pool.get_stream()),
        StreamPriority::High,
        "all busy: High"
    );
    for stream in pool.streams() {
        stream.synchronize().unwrap();
    }
}

#[test]
fn exclusive_streams_are_never_shared() {
    let _serial = serial();
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 4).unwrap();
    let shared: HashSet<u64> = ids(pool.streams()).into_iter().collect();
    let a = pool.acquire_exclusive().unwrap();
    let b = pool
        .acquire_exclusive_with_priority(StreamPriority::High)
        .unwrap();
    assert_ne!(a.id(), b.id());
    assert!(!shared.contains(&a.id()) && !shared.contains(&b.id()));
    assert_eq!(b.priority().unwrap(), ctx.priority_range().greatest);
    // No getter ever hands them out.
    for _ in 0..16 {
        let id = pool.get_stream().id();
        assert!(id != a.id() && id != b.id());
    }
    let a_id = a.id();
    drop(a);
    let again = pool.acquire_exclusive().unwrap();
    assert_eq!(again.id(), a_id, "returned streams are reused");
    // A clone kept past the guard could still enqueue work: never recycled.
    let kept = std::sync::Arc::clone(again.stream());
    drop(again);
    let fresh = pool.acquire_exclusive().unwrap();
    assert_ne!(fresh.id(), kept.id());
    assert_eq!(pool.exclusive_streams_created(), 3);
}

#[test]
fn exclusive_holders_never_overlap_across_threads() {
    let _serial = serial();
    let ctx = ctx();
    let pool = StreamPool::new(&ctx, 2).unwrap();
    let in_use = std::sync::Mutex::new(HashSet::new());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..50 {
                    let guard = pool.acquire_exclusive().unwrap();
                    assert!(in_use.lock().unwrap().insert(guard.id()), "held twice");
                    std::thread::yield_now();
                    assert!(in_use.lock().unwrap().remove(&guard.id()));
                }
            });
        }
    });
    assert!(pool.exclusive_streams_created() <= 8);
}

#[test]
fn metrics_sum_the_driver_layers_counters() {
    let _serial = serial();
    let ctx = ctx();
    let spinner = spin_kernel(&ctx);
    let pool = StreamPool::new(&ctx, 3).unwrap();
    for _ in 0..6 {
        spin(&pool.get_stream(), &spinner, Duration::from_micros(10));
    }
    pool.get_stream().record_memory_transfer(1 << 20);
    for stream in pool.streams() {
        stream.synchronize().unwrap();
    }
    let m = pool.metrics();
    assert_eq!(m.kernel_launches, 6);
    assert_eq!(m.memory_transfers, 1);
    assert_eq!(m.bytes_transferred, 1 << 20);
    assert_eq!(m.operations_count, 7);
    assert_eq!(
        m.streams
            .iter()
            .map(|s| s.kernel_launches)
            .collect::<Vec<_>>(),
        [2, 2, 2]
    );
    assert_eq!(m.idle_streams, 3);
}
