//! Vector clocks for streams, event records and the host.
//!
//! A stream's clock is its own counter plus what it has learned of every
//! other agent (`others`). The own counter rises with every change: each
//! operation, and each wait that taught the stream something new. So a pair
//! (stream, counter) names one state of the stream's knowledge, and a wait
//! whose event the stream already knows of costs one comparison.
//!
//! A clock holds its entries inline, in two fixed arrays, for up to seven
//! other streams: taking a snapshot (an event record) is a copy of a few
//! dozen bytes of fixed size, with no allocation, no loop and no atomic
//! reference count; learning merges two sorted lists in one pass.

/// An agent: a stream (its [`crate::Stream::id`]).
pub(crate) type Agent = u64;

/// Entries a clock holds without allocating.
pub(super) const INLINE: usize = 7;

/// A sparse vector clock: `(agent, counter)` sorted by agent, inline for up
/// to [`INLINE`] agents, all on the heap (`spill`) beyond.
#[derive(Default)]
pub(crate) struct Vc {
    len: u32,
    agents: [Agent; INLINE],
    counters: [u32; INLINE],
    spill: Option<Box<Spill>>,
}

/// The entries of a clock that outgrew its inline arrays.
#[derive(Clone, Default)]
struct Spill {
    agents: Vec<Agent>,
    counters: Vec<u32>,
}

impl Clone for Vc {
    /// A fixed-size copy of the inline arrays (the common case), or of the
    /// heap's entries.
    #[inline]
    fn clone(&self) -> Self {
        Vc {
            len: self.len,
            agents: self.agents,
            counters: self.counters,
            spill: self.spill.clone(),
        }
    }
}

impl std::fmt::Debug for Vc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (agents, counters) = self.parts();
        f.debug_map().entries(agents.iter().zip(counters)).finish()
    }
}

impl PartialEq for Vc {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Vc {}

impl Vc {
    /// The agents (sorted) and their counters.
    #[inline(always)]
    fn parts(&self) -> (&[Agent], &[u32]) {
        match &self.spill {
            None => {
                let len = self.len as usize;
                (&self.agents[..len], &self.counters[..len])
            }
            Some(spill) => (&spill.agents, &spill.counters),
        }
    }

    #[inline]
    fn parts_mut(&mut self) -> (&[Agent], &mut [u32]) {
        match &mut self.spill {
            None => {
                let len = self.len as usize;
                (&self.agents[..len], &mut self.counters[..len])
            }
            Some(spill) => (&spill.agents, &mut spill.counters),
        }
    }

    /// Its entries, if inline (it knows of no more than [`INLINE`]).
    #[inline]
    pub(super) fn inline(&self) -> Option<(&[Agent], &[u32])> {
        self.spill.is_none().then(|| {
            let len = (self.len as usize).min(INLINE);
            (&self.agents[..len], &self.counters[..len])
        })
    }

    /// Make it the `len` (at most [`INLINE`]) inline entries `entry(i)`,
    /// sorted by agent.
    #[inline]
    pub(super) fn set_inline(&mut self, len: usize, mut entry: impl FnMut(usize) -> (Agent, u32)) {
        self.spill = None;
        let len = len.min(INLINE);
        for i in 0..len {
            (self.agents[i], self.counters[i]) = entry(i);
        }
        self.len = len as u32;
    }

    /// The number of agents it knows of.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.parts().0.len()
    }

    /// Where `agent` is, or would go.
    #[inline(always)]
    fn find(agents: &[Agent], agent: Agent) -> Result<usize, usize> {
        // A few entries: a scan beats a binary search's branches.
        if agents.len() <= INLINE {
            for (i, &a) in agents.iter().enumerate() {
                if a >= agent {
                    return if a == agent { Ok(i) } else { Err(i) };
                }
            }
            Err(agents.len())
        } else {
            agents.binary_search(&agent)
        }
    }

    /// What this clock knows of `agent`.
    #[inline(always)]
    pub(crate) fn get(&self, agent: Agent) -> u32 {
        let (agents, counters) = self.parts();
        match Self::find(agents, agent) {
            Ok(i) => counters[i],
            Err(_) => 0,
        }
    }

    /// Insert `(agent, counter)` at `at`, which keeps the agents sorted.
    #[cold]
    #[inline(never)]
    fn insert(&mut self, at: usize, agent: Agent, counter: u32) {
        let len = self.len as usize;
        match &mut self.spill {
            None if len < INLINE => {
                self.agents.copy_within(at..len, at + 1);
                self.counters.copy_within(at..len, at + 1);
                self.agents[at] = agent;
                self.counters[at] = counter;
                self.len += 1;
            }
            None => {
                let mut spill = Spill {
                    agents: self.agents.to_vec(),
                    counters: self.counters.to_vec(),
                };
                spill.agents.insert(at, agent);
                spill.counters.insert(at, counter);
                self.spill = Some(Box::new(spill));
            }
            Some(spill) => {
                spill.agents.insert(at, agent);
                spill.counters.insert(at, counter);
            }
        }
    }

