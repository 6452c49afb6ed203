//! The fabric cost model: the plans' rounds ([`super::schedule`]) priced on the fabric's links.
//!
//! It is [`crate::cost`]'s model with the network replaced by the fabric:
//! - a transfer between ranks of one node costs `α + bytes / β` of the in-node link; a transfer
//!   between nodes goes NIC → leaf (→ spine (→ core → spine) → leaf) → NIC on the NIC of its
//!   connecting (lower) rank's rail at both ends, as the runtime's TCP links do, and costs
//!   `nic latency + switches × hop latency + bytes / rate`, where the rate is the flow's share
//!   of its most loaded link: `link rate × efficiency / flows on that link in this round`;
//! - a received transfer that is combined adds `bytes / reduce_bw`; in-node steps and copies
//!   cost what [`CostModel::local_step_time`] says (the in-node link as `local`);
//! - a round lasts as long as its slowest transfer or in-node step (the others wait for it at
//!   their next step), and a call is the sum of its rounds;
//! - every transfer of a call is priced at the call's largest transfer (ring chunks differ by at
//!   most one element; the round waits for the largest).
//!
//! The rounds and the census (flows per link, each flow's latency and rate) depend only on the
//! plans' shape, not on the size, so they are computed once per (collective, algorithm) and
//! reused for every size; per size only the largest transfer and the in-node steps are read
//! from the plans built at that size.

use super::route::{flow_key, LinkClass, Routes};
use super::schedule::{rotation, shape_count, Round, RoundLocal, RoundXfer, Schedule};
use super::{Fabric, FabricError};
use crate::build::Planner;
use crate::cost::{CostModel, LinkCost};
use crate::fx::FxMap;
use crate::plan::{Algo, CollKind, Layout, Plan, Step};
use std::collections::HashMap;
use std::rc::Rc;

/// Where a call's time goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Transfers between ranks of one node.
    InNode,
    /// A fabric link class.
    Link(LinkClass),
    /// In-node collective steps and copies.
    NodeStep,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::InNode => "in-node link",
            Tier::Link(c) => c.name(),
            Tier::NodeStep => "in-node steps",
        }
    }
}

/// The bottleneck of a call: the link class of the slowest transfer in the rounds that take most
/// of the time, how many flows share that link, and what ECMP did there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bottleneck {
    pub tier: Tier,
    /// Flows sharing the bottleneck link in those rounds.
    pub flows: u32,
    /// Equal-cost links the switch could spread them over (1: no choice).
    pub ecmp_width: u32,
    /// In those rounds: uplinks carrying more flows than an even spread would put on them.
    pub ecmp_overloaded: u32,
    /// In those rounds: the most flows on one uplink, and what an even spread would give.
    pub ecmp_max: u32,
    pub ecmp_even: u32,
    /// The latency terms outweigh the bytes.
    pub latency_bound: bool,
    /// Fraction of the call's time spent in those rounds.
    pub share: f64,
}

/// The predicted time of one call with one algorithm.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub algo: Algo,
    /// Seconds.
    pub time: f64,
    pub rounds: usize,
    /// The largest transfer, bytes.
    pub transfer: f64,
    pub bottleneck: Option<Bottleneck>,
    /// The rotation classes used (ranks simulated): 1 or the node size when the plans'
    /// symmetry was used, the rank count otherwise.
    pub rho: usize,
}

/// One candidate for a round's slowest transfer: `alpha + bytes * slope` seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Line {
    alpha: f64,
    slope: f64,
    tier: Tier,
    flows: u32,
    width: u32,
}

/// What the census of one round's transfers found.
#[derive(Clone, Debug, Default)]
struct Census {
    /// The upper envelope of the flows' times (dominated lines removed).
    lines: Vec<Line>,
    ecmp_overloaded: u32,
    ecmp_max: u32,
    ecmp_even: u32,
}

impl Census {
    fn at(&self, bytes: f64) -> (f64, Option<&Line>) {
        let mut best: Option<(f64, &Line)> = None;
        for l in &self.lines {
            let v = l.alpha + bytes * l.slope;
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, l));
            }
        }
        best.map_or((0.0, None), |(v, l)| (v, Some(l)))
    }
}

