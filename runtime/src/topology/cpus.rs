//! The CPU part of a binding ([`BindTo`] and the choice itself): where each local rank sits
//! inside the node (its NUMA node, or with `--map-by core|socket|numa|ppr:N:socket` the core it
//! is mapped to, as Open MPI maps), and the CPU set `--bind-to` gives it (`none`, `hwthread`,
//! `core`, `numa`, `socket`).
//!
//! `RAILRING_MAP_BY` ([`NodeMap`], set by railrun from `--map-by` / `--rank-by`) places ranks
//! without a visible GPU on cores: `core` one rank per core in CPU order; `socket` / `numa`
//! round-robin over sockets / NUMA nodes, each taking its next free core; `socket:fill` /
//! `numa:fill` consecutive local ranks in balanced blocks per object; `ppr:N:socket` /
//! `ppr:N:numa` exactly N per object (more local ranks than N × objects is an error: the node
//! differs from the one railrun counted). A rank with a GPU sits on its GPU's NUMA node.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use std::str::FromStr;

use super::model::Topology;
use super::util::{format_cpulist, intersect};
use super::TopoError;
use crate::vars;

/// `--bind-to` / `RAILRING_BIND_TO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BindTo {
    /// Leave CPU affinity alone.
    None,
    /// The default: `numa`, except where the ranks sharing a NUMA node outnumber its allowed
    /// CPUs and split evenly over its cores — then each rank gets one core (round-robin, as
    /// `core` does). Bound before exec, such ranks run their first thousands of calls faster
    /// than ranks a railring program pins to the same CPUs at start-up (4 ranks on 2 CPUs,
    /// railperf -n 200 -w 60: 256 KiB all-to-all 31.5 µs a call against 28.7, all-reduce 75.9
    /// against 69.8; equal over 20 000 calls). An uneven share (3 ranks on 2 cores) stays on
    /// the NUMA node, where the scheduler can balance a compute phase that a fixed binding
    /// would leave on one core twice.
    #[default]
    Auto,
    /// All allowed CPUs of the NUMA node.
    Numa,
    /// A disjoint share of the NUMA node's cores; with a `--map-by` object mapping
    /// (`RAILRING_MAP_BY`), the one core the rank is mapped to.
    Core,
    /// Every allowed CPU of the socket (package) the rank is on (Open MPI `--bind-to socket`).
    Socket,
    /// One hardware thread (Open MPI `--bind-to hwthread`): the ranks sharing a set take
    /// distinct threads, one per core before a second thread of any core.
    Hwthread,
}

impl FromStr for BindTo {
    type Err = TopoError;
    fn from_str(s: &str) -> Result<Self, TopoError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(BindTo::None),
            "auto" => Ok(BindTo::Auto),
            "numa" => Ok(BindTo::Numa),
            "core" => Ok(BindTo::Core),
            "socket" | "package" => Ok(BindTo::Socket),
            "hwthread" => Ok(BindTo::Hwthread),
            _ => Err(TopoError::BindTo {
                found: s.chars().take(40).collect(),
            }),
        }
    }
}

impl BindTo {
    /// `none`, `auto`, `numa`, `core`, `socket` or `hwthread`: the `--bind-to` /
    /// `RAILRING_BIND_TO` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BindTo::None => "none",
            BindTo::Auto => "auto",
            BindTo::Numa => "numa",
            BindTo::Core => "core",
            BindTo::Socket => "socket",
            BindTo::Hwthread => "hwthread",
        }
    }
}

impl fmt::Display for BindTo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One local rank's CPU choice while it is made: its NUMA node, the core a mapping put it
/// on, and the result.
pub(super) struct CpuPlan {
    pub numa: Option<usize>,
    pub loc: Option<Loc>,
    pub cpus: Vec<usize>,
    pub why: String,
}

/// A kind of object inside a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapObj {
    Core,
    Socket,
    Numa,
}

impl MapObj {
    fn name(self) -> &'static str {
        match self {
            MapObj::Core => "core",
            MapObj::Socket => "socket",
            MapObj::Numa => "NUMA node",
        }
    }
}

/// How local ranks spread over a node's objects (`RAILRING_MAP_BY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMap {
    /// Local rank i on object i mod K (`core`, `socket`, `numa`).
    RoundRobin(MapObj),
    /// Consecutive local ranks in balanced blocks per object (`socket:fill`, `numa:fill`).
    Fill(MapObj),
    /// Exactly N per object, in order (`ppr:N:socket`, `ppr:N:numa`).
    PerObject(usize, MapObj),
}

