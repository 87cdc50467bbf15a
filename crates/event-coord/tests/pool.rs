//! The event pool: reuse, growth up to a cap, utilization, thread safety.

mod support;

use cuda_streams_event_coord as events;

use driver::Error;
use driver::Event;
use events::EventPool;
use std::sync::Arc;
use support::{Gate, ctx, streams};

#[test]
fn acquire_and_release_reuse_events_without_growth() {
    let ctx = ctx();
    let pool = Arc::new(EventPool::new(&ctx, 3, 2).unwrap());
    assert_eq!(pool.utilization(), usage(3, 2, 0));
    let a = pool.acquire_event(false).unwrap();
    let t = pool.acquire_event(true).unwrap();
    assert!(!a.is_timing());
    assert!(t.is_timing());
    assert_eq!(pool.utilization(), usage(2, 1, 2));
    let raw = a.as_raw();
    pool.release_event(a);
    drop(t);
    assert_eq!(pool.utilization(), usage(3, 2, 0));
    // The last released is the next acquired: the same driver event.
    assert_eq!(pool.acquire_event(false).unwrap().as_raw(), raw);
    assert_eq!(pool.growth_count(), 0);
    assert!(Arc::ptr_eq(pool.context(), &ctx));
}

#[test]
fn pooled_events_work_as_events() {
    let ctx = ctx();
    let stream = &streams(&ctx, 1)[0];
    let pool = Arc::new(EventPool::new(&ctx, 1, 2).unwrap());
    let start = pool.acquire_event(true).unwrap();
    let end = pool.acquire_event(true).unwrap();
    let gate = Gate::close(stream);
    start.record(stream).unwrap();
    stream
        .add_callback(|| std::thread::sleep(std::time::Duration::from_millis(2)))
        .unwrap();
    end.record(stream).unwrap();
    assert!(!end.query().unwrap(), "the gate holds the stream");
    gate.open();
    end.synchronize().unwrap();
    assert!(Event::elapsed(&start, &end).unwrap() > std::time::Duration::ZERO);
}

#[test]
fn grows_when_exhausted_up_to_the_cap_then_errors() {
    let ctx = ctx();
    let pool = Arc::new(EventPool::with_capacity_limit(&ctx, 1, 0, 3).unwrap());
    let held: Vec<_> = (0..3).map(|_| pool.acquire_event(false).unwrap()).collect();
    assert_eq!(pool.growth_count(), 2);
    assert_eq!(pool.utilization(), usage(0, 0, 3));
    let err = pool.acquire_event(false).unwrap_err();
    assert!(
        matches!(
            err,
            Error::EventPoolExhausted {
                kind: "regular",
                cap: 3
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains('3'), "{err}");
    // The timing kind has its own cap.
    let timing: Vec<_> = (0..3).map(|_| pool.acquire_event(true).unwrap()).collect();
    assert!(matches!(
        pool.acquire_event(true),
        Err(Error::EventPoolExhausted {
            kind: "timing",
            cap: 3
        })
    ));
    assert_eq!(pool.growth_count(), 5);
    drop(held);
    drop(timing);
    assert_eq!(pool.utilization(), usage(3, 3, 0));
    // Now everything is reused.
    let again: Vec<_> = (0..3).map(|_| pool.acquire_event(false).unwrap()).collect();
    assert_eq!(pool.growth_count(), 5);
    drop(again);
}

#[test]
fn a_cap_below_the_initial_count_is_an_error() {
    let ctx = ctx();
    let err = EventPool::with_capacity_limit(&ctx, 5, 1, 4).unwrap_err();
    assert!(
        matches!(
            err,
            Error::EventPoolCapBelowInitial {
                kind: "regular",
                requested: 5,
                cap: 4
            }
        ),
        "{err}"
    );
}

#[test]
fn events_return_to_their_own_pool() {
    let ctx = ctx();
    let a = Arc::new(EventPool::new(&ctx, 1, 0).unwrap());
    let b = Arc::new(EventPool::new(&ctx, 1, 0).unwrap());
    let event = a.acquire_event(false).unwrap();
    assert!(Arc::ptr_eq(event.pool(), &a));
    b.release_event(event);
    assert_eq!(a.utilization(), usage(1, 0, 0));
    assert_eq!(b.utilization(), usage(1, 0, 0));
}

#[test]
fn releasing_inside_a_stream_callback_makes_no_driver_call() {
    let ctx = ctx();
    let stream = &streams(&ctx, 1)[0];
    let pool = Arc::new(EventPool::new(&ctx, 2, 0).unwrap());
    let event = pool.acquire_event(false).unwrap();
    event.record(stream).unwrap();
    stream.add_callback(move || drop(event)).unwrap();
    stream.synchronize().unwrap();
    stream.check_callback_panics().unwrap();
    assert_eq!(pool.utilization(), usage(2, 0, 0));
}

#[test]
fn concurrent_acquire_release_keeps_the_books_straight() {
    let ctx = ctx();
    let pool = Arc::new(EventPool::new(&ctx, 4, 4).unwrap());
    // Joined one by one rather than by `thread::scope`, whose end waits for
    // the closures only: a thread's shelf goes back to the pool in its
    // thread-local destructor, after the closure, and the books below must
    // be read after every shelf is back (a memcheck run on an H100 read
    // them while one was in transit).
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let a = pool.acquire_event((i + t) % 3 == 0).unwrap();
                    let b = pool.acquire_event(false).unwrap();
                    assert_ne!(a.as_raw(), b.as_raw(), "an event is never handed out twice");
                    drop(a);
                    drop(b);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let u = pool.utilization();
    let (regular, timing, in_use) = (u.available_regular, u.available_timing, u.in_use);
    assert_eq!(in_use, 0);
    assert_eq!(
        (regular + timing) as u64,
        8 + pool.growth_count(),
        "every event created is back"
    );
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<EventPool>();
    is_send_sync::<events::PooledEvent>();
}

#[test]
fn a_thread_keeps_what_it_released_and_gives_it_back_when_it_ends() {
    let ctx = ctx();
    let pool = Arc::new(EventPool::new(&ctx, 8, 0).unwrap());
    let (to_main, from_thread) = std::sync::mpsc::channel();
    let (to_thread, from_main) = std::sync::mpsc::channel::<()>();
    let worker = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let held: Vec<_> = (0..40)
                .map(|_| pool.acquire_event(false).unwrap())
                .collect();
            let raws: Vec<_> = held.iter().map(|e| e.as_raw() as usize).collect();
            drop(held);
            // The first 32 released stayed on this thread's shelf, the rest
            // went to the shared one; the next acquire takes the last one kept.
            let again = pool.acquire_event(false).unwrap();
            assert_eq!(again.as_raw() as usize, raws[31]);
            drop(again);
            to_main.send(raws).unwrap();
            from_main.recv().unwrap();
        })
    };
    let raws = from_thread.recv().unwrap();
    // 32 kept by the thread, 8 on the shared shelf; all count as available.
    assert_eq!(pool.growth_count(), 32);
    assert_eq!(pool.utilization(), usage(40, 0, 0));
    to_thread.send(()).unwrap();
    worker.join().unwrap();
    // The thread is gone and its shelf went back to the pool: all 40 can be
    // acquired here without creating any.
    let here: Vec<_> = (0..40)
        .map(|_| pool.acquire_event(false).unwrap())
        .collect();
    assert_eq!(pool.growth_count(), 32);
    let mut got: Vec<_> = here.iter().map(|e| e.as_raw() as usize).collect();
    let mut expected = raws;
    got.sort_unstable();
    expected.sort_unstable();
    assert_eq!(got, expected);
}

