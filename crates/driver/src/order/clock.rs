//! Vector clocks for streams, event records and the host.
//!
//! A stream's clock is its own counter plus what it has learned of every
//! other agent (`others`). The own counter rises with every change: each
//! operation, and each wait that taught the stream something new. So a pair
//! (stream, counter) names one state of the stream's knowledge, and a wait
//! whose event the stream already knows of costs one comparison.
//!
//! A clock holds its entries inline for up to eight other streams: taking a
//! snapshot (an event record) copies them, with no allocation and no atomic
//! reference count, and learning merges two sorted lists in one pass.

use smallvec::SmallVec;

/// An agent: a stream (its [`crate::Stream::id`]).
pub(crate) type Agent = u64;

/// A sparse vector clock: `(agent, counter)` sorted by agent, inline for up
/// to eight agents.
#[derive(Default, Debug, PartialEq, Eq)]
pub(crate) struct Vc(SmallVec<[(Agent, u32); 8]>);

impl Clone for Vc {
    /// One copy of the entries (the derived clone goes through a generic,
    /// element-by-element extend): a snapshot is taken at every record.
    #[inline]
    fn clone(&self) -> Self {
        Vc(SmallVec::from_slice(&self.0))
    }
}

impl Vc {
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
        self.join_except(other, Agent::MAX)
    }

    /// Take the pointwise maximum with `other`, leaving `except` out (a
    /// stream's own entry, which its own counter holds); whether anything
    /// rose. One pass over both sorted lists when `other` names no agent
    /// this one lacks (the steady state), one merge otherwise.
    pub(crate) fn join_except(&mut self, other: &Vc, except: Agent) -> bool {
        let mut grew = false;
        let mut missing = false;
        let mut i = 0;
        // Plain slices: a `SmallVec` index asks inline or spilled each time.
        let mine = self.0.as_mut_slice();
        for &(agent, counter) in other.0.as_slice() {
            if agent == except {
                continue;
            }
            while i < mine.len() && mine[i].0 < agent {
                i += 1;
            }
            match mine.get_mut(i) {
                Some(entry) if entry.0 == agent => {
                    if entry.1 < counter {
                        entry.1 = counter;
                        grew = true;
                    }
                }
                _ => missing = true,
            }
        }
        if !missing {
            return grew;
        }
        let (mine, theirs) = (&self.0, &other.0);
        let mut merged = SmallVec::with_capacity(mine.len() + theirs.len());
        let (mut a, mut b) = (0, 0);
        while a < mine.len() || b < theirs.len() {
            match (mine.get(a), theirs.get(b)) {
                (_, Some(&(agent, _))) if agent == except => b += 1,
                (Some(&x), Some(&y)) if x.0 == y.0 => {
                    merged.push((x.0, x.1.max(y.1)));
                    a += 1;
                    b += 1;
                }
                (Some(&x), Some(&y)) if x.0 < y.0 => {
                    merged.push(x);
                    a += 1;
                }
                (Some(_), Some(&y)) | (None, Some(&y)) => {
                    merged.push(y);
                    b += 1;
                }
                (Some(&x), None) => {
                    merged.push(x);
                    a += 1;
                }
                (None, None) => break,
            }
        }
        self.0 = merged;
        true
    }
}

/// A stream's clock, or a snapshot of one (an event's record).
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock {
    pub(crate) agent: Agent,
    pub(crate) own: u32,
    pub(crate) others: Vc,
}

impl Clock {
    pub(crate) fn new(agent: Agent) -> Self {
        Self {
            agent,
            own: 0,
            others: Vc::default(),
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
        self.others.raise(snapshot.agent, snapshot.own);
        // Our own entry may appear in the snapshot (we are in its past).
        self.others.join_except(&snapshot.others, self.agent);
        self.own += 1;
        true
    }

    /// Learn a plain vector (the host's clock); whether anything was new.
    pub(crate) fn learn_vc(&mut self, vc: &Vc) -> bool {
        if !self.others.join_except(vc, self.agent) {
            return false;
        }
        self.own += 1;
        true
    }

    /// This clock as a plain vector (own entry included).
    pub(crate) fn to_vc(&self) -> Vc {
        let mut vc = self.others.clone();
        vc.raise(self.agent, self.own);
        vc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vc(entries: &[(Agent, u32)]) -> Vc {
        Vc(entries.iter().copied().collect())
    }

    #[test]
    fn join_raises_in_place_merges_new_agents_and_skips_the_excepted_one() {
        let mut a = vc(&[(1, 5), (3, 2), (7, 9)]);
        assert!(!a.join_except(&vc(&[(1, 4), (7, 9)]), 0), "nothing new");
        assert!(a.join_except(&vc(&[(3, 6)]), 0), "raised in place");
        assert_eq!(a, vc(&[(1, 5), (3, 6), (7, 9)]));
        // New agents before, between and after the known ones; 4 is left out.
        assert!(a.join_except(&vc(&[(0, 1), (1, 8), (4, 3), (5, 2), (9, 1)]), 4));
        assert_eq!(a, vc(&[(0, 1), (1, 8), (3, 6), (5, 2), (7, 9), (9, 1)]));
        assert!(
            !a.join_except(&vc(&[(4, 100)]), 4),
            "only the excepted agent"
        );
        // More agents than fit inline.
        let many = Vc((10..30).map(|agent| (agent, agent as u32)).collect());
        assert!(a.join(&many));
        assert_eq!(a.0.len(), 26);
        assert!(a.0.windows(2).all(|w| w[0].0 < w[1].0), "still sorted");
        assert_eq!(a.get(29), 29);
        assert_eq!(a.get(1), 8);
    }

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
