//! Every interleaving (up to `LOOM_MAX_PREEMPTIONS`) of threads enqueueing
//! on one stream the way `before_enqueue` and [`InFlight`](super::super::InFlight)
//! do: under the stream's lock, take the next step, put it in a free slot
//! (or beyond the slots, under the lock), take a point; then, without the
//! lock, make the driver call and empty the slot.
//!
//! Points are taken after each enqueue and each landing, under the lock.
//! Checked, from the protocol on [`FlyingSlots`]:
//! - a slot is never handed to a step while another step holds it (each
//!   slot's holder is written in a loom cell by the filler and cleared by
//!   the emptier: a second holder trips the assertion, or loom's check of
//!   the cell's accesses);
//! - a point taken under the lock (the steps below the lowest in flight,
//!   as `TrackedStream::snapshot_of` takes it) covers only steps whose
//!   driver call has returned, and sees that call's effects (each call
//!   writes a loom cell, which the point reads: without the Release of
//!   `empty` and the Acquire of `lowest`, loom reports the read as a race).

use super::*;
use loom::cell::UnsafeCell;
use loom::sync::{Arc, Mutex};
use loom::thread;

/// Steps the models take at most.
const STEPS: usize = 4;

/// What the stream's lock guards here: its clock and the steps in flight
/// beyond the slots (`StreamState::clock.own` and `in_flight`).
#[derive(Default)]
struct Locked {
    clock: u32,
    beyond: Vec<u32>,
}

struct Model {
    lock: Mutex<Locked>,
    slots: FlyingSlots,
    /// The step holding each slot, by the model's own account.
    holder: [UnsafeCell<u32>; FLYING],
    /// Each step's driver call: set when it returned.
    returned: [UnsafeCell<bool>; STEPS + 1],
}

/// A step in flight: its number and slot.
type Flying = (u32, Option<u8>);

impl Model {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            lock: Mutex::new(Locked::default()),
            slots: FlyingSlots::default(),
            holder: std::array::from_fn(|_| UnsafeCell::new(0)),
            returned: std::array::from_fn(|_| UnsafeCell::new(false)),
        })
    }

    /// `before_enqueue`: the next step, in flight, and a point taken under
    /// the same lock.
    fn enqueue(&self) -> Flying {
        let mut locked = self.lock.lock().unwrap();
        locked.clock += 1;
        let step = locked.clock;
        let (slot, _) = self.slots.fill(step);
        match slot {
            Some(i) => self.holder[usize::from(i)].with_mut(|holder| {
                // SAFETY: loom checks this access against the emptier's.
                let holder = unsafe { &mut *holder };
                assert_eq!(
                    *holder, 0,
                    "slot {i} given to step {step} while step {holder} holds it"
                );
                *holder = step;
            }),
            None => locked.beyond.push(step),
        }
        self.check_point(&locked);
        (step, slot)
    }

    /// The driver call returns, then `InFlight`'s drop; then a point (an
    /// event recorded after the operation).
    fn land(&self, (step, slot): Flying) {
        // SAFETY: loom checks this access against the points' reads.
        self.returned[step as usize].with_mut(|returned| unsafe { *returned = true });
        match slot {
            Some(i) => {
                self.holder[usize::from(i)].with_mut(|holder| {
                    // SAFETY: loom checks this access against the filler's.
                    let holder = unsafe { &mut *holder };
                    assert_eq!(*holder, step, "slot {i} lost step {step}");
                    *holder = 0;
                });
                self.slots.empty(i);
            }
            None => self.lock.lock().unwrap().beyond.retain(|&b| b != step),
        }
        self.check_point(&self.lock.lock().unwrap());
    }

    /// A point taken now (an event record): the steps below the lowest in
    /// flight, each of whose driver calls must have returned, seen here.
    fn check_point(&self, locked: &Locked) {
        let beyond = locked.beyond.iter().min().copied();
        let lowest = match (self.slots.lowest(), beyond) {
            (Some(s), Some(b)) => Some(s.min(b)),
            (s, b) => s.or(b),
        };
        let covered = lowest.map_or(locked.clock, |lowest| lowest - 1);
        for step in 1..=covered {
            // SAFETY: loom checks this access against the driver call's.
            let returned = self.returned[step as usize].with(|returned| unsafe { *returned });
            assert!(
                returned,
                "a point covers step {step}, whose call is being made"
            );
        }
    }

    /// After every thread is done: nothing in flight, every step covered.
    fn check_done(&self) {
        let locked = self.lock.lock().unwrap();
        assert_eq!(self.slots.lowest(), None, "a slot still holds a step");
        assert!(locked.beyond.is_empty());
        self.check_point(&locked);
    }
}

/// Two threads enqueueing twice each on one stream: slots are taken,
/// emptied and taken again while the other thread takes points.
#[test]
fn loom_racing_enqueues_share_the_slots_and_points_cover_only_returned_calls() {
    loom::model(|| {
        let model = Model::new();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let model = Arc::clone(&model);
                thread::spawn(move || {
                    for _ in 0..2 {
                        let flying = model.enqueue();
                        model.land(flying);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        model.check_done();
    });
}

/// Every slot taken, one emptied by another thread while the filler
/// enqueues again: the new step takes that slot only once it is seen free
/// (else it goes beyond the slots), and the point after it still leaves out
/// the steps in flight below.
#[test]
fn loom_a_slot_emptied_elsewhere_is_refilled_only_once_seen_free() {
    loom::model(|| {
        let model = Model::new();
        let mut flying: Vec<_> = (0..FLYING).map(|_| model.enqueue()).collect();
        assert!(flying.iter().all(|(_, slot)| slot.is_some()));
        let second = flying.remove(1);
        let lander = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.land(second))
        };
        flying.push(model.enqueue());
        lander.join().unwrap();
        for step in flying {
            model.land(step);
        }
        model.check_done();
    });
}
