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
//! Ranks in other processes cannot be compared; NCCL runs their collectives
//! unchecked.

use crate::group::Shape;
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

    /// Post `calls` (each a local rank's collectives, in call order) as
    /// their ranks' next round. Returns `None` when there is nothing to
    /// compare against: this process has at most one of the ranks.
    pub(crate) fn post(self: &Arc<Self>, calls: Vec<(usize, Vec<Shape>)>) -> Option<Ticket> {
        let mut state = lock(&self.state);
        if state.local.iter().filter(|&&l| l).count() < 2 {
            return None;
        }
        // Every rank of one call posts to the same round: a thread that
        // holds a rank's communicator has collected every round that rank
        // posted, and each of those rounds was complete, so the ranks it
        // holds have posted equally often.
        let round = calls.iter().map(|(rank, _)| state.posted[*rank]).max()?;
        let named = calls[0].0;
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
            round,
            rank: named,
        })
    }
}

/// A call's place in a round, until it has the round's verdict.
pub(crate) struct Ticket {
    meeting: Arc<Meeting>,
    round: u64,
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
            let gone = state.gone;
            let Some(round) = state.rounds.get_mut(&self.round) else {
                return Ok(());
            };
            if let Some(verdict) = round.verdict.clone() {
                round.collected += 1;
                if round.collected == round.callers {
                    state.rounds.remove(&self.round);
                }
                return verdict.map_err(Refusal::Disagree);
            }
            if let Some(gone) = gone {
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
            Refusal::Gone { rank, gone } => Self::RankGone { rank, gone },
        }
    }
}
