//! Vector clocks for streams, event records and the host.
//!
//! A stream's clock is its own counter plus what it has learned of every
//! other agent (`others`, shared behind an `Arc` so that recording an event
//! copies a pointer, not a vector). The own counter rises with every change:
//! each operation, and each wait that taught the stream something new. So a
//! pair (stream, counter) names one state of the stream's knowledge, and a
//! wait whose event the stream already knows of costs one comparison.

use std::sync::Arc;

/// An agent: a stream (its [`crate::Stream::id`]).
pub(crate) type Agent = u64;

/// A sparse vector clock: `(agent, counter)` sorted by agent.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub(crate) struct Vc(Vec<(Agent, u32)>);

impl Vc {
    /// The clock that knows nothing.
    pub(crate) const EMPTY: Vc = Vc(Vec::new());

    /// What this clock knows of `agent`.
    #[inline]
    pub(crate) fn get(&self, agent: Agent) -> u32 {
        match self.0.binary_search_by_key(&agent, |(a, _)| *a) {
            Ok(i) => self.0[i].1,
            Err(_) => 0,
        }
    }

    /// Raise `agent` to at least `counter`; whether it rose.
    pub(crate) fn raise(&mut self, agent: Agent, counter: u32) -> bool {
        match self.0.binary_search_by_key(&agent, |(a, _)| *a) {
            Ok(i) if self.0[i].1 >= counter => false,
            Ok(i) => {
                self.0[i].1 = counter;
                true
            }
            Err(i) => {
                self.0.insert(i, (agent, counter));
                true
            }
        }
    }

    /// Take the pointwise maximum with `other`; whether anything rose.
    pub(crate) fn join(&mut self, other: &Vc) -> bool {
        let mut grew = false;
        for &(agent, counter) in &other.0 {
            grew |= self.raise(agent, counter);
        }
        grew
    }
}

/// A stream's clock, or a snapshot of one (an event's record).
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock {
    pub(crate) agent: Agent,
    pub(crate) own: u32,
    pub(crate) others: Arc<Vc>,
}

impl Clock {
    pub(crate) fn new(agent: Agent) -> Self {
        Self {
            agent,
            own: 0,
            others: Arc::default(),
        }
    }

    /// Whether the point `(agent, counter)` happened before this clock's
    /// present.
    #[inline]
    pub(crate) fn knows(&self, agent: Agent, counter: u32) -> bool {
        if agent == self.agent {
            self.own >= counter
        } else {
            self.others.get(agent) >= counter
        }
    }

    /// Learn everything `snapshot` knows; whether anything was new (then the
    /// own counter has risen too).
    pub(crate) fn learn(&mut self, snapshot: &Clock) -> bool {
        if snapshot.agent == self.agent || self.knows(snapshot.agent, snapshot.own) {
            // Knowing (agent, own) means knowing all it knew then.
            return false;
        }
        let others = Arc::make_mut(&mut self.others);
        others.raise(snapshot.agent, snapshot.own);
        others.join(&snapshot.others);
        // Our own entry may appear in the snapshot (we are in its past).
        others.0.retain(|(a, _)| *a != self.agent);
        self.own += 1;
        true
    }

    /// Learn a plain vector (the host's clock); whether anything was new.
    pub(crate) fn learn_vc(&mut self, vc: &Vc) -> bool {
        if self.others.covers_except(vc, self.agent) {
            return false;
        }
        let others = Arc::make_mut(&mut self.others);
        others.join(vc);
        others.0.retain(|(a, _)| *a != self.agent);
        self.own += 1;
        true
    }

    /// This clock as a plain vector (own entry included).
    pub(crate) fn to_vc(&self) -> Vc {
        let mut vc = (*self.others).clone();
        vc.raise(self.agent, self.own);
        vc
    }
}

impl Vc {
    fn covers_except(&self, other: &Vc, except: Agent) -> bool {
        other
            .0
            .iter()
            .all(|&(a, c)| a == except || self.get(a) >= c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learning_is_transitive_and_skips_what_is_known() {
        let (mut a, mut b, mut c) = (Clock::new(1), Clock::new(2), Clock::new(3));
        a.own = 5;
        assert!(b.learn(&a));
        assert!(b.knows(1, 5) && !b.knows(1, 6));
        let before = b.own;
        assert!(!b.learn(&a), "a point already known teaches nothing");
        assert_eq!(b.own, before);
        b.own += 1;
        assert!(c.learn(&b));
        assert!(c.knows(1, 5), "through b");
        assert!(c.knows(2, b.own));
        assert!(!a.knows(2, 1));
        // A snapshot holding our own past adds no entry for ourselves.
        a.own += 1;
        assert!(a.learn(&c));
        assert_eq!(a.others.get(1), 0);
        let mut host = Vc::default();
        host.join(&c.to_vc());
        let mut d = Clock::new(4);
        assert!(d.learn_vc(&host));
        assert!(d.knows(1, 5) && d.knows(3, c.own));
        assert!(!d.learn_vc(&host));
    }
}