    /// Raise `agent` to at least `counter`; whether it rose. Inline: a
    /// wait's learn is a few of these and one join, on a clock of a few
    /// entries, where a call costs as much as the work.
    #[inline]
    pub(crate) fn raise(&mut self, agent: Agent, counter: u32) -> bool {
        let (agents, counters) = self.parts_mut();
        match Self::find(agents, agent) {
            Ok(i) if counters[i] >= counter => false,
            Ok(i) => {
                counters[i] = counter;
                true
            }
            Err(i) => {
                self.insert(i, agent, counter);
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
    /// this one lacks (the steady state), an insertion per agent it lacks
    /// otherwise (rare: once per pair of streams that meet).
    #[inline]
    pub(crate) fn join_except(&mut self, other: &Vc, except: Agent) -> bool {
        if self.spill.is_none() && other.spill.is_none() {
            // Both inline (the common case): plain loops over fixed arrays.
            let (mine, theirs) = (self.len as usize, other.len as usize);
            let (mine, theirs) = (mine.min(INLINE), theirs.min(INLINE));
            let mut grew = false;
            let mut i = 0;
            for j in 0..theirs {
                let agent = other.agents[j];
                if agent == except {
                    continue;
                }
                while i < mine && self.agents[i] < agent {
                    i += 1;
                }
                if i == mine || self.agents[i] != agent {
                    return self.join_slow(other, except) | grew;
                }
                if self.counters[i] < other.counters[j] {
                    self.counters[i] = other.counters[j];
                    grew = true;
                }
            }
            return grew;
        }
        self.join_slow(other, except)
    }

    /// [`Vc::join_except`] with agents this one lacks, or spilled clocks:
    /// one raise per entry.
    #[cold]
    #[inline(never)]
    fn join_slow(&mut self, other: &Vc, except: Agent) -> bool {
        let (theirs, their_counters) = other.parts();
        let mut grew = false;
        for (&agent, &counter) in theirs.iter().zip(their_counters) {
            if agent != except {
                grew |= self.raise(agent, counter);
            }
        }
        grew
    }
}

/// A stream's clock, or a snapshot of one (an event's record).
#[derive(Clone, Debug, Default)]
pub(crate) struct VectorClock {
    pub(crate) agent: Agent,
    pub(crate) own: u32,
    pub(crate) others: Vc,
}

impl VectorClock {
    pub(crate) fn new(agent: Agent) -> Self {
        Self {
            agent,
            own: 0,
            others: Vc::default(),
        }
    }

    /// Whether the point `(agent, counter)` happened before this clock's
    /// present.
    #[inline(always)]
    pub(crate) fn knows(&self, agent: Agent, counter: u32) -> bool {
        if agent == self.agent {
            self.own >= counter
        } else {
            self.others.get(agent) >= counter
        }
    }

    /// Learn everything `snapshot` knows; whether anything was new (then the
    /// own counter has risen too).
    #[inline(always)]
    pub(crate) fn learn(&mut self, snapshot: &VectorClock) -> bool {
        if snapshot.agent == self.agent {
            return false;
        }
        let learnt = snapshot.others.inline().and_then(|(agents, counters)| {
            self.learn_in_place((snapshot.agent, snapshot.own, agents, counters))
        });
        match learnt {
            Some(learnt) => learnt,
            None => self.learn_new(snapshot),
        }
    }

    /// [`VectorClock::learn`] of a point kept as plain data (`Flat`), read where
    /// it is kept.
    #[inline(always)]
    pub(crate) fn learn_flat(&mut self, flat: &Flat) -> bool {
        let parts = flat.parts();
        if parts.0 == self.agent {
            return false;
        }
        match self.learn_in_place(parts) {
            Some(learnt) => learnt,
            None => self.learn_new(&flat.clock()),
        }
    }

    /// [`VectorClock::learn`] of a snapshot naming a stream this clock does not
    /// know of yet, or of spilled clocks: a raise and a join.
    #[cold]
    #[inline(never)]
    fn learn_new(&mut self, snapshot: &VectorClock) -> bool {
        if self.knows(snapshot.agent, snapshot.own) {
            // Knowing (agent, own) means knowing all it knew then.
            return false;
        }
        self.others.raise(snapshot.agent, snapshot.own);
        // Our own entry may appear in the snapshot (we are in its past).
        self.others.join_except(&snapshot.others, self.agent);
        self.own += 1;
        true
    }
}

impl VectorClock {
    /// [`VectorClock::learn`] of a snapshot (its agent, own counter and inline
    /// entries) in its steady state, in one pass over each clock's entries:
    /// this clock inline, and the snapshot naming no stream it does not
    /// know of already (`None` otherwise, with the snapshot's own entry
    /// and the own counter unchanged, and some other entries maybe raised
    /// to the snapshot's: [`VectorClock::learn_new`] learns the rest).
    /// `learning_in_place_agrees_with_raising_and_joining` fails if the
    /// own entry is raised before a stream this clock lacks is found.
    #[inline(always)]
    fn learn_in_place(
        &mut self,
        (agent, own, their_agents, their_counters): (Agent, u32, &[Agent], &[u32]),
    ) -> Option<bool> {
        let mine = &mut self.others;
        if mine.spill.is_some() {
            return None;
        }
        let m = (mine.len as usize).min(INLINE);
        let agents = &mine.agents[..m];
        let at = agents.iter().position(|&a| a == agent)?;
        if mine.counters[at] >= own {
            // Knowing (agent, own) means knowing all it knew then.
            return Some(false);
        }
        // Raised in place, with no copy: what a snapshot knows is true, so
        // the entries raised before one this clock lacks may stay raised
        // for the general way (`learn_new`), which raises them again (a
        // maximum). The snapshot's own entry is raised last: raised, it
        // would tell `learn_new` that all of it is known.
        let mut i = 0;
        for (&agent, &counter) in their_agents.iter().zip(their_counters) {
            if agent == self.agent {
                continue;
            }
            while i < m && agents[i] < agent {
                i += 1;
            }
            if i == m || agents[i] != agent {
                return None;
            }
            mine.counters[i] = mine.counters[i].max(counter);
        }
        mine.counters[at] = own;
        self.own += 1;
        Some(true)
    }

    /// Learn every entry of `taught` (another copy of this clock's, which
    /// learnt more meanwhile), leaving out this clock's own; whether
    /// anything was new (then the own counter has risen).
    #[inline]
    pub(crate) fn learn_all(&mut self, taught: &Vc) -> bool {
        let grew = self.others.join_except(taught, self.agent);
        if grew {
            self.own += 1;
        }
        grew
    }
}

/// A clock whose entries fit inline, as plain data (nothing to drop, so a
/// thread-local holding one costs no destructor registration): what an
/// enqueuing thread keeps of its stream's point.
#[derive(Clone, Copy)]
pub(crate) struct Flat {
    agent: Agent,
    own: u32,
    len: u32,
    agents: [Agent; INLINE],
    counters: [u32; INLINE],
}

impl Flat {
    pub(crate) const EMPTY: Self = Self {
        agent: 0,
        own: 0,
        len: 0,
        agents: [0; INLINE],
        counters: [0; INLINE],
    };

    /// Make it `clock` with its own counter at `own`, in place, if the
    /// clock's entries are inline (they are unless it learned of more than
    /// [`INLINE`] streams); whether they were (else it is as it was).
    #[inline]
    pub(crate) fn set(&mut self, clock: &VectorClock, own: u32) -> bool {
        let others = &clock.others;
        if others.spill.is_some() {
            return false;
        }
        self.agent = clock.agent;
        self.own = own;
        self.len = others.len;
        self.agents = others.agents;
        self.counters = others.counters;
        true
    }

    /// Make it the clock of `agent` at `own` with the `len` (at most
    /// [`INLINE`]) entries `entry(i)`, sorted by agent.
    #[inline]
    pub(crate) fn set_inline(
        &mut self,
        agent: Agent,
        own: u32,
        len: usize,
        mut entry: impl FnMut(usize) -> (Agent, u32),
    ) {
        self.agent = agent;
        self.own = own;
        let len = len.min(INLINE);
        for i in 0..len {
            (self.agents[i], self.counters[i]) = entry(i);
        }
        self.len = len as u32;
    }

    /// Its agent, own counter, and the agents and counters of its entries.
    #[inline]
    pub(crate) fn parts(&self) -> (Agent, u32, &[Agent], &[u32]) {
        let len = (self.len as usize).min(INLINE);
        (
            self.agent,
            self.own,
            &self.agents[..len],
            &self.counters[..len],
        )
    }

    /// The clock again.
    pub(crate) fn clock(&self) -> VectorClock {
        VectorClock {
            agent: self.agent,
            own: self.own,
            others: Vc {
                len: self.len,
                agents: self.agents,
                counters: self.counters,
                spill: None,
            },
        }
    }
}

/// Whether a point happened before a present: a stream's clock within a
/// graph being captured knows only what its clock says; an eager stream
/// also knows what the host had seen complete when it last looked ([`Past`]).
pub(crate) trait Knows {
    /// Whether the point `(agent, counter)` happened before.
    fn knows(&self, agent: Agent, counter: u32) -> bool;
}

impl Knows for VectorClock {
    #[inline(always)]
    fn knows(&self, agent: Agent, counter: u32) -> bool {
        VectorClock::knows(self, agent, counter)
    }
}

/// An eager stream's present: its clock, and the host's knowledge as of its
/// latest enqueue. The host's is kept apart rather than merged into the
/// clock: it names every stream the host ever waited for, and a clock that
/// held it would copy all of them at every event record.
#[derive(Clone, Copy)]
pub(crate) struct Past<'a> {
    pub(crate) clock: &'a VectorClock,
    pub(crate) host: &'a Vc,
}

impl Knows for Past<'_> {
    #[inline(always)]
    fn knows(&self, agent: Agent, counter: u32) -> bool {
        self.clock.knows(agent, counter) || self.host.get(agent) >= counter
    }
}

impl Vc {
    /// Learn everything `clock` knows (the host saw its point complete);
    /// whether anything was new.
    pub(crate) fn learn(&mut self, clock: &VectorClock) -> bool {
        let raised = self.raise(clock.agent, clock.own);
        self.join(&clock.others) | raised
    }

