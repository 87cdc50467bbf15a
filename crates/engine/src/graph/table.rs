//! The graph's operations, in one table under one lock.
//!
//! Ids are issued in order, and an operation is issued its id when it enters
//! the table, so the live operations sit in a ring indexed by `id - base`: a
//! lookup is an index, an insertion a push at the back, and retirement marks
//! a slot gone and trims the front. One lock guards the ring, each stream's
//! retirement queue and the counters, so an operation of the builder costs
//! one lock (two with dependencies) instead of a lock per map, queue and
//! counter it touches.
//!
//! An operation that stays live for long (registered and never begun, or
//! behind GPU work that does not finish) would keep every slot after it in
//! the ring: past [`RING_LIMIT`] slots it moves to a side map instead.

use super::OpNode;
use crate::error::{Error, Result};
use crate::operation::OperationId;
use driver::IdBuildHasher;
use driver::{CompletionTrail, EventPool, LocalShelf, PooledEvent, Stream};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Slots the ring holds before a long-lived operation at its front moves to
/// the side map.
const RING_LIMIT: usize = 4096;

/// How many completions on one stream between two sweeps of that stream.
pub(super) const SWEEP_EVERY: u32 = 32;

/// The most completion events kept for the next builder operations
/// ([`Table::spares`]): a sweep's worth for each stream that had
/// queued operations at once, at the most ([`Table::peak_lanes`]), and one
/// more. Each such stream takes about that many events before its next
/// sweep, and streams that sweep at once (those of a DAG whose rounds give
/// each the same number of operations) retire that many together: a fixed
/// two sweeps' worth sent half of a four-stream DAG's events back to the
/// pool only for its next operations to take them out again (a lock, an
/// `Arc` and its allocation each way). The graph held at least that many
/// events at its peak, so the spares hold no more than it already did.
fn spare_events_limit(peak_lanes: usize) -> usize {
    SWEEP_EVERY as usize * (peak_lanes + 1)
}

/// The longest retirement queue (in slots) kept for the next stream's lane.
const SPARE_QUEUE_LIMIT: usize = 1024;

/// What one sweep retires, inline for a sweep's usual count (no allocation).
pub(super) type ReleasedList = smallvec::SmallVec<[Released; SWEEP_EVERY as usize + 8]>;

/// What retired operations still hold, dropped outside the table's lock.
pub(super) struct Released {
    _stream: Option<Arc<Stream>>,
    _event: Option<Arc<PooledEvent>>,
}

/// One id of the ring.
enum Slot {
    Live(OpNode),
    /// Retired, moved to the side map, or issued to a registration that failed.
    Gone,
}

/// Completed operations of one stream, in the order their completion events
/// were recorded (under the table's lock), so in the order the GPU passes
/// them: the stream's completion trail (the driver's [`CompletionTrail`],
/// by the operations' completion events, which the table holds). The lane
/// holds the stream while it has operations queued, and goes when it has
/// none.
pub(super) struct Lane {
    pub(super) trail: CompletionTrail<OperationId>,
    since_sweep: u32,
    stream: Arc<Stream>,
}

/// Everything the graph knows of its operations.
pub(super) struct Table {
    /// The id of `ring[0]`; `ring` covers `base..next_id`.
    base: u64,
    ring: VecDeque<Slot>,
    /// Live operations that outgrew the ring.
    old: HashMap<u64, OpNode, IdBuildHasher>,
    next_id: u64,
    begin_clock: u64,
    /// Ids issued to registrations that failed: unknown, not retired.
    abandoned: HashSet<OperationId, IdBuildHasher>,
    pub(super) lanes: HashMap<u64, Lane, IdBuildHasher>,
    /// The most lanes held at once: a lane goes when its stream's queue
    /// empties (a DAG's host wait empties them all every round), so the
    /// streams in use are counted by their peak.
    peak_lanes: usize,
    /// The queues of lanes that went, kept with their capacity for the next
    /// lanes (one per stream in use at the most, [`Table::peak_lanes`]): a
    /// stream whose sweeps keep up empties its lane at every sweep, and
    /// would otherwise grow a new queue from nothing each time (with two
    /// streams taking turns, one kept queue left the other stream's lane
    /// growing from nothing at every sweep).
    spare_queues: Vec<VecDeque<OperationId>>,
    /// Completion events of retired operations that nothing else held
    /// (no `Op` handle, no callback), from the graph's own pool, kept with
    /// their `Arc` for the next builder operations (the pool's
    /// [`LocalShelf`], which decides what it may keep): an operation then
    /// costs neither the `Arc`'s allocation nor a trip through the pool. The
    /// GPU has passed them, and a wait takes an event's state when it is
    /// enqueued, so recording one again changes no earlier wait.
    pub(super) spares: LocalShelf,
    live: usize,
    pub(super) total: u64,
    pub(super) completed: u64,
    pub(super) retired: u64,
}

