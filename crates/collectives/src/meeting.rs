//! Where the ranks of a communicator that live in this process compare their
//! collectives before NCCL sees any.
//!
//! NCCL trusts every rank to make the same collectives, with the same counts,
//! types, operations and roots, in the same order; when they do not, it hangs
//! or reads and writes past the buffers. The ranks of one process can be
//! compared: each call (one collective alone, or one rank's part of a group)
//! posts its ranks' shapes for their next round, and waits until every rank
//! of the communicator made in this process has posted that round. The last
//! to post judges the round; every caller gets the same verdict, so either
//! all of them go on to NCCL or none does.
//!
//! Waiting cannot deadlock a correct program: NCCL requires every rank to
//! make each collective, and its own call may already block until the ranks
//! of a process have all made theirs (hence its rule that one thread driving
//! several ranks uses a group; a group here posts all of its ranks at once).
//! A rank whose communicator is dropped or aborted ends every wait for it
//! with an error instead of a hang. A call that fails its own rank's checks
//! (a buffer too short, a capturing stream) posts nothing, as it makes no
//! NCCL call: the other ranks wait for the rank's next call, as they would
//! on a GPU.
//!
//! Sends and receives are not rounds of every rank: the `k`-th send from
//! rank `a` to rank `b` meets the `k`-th receive of `b` from `a` (NCCL
//! matches them in that order), and the call that posts one side waits for
//! the other, when both ranks live here. The pair must agree on the count
//! and the element type. A call that holds both ranks of a pair (a group
//! driving them) must hold both sides, or it would wait for itself.
//!
//! Ranks in other processes cannot be compared; NCCL runs their collectives
//! unchecked.

use crate::shape::{Kind, Shape};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// The ranks of one communicator that live in this process, and their rounds.
pub(crate) struct Meeting {
    nranks: usize,
    /// For a communicator made from a unique id: the id's bytes, under which
    /// ranks joining in this process find the meeting.
    key: Option<[u8; 128]>,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    /// Ranks whose communicator was made in this process.
    local: Vec<bool>,
    /// Rounds each rank has posted.
    posted: Vec<u64>,
    /// Rounds not yet collected by every caller that posted to them.
    rounds: HashMap<u64, Round>,
    /// A local rank whose communicator was dropped or aborted: no round can
    /// complete any more.
    gone: Option<usize>,
    /// Every local rank whose communicator is gone: a send or receive
    /// fails only when its own peer is.
    left: Vec<bool>,
    /// Sends posted from one rank to another, and receives posted by the
    /// other from the one, by `(from, to)`.
    sent: HashMap<(usize, usize), u64>,
    received: HashMap<(usize, usize), u64>,
    /// Send/receive pairs not yet collected by both sides, by
    /// `(from, to, seq)`.
    pairs: HashMap<PairKey, Pair>,
}

/// `(from, to, seq)`: the `seq`-th send from `from` to `to`.
type PairKey = (usize, usize, u64);

#[derive(Default)]
struct Pair {
    send: Option<Shape>,
    recv: Option<Shape>,
    verdict: Option<Result<(), Disagreement>>,
    /// Sides whose caller has read the verdict.
    collected: u8,
}

struct Round {
    /// Each rank's collectives in this round, in call order.
    calls: Vec<Option<Vec<Shape>>>,
    verdict: Option<Result<(), Disagreement>>,
    /// Calls that posted to the round, and those that have read its verdict.
    callers: usize,
    collected: usize,
}

/// Why the ranks of a round disagree.
#[derive(Clone, Debug)]
pub(crate) enum Disagreement {
    /// Different numbers of collectives in one call.
    Calls {
        rank: usize,
        calls_here: usize,
        other_rank: usize,
        calls_there: usize,
    },
    /// A send and its receive differ in count or element type.
    Peer {
        from: usize,
        to: usize,
        sent: Shape,
        received: Shape,
    },
    /// Collective `index` of the round differs.
    Shape {
        index: usize,
        rank: usize,
        mine: Shape,
        other_rank: usize,
        theirs: Shape,
    },
}

/// Why a call could not meet the other ranks.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The ranks disagree.
    Disagree(Disagreement),
    /// Rank `gone`'s communicator was dropped or aborted before it posted.
    Gone { rank: usize, gone: usize },
}

/// Meetings of communicators made from unique ids whose ranks may still be
/// joining in this process.
fn forming() -> &'static Mutex<HashMap<[u8; 128], Arc<Meeting>>> {
    static FORMING: OnceLock<Mutex<HashMap<[u8; 128], Arc<Meeting>>>> = OnceLock::new();
    FORMING.get_or_init(Mutex::default)
}