/// The rounds of one (collective, algorithm, shape) with each round's census.
struct Structure {
    rho: usize,
    /// Number of rounds.
    len: usize,
    /// Rounds with transfers only: (census id, how many rounds have it).
    plain: Vec<(usize, usize)>,
    /// Rounds with in-node steps or copies: the census id of their transfers (if any) and the
    /// local steps.
    mixed: Vec<(Option<usize>, Vec<RoundLocal>)>,
    censuses: Vec<Census>,
}

/// Prices calls on one fabric; caches the rounds and censuses between sizes.
pub struct FabricPlanner<'f> {
    fabric: &'f Fabric,
    routes: Routes,
    model: CostModel,
    ranks: usize,
    layout: Rc<Layout>,
    /// Rotation symmetry on (the fast path) or off (every rank simulated: the brute force).
    symmetric: bool,
    cache: HashMap<(CollKind, Algo, usize, usize), Rc<Structure>>,
    /// Scratch: flows per link in the round being counted.
    load: Vec<u32>,
}

impl<'f> FabricPlanner<'f> {
    /// A planner for `ranks` ranks (at most the fabric's) placed `ranks_per_node` per node.
    /// `symmetric`: use the plans' rotation symmetry (false: run every rank, for tests).
    pub fn new(
        fabric: &'f Fabric,
        ranks: usize,
        symmetric: bool,
    ) -> Result<FabricPlanner<'f>, FabricError> {
        fabric.validate()?;
        if ranks == 0 || ranks > fabric.ranks() {
            return Err(FabricError(format!(
                "{ranks} ranks: the fabric has room for 1 to {} ranks",
                fabric.ranks()
            )));
        }
        let routes = Routes::new(fabric);
        let model = CostModel {
            local: LinkCost {
                alpha: fabric.node_link.latency,
                beta: fabric.node_link.bw,
            },
            net: LinkCost {
                alpha: fabric.nic.latency,
                beta: fabric.nic.bw * fabric.efficiency,
            },
            rails: fabric.nics,
            reduce_bw: fabric.reduce_bw,
        };
        let load = vec![0u32; routes.len()];
        Ok(FabricPlanner {
            fabric,
            routes,
            model,
            ranks,
            layout: Rc::new(fabric.layout(ranks)),
            symmetric,
            cache: HashMap::new(),
            load,
        })
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The time of one call of `count` elements of `dtype_size` bytes with `algo`.
    pub fn predict(
        &mut self,
        kind: CollKind,
        algo: Algo,
        count: usize,
        dtype_size: usize,
        root: usize,
    ) -> Result<Prediction, String> {
        let n = self.ranks;
        let root = root.min(n - 1);
        let layout = self.layout.clone();
        let planner = Planner::new(&layout).map_err(|e| e.to_string())?;
        let cc = shape_count(kind, algo, count, n);
        let rho = if self.symmetric {
            rotation(kind, algo, &self.layout)
        } else {
            n
        };
        // the plans exist at this size (two_level on a non-uniform layout does not)
        planner
            .plan(kind, algo, 0, count, root)
            .map_err(|e| e.to_string())?;
        let empty = Prediction {
            algo,
            time: 0.0,
            rounds: 0,
            transfer: 0.0,
            bottleneck: None,
            rho,
        };
        if cc == 0 {
            return Ok(empty);
        }
        let s = self.structure(&planner, kind, algo, cc, root, rho)?;
        // The plans at this size: the representatives', for the largest transfer and the
        // in-node steps (whole-buffer algorithms: any rank's transfer is the largest).
        let mut sample: Vec<usize> = if rho < n || n <= 64 || !self.symmetric {
            (0..rho).collect()
        } else {
            vec![0, 1.min(n - 1), n - 1]
        };
        sample.push(root);
        for (_, locals) in &s.mixed {
            sample.extend(locals.iter().map(|l| l.rank as usize));
        }
        sample.sort_unstable();
        sample.dedup();
        let mut real: HashMap<usize, Plan> = HashMap::new();
        let mut largest = 0usize;
        for &r in &sample {
            let p = planner
                .plan(kind, algo, r, count, root)
                .map_err(|e| e.to_string())?;
            for st in &p.steps {
                if let Step::Exchange { send, recv, .. } = st {
                    for x in send.iter().chain(recv.iter()) {
                        largest = largest.max(x.region.len);
                    }
                }
            }
            real.insert(r, p);
        }
        let bytes = (largest * dtype_size) as f64;
        let mut locals_of: HashMap<usize, Vec<&Step>> = HashMap::new();
        for (&r, p) in &real {
            locals_of.insert(
                r,
                p.steps
                    .iter()
                    .filter(|s| !matches!(s, Step::Exchange { .. }))
                    .collect(),
            );
        }
        let mut time = 0.0;
        let mut per_census = vec![0.0f64; s.censuses.len()];
        for &(c, k) in &s.plain {
            let tr = s.censuses[c].at(bytes).0 * k as f64;
            time += tr;
            per_census[c] += tr;
        }
        let mut local_time = 0.0;
        for (cid, locals) in &s.mixed {
            let (tx, _) = cid.map_or((0.0, None), |c| s.censuses[c].at(bytes));
            let mut tl = 0.0f64;
            for l in locals {
                let step = locals_of
                    .get(&(l.rank as usize))
                    .and_then(|v| v.get(l.index as usize))
                    .ok_or_else(|| {
                        format!(
                            "rank {}: the plan at {count} elements has fewer in-node steps than its shape",
                            l.rank
                        )
                    })?;
                tl = tl.max(
                    self.model
                        .local_step_time(step, l.rank as usize, dtype_size)
                        .unwrap_or(0.0),
                );
            }
            let tr = tx.max(tl);
            time += tr;
            if tl > tx {
                local_time += tr;
            } else if let Some(c) = cid {
                per_census[*c] += tr;
            }
        }
        let mut bottleneck = None;
        if time > 0.0 {
            let (best, best_t) =
                per_census
                    .iter()
                    .enumerate()
                    .fold(
                        (None, 0.0),
                        |(b, bt), (i, &t)| {
                            if t > bt {
                                (Some(i), t)
                            } else {
                                (b, bt)
                            }
                        },
                    );
            if local_time >= best_t {
                bottleneck = Some(Bottleneck {
                    tier: Tier::NodeStep,
                    flows: 0,
                    ecmp_width: 1,
                    ecmp_overloaded: 0,
                    ecmp_max: 0,
                    ecmp_even: 0,
                    latency_bound: false,
                    share: local_time / time,
                });
            } else if let Some(c) = best {
                let cen = &s.censuses[c];
                if let (_, Some(l)) = cen.at(bytes) {
                    bottleneck = Some(Bottleneck {
                        tier: l.tier,
                        flows: l.flows,
                        ecmp_width: l.width,
                        ecmp_overloaded: cen.ecmp_overloaded,
                        ecmp_max: cen.ecmp_max,
                        ecmp_even: cen.ecmp_even,
                        latency_bound: l.alpha > bytes * l.slope,
                        share: best_t / time,
                    });
                }
            }
        }
        Ok(Prediction {
            algo,
            time,
            rounds: s.len,
            transfer: bytes,
            bottleneck,
            rho: s.rho,
        })
    }