#[test]
fn events_released_in_a_callback_go_to_the_shared_shelf() {
    let ctx = ctx();
    let stream = &streams(&ctx, 1)[0];
    let pool = Arc::new(EventPool::new(&ctx, 1, 0).unwrap());
    let event = pool.acquire_event(false).unwrap();
    let raw = event.as_raw();
    stream.add_callback(move || drop(event)).unwrap();
    stream.synchronize().unwrap();
    // Another thread, with no shelf of its own, finds it without growth.
    let pool2 = Arc::clone(&pool);
    let found = std::thread::spawn(move || pool2.acquire_event(false).unwrap().as_raw() as usize)
        .join()
        .unwrap();
    assert_eq!(found, raw as usize);
    assert_eq!(pool.growth_count(), 0);
}

#[test]
fn a_capped_pool_shares_every_free_event_between_threads() {
    let ctx = ctx();
    let pool = Arc::new(EventPool::with_capacity_limit(&ctx, 1, 0, 1).unwrap());
    let pool2 = Arc::clone(&pool);
    // Released on one thread, acquired on another at the cap.
    std::thread::spawn(move || drop(pool2.acquire_event(false).unwrap()))
        .join()
        .unwrap();
    let event = pool.acquire_event(false).unwrap();
    assert_eq!(pool.utilization(), usage(0, 0, 1));
    drop(event);
}

#[test]
fn a_thread_drops_the_events_of_pools_that_are_gone() {
    let ctx = ctx();
    let old = Arc::new(EventPool::new(&ctx, 2, 2).unwrap());
    let kept = Arc::downgrade(&old);
    drop((
        old.acquire_event(false).unwrap(),
        old.acquire_event(true).unwrap(),
    ));
    drop(old);
    assert!(
        kept.upgrade().is_none(),
        "a thread's shelf does not keep its pool alive"
    );
    // Keeping events for a new pool clears out the old pool's shelf; the new
    // pool's books are unaffected.
    let new = Arc::new(EventPool::new(&ctx, 1, 1).unwrap());
    drop(new.acquire_event(true).unwrap());
    assert_eq!(new.utilization(), usage(1, 1, 0));
    assert_eq!(new.growth_count(), 0);
}

/// Expected pool counts, by name.
fn usage(
    available_regular: usize,
    available_timing: usize,
    in_use: usize,
) -> cuda_streams_event_coord::EventPoolUtilization {
    cuda_streams_event_coord::EventPoolUtilization {
        available_regular,
        available_timing,
        in_use,
    }
}