/// A poisoned lock only means another thread panicked while holding it; the
/// state it guards is updated in single steps and stays consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Meeting {
    fn new(nranks: usize, key: Option<[u8; 128]>, local: Vec<bool>) -> Self {
        Self {
            nranks,
            key,
            state: Mutex::new(State {
                local,
                posted: vec![0; nranks],
                rounds: HashMap::new(),
                gone: None,
                left: vec![false; nranks],
                sent: HashMap::new(),
                received: HashMap::new(),
                pairs: HashMap::new(),
            }),
            changed: Condvar::new(),
        }
    }

    /// The meeting of `nranks` ranks all made here (`ncclCommInitAll`).
    pub(crate) fn all_local(nranks: usize) -> Arc<Self> {
        Arc::new(Self::new(nranks, None, vec![true; nranks]))
    }

    /// Rank `rank` of the communicator named by `id` is being made in this
    /// process. Called before the rank's `ncclCommInitRank`, which returns
    /// only once every rank has called it: so when any rank's communicator
    /// exists, every rank of this process has joined, and the set of local
    /// ranks no longer changes.
    pub(crate) fn join(id: [u8; 128], nranks: usize, rank: usize) -> Arc<Self> {
        let mut forming = lock(forming());
        let reusable = forming.get(&id).filter(|meeting| {
            let state = lock(&meeting.state);
            // The same bytes again after a communicator was complete, or a
            // rank joining twice: a new communicator (NCCL decides whether
            // the id may be used again).
            meeting.nranks == nranks && !state.local[rank] && state.gone.is_none()
        });
        let meeting = match reusable {
            Some(meeting) => Arc::clone(meeting),
            None => {
                let meeting = Arc::new(Self::new(nranks, Some(id), vec![false; nranks]));
                forming.insert(id, Arc::clone(&meeting));
                meeting
            }
        };
        let complete = {
            let mut state = lock(&meeting.state);
            state.local[rank] = true;
            state.local.iter().all(|&l| l)
        };
        if complete {
            forming.remove(&id);
        }
        meeting
    }

    /// Rank `rank` failed to join (its `ncclCommInitRank` failed): it is not
    /// one of this process's ranks after all.
    pub(crate) fn unjoin(&self, rank: usize) {
        let empty = {
            let mut state = lock(&self.state);
            state.local[rank] = false;
            !state.local.iter().any(|&l| l)
        };
        if empty {
            self.forget();
        }
    }

    /// Rank `rank`'s communicator is gone (dropped or aborted): wake every
    /// call waiting for it.
    pub(crate) fn leave(&self, rank: usize) {
        {
            let mut state = lock(&self.state);
            if !state.local[rank] {
                return;
            }
            state.gone.get_or_insert(rank);
            state.left[rank] = true;
            self.changed.notify_all();
        }
        self.forget();
    }

    /// Stop offering this meeting to joining ranks.
    fn forget(&self) {
        if let Some(key) = &self.key {
            let mut forming = lock(forming());
            if forming
                .get(key)
                .is_some_and(|m| std::ptr::eq(Arc::as_ptr(m), self))
            {
                forming.remove(key);
            }
        }
    }

    /// How many of the communicator's ranks live in this process (fixed
    /// once any of their communicators exists).
    pub(crate) fn local_ranks(&self) -> usize {
        lock(&self.state).local.iter().filter(|&&l| l).count()
    }

    /// Before posting: a call that holds both ranks of a send/receive pair
    /// holds both sides, in equal numbers, or it would wait for itself.
    pub(crate) fn check_pairs_within(
        &self,
        calls: &std::collections::BTreeMap<usize, Vec<Shape>>,
    ) -> Result<(), crate::Error> {
        for (&rank, shapes) in calls {
            for shape in shapes.iter().filter(|s| s.kind == Kind::Send) {
                let peer = shape.root;
                let Some(theirs) = calls.get(&peer) else {
                    continue;
                };
                let count = |list: &[Shape], kind: Kind, other: usize| {
                    list.iter()
                        .filter(|s| s.kind == kind && s.root == other)
                        .count()
                };
                let sends = count(shapes, Kind::Send, peer);
                let recvs = count(theirs, Kind::Recv, rank);
                if sends != recvs {
                    return Err(crate::Error::UnmatchedPeer {
                        from: rank,
                        to: peer,
                        sends,
                        recvs,
                    });
                }
            }
            for shape in shapes.iter().filter(|s| s.kind == Kind::Recv) {
                let peer = shape.root;
                let Some(theirs) = calls.get(&peer) else {
                    continue;
                };
                let recvs = shapes
                    .iter()
                    .filter(|s| s.kind == Kind::Recv && s.root == peer)
                    .count();
                let sends = theirs
                    .iter()
                    .filter(|s| s.kind == Kind::Send && s.root == rank)
                    .count();
                if sends != recvs {
                    return Err(crate::Error::UnmatchedPeer {
                        from: peer,
                        to: rank,
                        sends,
                        recvs,
                    });
                }
            }
        }
        Ok(())
    }

    /// The verdict on `calls` when they hold every rank of the
    /// communicator and no other thread can post to it (one thread drives
    /// a communicator made by `all_devices` whole: it borrows every rank,
    /// and a `Communicator` is not `Sync`): the same judgement as a posted
    /// round's and pairs', without the lock, the wait or the bookkeeping.
    /// Skipping the post leaves every rank's round and pair counters where
    /// they were, so later posted calls still line up.
    pub(crate) fn judge_whole(
        &self,
        calls: &std::collections::BTreeMap<usize, Vec<Shape>>,
    ) -> Result<(), crate::Error> {
        debug_assert_eq!(calls.len(), self.nranks);
        for (&from, shapes) in calls {
            for (&to, theirs) in calls {
                let sends = shapes
                    .iter()
                    .filter(|s| s.kind == Kind::Send && s.root == to);
                let recvs = theirs
                    .iter()
                    .filter(|s| s.kind == Kind::Recv && s.root == from);
                // Equal in number (`check_pairs_within`): the k-th send
                // meets the k-th receive.
                for (sent, received) in sends.zip(recvs) {
                    if sent.count != received.count || sent.dtype != received.dtype {
                        return Err(Refusal::Disagree(Disagreement::Peer {
                            from,
                            to,
                            sent: *sent,
                            received: *received,
                        })
                        .into());
                    }
                }
            }
        }
        let rounds: Vec<Option<Vec<Shape>>> = calls
            .values()
            .map(|shapes| {
                Some(
                    shapes
                        .iter()
                        .filter(|s| !s.kind.is_p2p())
                        .copied()
                        .collect(),
                )
            })
            .collect();
        judge(&rounds, &vec![true; self.nranks])
            .map_err(|disagreement| Refusal::Disagree(disagreement).into())
    }

    /// Post `calls` (each a local rank's collectives, sends and receives,
    /// in call order): the collectives as their ranks' next round, each
    /// send or receive with a local peer as its side of a pair. Returns
    /// `None` when there is nothing to compare against.
    pub(crate) fn post(self: &Arc<Self>, calls: Vec<(usize, Vec<Shape>)>) -> Option<Ticket> {
        let mut state = lock(&self.state);
        if state.local.iter().filter(|&&l| l).count() < 2 {
            return None;
        }
        let named = calls.first()?.0;
        let mut sides = Vec::new();
        for (rank, shapes) in &calls {
            for shape in shapes.iter().filter(|s| s.kind.is_p2p()) {
                let peer = shape.root;
                if !state.local.get(peer).copied().unwrap_or(false) {
                    continue;
                }
                let send = shape.kind == Kind::Send;
                let (from, to) = if send { (*rank, peer) } else { (peer, *rank) };
                let counter = if send {
                    state.sent.entry((from, to)).or_default()
                } else {
                    state.received.entry((from, to)).or_default()
                };
                let seq = *counter;
                *counter += 1;
                let key = (from, to, seq);
                let pair = state.pairs.entry(key).or_default();
                if send {
                    pair.send = Some(*shape);
                } else {
                    pair.recv = Some(*shape);
                }
                if let (Some(sent), Some(received)) = (pair.send, pair.recv) {
                    pair.verdict = Some(
                        if sent.count == received.count && sent.dtype == received.dtype {
                            Ok(())
                        } else {
                            Err(Disagreement::Peer {
                                from,
                                to,
                                sent,
                                received,
                            })
                        },
                    );
                    self.changed.notify_all();
                }
                sides.push(key);
            }
        }
        let calls: Vec<(usize, Vec<Shape>)> = calls
            .into_iter()
            .map(|(rank, shapes)| {
                let collectives: Vec<Shape> =
                    shapes.into_iter().filter(|s| !s.kind.is_p2p()).collect();
                (rank, collectives)
            })
            .filter(|(_, shapes)| !shapes.is_empty())
            .collect();
        if calls.is_empty() {
            return (!sides.is_empty()).then(|| Ticket {
                meeting: Arc::clone(self),
                round: None,
                sides,
                rank: named,
            });
        }
        // Every rank of one call posts to the same round: a thread that
        // holds a rank's communicator has collected every round that rank
        // posted, and each of those rounds was complete, so the ranks it
        // holds have posted equally often.
        let round = calls.iter().map(|(rank, _)| state.posted[*rank]).max()?;
        let nranks = self.nranks;
        for (rank, shapes) in calls {
            state.posted[rank] = round + 1;
            let entry = state.rounds.entry(round).or_insert_with(|| Round {
                calls: vec![None; nranks],
                verdict: None,
                callers: 0,
                collected: 0,
            });
            entry.calls[rank] = Some(shapes);
        }
        let local = state.local.clone();
        let entry = state.rounds.get_mut(&round)?;
        entry.callers += 1;
        let complete = (0..nranks).all(|r| !local[r] || entry.calls[r].is_some());
        if complete {
            entry.verdict = Some(judge(&entry.calls, &local));
            self.changed.notify_all();
        }
        Some(Ticket {
            meeting: Arc::clone(self),
            round: Some(round),
            sides,
            rank: named,
        })
    }
}