impl Table {
    /// An empty table, keeping spare completion events of `pool`.
    pub(super) fn new(pool: &Arc<EventPool>) -> Self {
        Table {
            base: 1,
            ring: VecDeque::new(),
            old: HashMap::default(),
            next_id: 1,
            begin_clock: 1,
            abandoned: HashSet::default(),
            lanes: HashMap::default(),
            peak_lanes: 0,
            spare_queues: Vec::new(),
            spares: pool.local_shelf(spare_events_limit(0)),
            live: 0,
            total: 0,
            completed: 0,
            retired: 0,
        }
    }
}

impl Table {
    /// Issue the next id to `op`.
    #[inline]
    pub(super) fn issue(&mut self, op: OpNode) -> OperationId {
        let id = OperationId(self.next_id);
        self.next_id += 1;
        self.ring.push_back(Slot::Live(op));
        self.live += 1;
        self.total += 1;
        // Gone slots reach the front only through retirement and failed
        // registrations, which trim themselves: here only the limit.
        if self.ring.len() > RING_LIMIT {
            self.trim();
        }
        id
    }

    /// Issue the next id to a registration that failed, so its error can
    /// name it; the id stays unknown.
    pub(super) fn abandon_next(&mut self) -> OperationId {
        let id = OperationId(self.next_id);
        self.next_id += 1;
        self.ring.push_back(Slot::Gone);
        self.abandoned.insert(id);
        self.trim();
        id
    }

    /// The id the next operation will be issued.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The next position in begin order.
    pub(super) fn tick(&mut self) -> u64 {
        let at = self.begin_clock;
        self.begin_clock += 1;
        at
    }

    /// Whether `id` was issued to an operation that entered the graph (live
    /// or retired).
    #[inline]
    pub(super) fn is_known(&self, id: OperationId) -> bool {
        id.0 >= 1 && id.0 < self.next_id && !self.abandoned.contains(&id)
    }

