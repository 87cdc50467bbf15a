//! An operation's step: its access recorded in the shadow when nothing
//! conflicts with it, then taken as its stream's next step, in flight until
//! its driver call returns.

use super::clock::Past;
use super::in_flight::InFlight;
use super::kept::keep_point;
use super::label::current_label;
use super::stream_state::StreamState;
use super::touch::Touch;
use super::tracker::{Access, Shadow};
use crate::objects::stream::Stream;
use smallvec::SmallVec;

/// The access `stream`'s next step would make.
#[inline]
pub(super) fn next_access(state: &StreamState, stream: &Stream, what: &'static str) -> Access {
    Access {
        agent: stream.id(),
        counter: state.clock.own + 1,
        device: stream.context().ordinal(),
        what,
        label: current_label(),
    }
}

/// Record `access` to every touch of one context's `shadow` if none
/// conflicts; whether it did (nothing is recorded otherwise). Inline, as
/// [`commit_step`].
#[inline(always)]
pub(super) fn record_if_ordered(
    shadow: &mut Shadow,
    touches: &[Touch],
    access: &Access,
    clock: &Past<'_>,
) -> bool {
    if let Some(recorded) = shadow.record_exact_or_races(touches, access, clock, |_, _| {}) {
        return recorded;
    }
    if touches.iter().any(|t| {
        let (lo, hi) = t.range();
        shadow.any_conflict(lo, hi, t.write, clock)
    }) {
        return false;
    }
    for &touch in touches {
        let (lo, hi) = touch.range();
        shadow.record(lo, hi, touch.write, access, clock);
    }
    true
}

/// [`record_if_ordered`] for `Auto`: when an access races, every race of
/// every touch goes into `races` (per stream, the latest step raced with),
/// found in the same lookups, and nothing is recorded; whether it recorded.
#[inline]
pub(super) fn record_or_races(
    shadow: &mut Shadow,
    touches: &[Touch],
    access: &Access,
    clock: &Past<'_>,
    races: &mut SmallVec<[(u64, u32); 2]>,
) -> bool {
    let exact = shadow.record_exact_or_races(touches, access, clock, |agent, step| {
        note_race(races, agent, step);
    });
    if let Some(recorded) = exact {
        return recorded;
    }
    // Some range is not one whole segment: every range is looked at again
    // below, the races found so far with them.
    races.clear();
    let mut found = |agent: u64, step: u32| note_race(races, agent, step);
    let mut any = false;
    for &touch in touches {
        let (lo, hi) = touch.range();
        shadow.conflicts(lo, hi, touch.write, clock, |conflict| {
            any = true;
            found(conflict.prior.agent, conflict.prior.counter);
        });
    }
    if any {
        return false;
    }
    for &touch in touches {
        let (lo, hi) = touch.range();
        shadow.record(lo, hi, touch.write, access, clock);
    }
    true
}

/// Note a race with `agent`'s step `step` in `races` (per stream, the
/// latest step raced with).
#[inline]
pub(super) fn note_race(races: &mut SmallVec<[(u64, u32); 2]>, agent: u64, step: u32) {
    match races.iter_mut().find(|(id, _)| *id == agent) {
        Some(entry) => entry.1 = entry.1.max(step),
        None => races.push((agent, step)),
    }
}

/// The access just recorded in `shadow` (of context `ctx`) is the stream's
/// next step, in flight until the driver call returns. Inline: a call
/// costs a good part of what it does.
#[inline(always)]
pub(super) fn commit_step<'s>(
    state: &mut StreamState,
    stream: &'s Stream,
    ctx: u64,
    shadow: &mut Shadow,
) -> InFlight<'s> {
    join(state, stream, ctx, shadow);
    state.clock.own += 1;
    let step = state.clock.own;
    let (slot, under_another) = stream.order.fly(state, step);
    keep_point(stream, &state.clock, step, under_another);
    InFlight(Some((stream, step, slot)))
}

/// Make `shadow` (of context `ctx`) know `stream` by its id, once.
#[inline(always)]
pub(super) fn join(state: &mut StreamState, stream: &Stream, ctx: u64, shadow: &mut Shadow) {
    // The stream's own context is the first it joins, and the one nearly
    // every operation touches: one comparison.
    if state.joined.first() != Some(&ctx) && !state.joined.contains(&ctx) {
        join_first_time(state, stream, ctx, shadow);
    }
}

#[cold]
#[inline(never)]
fn join_first_time(state: &mut StreamState, stream: &Stream, ctx: u64, shadow: &mut Shadow) {
    shadow.join(stream);
    state.joined.push(ctx);
}