    /// Flows per link in the round that takes most of the time (the bottleneck's round) for a
    /// call with `algo`, as (link id, flows); empty when nothing crosses the fabric.
    pub fn link_loads(
        &mut self,
        kind: CollKind,
        algo: Algo,
        count: usize,
        root: usize,
    ) -> Result<Vec<(u32, u32)>, String> {
        let n = self.ranks;
        let layout = self.layout.clone();
        let planner = Planner::new(&layout).map_err(|e| e.to_string())?;
        let cc = shape_count(kind, algo, count, n);
        if cc == 0 {
            return Ok(Vec::new());
        }
        let rho = if self.symmetric {
            rotation(kind, algo, &self.layout)
        } else {
            n
        };
        let sched = self.schedule(&planner, kind, algo, cc, root.min(n - 1), rho)?;
        // the round with the most transfers crossing the fabric
        let mut best: Vec<(u32, u32)> = Vec::new();
        for round in &sched.rounds {
            let loads = self.count(&round.xfers, rho);
            if loads.iter().map(|x| x.1 as u64).sum::<u64>()
                > best.iter().map(|x| x.1 as u64).sum::<u64>()
            {
                best = loads;
            }
        }
        Ok(best)
    }

    fn schedule(
        &self,
        planner: &Planner,
        kind: CollKind,
        algo: Algo,
        cc: usize,
        root: usize,
        rho: usize,
    ) -> Result<Schedule, String> {
        Schedule::run_with(self.ranks, rho, |r| {
            planner
                .plan(kind, algo, r, cc, root)
                .map_err(|e| e.to_string())
        })
    }

