//! Cost model, in the spirit of NCCL's tuning model: every transfer costs `α + bytes / β` on its
//! link class, reductions cost `bytes / reduce_bw`, and a plan's steps run one after the other.
//!
//! - [`LinkCost`] per link class: `local` (shared memory inside a node) and `net` (the network,
//!   per rail).
//! - An `Exchange` costs the slower of its send and its receive (they run concurrently), each
//!   priced on the class of its peer (same node → `local`, else `net`), plus the reduction of the
//!   received bytes when `reduce` is set.
//! - `NodeReduceScatter` costs `ceil(log2 L)` × `local.alpha` (the members' synchronisation)
//!   plus reading (and reducing) the L-1 other members' copies of the largest slice;
//!   `NodeAllGather` the same synchronisation plus reading the other members' slices;
//!   `NodeBroadcast` the synchronisation plus one pass over the region (the root copies a chunk in
//!   while the others copy the previous one out); `NodeAllToAll` the synchronisation plus every block for a peer copied in and out;
//!   `Copy` its bytes at `local.beta`.
//! - Network sharing: algorithms in which every rank of a node talks to the network at once
//!   (two_level's L rings, recursive_doubling's cross-node rounds, pairwise) share the node's
//!   `rails` NICs: their network β is divided by `ceil(L / rails)`. A flat ring or a tree has
//!   one network flow per node at a time.
//! - A call's price is its critical path: a timed run of all ranks' plans
//!   ([`CostModel::simulate`]), so waiting for peers counts.
//!
//! The numbers are fields; the runtime may override them (e.g. from environment variables, via
//! [`CostModel::set`]). Forcing an algorithm is the runtime's job (RAILRING_ALGO).

use crate::build::{algorithms_for, build_plan};
use crate::builder::{validate_layout, PlanError};
use crate::plan::{Algo, CollKind, Layout, Plan, Step, Xfer};
use std::collections::{HashMap, VecDeque};

/// Latency and bandwidth of one link class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per transfer.
    pub alpha: f64,
    /// Bytes per second.
    pub beta: f64,
}

impl LinkCost {
    /// Seconds to move `bytes` (zero bytes cost nothing: executors skip empty transfers).
    pub fn time(&self, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            0.0
        } else {
            self.alpha + bytes / self.beta
        }
    }
}

/// The tuning model. See the module documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Shared memory inside a node.
    pub local: LinkCost,
    /// The network, per rail.
    pub net: LinkCost,
    /// Network rails (NICs) per node.
    pub rails: usize,
    /// Bytes per second one rank combines in a reduction kernel.
    pub reduce_bw: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::default_cpu()
    }
}

/// Most rails (NICs) per node a cost model takes (`rails`): more than any machine has.
pub const MAX_RAILS: usize = 64;

/// Keys accepted by [`CostModel::set`].
pub const COST_KEYS: [&str; 6] = [
    "local_alpha",
    "local_beta",
    "net_alpha",
    "net_beta",
    "rails",
    "reduce_bw",
];

impl CostModel {
    /// Defaults for CPUs over TCP: shared memory α = 1 µs, β = 5 GB/s; network α = 30 µs,
    /// β = 1.2 GB/s per rail (10 GbE-class), 1 rail; reductions at 8 GB/s.
    pub fn default_cpu() -> CostModel {
        CostModel {
            local: LinkCost {
                alpha: 1e-6,
                beta: 5e9,
            },
            net: LinkCost {
                alpha: 30e-6,
                beta: 1.2e9,
            },
            rails: 1,
            reduce_bw: 8e9,
        }
    }

    /// Overrides one field by name (see [`COST_KEYS`]): `local_alpha` / `net_alpha` in seconds
    /// (≥ 0), `local_beta` / `net_beta` / `reduce_bw` in bytes per second (> 0), `rails` (a whole number, 1 to [`MAX_RAILS`]).
    pub fn set(&mut self, key: &str, value: f64) -> Result<(), String> {
        if !value.is_finite() || value < 0.0 {
            return Err(format!(
                "cost {key} = {value}: must be a finite number >= 0"
            ));
        }
        let positive = |v: f64| {
            if v > 0.0 {
                Ok(v)
            } else {
                Err(format!("cost {key} = {value}: must be > 0"))
            }
        };
        match key {
            "local_alpha" => self.local.alpha = value,
            "net_alpha" => self.net.alpha = value,
            "local_beta" => self.local.beta = positive(value)?,
            "net_beta" => self.net.beta = positive(value)?,
            "reduce_bw" => self.reduce_bw = positive(value)?,
            "rails" => {
                if value.fract() != 0.0 || !(1.0..=MAX_RAILS as f64).contains(&value) {
                    return Err(format!(
                        "cost rails = {value}: expected a whole number of rails from 1 to {MAX_RAILS}"
                    ));
                }
                self.rails = value as usize
            }
            _ => {
                return Err(format!(
                    "unknown cost parameter '{key}' (expected one of {})",
                    COST_KEYS.join(", ")
                ))
            }
        }
        Ok(())
    }