impl NodeMap {
    /// Parse `core`, `socket`, `package`, `numa`, `socket:fill`, `numa:fill`,
    /// `ppr:N:socket`, `ppr:N:package`, `ppr:N:numa`.
    pub fn parse(s: &str) -> Result<NodeMap, TopoError> {
        let bad = || TopoError::Env {
            var: vars::MAP_BY.into(),
            msg: format!(
                "{:?}: expected core, socket, numa, socket:fill, numa:fill or ppr:N:socket|numa",
                s.chars().take(40).collect::<String>()
            ),
        };
        let t = s.trim().to_ascii_lowercase();
        let obj = |o: &str| match o {
            "core" => Some(MapObj::Core),
            "socket" | "package" => Some(MapObj::Socket),
            "numa" => Some(MapObj::Numa),
            _ => None,
        };
        let parts: Vec<&str> = t.split(':').collect();
        match parts.as_slice() {
            [o] => obj(o).map(NodeMap::RoundRobin).ok_or_else(bad),
            [o, "fill"] => obj(o).map(NodeMap::Fill).ok_or_else(bad),
            ["ppr", n, o] => {
                let n: usize = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(bad)?;
                match obj(o) {
                    Some(o @ (MapObj::Socket | MapObj::Numa)) => Ok(NodeMap::PerObject(n, o)),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for NodeMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = |o: MapObj| match o {
            MapObj::Core => "core",
            MapObj::Socket => "socket",
            MapObj::Numa => "numa",
        };
        match self {
            NodeMap::RoundRobin(x) => f.write_str(o(*x)),
            NodeMap::Fill(x) => write!(f, "{}:fill", o(*x)),
            NodeMap::PerObject(n, x) => write!(f, "ppr:{n}:{}", o(*x)),
        }
    }
}

/// Where a mapped rank sits: its core (threads ∩ allowed) and how many earlier ranks share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Loc {
    pub core: Vec<usize>,
    pub share: usize,
    pub why: String,
}

impl Topology {
    /// The NUMA node holding CPU `c`.
    pub(super) fn numa_of_cpu(&self, c: usize) -> Option<usize> {
        self.numa_nodes
            .iter()
            .find(|n| n.cpus.binary_search(&c).is_ok() || n.cpus.contains(&c))
            .map(|n| n.id)
    }

    /// The socket of a NUMA node (its package; the NUMA node itself when unknown), as a key.
    fn socket_key(&self, numa: usize) -> (bool, usize) {
        match self.numa_node(numa).and_then(|n| n.package) {
            Some(p) => (true, p),
            None => (false, numa),
        }
    }

    /// Every CPU of the socket holding NUMA node `numa`.
    fn socket_cpus(&self, numa: usize) -> Vec<usize> {
        let key = self.socket_key(numa);
        let mut v: Vec<usize> = self
            .numa_nodes
            .iter()
            .filter(|n| self.socket_key(n.id) == key)
            .flat_map(|n| n.cpus.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Place `n` local ranks on cores of `allowed` as `map` says (see the module docs).
    pub(super) fn map_ranks(
        &self,
        n: usize,
        map: NodeMap,
        allowed: &[usize],
    ) -> Result<Vec<Loc>, TopoError> {
        let cores = self.cores_within(allowed);
        if cores.is_empty() {
            return Err(TopoError::Env {
                var: vars::MAP_BY.into(),
                msg: format!("{map}: no allowed CPU is known on this node"),
            });
        }
        let obj = match map {
            NodeMap::RoundRobin(o) | NodeMap::Fill(o) | NodeMap::PerObject(_, o) => o,
        };
        // Cores grouped by object, objects in order of their first core.
        /// An object's key (kind, known, id) and its cores.
        type Group = ((u8, bool, usize), Vec<Vec<usize>>);
        let mut groups: Vec<Group> = Vec::new();
        for (i, c) in cores.iter().enumerate() {
            let numa = self.numa_of_cpu(c[0]);
            let key = match (obj, numa) {
                (MapObj::Core, _) => (0, true, i),
                (MapObj::Numa, Some(m)) => (1, true, m),
                (MapObj::Socket, Some(m)) => {
                    let (known, k) = self.socket_key(m);
                    (2, known, k)
                }
                (_, None) => (3, false, 0),
            };
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(c.clone()),
                None => groups.push((key, vec![c.clone()])),
            }
        }
        let k = groups.len();
        let mut used = vec![0usize; k];
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            let o = match map {
                NodeMap::RoundRobin(_) => r % k,
                NodeMap::Fill(_) => r * k / n.max(1),
                NodeMap::PerObject(per, _) => {
                    let o = r / per;
                    if o >= k {
                        return Err(TopoError::Env {
                            var: vars::MAP_BY.into(),
                            msg: format!(
                                "{map}: {n} local ranks run on this node but it has {k} {}(s), room for {}; the node railrun counted has more: use --map-by ppr:N:node",
                                obj.name(),
                                k * per
                            ),
                        });
                    }
                    o
                }
            };
            let g = &groups[o].1;
            let j = used[o];
            used[o] += 1;
            let core = g[j % g.len()].clone();
            let share = j / g.len();
            let what = match obj {
                MapObj::Core => format!("core {o} of {k}"),
                _ => format!("{} {o} of {k}, its core {j}", obj.name()),
            };
            let why = format!(
                "{what} by {}={map} (CPUs {}){}",
                vars::MAP_BY,
                format_cpulist(&core),
                if share > 0 {
                    format!(", shared: more ranks than its {} core(s)", g.len())
                } else {
                    String::new()
                }
            );
            out.push(Loc { core, share, why });
        }
        Ok(out)
    }

    /// Step 3 of the binding: each plan's CPUs from its NUMA node (or its mapped core) and
    /// `bind_to`, within `allowed`.
    pub(super) fn choose_cpus(
        &self,
        plans: &mut [CpuPlan],
        bind_to: BindTo,
        allowed: &[usize],
        restricted: bool,
    ) {
        let allowed_word = if restricted {
            "allowed CPUs (sched_getaffinity)"
        } else {
            "all CPUs"
        };
        // Base set per rank: NUMA CPUs ∩ allowed (the socket's with --bind-to socket).
        let mut bases: Vec<Vec<usize>> = Vec::with_capacity(plans.len());
        for p in plans.iter_mut() {
            let (base, why) = match p.numa.and_then(|n| self.numa_node(n)) {
                Some(node) if !node.cpus.is_empty() => {
                    let (set, what) = if bind_to == BindTo::Socket {
                        let key = self.socket_key(node.id);
                        let name = if key.0 {
                            format!("socket {} (NUMA node {})", key.1, node.id)
                        } else {
                            format!("NUMA node {} (socket unknown)", node.id)
                        };
                        (self.socket_cpus(node.id), name)
                    } else {
                        (node.cpus.clone(), format!("NUMA node {}", node.id))
                    };
                    let i = intersect(&set, allowed);
                    if i.is_empty() {
                        (
                            allowed.to_vec(),
                            format!("{what} has none of the {allowed_word}, so all of those"),
                        )
                    } else {
                        (i, format!("{what} ∩ {allowed_word}"))
                    }
                }
                Some(node) => (
                    allowed.to_vec(),
                    format!("CPUs of NUMA node {} unknown: {allowed_word}", node.id),
                ),
                None => (
                    allowed.to_vec(),
                    format!("NUMA node unknown: {allowed_word}"),
                ),
            };
            p.why = why;
            bases.push(base);
        }
        let mode = bind_to.as_str();
        let mut out = vec![Vec::new(); bases.len()];
        // Mapped ranks (RAILRING_MAP_BY): bind to the object holding their core.
        let mut unmapped: Vec<usize> = Vec::new();
        for (r, p) in plans.iter_mut().enumerate() {
            let Some(loc) = p.loc.clone() else {
                unmapped.push(r);
                continue;
            };
            let set = match bind_to {
                BindTo::None => Vec::new(),
                BindTo::Core => loc.core.clone(),
                BindTo::Hwthread => vec![loc.core[loc.share % loc.core.len()]],
                BindTo::Auto | BindTo::Numa | BindTo::Socket => bases[r].clone(),
            };
            p.why = match bind_to {
                BindTo::None => "bind-to none: CPU affinity left unchanged".to_string(),
                BindTo::Core | BindTo::Hwthread => format!("CPUs: {} (bind-to {mode})", loc.why),
                _ => format!("CPUs: {} of the rank {} (bind-to {mode})", p.why, loc.why),
            };
            out[r] = set;
        }
        // the unmapped ranks grouped by their base set (`auto`, `core`, `hwthread` share it out)
        let mut groups: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for &r in &unmapped {
            groups.entry(bases[r].clone()).or_default().push(r);
        }
        match bind_to {
            BindTo::None => {
                for &r in &unmapped {
                    plans[r].why = "bind-to none: CPU affinity left unchanged".to_string();
                }
            }
            BindTo::Numa | BindTo::Socket => {
                for &r in &unmapped {
                    plans[r].why = format!("CPUs: {} (bind-to {mode})", plans[r].why);
                    out[r] = bases[r].clone();
                }
            }
            BindTo::Auto => {
                // numa, but ranks that outnumber their set's CPUs and split evenly over its
                // cores take one core each (see [`BindTo::Auto`])
                for (base, ranks) in groups {
                    let cores = self.cores_within(&base);
                    let (k, n) = (ranks.len(), cores.len());
                    let even = n > 0 && k > base.len() && k % n == 0;
                    for (j, &r) in ranks.iter().enumerate() {
                        if even {
                            let c = j % n;
                            plans[r].why = format!(
                                "CPUs: core {c} of {n} of {}: {k} local ranks outnumber its {} CPU(s), {} per core (bind-to auto; numa keeps them all)",
                                plans[r].why,
                                base.len(),
                                k / n
                            );
                            out[r] = cores[c].clone();
                        } else {
                            plans[r].why = format!("CPUs: {} (bind-to auto: numa)", plans[r].why);
                            out[r] = bases[r].clone();
                        }
                    }
                }
            }
            BindTo::Core | BindTo::Hwthread => {
                for (base, ranks) in groups {
                    let units = if bind_to == BindTo::Core {
                        self.cores_within(&base)
                    } else {
                        self.threads_within(&base)
                    };
                    let unit = if bind_to == BindTo::Core {
                        "core"
                    } else {
                        "hardware thread"
                    };
                    let k = ranks.len();
                    for (j, &r) in ranks.iter().enumerate() {
                        let (set, why) = if units.is_empty() {
                            (Vec::new(), "no CPU known".to_string())
                        } else if bind_to == BindTo::Hwthread {
                            let c = j % units.len();
                            let shared = if k > units.len() {
                                format!(", shared: more local ranks ({k}) than threads")
                            } else {
                                String::new()
                            };
                            (
                                units[c].clone(),
                                format!(
                                    "{unit} {c} of {} (one per core first){shared}",
                                    units.len()
                                ),
                            )
                        } else if units.len() >= k {
                            let (s, e) = (j * units.len() / k, (j + 1) * units.len() / k);
                            (
                                units[s..e].concat(),
                                format!(
                                    "cores {}..{} of {} (split over {k} local rank(s))",
                                    s,
                                    e - 1,
                                    units.len()
                                ),
                            )
                        } else {
                            let c = j % units.len();
                            (
                                units[c].clone(),
                                format!(
                                    "core {c} of {}, shared: more local ranks ({k}) than cores",
                                    units.len()
                                ),
                            )
                        };
                        let mut set = set;
                        set.sort_unstable();
                        plans[r].why =
                            format!("CPUs: {} of {} (bind-to {mode})", why, plans[r].why);
                        out[r] = set;
                    }
                }
            }
        }
        for (p, s) in plans.iter_mut().zip(out) {
            if !s.is_empty() {
                p.why = format!("{} = {}", p.why, format_cpulist(&s));
            }
            p.cpus = s;
        }
    }

    /// The cores (hyper-thread groups) inside `set`, in CPU order; CPUs no
    /// known core covers count as a core each.
    pub(super) fn cores_within(&self, set: &[usize]) -> Vec<Vec<usize>> {
        let mut covered: Vec<usize> = Vec::new();
        let mut cores: Vec<Vec<usize>> = Vec::new();
        for c in &self.cores {
            let i = intersect(c, set);
            if !i.is_empty() && !i.iter().any(|x| covered.contains(x)) {
                covered.extend(&i);
                cores.push(i);
            }
        }
        covered.sort_unstable();
        for &c in set {
            if covered.binary_search(&c).is_err() {
                cores.push(vec![c]);
            }
        }
        cores.sort_by_key(|c| c.first().copied());
        cores
    }

    /// The hardware threads inside `set`, one per core first (the first thread of every
    /// core, then the second threads, ...), each as a one-CPU set.
    fn threads_within(&self, set: &[usize]) -> Vec<Vec<usize>> {
        let cores = self.cores_within(set);
        let most = cores.iter().map(Vec::len).max().unwrap_or(0);
        let mut out = Vec::new();
        for t in 0..most {
            for c in &cores {
                if let Some(&x) = c.get(t) {
                    out.push(vec![x]);
                }
            }
        }
        out
    }
}
