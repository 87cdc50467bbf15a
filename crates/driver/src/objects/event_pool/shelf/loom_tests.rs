//! Every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of threads taking,
//! growing and returning items on one [`Shelf`]: no item is handed to two
//! takers at once, racing growers never pass the cap, a failed creation
//! gives its place back, and every item created ends up back on the shelf.

use super::*;
use loom::sync::Arc;
use loom::sync::atomic::AtomicBool;
use loom::thread;

/// Items are indices into `in_use`; `next` numbers new ones.
struct Model {
    shelf: Shelf<usize>,
    in_use: [AtomicBool; 3],
    next: AtomicUsize,
}

impl Model {
    fn new(free: usize, cap: usize) -> Arc<Self> {
        Arc::new(Self {
            shelf: Shelf::new((0..free).collect(), cap, "regular"),
            in_use: std::array::from_fn(|_| AtomicBool::new(false)),
            next: AtomicUsize::new(free),
        })
    }

    /// Take one (creating it if the shelf is empty and `fail` is false), use
    /// it, put it back. Whether it got one.
    fn round_trip(&self, fail: bool) -> bool {
        let taken = self.shelf.take_or_grow(|| {
            assert!(
                self.shelf.created() <= self.shelf.cap(),
                "growth passed the cap"
            );
            if fail {
                return Err(Error::EventPoolExhausted {
                    kind: "regular",
                    cap: 0,
                });
            }
            Ok(self.next.fetch_add(1, Ordering::Relaxed))
        });
        let Ok((item, _grew)) = taken else {
            return false;
        };
        assert!(
            !self.in_use[item].swap(true, Ordering::Relaxed),
            "item {item} handed to two takers"
        );
        self.in_use[item].store(false, Ordering::Relaxed);
        self.shelf.put(item);
        true
    }
}

#[test]
fn loom_one_free_item_is_handed_to_one_taker_at_a_time() {
    loom::model(|| {
        // One item and no room to grow: the takers share it or go without.
        let model = Model::new(1, 1);
        let other = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.round_trip(false))
        };
        let mine = model.round_trip(false);
        let theirs = other.join().unwrap();
        assert!(mine || theirs, "someone got the free item");
        assert_eq!(model.shelf.created(), 1, "nothing grew past the cap");
        assert_eq!(*model.shelf.lock(), [0], "the item came back");
    });
}

#[test]
fn loom_racing_growers_stay_under_the_cap_and_a_failure_gives_its_place_back() {
    loom::model(|| {
        // An empty shelf with room for two: two growers that succeed and
        // one whose creation fails.
        let model = Model::new(0, 2);
        let growers: Vec<_> = [false, true]
            .into_iter()
            .map(|fail| {
                let model = Arc::clone(&model);
                thread::spawn(move || model.round_trip(fail))
            })
            .collect();
        let mine = model.round_trip(false);
        // (The thread whose creation fails may still take an item another
        // thread put back: only what it created is failed.)
        let got: Vec<bool> = growers.into_iter().map(|t| t.join().unwrap()).collect();
        let successes = usize::from(mine) + usize::from(got[0]);
        // The failure's place was given back: only real items count, and
        // each one is back on the shelf.
        assert_eq!(model.shelf.created(), model.shelf.lock().len());
        assert!(model.shelf.created() <= 2);
        assert!(successes >= 1, "one of two growers always has room");
        let mut free = model.shelf.lock().clone();
        free.sort_unstable();
        free.dedup();
        assert_eq!(free.len(), model.shelf.created(), "no item twice");
    });
}