    fn rank_view<'a>(&'a self, plan: &Plan, nodes: &'a NodeMap, dtype_size: usize) -> RankView<'a> {
        let home = nodes.node_of(plan.rank);
        let node_size = home.map_or(1, |k| nodes.sizes[k]);
        let sharers = match plan.algo {
            Algo::TwoLevel | Algo::RecursiveDoubling | Algo::Pairwise | Algo::Bruck => node_size,
            Algo::Ring | Algo::Tree => 1,
        };
        let share = sharers.div_ceil(self.rails.max(1)).max(1) as f64;
        RankView {
            model: self,
            nodes,
            rank: plan.rank,
            home,
            net: LinkCost {
                alpha: self.net.alpha,
                beta: self.net.beta / share,
            },
            ds: dtype_size as f64,
        }
    }

    /// Seconds rank `rank` spends on an in-node step (`NodeReduceScatter`, `NodeAllGather`) or a
    /// `Copy`, as [`CostModel::price`] counts it; `None` for an `Exchange` (priced per link).
    /// The fabric model ([`crate::fabric`]) prices in-node steps through this.
    pub fn local_step_time(&self, step: &Step, rank: usize, dtype_size: usize) -> Option<f64> {
        let m = self;
        let ds = dtype_size as f64;
        match step {
            Step::Exchange { .. } => None,
            Step::NodeReduceScatter { group, slices } => {
                let others = group.len().saturating_sub(1) as f64;
                let largest = slices.iter().map(|s| s.len).max().unwrap_or(0);
                let b = others * largest as f64 * ds;
                Some(if b > 0.0 {
                    node_sync(m, group.len()) + b / m.local.beta + b / m.reduce_bw
                } else {
                    0.0
                })
            }
            Step::NodeAllGather { group, slices } => {
                let mine = group.iter().position(|&g| g == rank);
                let b: f64 = slices
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| Some(*i) != mine)
                    .map(|(_, s)| s.len as f64 * ds)
                    .sum();
                Some(if b > 0.0 {
                    node_sync(m, group.len()) + b / m.local.beta
                } else {
                    0.0
                })
            }
            Step::NodeBroadcast { group, region, .. } => {
                // the root copies chunk c+1 in while the others copy chunk c out: one pass
                let b = region.len as f64 * ds;
                Some(if b > 0.0 && group.len() > 1 {
                    node_sync(m, group.len()) + b / m.local.beta
                } else {
                    0.0
                })
            }
            Step::NodeAllToAll { group, blocks, .. } => {
                // every block for a peer copied into the slot once, and out once by the peer
                let mine = group.iter().position(|&g| g == rank);
                let b: f64 = blocks
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| Some(*i) != mine)
                    .map(|(_, s)| s.len as f64 * ds)
                    .sum();
                let own = mine
                    .and_then(|i| blocks.get(i))
                    .map_or(0.0, |s| s.len as f64);
                Some(if b > 0.0 {
                    node_sync(m, group.len()) + (2.0 * b + own * ds) / m.local.beta
                } else {
                    own * ds / m.local.beta
                })
            }
            Step::Copy { src, .. } => Some(src.len as f64 * ds / m.local.beta),
        }
    }

    /// Seconds one rank spends on `plan` if it never waited for anyone (its steps in sequence).
    /// A lower bound of the call's time; [`CostModel::simulate`] adds the waiting.
    pub fn price(&self, plan: &Plan, layout: &Layout, dtype_size: usize) -> f64 {
        let nodes = NodeMap::new(layout);
        let v = self.rank_view(plan, &nodes, dtype_size);
        plan.steps.iter().map(|s| v.step(s)).sum()
    }

    /// Seconds the whole call takes: a timed run of every rank's plan with the execution model
    /// of [`crate::check`](mod@crate::check) (a transfer starts when both its send and its
    /// receive are posted, a step ends when its send has been delivered and its receive has
    /// arrived and been combined; node steps start when the last member arrives). The critical
    /// path, so a ring over a 1-element buffer pays its 2(n-1) hops even though each rank only
    /// moves data in a few of them. Plans that stall (deadlock) cost infinity.
    pub fn simulate(&self, plans: &[Plan], layout: &Layout, dtype_size: usize) -> f64 {
        let n = plans.len();
        let nodes = NodeMap::new(layout);
        let views: Vec<RankView> = plans
            .iter()
            .map(|p| self.rank_view(p, &nodes, dtype_size))
            .collect();
        let mut t = vec![0.0f64; n];
        let mut pc = vec![0usize; n];
        let mut st = vec![TimedState::default(); n];
        let mut queues: HashMap<(usize, usize, usize), VecDeque<TimedMsg>> = HashMap::new();
        let mut seqs: HashMap<(usize, usize, usize), u64> = HashMap::new();
        let mut delivered: HashMap<((usize, usize, usize), u64), f64> = HashMap::new();
        let live = |x: &Option<Xfer>| x.filter(|x| x.region.len > 0);
        loop {
            let mut progress = false;
            for r in 0..n {
                while let Some(step) = plans[r].steps.get(pc[r]) {
                    let mut moved = false;
                    match step {
                        Step::Copy { .. } => {
                            t[r] += views[r].step(step);
                            pc[r] += 1;
                            moved = true;
                        }
                        Step::Exchange { send, recv, reduce } => {
                            let (send, recv) = (live(send), live(recv));
                            if !st[r].posted {
                                st[r].posted = true;
                                moved = true;
                                if let Some(x) = send {
                                    let key = (r, x.peer, x.chan);
                                    let seq = seqs.entry(key).or_insert(0);
                                    st[r].send = Some((key, *seq));
                                    queues.entry(key).or_default().push_back(TimedMsg {
                                        posted: t[r],
                                        seq: *seq,
                                        time: views[r].link(x.peer).time(views[r].bytes(&x)),
                                    });
                                    *seq += 1;
                                }
                            }
                            if let (Some(x), None) = (recv, st[r].recv) {
                                let key = (x.peer, r, x.chan);
                                if let Some(m) = queues.get_mut(&key).and_then(|q| q.pop_front()) {
                                    let done = m.posted.max(t[r]) + m.time;
                                    delivered.insert((key, m.seq), done);
                                    let combine = if *reduce {
                                        views[r].bytes(&x) / self.reduce_bw
                                    } else {
                                        0.0
                                    };
                                    st[r].recv = Some(done + combine);
                                    moved = true;
                                }
                            }
                            let sent = match st[r].send {
                                None => Some(t[r]),
                                Some(k) => delivered.get(&k).copied(),
                            };
                            let got = if recv.is_some() {
                                st[r].recv
                            } else {
                                Some(t[r])
                            };
                            if let (Some(a), Some(b)) = (sent, got) {
                                if let Some(k) = st[r].send {
                                    delivered.remove(&k);
                                }
                                t[r] = t[r].max(a).max(b);
                                st[r] = TimedState::default();
                                pc[r] += 1;
                                moved = true;
                            }
                        }
                        Step::NodeReduceScatter { .. }
                        | Step::NodeAllGather { .. }
                        | Step::NodeBroadcast { .. }
                        | Step::NodeAllToAll { .. } => {
                            let group = step.node_group().unwrap_or(&[]);
                            let ready = group.iter().all(|&m| {
                                m < n
                                    && plans[m]
                                        .steps
                                        .get(pc[m])
                                        .is_some_and(|s| s.node_group().is_some())
                            });
                            if ready {
                                let start = group.iter().map(|&m| t[m]).fold(0.0, f64::max);
                                let dur = group
                                    .iter()
                                    .map(|&m| views[m].step(&plans[m].steps[pc[m]]))
                                    .fold(0.0, f64::max);
                                for &m in group {
                                    t[m] = start + dur;
                                    pc[m] += 1;
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
        if (0..n).any(|r| pc[r] < plans[r].steps.len()) {
            return f64::INFINITY;
        }
        t.into_iter().fold(0.0, f64::max)
    }

    /// Seconds the call takes with `algo` ([`CostModel::simulate`] over every rank's plan; above
    /// [`SIMULATE_MAX_RANKS`] ranks, the largest [`CostModel::price`] of a sample of ranks: the
    /// first two in node-major order, the first and last of every node, and the root).
    pub fn price_call(
        &self,
        kind: CollKind,
        algo: Algo,
        layout: &Layout,
        count: usize,
        dtype_size: usize,
        root: usize,
    ) -> Result<f64, PlanError> {
        let n = validate_layout(layout)?;
        if n <= SIMULATE_MAX_RANKS {
            let plans = (0..n)
                .map(|r| build_plan(kind, algo, layout, r, count, root))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(self.simulate(&plans, layout, dtype_size));
        }
        let mut worst: f64 = 0.0;
        for r in sampled_ranks(layout, n, root) {
            let plan = build_plan(kind, algo, layout, r, count, root)?;
            worst = worst.max(self.price(&plan, layout, dtype_size));
        }
        Ok(worst)
    }

    /// Seconds per call of back-to-back calls: the busiest rank's busiest direction — its sends,
    /// or its receives and their reductions, each summed over the plan (links are full duplex:
    /// the next call's receive overlaps this call's send), waiting excluded. In a rooted call
    /// only the root waits for the result (a broadcast's root, a reduce's other ranks, are done
    /// once their data is out), so consecutive calls overlap and this, not the critical path, is
    /// their pace.
    pub fn stream_price(
        &self,
        kind: CollKind,
        algo: Algo,
        layout: &Layout,
        count: usize,
        dtype_size: usize,
        root: usize,
    ) -> Result<f64, PlanError> {
        let n = validate_layout(layout)?;
        let ranks: Vec<usize> = if n <= SIMULATE_MAX_RANKS {
            (0..n).collect()
        } else {
            sampled_ranks(layout, n, root)
        };
        let nodes = NodeMap::new(layout);
        let mut worst: f64 = 0.0;
        for r in ranks {
            let plan = build_plan(kind, algo, layout, r, count, root)?;
            worst = worst.max(self.rank_view(&plan, &nodes, dtype_size).pace(&plan.steps));
        }
        Ok(worst)
    }

    /// Picks the cheapest algorithm for the call, with the reason (every candidate's price).
    /// Ties go to the earlier candidate of [`algorithms_for`]. Barrier is priced as an all-reduce
    /// of `max(count, 1)` elements. send_recv has no plan: `Ring` is returned with a reason
    /// saying so.
    ///
    /// Rooted calls (broadcast, reduce) are chosen for calls that follow each other: among the
    /// algorithms whose single call takes at most [`ROOTED_SLACK`] x the quickest one's, the one
    /// with the least [`Self::stream_price`], when that is below [`ROOTED_GAIN`] x the quickest
    /// one's (e.g. 4 nodes, reduce of 4 KiB: the chain, whose root takes one message's bytes a
    /// call, not the tree, whose root takes two, though the tree's single call is quicker; at 8
    /// bytes, where per-message work rules, the tree). The bound keeps a 63-hop chain from a
    /// small call on 64 nodes.
    pub fn choose(
        &self,
        kind: CollKind,
        layout: &Layout,
        count: usize,
        dtype_size: usize,
        root: usize,
    ) -> (Algo, String) {
        let cands = algorithms_for(kind);
        if cands.is_empty() {
            return (
                Algo::Ring,
                format!("{kind} is point-to-point: no plan to choose"),
            );
        }
        let fallback = if cands.contains(&Algo::Ring) {
            Algo::Ring
        } else {
            cands[0]
        };
        let n = match validate_layout(layout) {
            Ok(n) => n,
            Err(e) => return (fallback, format!("{kind}: {e}; using {fallback}")),
        };
        let root = if root < n { root } else { 0 };
        let mut best: Option<(Algo, f64)> = None;
        let mut parts = Vec::new();
        let mut priced: Vec<(Algo, f64)> = Vec::new();
        for &algo in cands {
            match self.price_call(kind, algo, layout, count, dtype_size, root) {
                Ok(t) => {
                    parts.push(format!("{algo} {}", fmt_time(t)));
                    priced.push((algo, t));
                    if best.is_none() || best.is_some_and(|(_, b)| t < b) {
                        best = Some((algo, t));
                    }
                }
                Err(e) => parts.push(format!("{algo} n/a ({e})")),
            }
        }
        let mut algo = best.map_or(fallback, |b| b.0);
        let mut how = String::new();
        if let (Some((_, quickest)), CollKind::Reduce | CollKind::Broadcast) = (best, kind) {
            let mut paced: Option<(Algo, f64)> = None;
            let mut own: Option<f64> = None;
            let mut paces = Vec::new();
            for &(a, t) in &priced {
                if t > ROOTED_SLACK * quickest {
                    continue;
                }
                if let Ok(p) = self.stream_price(kind, a, layout, count, dtype_size, root) {
                    paces.push(format!("{a} {}", fmt_time(p)));
                    if a == algo {
                        own = Some(p);
                    }
                    if paced.is_none_or(|(_, b)| p < b) {
                        paced = Some((a, p));
                    }
                }
            }
            // only a clear gain back to back leaves the quickest single call
            if let (Some((a, p)), Some(o)) = (paced, own) {
                if p < ROOTED_GAIN * o {
                    algo = a;
                }
            }
            how = format!(
                "; back to back, per call (single call within {ROOTED_SLACK}x the quickest): {}",
                paces.join(", ")
            );
        }
        let reason = format!(
            "{kind} of {count} x {dtype_size} B on {n} ranks / {} nodes: {}{how} -> {algo}",
            layout.nodes.len(),
            parts.join(", ")
        );
        (algo, reason)
    }
}

/// The share of a network receive's latency that counts as per-message work in a stream of
/// calls ([`CostModel::stream_price`]) on a rank alone on its node. A send is a system call per
/// message; a receiver that was busy finds the messages that arrived meanwhile queued and takes
/// them in one read (the forwarding rank of a 4-host small reduce made a third as many reads
/// as sends), and their latency overlaps its work on the previous call. Priced whole, a 4-host
/// small broadcast's tree (root: two sends a call) and chain (one send, one receive) tied and
/// the tree ran; back to back on the emulated cluster, 8 B-512 B, µs a call over 3 launches:
/// the chain 14-21, the tree 25-39, Open MPI 25-39. Where node-mates share the node's CPUs
/// receives count whole: with the share, 4 hosts x 2 ranks moved from the tree to the two-level
/// broadcast, which ran slower (46-87 µs against 44-65).
pub const RECV_PACE_SHARE: f64 = 0.25;

/// How much slower than the quickest single call a rooted call's algorithm may be and still be
/// chosen for its pace back to back ([`CostModel::choose`]).
pub const ROOTED_SLACK: f64 = 2.0;
/// A rooted call leaves the quickest single call's algorithm only for one whose pace back to
/// back is below this fraction of its own ([`CostModel::choose`]).
pub const ROOTED_GAIN: f64 = 0.8;

/// The ranks a large call is priced by: the first two in node-major order, the first and last
/// of every node, and the root.
fn sampled_ranks(layout: &Layout, n: usize, root: usize) -> Vec<usize> {
    let order: Vec<usize> = layout.nodes.iter().flatten().copied().collect();
    let mut v = vec![order[0], order[1], root.min(n - 1)];
    for node in &layout.nodes {
        v.extend(node.first());
        v.extend(node.last());
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Above this many ranks, [`CostModel::price_call`] prices a sample of ranks instead of
/// simulating the whole call.
pub const SIMULATE_MAX_RANKS: usize = 512;

/// One rank's view of the links, for pricing its steps.
/// Node index of every rank, computed once per pricing (`Layout::locate` is a linear search).
struct NodeMap {
    node: Vec<usize>,
    sizes: Vec<usize>,
}

impl NodeMap {
    fn new(layout: &Layout) -> NodeMap {
        let n = layout.nodes.iter().flatten().max().map_or(0, |&m| m + 1);
        let mut node = vec![usize::MAX; n];
        for (k, members) in layout.nodes.iter().enumerate() {
            for &r in members {
                node[r] = k;
            }
        }
        NodeMap {
            node,
            sizes: layout.nodes.iter().map(|m| m.len()).collect(),
        }
    }

    fn node_of(&self, rank: usize) -> Option<usize> {
        self.node.get(rank).copied().filter(|&k| k != usize::MAX)
    }
}

struct RankView<'a> {
    model: &'a CostModel,
    nodes: &'a NodeMap,
    rank: usize,
    home: Option<usize>,
    /// Network link with this rank's share of the rails.
    net: LinkCost,
    ds: f64,
}

impl RankView<'_> {
    /// Whether `peer` is on this rank's node.
    fn local(&self, peer: usize) -> bool {
        self.home.is_some() && self.nodes.node_of(peer) == self.home
    }

    /// Whether this rank's receives count [`RECV_PACE_SHARE`] of their latency back to back:
    /// it is alone on its node, so every receive is a network one.
    fn streams_in(&self) -> bool {
        self.home
            .and_then(|h| self.nodes.sizes.get(h))
            .is_some_and(|&s| s == 1)
    }

    fn link(&self, peer: usize) -> LinkCost {
        if self.local(peer) {
            self.model.local
        } else {
            self.net
        }
    }

    fn bytes(&self, x: &Xfer) -> f64 {
        x.region.len as f64 * self.ds
    }

    /// Seconds a call of back-to-back calls keeps this rank busy: every send's latency (the
    /// per-message work of this rank) and [`RECV_PACE_SHARE`] of every receive's, plus the busier
    /// direction's bytes — sends, or receives and their reductions: a link carries both
    /// directions at once, and the next call's receive overlaps this call's send — with in-node
    /// steps counted whole.
    fn pace(&self, steps: &[Step]) -> f64 {
        let m = self.model;
        let live = |x: &Option<Xfer>| x.filter(|x| x.region.len > 0);
        let (mut fixed, mut out, mut inn) = (0.0, 0.0, 0.0);
        for step in steps {
            match step {
                Step::Exchange { send, recv, reduce } => {
                    if let Some(x) = live(send) {
                        let l = self.link(x.peer);
                        fixed += l.alpha;
                        out += self.bytes(&x) / l.beta;
                    }
                    if let Some(x) = live(recv) {
                        let (l, b) = (self.link(x.peer), self.bytes(&x));
                        fixed += l.alpha
                            * if self.streams_in() {
                                RECV_PACE_SHARE
                            } else {
                                1.0
                            };
                        inn += b / l.beta + if *reduce { b / m.reduce_bw } else { 0.0 };
                    }
                }
                _ => fixed += self.step(step),
            }
        }
        fixed + f64::max(out, inn)
    }

    /// Seconds for one step, ignoring waiting for peers.
    fn step(&self, step: &Step) -> f64 {
        let m = self.model;
        let live = |x: &Option<Xfer>| x.filter(|x| x.region.len > 0);
        match step {
            Step::Exchange { send, recv, reduce } => {
                let ts = live(send).map_or(0.0, |x| self.link(x.peer).time(self.bytes(&x)));
                let tr = live(recv).map_or(0.0, |x| {
                    let b = self.bytes(&x);
                    let combine = if *reduce { b / m.reduce_bw } else { 0.0 };
                    self.link(x.peer).time(b) + combine
                });
                ts.max(tr)
            }
            _ => m
                .local_step_time(step, self.rank, self.ds as usize)
                .unwrap_or(0.0),
        }
    }
}

/// Latency of an in-node collective over `members` ranks: a dissemination barrier's
/// `ceil(log2 members)` shared-memory hops.
fn node_sync(m: &CostModel, members: usize) -> f64 {
    m.local.alpha * members.next_power_of_two().trailing_zeros() as f64
}

#[derive(Clone, Default)]
struct TimedState {
    posted: bool,
    send: Option<((usize, usize, usize), u64)>,
    /// When the receive has arrived and been combined.
    recv: Option<f64>,
}

struct TimedMsg {
    posted: f64,
    seq: u64,
    /// Transfer time on the sender's link.
    time: f64,
}

fn fmt_time(t: f64) -> String {
    if !t.is_finite() {
        "stalls".to_string()
    } else if t < 1e-3 {
        format!("{:.1}us", t * 1e6)
    } else if t < 1.0 {
        format!("{:.3}ms", t * 1e3)
    } else {
        format!("{t:.3}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Region;

    #[test]
    fn defaults_and_overrides() {
        let mut m = CostModel::default();
        assert_eq!(m, CostModel::default_cpu());
        assert_eq!(m.local.alpha, 1e-6);
        assert_eq!(m.net.beta, 1.2e9);
        m.set("net_alpha", 5e-6).unwrap();
        m.set("rails", 2.0).unwrap();
        assert_eq!((m.net.alpha, m.rails), (5e-6, 2));
        assert!(m.set("net_beta", 0.0).is_err());
        assert!(m.set("local_alpha", f64::NAN).is_err());
        assert!(m.set("bogus", 1.0).unwrap_err().contains("net_alpha"));
    }

    #[test]
    fn prices_by_link_class() {
        let m = CostModel::default_cpu();
        let l = Layout::block(4, 2);
        let ex = |peer| Plan {
            kind: CollKind::AllReduce,
            algo: Algo::Ring,
            rank: 0,
            steps: vec![Step::Exchange {
                send: Some(Xfer {
                    peer,
                    region: Region::work(0, 1000),
                    chan: 0,
                }),
                recv: None,
                reduce: false,
            }],
        };
        let local = m.price(&ex(1), &l, 4);
        let net = m.price(&ex(2), &l, 4);
        assert!((local - (1e-6 + 4000.0 / 5e9)).abs() < 1e-12);
        assert!((net - (30e-6 + 4000.0 / 1.2e9)).abs() < 1e-12);
        let empty = Plan {
            steps: vec![],
            ..ex(1)
        };
        assert_eq!(m.price(&empty, &l, 4), 0.0);
    }

    #[test]
    fn small_all_reduce_is_latency_bound() {
        let m = CostModel::default_cpu();
        for l in [
            Layout::block(16, 4),
            Layout::single_node(8),
            Layout::block(6, 4),
        ] {
            let (algo, why) = m.choose(CollKind::AllReduce, &l, 1, 4, 0);
            assert_eq!(algo, Algo::RecursiveDoubling, "{why}");
        }
        let (algo, why) = m.choose(CollKind::Barrier, &Layout::block(16, 4), 0, 1, 0);
        assert_eq!(algo, Algo::RecursiveDoubling, "{why}");
    }

    #[test]
    fn large_all_reduce_is_bandwidth_bound() {
        let m = CostModel::default_cpu();
        let big = 16 << 20;
        for l in [Layout::block(16, 4), Layout::single_node(8)] {
            let (algo, why) = m.choose(CollKind::AllReduce, &l, big, 4, 0);
            assert!(matches!(algo, Algo::TwoLevel | Algo::Ring), "{why}");
            for name in ["two_level", "ring", "recursive_doubling", "tree"] {
                assert!(why.contains(name), "{why}");
            }
        }
        // With several rails the in-node rings use them all.
        let mut m4 = m.clone();
        m4.rails = 4;
        let (algo, why) = m4.choose(CollKind::AllReduce, &Layout::block(16, 4), big, 4, 0);
        assert_eq!(algo, Algo::TwoLevel, "{why}");
        // Non-uniform: two_level is not a candidate.
        let (algo, why) = m.choose(CollKind::AllReduce, &Layout::block(6, 4), big, 4, 0);
        assert_eq!(algo, Algo::Ring, "{why}");
        assert!(why.contains("two_level n/a"), "{why}");
    }

    #[test]
    fn broadcast_choice() {
        let m = CostModel::default_cpu();
        let l = Layout::block(16, 4);
        // small: chosen for its pace back to back, but never at more than ROOTED_SLACK x the
        // quickest single call
        let (algo, why) = m.choose(CollKind::Broadcast, &l, 1, 4, 3);
        let single = |a| m.price_call(CollKind::Broadcast, a, &l, 1, 4, 3).unwrap();
        let quickest = [Algo::Tree, Algo::Ring, Algo::TwoLevel]
            .into_iter()
            .map(single)
            .fold(f64::INFINITY, f64::min);
        assert!(single(algo) <= ROOTED_SLACK * quickest, "{why}");
        assert!(why.contains("back to back"), "{why}");
        // 64 nodes: the flat chain's 63 network hops are far beyond that bound for a small call
        let wide = Layout::block(64, 1);
        let (algo, why) = m.choose(CollKind::Broadcast, &wide, 1, 4, 0);
        assert_ne!(algo, Algo::Ring, "{why}");
        // 4 nodes of one rank on 500 Mbit/s rails (the emulated cluster's), 4 KiB: the tree's
        // single call is quicker, but its root moves two messages' bytes a call where the
        // chain's moves one: back to back, the chain. At 8 bytes, per-message work rules: a
        // broadcast's tree root sends two messages a call where a chain's ranks send one and
        // take one in from a stream (RECV_PACE_SHARE): the chain; a reduce's tree root only
        // takes two in, its other ranks send one: the tree.
        let mut slow = m.clone();
        slow.net.beta = 500e6 / 8.0 * 0.956;
        let four = Layout::block(4, 1);
        for kind in [CollKind::Broadcast, CollKind::Reduce] {
            let (algo, why) = slow.choose(kind, &four, 1024, 4, 0);
            assert_ne!(algo, Algo::Tree, "{why}");
        }
        let (algo, why) = slow.choose(CollKind::Broadcast, &four, 2, 4, 0);
        assert_eq!(algo, Algo::Ring, "{why}");
        let (algo, why) = slow.choose(CollKind::Reduce, &four, 2, 4, 0);
        assert_eq!(algo, Algo::Tree, "{why}");
        // large: pipelined (every link busy at once), never the tree's whole-message hops
        let (algo, why) = m.choose(CollKind::Broadcast, &l, 16 << 20, 4, 3);
        assert!(matches!(algo, Algo::Ring | Algo::TwoLevel), "{why}");
        // one node: the fabric
        let (algo, why) = m.choose(CollKind::Broadcast, &Layout::single_node(4), 1 << 20, 4, 1);
        assert_eq!(algo, Algo::TwoLevel, "{why}");
    }

    #[test]
    fn other_kinds() {
        let m = CostModel::default_cpu();
        let l = Layout::block(8, 4);
        // all-to-all: on one node the fabric's one round beats n-1 point-to-point rounds
        let one = Layout::single_node(4);
        let (a, why) = m.choose(CollKind::AllToAll, &one, 10, 4, 0);
        assert_eq!(a, Algo::TwoLevel, "{why}");
        // Two nodes of four: never the flat ring's seven network-bound steps. Small blocks:
        // recursive doubling's log2(8) = 3 rounds (or two-level); large: two-level, which
        // crosses the network once per rail.
        for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
            let (a, why) = m.choose(kind, &l, 10, 4, 0);
            assert!(
                matches!(a, Algo::TwoLevel | Algo::RecursiveDoubling),
                "{kind} x10: {why}"
            );
            let (a, why) = m.choose(kind, &l, 1 << 20, 4, 0);
            assert_eq!(a, Algo::TwoLevel, "{kind} x{}: {why}", 1 << 20);
        }
        // Non-uniform layouts have no two-level plan, 4 ranks do have recursive doubling; 3 ranks
        // on uneven nodes: the ring it is.
        let odd = Layout {
            nodes: vec![vec![0, 1, 2], vec![3]],
        };
        let (a, why) = m.choose(CollKind::AllGather, &odd, 10, 4, 0);
        assert!(matches!(a, Algo::Ring | Algo::RecursiveDoubling), "{why}");
        let odd3 = Layout {
            nodes: vec![vec![0, 1], vec![2]],
        };
        assert_eq!(m.choose(CollKind::AllGather, &odd3, 10, 4, 0).0, Algo::Ring);
        let (a, why) = m.choose(CollKind::Reduce, &l, 10, 4, 7);
        assert!(matches!(a, Algo::Tree | Algo::TwoLevel), "{why}");
        let (a, why) = m.choose(CollKind::Reduce, &l, 1 << 22, 4, 7);
        assert_eq!(a, Algo::TwoLevel, "{why}");
        let (a, why) = m.choose(CollKind::SendRecv, &l, 10, 4, 0);
        assert_eq!(a, Algo::Ring);
        assert!(why.contains("point-to-point"));
        let (a, why) = m.choose(CollKind::AllReduce, &Layout { nodes: vec![] }, 10, 4, 0);
        assert_eq!(a, Algo::Ring);
        assert!(why.contains("invalid layout"), "{why}");
        // Large communicators price a sample of ranks.
        for n in [256, 600] {
            let l = Layout::block(n, 8);
            let (a, why) = m.choose(CollKind::AllReduce, &l, 1 << 20, 4, 0);
            assert!(matches!(a, Algo::TwoLevel | Algo::Ring), "{why}");
        }
    }
}