/// A call's place in a round, until it has the round's verdict.
pub(crate) struct Ticket {
    meeting: Arc<Meeting>,
    /// The round of the call's collectives, if it has any.
    round: Option<u64>,
    /// The sides of send/receive pairs it posted.
    sides: Vec<PairKey>,
    /// A rank of the call, to name in errors.
    rank: usize,
}

impl Ticket {
    /// Wait until every local rank has posted the round (or one of them is
    /// gone); the round's verdict.
    pub(crate) fn wait(self) -> Result<(), Refusal> {
        let meeting = &self.meeting;
        let mut state = lock(&meeting.state);
        loop {
            let round_ready = self
                .round
                .is_none_or(|round| state.rounds.get(&round).is_none_or(|r| r.verdict.is_some()));
            let pairs_ready = self
                .sides
                .iter()
                .all(|key| state.pairs.get(key).is_none_or(|p| p.verdict.is_some()));
            if round_ready && pairs_ready {
                return self.collect(&mut state);
            }
            if let (false, Some(gone)) = (round_ready, state.gone) {
                return Err(Refusal::Gone {
                    rank: self.rank,
                    gone,
                });
            }
            // A pair waits only for its own peer.
            let peer_gone = self.sides.iter().find_map(|key| {
                let pair = state.pairs.get(key)?;
                let missing = match (pair.send, pair.recv) {
                    (None, _) => key.0,
                    (_, None) => key.1,
                    _ => return None,
                };
                state.left[missing].then_some(missing)
            });
            if let Some(gone) = peer_gone {
                return Err(Refusal::Gone {
                    rank: self.rank,
                    gone,
                });
            }
            state = meeting
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Read every verdict of the call (each is ready), forgetting what
    /// every caller has read; the first refusal.
    fn collect(&self, state: &mut State) -> Result<(), Refusal> {
        let mut result = Ok(());
        if let Some(round_number) = self.round
            && let Some(round) = state.rounds.get_mut(&round_number)
        {
            let verdict = round.verdict.clone().unwrap_or(Ok(()));
            round.collected += 1;
            if round.collected == round.callers {
                state.rounds.remove(&round_number);
            }
            result = verdict.map_err(Refusal::Disagree);
        }
        for key in &self.sides {
            if let Some(pair) = state.pairs.get_mut(key) {
                let verdict = pair.verdict.clone().unwrap_or(Ok(()));
                pair.collected += 1;
                if pair.collected == 2 {
                    state.pairs.remove(key);
                }
                result = result.and(verdict.map_err(Refusal::Disagree));
            }
        }
        result
    }
}

/// Every local rank's collectives against the lowest local rank's.
fn judge(calls: &[Option<Vec<Shape>>], local: &[bool]) -> Result<(), Disagreement> {
    let mut ranks = (0..calls.len()).filter(|&r| local[r]);
    let Some(first) = ranks.next() else {
        return Ok(());
    };
    let mine = calls[first].as_deref().unwrap_or_default();
    for rank in ranks {
        let theirs = calls[rank].as_deref().unwrap_or_default();
        if mine.len() != theirs.len() {
            return Err(Disagreement::Calls {
                rank: first,
                calls_here: mine.len(),
                other_rank: rank,
                calls_there: theirs.len(),
            });
        }
        if let Some((index, (a, b))) = mine
            .iter()
            .zip(theirs)
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            return Err(Disagreement::Shape {
                index,
                rank: first,
                mine: *a,
                other_rank: rank,
                theirs: *b,
            });
        }
    }
    Ok(())
}

impl From<Refusal> for crate::Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Disagree(Disagreement::Calls {
                rank,
                calls_here,
                other_rank,
                calls_there,
            }) => Self::MissingRank {
                rank,
                calls_here,
                other_rank,
                calls_there,
            },
            Refusal::Disagree(Disagreement::Shape {
                index,
                rank,
                mine,
                other_rank,
                theirs,
            }) => Self::RanksDisagree {
                index,
                what: format!("rank {rank} calls {mine}, but rank {other_rank} calls {theirs}"),
            },
            Refusal::Disagree(Disagreement::Peer {
                from,
                to,
                sent,
                received,
            }) => Self::PeerMismatch {
                from,
                to,
                sent: sent.to_string(),
                received: received.to_string(),
            },
            Refusal::Gone { rank, gone } => Self::RankGone { rank, gone },
        }
    }
}