    fn structure(
        &mut self,
        planner: &Planner,
        kind: CollKind,
        algo: Algo,
        cc: usize,
        root: usize,
        rho: usize,
    ) -> Result<Rc<Structure>, String> {
        let key = (kind, algo, cc, if rho == 1 { 0 } else { root });
        if let Some(s) = self.cache.get(&key) {
            return Ok(s.clone());
        }
        let sched = self.schedule(planner, kind, algo, cc, root, rho)?;
        let mut ids: FxMap<Vec<RoundXfer>, usize> = FxMap::default();
        let mut censuses = Vec::new();
        let len = sched.rounds.len();
        let mut plain: Vec<(usize, usize)> = Vec::new();
        let mut plain_at: FxMap<usize, usize> = FxMap::default();
        let mut mixed = Vec::new();
        let mut last: Option<(Vec<RoundXfer>, usize)> = None;
        for Round { xfers, locals } in sched.rounds {
            let cid = if xfers.is_empty() {
                None
            } else if let Some((_, c)) = last.as_ref().filter(|(x, _)| *x == xfers) {
                Some(*c)
            } else if let Some(&c) = ids.get(&xfers) {
                last = Some((xfers, c));
                Some(c)
            } else {
                let c = censuses.len();
                censuses.push(self.census(&xfers, rho));
                ids.insert(xfers.clone(), c);
                last = Some((xfers, c));
                Some(c)
            };
            match (cid, locals.is_empty()) {
                (Some(c), true) => {
                    let i = *plain_at.entry(c).or_insert_with(|| {
                        plain.push((c, 0));
                        plain.len() - 1
                    });
                    plain[i].1 += 1;
                }
                (None, true) => {}
                _ => mixed.push((cid, locals)),
            }
        }
        let s = Rc::new(Structure {
            rho,
            len,
            plain,
            mixed,
            censuses,
        });
        self.cache.insert(key, s.clone());
        Ok(s)
    }

