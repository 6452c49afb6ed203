//! The rounds of a call: which transfers happen together.
//!
//! Every rank's plan is run in unit time with the execution rules of [`crate::cost`] and
//! [`crate::check`](mod@crate::check): a transfer starts when its send and its receive are both
//! posted (FIFO per sender, receiver and channel) and takes one round; an exchange step ends when
//! its send was delivered and its receive arrived; an in-node step starts when the last member
//! arrives and takes one round; a copy takes one round. A transfer's round is the round it
//! starts in. Transfers of one round run at the same time and share the fabric's links.
//!
//! **Rotation classes.** When shifting every rank by `rho` positions maps each rank's plan onto
//! another rank's plan (peers shifted alike, the same steps in the same order, transfers of the
//! same sizes up to the one element `split` may add), ranks ≡ c (mod rho) run in lock-step and
//! one representative per class suffices: rank c stands for every rank c + k·rho, a message it
//! sends to `c + off` stands for every member's message to `member + off`, and the queues are
//! keyed by (sender class, offset, channel). `rho = n` is the brute force: every rank is its own
//! class. [`rotation`] says which `rho` each algorithm's plans allow; the tests check that both
//! give the same schedule on small fabrics.

use crate::fx::FxMap;
use crate::plan::{Algo, CollKind, Layout, Plan, Step};
use std::collections::VecDeque;

/// One transfer class of a round: every rank `m ≡ src (mod rho)` sends to `m + off (mod n)` on
/// channel `chan`; `reduce` when the receiver combines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoundXfer {
    pub src: u32,
    pub off: u32,
    pub chan: u32,
    pub reduce: bool,
}

/// An in-node step or copy in a round: representative `rank`'s `index`-th local step (counting
/// only in-node steps and copies of its plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoundLocal {
    pub rank: u32,
    pub index: u32,
}

/// What happens in one round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub xfers: Vec<RoundXfer>,
    pub locals: Vec<RoundLocal>,
}

/// The rounds of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub n: usize,
    pub rho: usize,
    pub rounds: Vec<Round>,
}

/// The rotation step of the plans' symmetry for (kind, algo) on `layout` (node-major order =
/// rank order, as for [`crate::fabric::Fabric::layout`]): 1 for the flat ring and pairwise
/// exchange (every rank alike), the node size for two-level on a uniform layout (local rank i of
/// every node alike), `n` (no symmetry used) otherwise — trees and recursive doubling have
/// O(log n) steps per rank and are run for every rank; the ring broadcast is a pipeline whose
/// ranks do not run in lock-step.
pub fn rotation(kind: CollKind, algo: Algo, layout: &Layout) -> usize {
    let n = layout.size().max(1);
    let block = layout
        .nodes
        .iter()
        .flatten()
        .enumerate()
        .all(|(i, &r)| i == r);
    if !block {
        return n;
    }
    match (kind, algo) {
        (CollKind::AllReduce | CollKind::Barrier, Algo::Ring)
        | (CollKind::ReduceScatter | CollKind::AllGather, Algo::Ring)
        | (CollKind::AllToAll, Algo::Pairwise) => 1,
        (CollKind::AllReduce | CollKind::Barrier, Algo::TwoLevel)
            if layout.uniform() && layout.nodes.len() > 1 =>
        {
            layout.nodes[0].len()
        }
        _ => n,
    }
}

/// The count whose plans have the same rounds as a call of `count` elements on `n` ranks, and
/// no empty transfer: the ring and two-level all-reduces cut the buffer into n chunks, and below
/// one element per chunk ranks skip the exchanges of empty chunks while the chunks in flight
/// still pass through them, so their rounds are those of the plan at n elements (every link busy
/// every round: an upper bound that differs only in one-element transfers). The others move
/// whole blocks (a count ≥ 1 gives the same rounds) or, for the ring broadcast, as many chunks
/// as [`crate::ring::broadcast_chunks`] says.
pub fn shape_count(kind: CollKind, algo: Algo, count: usize, n: usize) -> usize {
    if count == 0 && kind != CollKind::Barrier {
        return 0;
    }
    match (kind, algo) {
        (CollKind::AllReduce | CollKind::Barrier, Algo::Ring | Algo::TwoLevel) => n.max(1),
        (CollKind::Broadcast, Algo::Ring) => {
            crate::ring::broadcast_chunks(count) * crate::ring::BCAST_CHUNK_ELEMS
        }
        _ => 1,
    }
}

type QKey = (u32, u32, u32);

