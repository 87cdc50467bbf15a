//! The check before each enqueue ([`before_enqueue`]): an operation's
//! accesses against every access recorded before it, acted on as the
//! policy says. The common case takes one lock; memory of several contexts
//! and races go the general way ([`check_and_repair`]), which also writes
//! the race reports.

use super::clock::{Knows, Past};
use super::in_flight::InFlight;
use super::label::current_label;
use super::policy::OrderPolicy;
use super::repair::{order_after, repair};
use super::step::{commit_step, join, next_access, note_race, record_if_ordered, record_or_races};
use super::stream_state::{Held, StreamState};
use super::touch::Touch;
use super::tracker::{self, Access, Shadow};
use crate::ground::error::{Error, Result};
use crate::ground::race::{Race, RaceOp};
use crate::objects::context::Context;
use crate::objects::stream::Stream;
use smallvec::SmallVec;
use std::sync::{Arc, MutexGuard, Weak};

/// The shadows of the contexts an operation touches, locked in id order.
/// The stream's own (which guards its state) and the others' (peer memory).
struct Locked<'c> {
    home: u64,
    held: Held<'c>,
    others: SmallVec<[(u64, MutexGuard<'c, Shadow>); 1]>,
}

impl<'c> Locked<'c> {
    /// Lock `stream`'s state and the shadows of `home` (its context) and
    /// `others`, in the order of their ids.
    fn new(stream: &'c Stream, home: &'c Context, others: &'c [Arc<Context>]) -> Self {
        let mut contexts: SmallVec<[&Context; 2]> = SmallVec::new();
        contexts.push(home);
        contexts.extend(others.iter().map(|c| &**c));
        contexts.sort_by_key(|c| c.id());
        let mut held = None;
        let mut guards = SmallVec::new();
        for ctx in contexts {
            if ctx.id() == home.id() {
                held = Some(stream.order.lock());
            } else {
                guards.push((ctx.id(), ctx.order.shadow()));
            }
        }
        Locked {
            home: home.id(),
            held: held.expect("the stream's own context is listed"),
            others: guards,
        }
    }

    /// The stream's state, and the shadow of context `ctx`.
    fn split(&mut self, ctx: u64) -> (&mut StreamState, &mut Shadow) {
        let (state, own) = self.held.split();
        match self.others.iter_mut().find(|(id, _)| *id == ctx) {
            Some((_, shadow)) if ctx != self.home => (state, &mut **shadow),
            _ => (state, own),
        }
    }

    fn versions(&mut self) -> SmallVec<[u64; 2]> {
        let own = self.held.shadow().version();
        let others = self.others.iter().map(|(_, g)| g.version());
        std::iter::once(own).chain(others).collect()
    }

    fn streams(&mut self, id: u64) -> impl Iterator<Item = Weak<Stream>> {
        let own = self.held.shadow().stream(id);
        let others: SmallVec<[Weak<Stream>; 1]> =
            self.others.iter().map(|(_, g)| g.stream(id)).collect();
        std::iter::once(own).chain(others)
    }
}

/// Check the accesses of one operation about to be enqueued on `stream`
/// against every access recorded before it, act on the races as the policy
/// says, and record them. `policy` is the stream context's, not `Off`.
///
/// The common case (memory of the stream's own context, nothing unordered)
/// takes two locks, one lookup per touched range and allocates nothing;
/// anything else goes the general way ([`check_and_repair`]).
pub(crate) fn before_enqueue<'s>(
    stream: &'s Stream,
    what: &'static str,
    touches: &[Touch],
    policy: OrderPolicy,
) -> Result<InFlight<'s>> {
    let home = stream.context();
    if touches.iter().all(|t| t.ctx == home.id()) {
        // The stream's state and the shadow: one lock.
        let mut held = stream.order.lock();
        let (state, shadow) = held.split();
        state.learn_host();
        let access = next_access(state, stream, what);
        if policy != OrderPolicy::Auto {
            if record_if_ordered(shadow, touches, &access, &state.past()) {
                return Ok(commit_step(state, stream, home.id(), shadow));
            }
        } else {
            // The races found on the way are what the repair waits for:
            // each range is looked up once.
            let mut races = SmallVec::new();
            if record_or_races(shadow, touches, &access, &state.past(), &mut races) {
                return Ok(commit_step(state, stream, home.id(), shadow));
            }
            if let Some(in_flight) = repair(stream, access, touches, held, &races)? {
                return Ok(in_flight);
            }
        }
    }
    check_and_repair(stream, what, touches, policy)
}

/// `Auto`'s last repair of one operation: the shadows' versions it saw, and
/// per stream it made the operation's stream wait for, the step to cover.
type Repair = (SmallVec<[u64; 2]>, SmallVec<[(u64, u32); 2]>);