    #[inline]
    pub(super) fn get(&self, id: OperationId) -> Option<&OpNode> {
        if id.0 < self.base {
            return self.old.get(&id.0);
        }
        match self.ring.get(usize::try_from(id.0 - self.base).ok()?) {
            Some(Slot::Live(op)) => Some(op),
            _ => None,
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, id: OperationId) -> Option<&mut OpNode> {
        if id.0 < self.base {
            return self.old.get_mut(&id.0);
        }
        match self.ring.get_mut(usize::try_from(id.0 - self.base).ok()?) {
            Some(Slot::Live(op)) => Some(op),
            _ => None,
        }
    }

    /// The live operation `id`, for `call`; a retired one was completed.
    pub(super) fn live_mut(&mut self, id: OperationId, call: &'static str) -> Result<&mut OpNode> {
        if self.get(id).is_none() {
            return Err(match self.is_known(id) {
                true => Error::AlreadyCompleted { operation: id },
                false => Error::UnknownOperation {
                    operation: id,
                    call,
                },
            });
        }
        Ok(self.get_mut(id).expect("checked just above"))
    }

    /// Retire a live operation: what it holds that must be dropped outside
    /// the lock (its stream and completion event) is taken out, and the rest
    /// dropped where it lies (moving the whole operation out of its slot
    /// cost two copies of it per retired operation).
    fn remove(&mut self, id: OperationId) -> Option<Released> {
        let released = if id.0 < self.base {
            let op = self.old.remove(&id.0)?;
            Released {
                _stream: op.seed.map(|seed| seed.stream),
                _event: op.completion,
            }
        } else {
            let slot = self.ring.get_mut(usize::try_from(id.0 - self.base).ok()?)?;
            let Slot::Live(op) = slot else {
                return None;
            };
            let released = Released {
                _stream: op.seed.take().map(|seed| seed.stream),
                _event: op.completion.take(),
            };
            *slot = Slot::Gone;
            released
        };
        self.live -= 1;
        Some(released)
    }

    /// Drop gone slots from the front; move long-lived operations out of a
    /// ring grown past its limit. Gone slots leave in one `drain`, dropped
    /// where they lie (popping each one copied the whole slot out).
    fn trim(&mut self) {
        loop {
            let gone = self
                .ring
                .iter()
                .take_while(|slot| matches!(slot, Slot::Gone))
                .count();
            if gone > 0 {
                self.ring.drain(..gone);
                self.base += gone as u64;
            }
            if self.ring.len() <= RING_LIMIT {
                return;
            }
            // A live operation at the front of a ring past its limit: to
            // the side map, and the ring goes on from the next slot.
            let Some(Slot::Live(op)) = self.ring.pop_front() else {
                return;
            };
            self.old.insert(self.base, op);
            self.base += 1;
        }
    }

    /// The live operations, with their ids.
    pub(super) fn iter(&self) -> impl Iterator<Item = (OperationId, &OpNode)> + '_ {
        let ring = self
            .ring
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot {
                Slot::Live(op) => Some((OperationId(self.base + i as u64), op)),
                Slot::Gone => None,
            });
        ring.chain(self.old.iter().map(|(&id, op)| (OperationId(id), op)))
    }

    /// Operations not yet retired.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Queue `id` (just completed, its event just recorded) for retirement
    /// on its stream. Returns whether a sweep of that stream is due.
    pub(super) fn queue(&mut self, stream: &Stream, id: OperationId) -> bool {
        // The stream's lane is usually there: one look-up, no entry.
        let lane = match self.lanes.get_mut(&stream.id()) {
            Some(lane) => lane,
            None => self.new_lane(stream),
        };
        lane.trail.push(id);
        lane.since_sweep += 1;
        let due = lane.since_sweep >= SWEEP_EVERY;
        if due {
            lane.since_sweep = 0;
        }
        due
    }

    /// A lane for `stream`, which has none, with a kept queue's capacity.
    #[cold]
    fn new_lane(&mut self, stream: &Stream) -> &mut Lane {
        let lane = Lane {
            trail: CompletionTrail::from_entries(self.spare_queues.pop().unwrap_or_default()),
            since_sweep: 0,
            stream: stream.to_arc(),
        };
        if self.lanes.len() + 1 > self.peak_lanes {
            self.peak_lanes = self.lanes.len() + 1;
            self.spares.set_limit(spare_events_limit(self.peak_lanes));
        }
        self.lanes.entry(stream.id()).or_insert(lane)
    }

    /// The stream of a stream's retirement queue, while it has one.
    pub(super) fn lane_stream(&self, stream_id: u64) -> Option<Arc<Stream>> {
        self.lanes
            .get(&stream_id)
            .map(|lane| Arc::clone(&lane.stream))
    }

    /// Take the first `count` queued operations of a stream out of the
    /// graph. Completion events only the table held are kept as spares
    /// (up to [`spare_events_limit`]; the shelf refuses another pool's
    /// events and a capped pool's). Each is
    /// dropped here except its stream and completion event, which the caller
    /// drops once the lock is released: a stream's last handle destroys it,
    /// which can wait for the device, and a completion callback running
    /// there may be waiting for this lock.
    /// Returns how many were retired; what they hold is added to
    /// `released` (the caller's, so that the list is not copied out).
    pub(super) fn retire_front(
        &mut self,
        stream_id: u64,
        count: usize,
        released: &mut ReleasedList,
    ) -> usize {
        let Some(lane) = self.lanes.get_mut(&stream_id) else {
            return 0;
        };
        let mut trail = std::mem::take(&mut lane.trail);
        let mut retired = 0;
        for id in trail.take_front(count) {
            if let Some(mut held) = self.remove(id) {
                held._event = held._event.and_then(|event| self.spares.put(event));
                // Most hold nothing more (a builder operation's event kept
                // as a spare): nothing to drop later.
                if held._stream.is_some() || held._event.is_some() {
                    released.push(held);
                }
                retired += 1;
            }
        }
        self.retired += retired as u64;
        if trail.is_empty() {
            let queue = trail.into_entries();
            // A queue grown long by a stream far behind is not kept.
            if queue.capacity() <= SPARE_QUEUE_LIMIT && self.spare_queues.len() < self.peak_lanes {
                self.spare_queues.push(queue);
            }
            if let Some(lane) = self.lanes.remove(&stream_id) {
                released.push(Released {
                    _stream: Some(lane.stream),
                    _event: None,
                });
            }
        } else if let Some(lane) = self.lanes.get_mut(&stream_id) {
            // A sweep can retire only what the trail still holds: counting
            // more completions than that since the last sweep would make the
            // next one come early. After `retire_through` (a program that
            // retires each round it has checked), the automatic sweep then
            // waits for a sweep's worth of new completions, instead of
            // querying again what the program has just retired.
            lane.since_sweep = lane.since_sweep.min(trail.len() as u32);
            lane.trail = trail;
        }
        self.trim();
        retired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::OperationGraph;
    use crate::operation::{EventPriority, OperationState, OperationType};
    use driver::Context;

    /// After `retire_through` leaves part of a stream's trail, the count
    /// toward its next automatic sweep is no more than what the trail still
    /// holds: the sweep waits for new completions instead of coming at
    /// once to query what the program has just retired.
    #[test]
    fn retiring_through_counts_only_what_is_left_toward_the_next_sweep() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let graph = OperationGraph::for_context(&ctx);
        let ops: Vec<_> = (0..20)
            .map(|_| graph.op(&stream).run(|_| Ok(())).unwrap())
            .collect();
        let gate = test_support::Gate::close(&stream);
        for _ in 0..10 {
            let _ = graph.op(&stream).run(|_| Ok(())).unwrap();
        }
        let since_sweep = |graph: &OperationGraph| {
            let table = graph.table();
            let lane = &table.lanes[&stream.id()];
            (lane.since_sweep, lane.trail.len())
        };
        assert_eq!(since_sweep(&graph), (30, 30));
        ops[19].wait().unwrap();
        assert_eq!(graph.retire_through(ops[19].id()).unwrap(), 20);
        // The ten behind the gate are left, and count as ten.
        assert_eq!(since_sweep(&graph), (10, 10));
        gate.open();
        stream.synchronize().unwrap();
        graph.retire_completed();
        assert_eq!(graph.table().live(), 0);
    }

    /// An operation registered and never begun stays live at the ring's
    /// front: past the ring's limit it moves to the side map, the retired
    /// slots behind it leave the ring, and it stays usable.
    #[test]
    fn a_long_lived_operation_leaves_the_ring_at_its_limit() {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let graph = OperationGraph::for_context(&ctx);
        let waiting = graph
            .register_operation(
                OperationType::Kernel,
                EventPriority::Normal,
                &stream,
                vec![],
                "never begun",
            )
            .unwrap();
        for _ in 0..RING_LIMIT + 64 {
            let _ = graph.op(&stream).run(|_| Ok(())).unwrap();
        }
        stream.synchronize().unwrap();
        graph.retire_completed();
        {
            let table = graph.table();
            assert!(
                table.old.contains_key(&waiting.0),
                "still in the ring of {} slots",
                table.ring.len()
            );
            assert!(table.ring.len() < 64, "{} slots kept", table.ring.len());
        }
        assert_eq!(graph.state(waiting), Some(OperationState::Registered));
        graph.begin_operation(waiting, &stream).unwrap();
        graph.complete_operation(waiting).unwrap();
        stream.synchronize().unwrap();
        graph.retire_completed();
        assert_eq!(graph.state(waiting), Some(OperationState::Retired));
        assert!(graph.table().old.is_empty());
    }
}