    /// Whether this vector knows everything `clock` knows.
    pub(crate) fn covers(&self, clock: &VectorClock) -> bool {
        if self.get(clock.agent) < clock.own {
            return false;
        }
        let (agents, counters) = clock.others.parts();
        agents
            .iter()
            .zip(counters)
            .all(|(&agent, &counter)| self.get(agent) >= counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vc(entries: &[(Agent, u32)]) -> Vc {
        let mut vc = Vc::default();
        for &(agent, counter) in entries {
            vc.raise(agent, counter);
        }
        vc
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
        let many = vc(&(10..30)
            .map(|agent| (agent, agent as u32))
            .collect::<Vec<_>>());
        assert!(a.join(&many));
        assert_eq!(a.len(), 26);
        assert!(a.parts().0.windows(2).all(|w| w[0] < w[1]), "still sorted");
        let copy = a.clone();
        assert_eq!(copy, a, "a spilled clock copies");
        assert_eq!(a.get(29), 29);
        assert_eq!(a.get(1), 8);
    }

    /// The one-pass learn agrees with the general one (a raise and a join)
    /// on every combination of small clocks: streams known to both, new to
    /// the learner (the general way), the learner itself named in the
    /// snapshot, and points already known.
    #[test]
    fn learning_in_place_agrees_with_raising_and_joining() {
        let reference = |mut clock: VectorClock, snapshot: &VectorClock| {
            if snapshot.agent == clock.agent || clock.knows(snapshot.agent, snapshot.own) {
                return (clock, false);
            }
            clock.others.raise(snapshot.agent, snapshot.own);
            clock.others.join_except(&snapshot.others, clock.agent);
            clock.own += 1;
            (clock, true)
        };
        let mut cases = 0;
        // Each of streams 1..=4 unknown (0) or known up to 1 or 3, in the
        // learner (stream 0, or stream 2) and in the snapshot (stream 3).
        for learner in [0, 2] {
            for mine in 0..81u32 {
                for theirs in 0..81u32 {
                    let entries = |mut code: u32, except: Agent| {
                        let mut vc = Vc::default();
                        for agent in 1..=4 {
                            let counter = [0, 1, 3][(code % 3) as usize];
                            code /= 3;
                            if counter > 0 && agent != except {
                                vc.raise(agent, counter);
                            }
                        }
                        vc
                    };
                    let mut clock = VectorClock::new(learner);
                    clock.own = 5;
                    clock.others = entries(mine, learner);
                    let mut snapshot = VectorClock::new(3);
                    snapshot.own = 2;
                    snapshot.others = entries(theirs, 3);
                    let (expected, grew) = reference(clock.clone(), &snapshot);
                    let learnt = clock.learn(&snapshot);
                    assert_eq!(
                        (learnt, clock.own, &clock.others),
                        (grew, expected.own, &expected.others),
                        "learner {learner}, codes {mine} and {theirs}"
                    );
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 2 * 81 * 81);
    }

    #[test]
    fn learning_is_transitive_and_skips_what_is_known() {
        let (mut a, mut b, mut c) = (
            VectorClock::new(1),
            VectorClock::new(2),
            VectorClock::new(3),
        );
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
        assert!(!host.covers(&c));
        assert!(host.learn(&c));
        assert!(host.covers(&c) && !host.learn(&c));
        let d = VectorClock::new(4);
        let past = Past {
            clock: &d,
            host: &host,
        };
        assert!(past.knows(1, 5) && past.knows(3, c.own), "through the host");
        assert!(!past.knows(3, c.own + 1) && !Knows::knows(&d, 1, 5));
    }
}