/// [`before_enqueue`] the general way: memory of several contexts, and
/// operations that race, which `Check` refuses, `Report` logs and `Auto`
/// repairs (then checks again, unless nothing changed meanwhile).
fn check_and_repair<'s>(
    stream: &'s Stream,
    what: &'static str,
    touches: &[Touch],
    policy: OrderPolicy,
) -> Result<InFlight<'s>> {
    let home = stream.context();
    // Memory of other contexts (peer copies) needs those contexts' shadows.
    let mut others: SmallVec<[Arc<Context>; 1]> = SmallVec::new();
    for &touch in touches {
        if touch.ctx != home.id() && !others.iter().any(|c| c.id() == touch.ctx) {
            match crate::objects::context::by_id(touch.ctx) {
                Some(ctx) => others.push(ctx),
                // A context nobody holds any more: its memory is gone.
                None => return Ok(InFlight(None)),
            }
        }
    }
    let mut repaired: Option<Repair> = None;
    for attempt in 0..4 {
        let mut locked = Locked::new(stream, home, &others);
        locked.held.learn_host();
        // The waits inserted last time cover every conflict found then; if
        // no access was recorded since, there is nothing to look for.
        let settled = repaired.as_ref().is_some_and(|(versions, covered)| {
            *versions == locked.versions()
                && covered
                    .iter()
                    .all(|&(agent, step)| locked.held.past().knows(agent, step))
        });
        if !settled {
            let mut races: SmallVec<[Race; 1]> = SmallVec::new();
            // Per stream to wait for: its id, the step to cover.
            let mut wait_for: SmallVec<[(u64, u32); 2]> = SmallVec::new();
            for &touch in touches {
                let (lo, hi) = touch.range();
                let (state, shadow) = locked.split(touch.ctx);
                shadow.conflicts(lo, hi, touch.write, &state.past(), |conflict| {
                    if policy == OrderPolicy::Auto {
                        note_race(&mut wait_for, conflict.prior.agent, conflict.prior.counter);
                    } else {
                        races.push(race(stream, what, touch, &conflict));
                    }
                });
            }
            if !wait_for.is_empty() {
                // Under `Auto`: one report per repaired operation.
                locked.held.shadow().stats.reports += 1;
                let handles: SmallVec<[(Weak<Stream>, u32); 2]> = wait_for
                    .iter()
                    .map(|&(id, step)| {
                        let live = locked.streams(id).find(|w| w.strong_count() > 0);
                        (live.unwrap_or_default(), step)
                    })
                    .collect();
                let versions = locked.versions();
                drop(locked);
                let refuse = || first_race(stream, what, touches);
                if attempt == 3 {
                    return Err(refuse());
                }
                for (earlier, step) in handles {
                    // A stream that is gone cannot be waited for: refuse.
                    let Some(earlier) = earlier.upgrade() else {
                        return Err(refuse());
                    };
                    order_after(stream, &earlier, step)?;
                }
                repaired = Some((versions, wait_for));
                continue;
            }
            if !races.is_empty() {
                locked.held.shadow().stats.reports += races.len() as u64;
                if policy == OrderPolicy::Report {
                    for race in &races {
                        tracing::warn!(target: "cuda_streams_driver::order", stream = stream.id(), "{race}");
                    }
                } else {
                    let race = races.swap_remove(0);
                    tracing::debug!(target: "cuda_streams_driver::order", "refused: {race}");
                    return Err(Error::UnorderedAccess(Box::new(race)));
                }
            }
        }
        // No race left (or reported): the access is this stream's next step.
        let access = next_access(&locked.held, stream, what);
        for &touch in touches {
            let (lo, hi) = touch.range();
            let (state, shadow) = locked.split(touch.ctx);
            shadow.record(lo, hi, touch.write, &access, &state.past());
        }
        for (ctx, shadow) in &mut locked.others {
            let state = locked.held.split().0;
            join(state, stream, *ctx, shadow);
        }
        let (state, shadow) = locked.held.split();
        return Ok(commit_step(state, stream, home.id(), shadow));
    }
    unreachable!("the last attempt returns")
}

/// The race `conflict` makes with an access to `touch` by `what` on `stream`.
pub(super) fn race(
    stream: &Stream,
    what: &'static str,
    touch: Touch,
    conflict: &tracker::Conflict<'_>,
) -> Race {
    let (lo, _) = touch.range();
    Race {
        earlier: race_op(conflict.prior, conflict.prior_writes),
        later: RaceOp {
            what,
            label: current_label().map(|l| l.to_string()),
            stream: stream.id(),
            device: stream.context().ordinal(),
            writes: touch.write,
            kernel: None,
            argument: None,
        },
        buffer: lo,
        buffer_bytes: touch.bytes,
        overlap: conflict.from - lo..conflict.to - lo,
        policy: policy_name(stream.context().ordering()),
        on_gpu: stream.context().is_gpu(),
    }
}

/// The policy's name as `CUDA_STREAMS_ORDERING` spells it, for a report.
fn policy_name(policy: super::OrderPolicy) -> &'static str {
    match policy {
        super::OrderPolicy::Off => "off",
        super::OrderPolicy::Check => "check",
        super::OrderPolicy::Report => "report",
        super::OrderPolicy::Auto => "auto",
    }
}