    /// Every flow of a round: (source rank, destination rank, channel, reduce).
    fn flows(
        &self,
        xfers: &[RoundXfer],
        rho: usize,
    ) -> impl Iterator<Item = (usize, usize, usize, bool)> + '_ {
        let n = self.ranks;
        let xs: Vec<RoundXfer> = xfers.to_vec();
        xs.into_iter().flat_map(move |x| {
            (x.src as usize..n)
                .step_by(rho)
                .map(move |m| (m, (m + x.off as usize) % n, x.chan as usize, x.reduce))
        })
    }

    /// The NIC both ends of a flow use: the connecting (lower) rank's rail.
    fn endpoints(&self, src: usize, dst: usize) -> ((usize, usize), (usize, usize)) {
        let f = self.fabric;
        let nic = f.rail_of(src.min(dst));
        ((f.node_of(src), nic), (f.node_of(dst), nic))
    }

    /// Flows per link of a round, as (link, flows), sorted by link.
    fn count(&mut self, xfers: &[RoundXfer], rho: usize) -> Vec<(u32, u32)> {
        let flows: Vec<_> = self.flows(xfers, rho).collect();
        let mut touched = Vec::new();
        for (s, d, ch, _) in flows {
            let (a, b) = self.endpoints(s, d);
            if let Some(p) = self.routes.path(self.fabric, a, b, flow_key(s, d, ch)) {
                for &l in p.links() {
                    if self.load[l as usize] == 0 {
                        touched.push(l);
                    }
                    self.load[l as usize] += 1;
                }
            }
        }
        touched.sort_unstable();
        let out = touched
            .iter()
            .map(|&l| (l, self.load[l as usize]))
            .collect();
        for l in touched {
            self.load[l as usize] = 0;
        }
        out
    }

    /// The census of one round: every flow routed, the links' loads counted, each flow's
    /// latency and rate, the envelope of their times, and what ECMP did to the uplinks.
    fn census(&mut self, xfers: &[RoundXfer], rho: usize) -> Census {
        let f = self.fabric;
        let flows: Vec<_> = self.flows(xfers, rho).collect();
        let mut paths = Vec::with_capacity(flows.len());
        let mut touched = Vec::new();
        for &(s, d, ch, _) in &flows {
            let (a, b) = self.endpoints(s, d);
            let p = self.routes.path(f, a, b, flow_key(s, d, ch));
            if let Some(p) = &p {
                for &l in p.links() {
                    if self.load[l as usize] == 0 {
                        touched.push(l);
                    }
                    self.load[l as usize] += 1;
                }
            }
            paths.push(p);
        }
        let combine = 1.0 / f.reduce_bw;
        let mut seen: HashMap<(u64, u64), Line> = HashMap::new();
        for (&(_, _, _, reduce), p) in flows.iter().zip(&paths) {
            let red = if reduce { combine } else { 0.0 };
            let line = match p {
                None => Line {
                    alpha: f.node_link.latency,
                    slope: 1.0 / f.node_link.bw + red,
                    tier: Tier::InNode,
                    flows: 1,
                    width: 1,
                },
                Some(p) => {
                    // the most loaded link relative to its capacity; ties: the first on the path
                    let mut worst = (f64::INFINITY, p.links[0]);
                    for &l in p.links() {
                        let rate = self.routes.rate(l, self.load[l as usize]);
                        if rate < worst.0 {
                            worst = (rate, l);
                        }
                    }
                    let l = worst.1;
                    Line {
                        alpha: f.nic.latency + p.hops as f64 * f.hop_latency,
                        slope: 1.0 / worst.0 + red,
                        tier: Tier::Link(self.routes.class(l)),
                        flows: self.load[l as usize],
                        width: self.routes.ecmp_width(l) as u32,
                    }
                }
            };
            // equal times from different links: keep one canonical description
            let e = seen
                .entry((line.alpha.to_bits(), line.slope.to_bits()))
                .or_insert(line);
            if (line.tier, line.flows, line.width) > (e.tier, e.flows, e.width) {
                *e = line;
            }
        }
        // ECMP: uplinks loaded above an even spread of their bundle
        let mut bundles: HashMap<(LinkClass, usize), (u32, u32, usize)> = HashMap::new();
        for &l in &touched {
            let class = self.routes.class(l);
            if matches!(class, LinkClass::LeafUp | LinkClass::SpineUp)
                && self.routes.ecmp_width(l) > 1
                && self.fabric.ecmp != super::Ecmp::Ideal
            {
                let e = bundles.entry(self.routes.bundle_of(l)).or_insert((0, 0, 0));
                e.0 += self.load[l as usize];
                e.1 = e.1.max(self.load[l as usize]);
                e.2 = self.routes.ecmp_width(l);
            }
        }
        let mut census = Census::default();
        for &l in &touched {
            let class = self.routes.class(l);
            if let Some(&(sum, _, w)) = bundles.get(&self.routes.bundle_of(l)) {
                if matches!(class, LinkClass::LeafUp | LinkClass::SpineUp) {
                    let even = sum.div_ceil(w as u32);
                    if self.load[l as usize] > even {
                        census.ecmp_overloaded += 1;
                    }
                }
            }
        }
        for &(sum, max, w) in bundles.values() {
            let even = sum.div_ceil(w as u32);
            if max > census.ecmp_max || (max == census.ecmp_max && even > census.ecmp_even) {
                census.ecmp_max = max;
                census.ecmp_even = even;
            }
        }
        for l in touched {
            self.load[l as usize] = 0;
        }
        // keep the upper envelope: drop lines below another in both terms
        let mut lines: Vec<Line> = seen.into_values().collect();
        lines.sort_by(|a, b| {
            b.slope
                .total_cmp(&a.slope)
                .then(b.alpha.total_cmp(&a.alpha))
                .then(b.flows.cmp(&a.flows))
        });
        let mut kept: Vec<Line> = Vec::new();
        for l in lines {
            if !kept
                .iter()
                .any(|k| k.alpha >= l.alpha && k.slope >= l.slope)
            {
                kept.push(l);
            }
        }
        census.lines = kept;
        census
    }
}