/// One (sender class, offset, channel) FIFO. A sender's step ends only once its message was
/// received, so a FIFO holds at most one message (time posted) and at most one delivery
/// (time it arrived) the sender has not read yet.
#[derive(Default, Clone, Copy)]
struct Fifo {
    msg: Option<u64>,
    delivered: Option<u64>,
}

/// The FIFOs, by sender: each sender's few (offset, channel) FIFOs side by side.
struct Fifos(Vec<Vec<(u32, u32, Fifo)>>);

impl Fifos {
    fn get(&mut self, (src, off, chan): QKey) -> &mut Fifo {
        let v = &mut self.0[src as usize];
        let i = match v.iter().position(|e| e.0 == off && e.1 == chan) {
            Some(i) => i,
            None => {
                v.push((off, chan, Fifo::default()));
                v.len() - 1
            }
        };
        &mut v[i].2
    }
}

#[derive(Clone, Default)]
struct St {
    posted: bool,
    send: Option<QKey>,
    recv: Option<u64>,
}

/// A plan step reduced to what the unit-time run reads (so that 100 000 ranks' plans fit in
/// cache-friendly memory): the peers and channels of its live sides, or its in-node group.
#[derive(Clone, Copy)]
struct CStep {
    kind: u8,
    reduce: bool,
    send: u32,
    send_chan: u32,
    recv: u32,
    recv_chan: u32,
    /// In-node steps: index into the group table (`u32::MAX`: a member outside the world).
    group: u32,
}

const NONE: u32 = u32::MAX;
const XCHG: u8 = 0;
const NODE: u8 = 1;
const COPY: u8 = 2;

impl Schedule {
    /// Runs the plans of ranks `0..rho` (`plans[c]` is rank c's plan; with `rho = n`, every
    /// rank's) in unit time and collects the rounds. `Err` when the run stalls: the plans
    /// deadlock, or (with `rho < n`) the ranks of a class do not run in lock-step.
    pub fn run(plans: &[Plan], n: usize, rho: usize) -> Result<Schedule, String> {
        if plans.len() != rho {
            return Err(format!("{} plans for {rho} rotation classes", plans.len()));
        }
        Schedule::run_with(n, rho, |r| Ok(plans[r].clone()))
    }

