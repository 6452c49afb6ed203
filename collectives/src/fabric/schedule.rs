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

use crate::plan::{Algo, CollKind, Layout, Plan, Step};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for small integer keys (FxHash's multiply-rotate): the run hashes a few
/// million queue keys for 100 000 ranks, and SipHash's resistance to hostile keys is not needed
/// for keys the plans make.
#[derive(Default, Clone, Copy)]
pub(crate) struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map with [`Fx`].
pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

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

/// One (sender class, offset, channel) FIFO: messages posted and not yet received (time
/// posted, sequence), the next sequence number, and deliveries the sender has not read yet.
#[derive(Default)]
struct Fifo {
    queue: VecDeque<(u64, u64)>,
    next: u64,
    delivered: Vec<(u64, u64)>,
}

#[derive(Clone, Default)]
struct St {
    posted: bool,
    send: Option<(QKey, u64)>,
    recv: Option<u64>,
}

impl Schedule {
    /// Runs the plans of ranks `0..rho` (`plans[c]` is rank c's plan; with `rho = n`, every
    /// rank's) in unit time and collects the rounds. `Err` when the run stalls: the plans
    /// deadlock, or (with `rho < n`) the ranks of a class do not run in lock-step.
    pub fn run(plans: &[Plan], n: usize, rho: usize) -> Result<Schedule, String> {
        if plans.len() != rho || rho == 0 || n % rho != 0 {
            return Err(format!(
                "{} plans for rotation classes of {rho} over {n} ranks",
                plans.len()
            ));
        }
        let nn = n as u64;
        let mut t = vec![0u64; rho];
        let mut pc = vec![0usize; rho];
        let mut local = vec![0u32; rho];
        let mut st = vec![St::default(); rho];
        let mut fifos: FxMap<QKey, Fifo> = FxMap::default();
        let mut rounds: Vec<Round> = Vec::new();
        let at = |rounds: &mut Vec<Round>, r: u64| -> usize {
            let r = r as usize;
            if rounds.len() <= r {
                rounds.resize_with(r + 1, Round::default);
            }
            r
        };
        let off = |from: usize, to: usize| ((to as u64 + nn - from as u64 % nn) % nn) as u32;
        let is_node =
            |s: &Step| matches!(s, Step::NodeReduceScatter { .. } | Step::NodeAllGather { .. });
        loop {
            let mut progress = false;
            for r in 0..rho {
                while let Some(step) = plans[r].steps.get(pc[r]) {
                    let mut moved = false;
                    match step {
                        Step::Copy { .. } => {
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
                        Step::Exchange { send, recv, reduce } => {
                            let send = send.filter(|x| x.region.len > 0);
                            let recv = recv.filter(|x| x.region.len > 0);
                            if !st[r].posted {
                                st[r].posted = true;
                                moved = true;
                                if let Some(x) = send {
                                    let key = (r as u32, off(r, x.peer), x.chan as u32);
                                    let f = fifos.entry(key).or_default();
                                    st[r].send = Some((key, f.next));
                                    f.queue.push_back((t[r], f.next));
                                    f.next += 1;
                                }
                            }
                            if let (Some(x), None) = (recv, st[r].recv) {
                                let key = ((x.peer % rho) as u32, off(x.peer, r), x.chan as u32);
                                let f = fifos.get_mut(&key);
                                if let Some((f, (posted, seq))) =
                                    f.and_then(|f| f.queue.pop_front().map(|m| (f, m)))
                                {
                                    let start = posted.max(t[r]);
                                    let i = at(&mut rounds, start);
                                    rounds[i].xfers.push(RoundXfer {
                                        src: key.0,
                                        off: key.1,
                                        chan: key.2,
                                        reduce: *reduce,
                                    });
                                    f.delivered.push((seq, start + 1));
                                    st[r].recv = Some(start + 1);
                                    moved = true;
                                }
                            }
                            let sent = match st[r].send {
                                None => Some(t[r]),
                                Some((k, seq)) => fifos.get(&k).and_then(|f| {
                                    f.delivered.iter().find(|d| d.0 == seq).map(|d| d.1)
                                }),
                            };
                            let got = if recv.is_some() { st[r].recv } else { Some(t[r]) };
                            if let (Some(a), Some(b)) = (sent, got) {
                                if let Some((k, seq)) = st[r].send {
                                    if let Some(f) = fifos.get_mut(&k) {
                                        f.delivered.retain(|d| d.0 != seq);
                                    }
                                }
                                t[r] = t[r].max(a).max(b);
                                st[r] = St::default();
                                pc[r] += 1;
                                moved = true;
                            }
                        }
                        Step::NodeReduceScatter { group, .. }
                        | Step::NodeAllGather { group, .. } => {
                            let mut members: Vec<usize> = group.iter().map(|&m| m % rho).collect();
                            members.sort_unstable();
                            members.dedup();
                            let ready = group.iter().all(|&m| m < n)
                                && members
                                    .iter()
                                    .all(|&c| plans[c].steps.get(pc[c]).is_some_and(is_node));
                            if ready {
                                let start = members.iter().map(|&c| t[c]).max().unwrap_or(0);
                                let i = at(&mut rounds, start);
                                for &c in &members {
                                    rounds[i].locals.push(RoundLocal {
                                        rank: c as u32,
                                        index: local[c],
                                    });
                                    local[c] += 1;
                                    t[c] = start + 1;
                                    pc[c] += 1;
                                }
                                moved = true;
                            }
                        }
                    }
                    if !moved {
                        break;
                    }
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
        if let Some(r) = (0..rho).find(|&r| pc[r] < plans[r].steps.len()) {
            return Err(format!(
                "the plans stall: rank {r} waits at step {} of {}{}",
                pc[r],
                plans[r].steps.len(),
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