/// The first race of an operation `Auto` could not repair, as its error.
#[cold]
fn first_race(stream: &Stream, what: &'static str, touches: &[Touch]) -> Error {
    let home = stream.context();
    // Copied out: the stream's lock is its context's shadow lock, and the
    // shadows are locked one at a time below.
    let (clock, host) = {
        let state = stream.order.lock();
        (state.clock.clone(), Arc::clone(&state.host))
    };
    let past = Past {
        clock: &clock,
        host: &host,
    };
    let mut found = None;
    for &touch in touches {
        let shadow = if touch.ctx == home.id() {
            Some(Arc::clone(home))
        } else {
            crate::objects::context::by_id(touch.ctx)
        };
        let Some(ctx) = shadow else { continue };
        let (lo, hi) = touch.range();
        ctx.order
            .shadow()
            .conflicts(lo, hi, touch.write, &past, |conflict| {
                if found.is_none() {
                    found = Some(race(stream, what, touch, &conflict));
                }
            });
        if found.is_some() {
            break;
        }
    }
    match found {
        Some(race) => Error::UnorderedAccess(Box::new(race)),
        // Ordered meanwhile (another thread's wait): say what failed.
        None => Error::UnorderedAccess(Box::new(Race {
            earlier: RaceOp {
                what: "an operation no longer recorded",
                label: None,
                stream: 0,
                device: home.ordinal(),
                writes: true,
                kernel: None,
                argument: None,
            },
            later: RaceOp {
                what,
                label: current_label().map(|l| l.to_string()),
                stream: stream.id(),
                device: home.ordinal(),
                writes: touches.iter().any(|t| t.write),
                kernel: None,
                argument: None,
            },
            buffer: touches.first().map_or(0, |t| t.address),
            buffer_bytes: touches.first().map_or(0, |t| t.bytes),
            overlap: 0..0,
            policy: policy_name(home.ordering()),
            on_gpu: home.is_gpu(),
        })),
    }
}

fn race_op(access: &Access, writes: bool) -> RaceOp {
    RaceOp {
        what: access.what,
        label: access.label.as_deref().map(str::to_string),
        stream: access.agent,
        device: access.device,
        writes,
        kernel: None,
        argument: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{buffer, locks, streams, under};
    use super::*;

    /// What the tracker locks per operation, counted (the uncontended
    /// lock and unlock are two atomic read-modify-writes each, much of
    /// `check`'s cost on a GPU host): an operation on memory used before
    /// takes one lock, its context's shadow, which guards its stream's
    /// clock too; its step lands with no lock; its buffer's use event
    /// takes none (recorded by its only holder); a record takes the write
    /// side of the event's sequence lock (one compare-and-swap), a wait
    /// reads it with no lock and locks only the stream; under `Off` nothing
    /// is locked at all, an event's record and a wait for it included.
    #[test]
    fn an_operation_takes_one_lock_for_its_stream_and_the_shadow() {
        let (ctx, _policy) = under(OrderPolicy::Check);
        let [stream, other] = streams(&ctx);
        let mut data = buffer(&ctx);
        let event = crate::Event::new(&ctx, crate::EventFlags::PLAIN).unwrap();
        stream.memset_u32_async(&mut data, 0).unwrap();
        let memset = locks(|| stream.memset_u32_async(&mut data, 1).unwrap());
        // The buffer's use event on a stream other than its home takes the
        // point the memset kept, and no write side: it is recorded under
        // its buffer's lock, by its only holder (2 locks before).
        assert_eq!(memset, 1, "a memset under check, and its use event");
        let record = locks(|| event.record(&stream).unwrap());
        assert_eq!(
            record, 1,
            "a record after an operation: the event's write side"
        );
        let wait = locks(|| other.wait_event(&event).unwrap());
        assert_eq!(
            wait, 1,
            "a wait: the stream's (the shadow); the event's is read"
        );
        let record = locks(|| event.record(&other).unwrap());
        assert_eq!(record, 2, "a record after a wait: the stream's point too");
        // The engine's completion events: the only handle, no overlap.
        stream.memset_u32_async(&mut data, 1).unwrap();
        let unique = crate::UniqueEvent::new(ctx.event_pool().acquire_event(false).unwrap());
        let alone = locks(|| drop(stream.record_latest_unique(unique).unwrap()));
        assert_eq!(alone, 0, "a record by the only handle after an operation");
        // `Off` is measured here on the software driver, which refuses it
        // through `set_ordering`: nothing below conflicts (one stream
        // writes, the other only waits), and the switch back synchronizes.
        ctx.order.force(OrderPolicy::Off);
        let off = locks(|| {
            stream.memset_u32_async(&mut data, 2).unwrap();
            event.record(&stream).unwrap();
            other.wait_event(&event).unwrap();
        });
        assert_eq!(off, 0, "tracker work under off");
        other.synchronize().unwrap();
        ctx.set_ordering(OrderPolicy::Check).unwrap();
    }
}
