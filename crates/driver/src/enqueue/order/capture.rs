//! Stream order inside one capture: the graph's own partial order.
//!
//! Captured work does not run, so it must not move the streams' real clocks;
//! and two branches of one graph that write the same bytes race at every
//! replay, whatever orders the replays. So each stream taking part keeps a
//! clock within the graph beside its own (events recorded and waited inside
//! the capture move that one: forks, joins, the engine's edges), and the
//! capture keeps a shadow of its own, checking each captured node against
//! the nodes before it. The races are told at [`crate::Capture::end`],
//! where the graph's partial order is complete; `Auto` repairs each one as
//! the node is captured instead (a wait inside the capture is an edge of
//! the graph). A launch of the finished graph is then one operation with
//! the graph's whole access set, checked as eager work is.

use super::check::race;
use super::clock::VectorClock;
use super::label::current_label;
use super::policy::OrderPolicy;
use super::touch::Touch;
use super::tracker::{Access, Shadow};
use crate::ground::error::{Error, Result};
use crate::ground::race::Race;
use crate::objects::stream::Stream;
use smallvec::SmallVec;
use std::sync::Arc;

/// The order within one capture, while the context's policy is not `Off`.
pub(crate) struct CaptureOrder {
    policy: OrderPolicy,
    shadow: Shadow,
    /// Races found so far, told at the end (not under `Auto`).
    races: Vec<Race>,
}

impl CaptureOrder {
    /// The order of a capture begun on `origin`; `None` when the context's
    /// policy is `Off` (nothing is tracked, the one branch it costs).
    pub(crate) fn begin(origin: &Stream) -> Option<Self> {
        let policy = origin.context().order.policy();
        (policy != OrderPolicy::Off).then(|| Self {
            policy,
            shadow: Shadow::default(),
            races: Vec::new(),
        })
    }

    /// Check a node about to be captured on `stream` that touches `touches`
    /// against the nodes captured before it. Under `Auto` each race is
    /// repaired here, with a wait captured on `stream` (an edge of the
    /// graph); otherwise the races are kept for [`CaptureOrder::end`].
    /// Returns the races to keep once the node is captured.
    pub(crate) fn check(
        &mut self,
        stream: &Stream,
        what: &'static str,
        touches: &[Touch],
    ) -> Result<SmallVec<[Race; 1]>> {
        let mut races: SmallVec<[Race; 1]> = SmallVec::new();
        let mut wait_for: SmallVec<[Arc<Stream>; 2]> = SmallVec::new();
        let clock = stream
            .order
            .captured()
            .unwrap_or_else(|| VectorClock::new(stream.id()));
        for &touch in touches {
            let (lo, hi) = touch.range();
            let shadow = &self.shadow;
            shadow.conflicts(lo, hi, touch.write, &clock, |conflict| {
                if let Some(earlier) = shadow.stream(conflict.prior.agent).upgrade()
                    && !wait_for.iter().any(|s| s.id() == earlier.id())
                {
                    wait_for.push(earlier);
                }
                races.push(race(stream, what, touch, &conflict));
            });
        }
        if races.is_empty() {
            return Ok(races);
        }
        let counters = &stream.context().order;
        counters.count(|s| s.reports += races.len() as u64);
        if self.policy != OrderPolicy::Auto {
            return Ok(races);
        }
        for earlier in &wait_for {
            // Both streams take part in the capture: the event is recorded
            // and waited inside it, which makes an edge of the graph.
            let event = earlier.mark()?;
            stream.wait_event(&event)?;
            counters.count(|s| s.inserted_waits += 1);
            tracing::trace!(
                target: "cuda_streams_driver::order",
                "captured stream {} now waits for captured stream {}",
                stream.id(),
                earlier.id()
            );
        }
        Ok(SmallVec::new())
    }

    /// The node checked by [`CaptureOrder::check`] was captured: record its
    /// accesses as the next step of `stream`, and keep `races`.
    pub(crate) fn record(
        &mut self,
        stream: &Stream,
        what: &'static str,
        touches: &[Touch],
        races: SmallVec<[Race; 1]>,
    ) {
        self.races.extend(races);
        let clock = stream.order.captured_step();
        let access = Access {
            agent: stream.id(),
            counter: clock.own,
            device: stream.context().ordinal(),
            what,
            label: current_label(),
        };
        self.shadow.join(stream);
        for &touch in touches {
            let (lo, hi) = touch.range();
            self.shadow.record(lo, hi, touch.write, &access, &clock);
        }
    }

    /// The capture ends: under `Check` the first race is the error (the
    /// graph is discarded); under `Report` each is logged and the graph is
    /// kept.
    pub(crate) fn end(self, origin: &Stream) -> Result<()> {
        let mut races = self.races;
        if races.is_empty() {
            return Ok(());
        }
        match self.policy {
            OrderPolicy::Report => {
                for race in &races {
                    tracing::warn!(
                        target: "cuda_streams_driver::order",
                        stream = origin.id(),
                        "in the graph captured on stream {}: {race}",
                        origin.id()
                    );
                }
                Ok(())
            }
            _ => Err(Error::UnorderedAccess(Box::new(races.swap_remove(0)))),
        }
    }
}