    /// [`Schedule::run`] with the plans built one at a time by `plan_of(rank)` and kept only in
    /// compact form.
    pub fn run_with(
        n: usize,
        rho: usize,
        mut plan_of: impl FnMut(usize) -> Result<Plan, String>,
    ) -> Result<Schedule, String> {
        if rho == 0 || !n.is_multiple_of(rho) || n > u32::MAX as usize {
            return Err(format!("rotation classes of {rho} over {n} ranks"));
        }
        let mut steps: Vec<CStep> = Vec::new();
        let mut first: Vec<usize> = Vec::with_capacity(rho + 1);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_ids: FxMap<Vec<usize>, u32> = FxMap::default();
        for r in 0..rho {
            first.push(steps.len());
            let plan = plan_of(r)?;
            for step in &plan.steps {
                let mut c = CStep {
                    kind: XCHG,
                    reduce: false,
                    send: NONE,
                    send_chan: 0,
                    recv: NONE,
                    recv_chan: 0,
                    group: NONE,
                };
                match step {
                    Step::Exchange { send, recv, reduce } => {
                        c.reduce = *reduce;
                        if let Some(x) = send.filter(|x| x.region.len > 0) {
                            c.send = x.peer as u32;
                            c.send_chan = x.chan as u32;
                        }
                        if let Some(x) = recv.filter(|x| x.region.len > 0) {
                            c.recv = x.peer as u32;
                            c.recv_chan = x.chan as u32;
                        }
                    }
                    Step::NodeReduceScatter { group, .. }
                    | Step::NodeAllGather { group, .. }
                    | Step::NodeBroadcast { group, .. }
                    | Step::NodeAllToAll { group, .. } => {
                        c.kind = NODE;
                        if group.iter().all(|&m| m < n) {
                            let mut members: Vec<usize> = group.iter().map(|&m| m % rho).collect();
                            members.sort_unstable();
                            members.dedup();
                            let next = groups.len() as u32;
                            c.group = *group_ids.entry(members.clone()).or_insert_with(|| {
                                groups.push(members);
                                next
                            });
                        }
                    }
                    Step::Copy { .. } => c.kind = COPY,
                }
                steps.push(c);
            }
        }
        first.push(steps.len());
        let len = |r: usize| first[r + 1] - first[r];
        let step_at = |r: usize, pc: usize| (pc < len(r)).then(|| steps[first[r] + pc]);
        let nn = n as u64;
        let mut t = vec![0u64; rho];
        let mut pc = vec![0usize; rho];
        let mut local = vec![0u32; rho];
        let mut st = vec![St::default(); rho];
        let mut fifos = Fifos(vec![Vec::new(); rho]);
        let mut rounds: Vec<Round> = Vec::new();
        let at = |rounds: &mut Vec<Round>, r: u64| -> usize {
            let r = r as usize;
            if rounds.len() <= r {
                rounds.resize_with(r + 1, Round::default);
            }
            r
        };
        let off = |from: usize, to: usize| ((to as u64 + nn - from as u64 % nn) % nn) as u32;
        // A worklist of representatives that may move: a blocked one is woken by the event it
        // waits for (a message posted to it, its message received, its node group complete).
        // The times do not depend on the order ranks are visited in.
        let mut work: VecDeque<usize> = (0..rho).collect();
        let mut queued = vec![true; rho];
        let wake = |work: &mut VecDeque<usize>, queued: &mut Vec<bool>, c: usize| {
            if !queued[c] {
                queued[c] = true;
                work.push_back(c);
            }
        };
        while let Some(r) = work.pop_front() {
            queued[r] = false;
            while let Some(step) = step_at(r, pc[r]) {
                let mut moved = false;
                match step.kind {
                    COPY => {
                        let i = at(&mut rounds, t[r]);
                        rounds[i].locals.push(RoundLocal {
                            rank: r as u32,
                            index: local[r],
                        });
                        local[r] += 1;
                        t[r] += 1;
                        pc[r] += 1;
                        moved = true;
                    }
                    XCHG => {
                        if !st[r].posted {
                            st[r].posted = true;
                            moved = true;
                            if step.send != NONE {
                                let peer = step.send as usize;
                                let key = (r as u32, off(r, peer), step.send_chan);
                                let f = fifos.get(key);
                                if f.msg.is_some() || f.delivered.is_some() {
                                    return Err(format!(
                                        "rank {r}: a second message to {peer} before the first arrived"
                                    ));
                                }
                                f.msg = Some(t[r]);
                                st[r].send = Some(key);
                                wake(&mut work, &mut queued, peer % rho);
                            }
                        }
                        if step.recv != NONE && st[r].recv.is_none() {
                            let peer = step.recv as usize;
                            let key = ((peer % rho) as u32, off(peer, r), step.recv_chan);
                            let f = fifos.get(key);
                            if let Some(posted) = f.msg.take() {
                                let start = posted.max(t[r]);
                                f.delivered = Some(start + 1);
                                let i = at(&mut rounds, start);
                                rounds[i].xfers.push(RoundXfer {
                                    src: key.0,
                                    off: key.1,
                                    chan: key.2,
                                    reduce: step.reduce,
                                });
                                st[r].recv = Some(start + 1);
                                moved = true;
                                wake(&mut work, &mut queued, key.0 as usize);
                            }
                        }
                        let sent = match st[r].send {
                            None => Some(t[r]),
                            Some(k) => fifos.get(k).delivered,
                        };
                        let got = if step.recv != NONE {
                            st[r].recv
                        } else {
                            Some(t[r])
                        };
                        if let (Some(a), Some(b)) = (sent, got) {
                            if let Some(k) = st[r].send {
                                fifos.get(k).delivered = None;
                            }
                            t[r] = t[r].max(a).max(b);
                            st[r] = St::default();
                            pc[r] += 1;
                            moved = true;
                        }
                    }
                    _ => {
                        let members: &[usize] = if step.group == NONE {
                            &[]
                        } else {
                            &groups[step.group as usize]
                        };
                        let ready = step.group != NONE
                            && members
                                .iter()
                                .all(|&c| step_at(c, pc[c]).is_some_and(|s| s.kind == NODE));
                        if ready {
                            let start = members.iter().map(|&c| t[c]).max().unwrap_or(0);
                            let i = at(&mut rounds, start);
                            for &c in members {
                                rounds[i].locals.push(RoundLocal {
                                    rank: c as u32,
                                    index: local[c],
                                });
                                local[c] += 1;
                                t[c] = start + 1;
                                pc[c] += 1;
                                if c != r {
                                    wake(&mut work, &mut queued, c);
                                }
                            }
                            moved = true;
                        }
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        if let Some(r) = (0..rho).find(|&r| pc[r] < len(r)) {
            return Err(format!(
                "the plans stall: rank {r} waits at step {} of {}{}",
                pc[r],
                len(r),
                if rho < n {
                    " (the ranks of a rotation class are not in lock-step)"
                } else {
                    ""
                }
            ));
        }
        for round in &mut rounds {
            round.xfers.sort_unstable();
            round.locals.sort_unstable();
        }
        Ok(Schedule { n, rho, rounds })
    }
}
