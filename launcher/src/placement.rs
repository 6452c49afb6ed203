//! Rank placement: which host each rank runs on, and its node/local ranks (one concern: the
//! mapping rules, their errors and the `--dry-run` renderings of the result; the tests are most
//! of the file's length).
//!
//! Rules (Open MPI's documented mapping, plus Hydra's `-ppn`):
//!
//! * `--map-by slot` (default): fill each host's slots, in host order, before
//!   the next host. `a slots=2, b slots=2, -np 4` gives `a a b b`.
//! * `--map-by node`: round-robin, one rank per host per pass, skipping hosts
//!   whose slots are full. Same hosts give `a b a b`.
//! * `--map-by ppr:N:node`: N consecutive ranks per host; `-np` may not
//!   exceed N × hosts.
//! * `--map-by ppr:N:socket` / `ppr:N:package` / `ppr:N:numa`: N ranks per socket (NUMA node)
//!   of a host, i.e. `ppr:N×S:node` where S is the host's socket (NUMA node) count; railrun
//!   counts this machine's and the runtime checks every node's at start.
//! * `--map-by core` / `socket` / `numa`: hosts fill slot by slot as with `slot`; inside a
//!   node ranks go one per core / round-robin over sockets / NUMA nodes (the runtime's
//!   binding, `RAILRING_MAP_BY`).
//! * `--map-by seq`: rank i on the host of line i of the hostfile (or item i of `-H`);
//!   slot counts are ignored and `-np` may not exceed the lines.
//! * `--ppn N` (Hydra `-ppn`): N consecutive ranks per host, then the next
//!   host, wrapping around to the first host. Like Hydra it ignores slot
//!   counts; only `max_slots` limits it.
//! * A Hydra hostfile (`host:N` syntax, [`Family::Hydra`]) without `--map-by`: each line
//!   takes its count (1 without one) of consecutive ranks, then the next line, cycling over
//!   the lines until every rank has a host, as Hydra does; slot counts never stop it.
//! * `--rank-by slot|fill` numbers each host's ranks consecutively (host by host);
//!   `--rank-by node|span` deals ranks round-robin over the hosts; `core`, `socket`, `numa`,
//!   `package` and `hwthread` number host by host like `slot` (inside a node they order the
//!   ranks over those objects, `RAILRING_MAP_BY`). Without it, ranks follow the mapping.
//! * Without `-np`: np = total slots (slot/node), or N × hosts (ppr, ppn).
//! * More ranks than slots is an error naming requested vs available, unless
//!   `--oversubscribe` or the host source is the implicit localhost. When
//!   oversubscribed, all slots are filled first, then the extra ranks go
//!   round-robin over the hosts that are below their `max_slots`; with
//!   `map-by slot` each host's ranks stay consecutive. If even `max_slots`
//!   cannot hold np ranks, it is an error.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use crate::host_source::{Family, HostEntry, HostSource};

/// Most ranks one job may have.
pub const MAX_RANKS: usize = 1_000_000;

/// An object inside a node that `--map-by` / `--rank-by` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeObj {
    Core,
    /// A socket (Open MPI also says `package`).
    Socket,
    Numa,
}

impl NodeObj {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeObj::Core => "core",
            NodeObj::Socket => "socket",
            NodeObj::Numa => "numa",
        }
    }
}

/// `--map-by` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapBy {
    /// Fill each host's slots before the next host.
    #[default]
    Slot,
    /// Round-robin over hosts.
    Node,
    /// `ppr:N:node`: N ranks per host.
    PprNode(usize),
    /// `ppr:N:socket` / `ppr:N:numa`: N ranks per socket (NUMA node) of each host.
    PprObj(usize, NodeObj),
    /// `core`, `socket`, `numa`: hosts by slot; inside a node one rank per core, or
    /// round-robin over sockets / NUMA nodes.
    Obj(NodeObj),
    /// `seq`: rank i on line i of the hostfile.
    Seq,
}

impl MapBy {
    /// Parse `slot`, `node`, `ppr:N:node`, `ppr:N:socket`, `ppr:N:package`, `ppr:N:numa`,
    /// `core`, `socket`, `package`, `numa`, `seq` (case-insensitive; `byslot`, `bynode`,
    /// `hwthread` as `core`... no: see the docs), with Open MPI's modifiers after a colon:
    /// `:oversubscribe` / `:nooversubscribe` (returned as `Some(bool)`). `:PE=n` and the
    /// others are refused with a message.
    pub fn parse_with_modifiers(s: &str) -> Result<(MapBy, Option<bool>), PlacementError> {
        let bad = || PlacementError::BadMapBy(s.chars().take(60).collect());
        let t = s.trim().to_ascii_lowercase();
        let mut parts: Vec<&str> = t.split(':').collect();
        let mut over = None;
        // Trailing modifiers (Open MPI: `--map-by node:OVERSUBSCRIBE`).
        while parts.len() > 1 {
            match *parts.last().unwrap_or(&"") {
                "oversubscribe" => over = Some(true),
                "nooversubscribe" => over = Some(false),
                m if m.starts_with("pe=")
                    || matches!(
                        m,
                        "span" | "nolocal" | "display" | "displaydevel" | "hwtcpus"
                    ) =>
                {
                    return Err(PlacementError::MapByModifier {
                        spec: s.chars().take(60).collect(),
                        modifier: m.to_string(),
                    })
                }
                _ => break,
            }
            parts.pop();
        }
        let num = |n: &str| -> Result<usize, PlacementError> {
            if n.is_empty() || !n.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            match n.parse::<usize>() {
                Ok(v) if (1..=MAX_RANKS).contains(&v) => Ok(v),
                _ => Err(bad()),
            }
        };
        let m = match parts.as_slice() {
            ["slot" | "byslot"] => MapBy::Slot,
            ["node" | "bynode"] => MapBy::Node,
            ["seq"] => MapBy::Seq,
            ["core" | "bycore"] => MapBy::Obj(NodeObj::Core),
            ["socket" | "package" | "bysocket"] => MapBy::Obj(NodeObj::Socket),
            ["numa"] => MapBy::Obj(NodeObj::Numa),
            ["ppr", n, "node"] => MapBy::PprNode(num(n)?),
            ["ppr", n, "socket" | "package"] => MapBy::PprObj(num(n)?, NodeObj::Socket),
            ["ppr", n, "numa"] => MapBy::PprObj(num(n)?, NodeObj::Numa),
            _ => return Err(bad()),
        };
        Ok((m, over))
    }

    /// Parse a `--map-by` value without modifiers (see [`MapBy::parse_with_modifiers`]).
    pub fn parse(s: &str) -> Result<MapBy, PlacementError> {
        match MapBy::parse_with_modifiers(s)? {
            (m, None) => Ok(m),
            (_, Some(_)) => Err(PlacementError::BadMapBy(s.chars().take(60).collect())),
        }
    }

    /// The object this mapping binds to by default (Open MPI: `--map-by X` binds to X).
    pub fn bind_object(self) -> Option<NodeObj> {
        match self {
            MapBy::Obj(o) | MapBy::PprObj(_, o) => Some(o),
            _ => None,
        }
    }
}

impl FromStr for MapBy {
    type Err = PlacementError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MapBy::parse(s)
    }
}

impl fmt::Display for MapBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapBy::Slot => write!(f, "slot"),
            MapBy::Node => write!(f, "node"),
            MapBy::PprNode(n) => write!(f, "ppr:{n}:node"),
            MapBy::PprObj(n, o) => write!(f, "ppr:{n}:{}", o.as_str()),
            MapBy::Obj(o) => f.write_str(o.as_str()),
            MapBy::Seq => write!(f, "seq"),
        }
    }
}

/// `--rank-by` policy: how ranks are numbered once the mapping decided each host's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankBy {
    /// Host by host, consecutive ranks on each (`slot`, `fill`).
    Slot,
    /// Round-robin over the hosts (`node`, `span`).
    Node,
    /// Host by host; inside a node over these objects (`core`, `hwthread`: in core order;
    /// `socket`/`package`, `numa`: round-robin over them).
    Obj(NodeObj),
}

impl RankBy {
    /// Parse `slot`, `fill`, `node`, `span`, `core`, `hwthread`, `socket`, `package`, `numa`.
    pub fn parse(s: &str) -> Result<RankBy, PlacementError> {
        let t = s.trim().to_ascii_lowercase();
        Ok(match t.split(':').next().unwrap_or("") {
            "slot" | "fill" | "byslot" => RankBy::Slot,
            "node" | "span" | "bynode" => RankBy::Node,
            "core" | "hwthread" => RankBy::Obj(NodeObj::Core),
            "socket" | "package" => RankBy::Obj(NodeObj::Socket),
            "numa" => RankBy::Obj(NodeObj::Numa),
            _ => return Err(PlacementError::BadRankBy(s.chars().take(60).collect())),
        })
    }
}

/// How ranks spread over the objects of one node (`RAILRING_MAP_BY`, read by the runtime's
/// binding), from `--map-by` and `--rank-by`; `None`: the runtime's own rule (GPU, else
/// round-robin over NUMA nodes).
pub fn node_spread(map_by: Option<MapBy>, rank_by: Option<RankBy>) -> Option<String> {
    let rr = |o: NodeObj| Some(o.as_str().to_string());
    let fill = |o: NodeObj| Some(format!("{}:fill", o.as_str()));
    match (map_by, rank_by) {
        (Some(MapBy::PprObj(_, _)), Some(RankBy::Obj(o @ (NodeObj::Socket | NodeObj::Numa)))) => {
            rr(o)
        }
        (Some(MapBy::PprObj(n, o)), _) => Some(format!("ppr:{n}:{}", o.as_str())),
        (
            Some(MapBy::Obj(NodeObj::Core)),
            Some(RankBy::Obj(o @ (NodeObj::Socket | NodeObj::Numa))),
        ) => rr(o),
        (Some(MapBy::Obj(NodeObj::Core)), _) => Some("core".into()),
        (Some(MapBy::Obj(o)), Some(RankBy::Slot | RankBy::Obj(NodeObj::Core))) => fill(o),
        (Some(MapBy::Obj(o)), _) => rr(o),
        (_, Some(RankBy::Obj(o @ (NodeObj::Socket | NodeObj::Numa)))) => rr(o),
        (_, Some(RankBy::Obj(NodeObj::Core))) => Some("core".into()),
        _ => None,
    }
}

/// What the user asked for on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementRequest {
    /// `-np/-n`; `None` = derive from slots (or ppr/ppn × hosts).
    pub np: Option<usize>,
    /// `--ppn/-ppn`: ranks per host, consecutive, wrapping around.
    pub ppn: Option<usize>,
    /// `--map-by`; `None`: the host source's family decides (Hydra hostfiles cycle over
    /// their lines, everything else fills by slot).
    pub map_by: Option<MapBy>,
    /// `--rank-by`.
    pub rank_by: Option<RankBy>,
    /// `--oversubscribe`.
    pub oversubscribe: bool,
    /// Sockets and NUMA nodes per host, for `ppr:N:socket` / `ppr:N:numa` (railrun counts
    /// this machine's).
    pub sockets: Option<usize>,
    pub numas: Option<usize>,
}

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankPlacement {
    pub rank: usize,
    pub host: String,
    /// Login user for the host; left out of JSON when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Index of the host among hosts that got ranks, by first appearance.
    pub node_rank: usize,
    /// Index of this rank among its host's ranks (ascending rank order).
    pub local_rank: usize,
    /// Number of ranks on this host.
    pub local_size: usize,
}

/// The full placement of a job. Serializes as the JSON array of ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Indexed by rank.
    pub ranks: Vec<RankPlacement>,
    /// Host names in node-rank order (only hosts that got ranks).
    pub hosts: Vec<String>,
}

impl Serialize for Placement {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(&self.ranks)
    }
}

impl Placement {
    /// Number of hosts that got at least one rank.
    pub fn nnodes(&self) -> usize {
        self.hosts.len()
    }

    /// Number of ranks.
    pub fn np(&self) -> usize {
        self.ranks.len()
    }

    /// `--dry-run=json`: a pretty JSON array of
    /// `{rank, host, [user,] node_rank, local_rank, local_size}`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.ranks).unwrap_or_else(|_| "[]".to_string())
    }

    /// `--dry-run`: an aligned table, one line per rank, then a summary line.
    pub fn table(&self) -> String {
        let header = ["rank", "host", "node_rank", "local_rank", "local_size"];
        let rows: Vec<[String; 5]> = self
            .ranks
            .iter()
            .map(|r| {
                let host = match &r.user {
                    Some(u) => format!("{u}@{}", r.host),
                    None => r.host.clone(),
                };
                [
                    r.rank.to_string(),
                    host,
                    r.node_rank.to_string(),
                    r.local_rank.to_string(),
                    r.local_size.to_string(),
                ]
            })
            .collect();
        let mut w = header.map(str::len);
        for row in &rows {
            for (i, c) in row.iter().enumerate() {
                w[i] = w[i].max(c.len());
            }
        }
        let mut out = String::new();
        let mut line = |cells: [&str; 5]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i == 4 {
                    l.push_str(c);
                } else {
                    l.push_str(&format!("{:<width$}  ", c, width = w[i]));
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(header);
        for row in &rows {
            line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
        }
        out.push_str(&format!(
            "{} rank{} on {} node{}\n",
            self.np(),
            if self.np() == 1 { "" } else { "s" },
            self.nnodes(),
            if self.nnodes() == 1 { "" } else { "s" }
        ));
        out
    }
}

/// Why ranks could not be placed. Every variant is detected before anything
/// is started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("--map-by `{0}`: unsupported; expected slot, node, seq, core, socket, package, numa or ppr:N:node|socket|package|numa (N >= 1), optionally followed by :oversubscribe")]
    BadMapBy(String),
    #[error("--map-by `{spec}`: the modifier `{modifier}` is not supported by railrun; leave it out (bindings: --bind-to)")]
    MapByModifier { spec: String, modifier: String },
    #[error("--rank-by `{0}`: unsupported; expected slot, fill, node, span, core, hwthread, socket, package or numa")]
    BadRankBy(String),
    #[error("--map-by {map}: the number of {what} per host is unknown (this machine's topology could not be read); use --map-by ppr:N:node")]
    UnknownObjects { map: String, what: &'static str },
    #[error("--map-by seq: {requested} ranks requested but the {from} lists {lines} host line(s) (one rank per line)")]
    SeqTooManyRanks {
        requested: usize,
        lines: usize,
        from: String,
    },
    #[error("-np 0: expected at least 1 rank")]
    ZeroRanks,
    #[error("--ppn 0: expected at least 1 rank per host")]
    ZeroPpn,
    #[error("{0}")]
    Conflict(String),
    #[error("no hosts to place ranks on")]
    NoHosts,
    #[error("{requested} ranks requested on localhost, which has {slots} CPU(s): more than {limit} ({IMPLICIT_OVERSUBSCRIBE} per CPU) needs --oversubscribe (or a hostfile naming the slots)")]
    TooManyLocal {
        requested: usize,
        slots: usize,
        limit: usize,
    },
    #[error("{requested} ranks requested but at most {limit} are supported")]
    TooManyRanks { requested: usize, limit: usize },
    #[error("not enough slots: {requested} ranks requested but only {available} slots are available on {nhosts} host(s) ({summary}); add --oversubscribe to run more ranks than slots")]
    NotEnoughSlots {
        requested: usize,
        available: usize,
        nhosts: usize,
        summary: String,
    },
    #[error("{requested} ranks requested but max_slots allows at most {max} on {nhosts} host(s) ({summary}), even with --oversubscribe")]
    MaxSlotsExceeded {
        requested: usize,
        max: usize,
        nhosts: usize,
        summary: String,
    },
    #[error("--map-by {spec} ({per_node} per host) on {nhosts} host(s) places at most {max} ranks, but -np {requested} was requested")]
    PprTooManyRanks {
        spec: String,
        requested: usize,
        per_node: usize,
        nhosts: usize,
        max: usize,
    },
    #[error("--map-by {spec} puts {count} ranks on {host}, which has {slots} slot(s); add --oversubscribe to run more ranks than slots")]
    PprExceedsSlots {
        spec: String,
        host: String,
        per_node: usize,
        count: usize,
        slots: usize,
    },
    #[error("{count} ranks on {host} ({how}) exceed its max_slots={max_slots}")]
    HostMaxSlots {
        host: String,
        count: usize,
        max_slots: usize,
        how: String,
    },
}

/// `a: 2, b: 2/4, ...` (slots, `/max` when set), first 8 hosts.
fn summary(hosts: &[HostEntry]) -> String {
    let mut parts: Vec<String> = hosts
        .iter()
        .take(8)
        .map(|h| match h.max_slots {
            Some(m) => format!("{}: {} (max {m})", h.name, h.slots),
            None => format!("{}: {}", h.name, h.slots),
        })
        .collect();
    if hosts.len() > 8 {
        parts.push(format!("... {} more", hosts.len() - 8));
    }
    parts.join(", ")
}

fn check_np(np: usize) -> Result<usize, PlacementError> {
    match np {
        0 => Err(PlacementError::ZeroRanks),
        n if n > MAX_RANKS => Err(PlacementError::TooManyRanks {
            requested: n,
            limit: MAX_RANKS,
        }),
        n => Ok(n),
    }
}

/// Round-robin `remaining` ranks over `active` hosts (in order, one per host
/// per pass), each host up to `limit(host)`; appends host indices to `order`.
fn round_robin(
    mut active: Vec<usize>,
    counts: &mut [usize],
    limit: impl Fn(usize) -> Option<usize>,
    remaining: &mut usize,
    order: &mut Vec<usize>,
) {
    active.retain(|&h| !matches!(limit(h), Some(l) if counts[h] >= l));
    while *remaining > 0 && !active.is_empty() {
        for &h in &active {
            if *remaining == 0 {
                break;
            }
            counts[h] += 1;
            order.push(h);
            *remaining -= 1;
        }
        active.retain(|&h| !matches!(limit(h), Some(l) if counts[h] >= l));
    }
}

/// Place ranks on hosts. See the module docs for the rules.
/// Ranks per slot (CPU) the implicit localhost runs without `--oversubscribe`.
pub const IMPLICIT_OVERSUBSCRIBE: usize = 64;

pub fn place(src: &HostSource, req: &PlacementRequest) -> Result<Placement, PlacementError> {
    let hosts = &src.hosts;
    if hosts.is_empty() {
        return Err(PlacementError::NoHosts);
    }
    if req.np == Some(0) {
        return Err(PlacementError::ZeroRanks);
    }
    // The implicit localhost oversubscribes without a flag (a laptop runs `-np 4` on 2 cores),
    // but only up to a sane limit: past it a typo (`-np 1000000`) would start a fork bomb.
    if src.is_implicit() && !req.oversubscribe {
        let slots = src.total_slots().max(1);
        let limit = slots.saturating_mul(IMPLICIT_OVERSUBSCRIBE);
        if let Some(np) = req.np.filter(|&n| n > limit) {
            return Err(PlacementError::TooManyLocal {
                requested: np,
                slots,
                limit,
            });
        }
    }
    let allow_over = req.oversubscribe || src.is_implicit();
    let assign = if let Some(ppn) = req.ppn {
        assign_ppn(hosts, req, ppn)?
    } else {
        match req.map_by {
            Some(MapBy::PprNode(per)) => assign_ppr(hosts, req.np, per, allow_over, None)?,
            Some(MapBy::PprObj(n, o)) => {
                let (count, what) = match o {
                    NodeObj::Numa => (req.numas, "NUMA nodes"),
                    _ => (req.sockets, "sockets"),
                };
                let Some(count) = count.filter(|&c| c > 0) else {
                    return Err(PlacementError::UnknownObjects {
                        map: MapBy::PprObj(n, o).to_string(),
                        what,
                    });
                };
                assign_ppr(
                    hosts,
                    req.np,
                    n.saturating_mul(count),
                    allow_over,
                    Some(MapBy::PprObj(n, o)),
                )?
            }
            Some(MapBy::Seq) => assign_seq(src, req.np)?,
            None if src.family == Family::Hydra => assign_cycle(src, req.np)?,
            _ => assign_slots(src, req, allow_over)?,
        }
    };
    let assign = match req.rank_by {
        Some(RankBy::Node) => rank_round_robin(nh_of(hosts), &assign),
        Some(_) => rank_host_major(&assign),
        None => assign,
    };
    Ok(number_ranks(hosts, &assign))
}

fn nh_of(hosts: &[HostEntry]) -> usize {
    hosts.len()
}

/// The same per-host counts, numbered host by host (hosts in order of first appearance).
fn rank_host_major(assign: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::new();
    let mut counts: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for &h in assign {
        let c = counts.entry(h).or_insert(0);
        if *c == 0 {
            order.push(h);
        }
        *c += 1;
    }
    order
        .into_iter()
        .flat_map(|h| std::iter::repeat_n(h, counts[&h]))
        .collect()
}

/// The same per-host counts, dealt round-robin over the hosts (in order of first appearance).
fn rank_round_robin(nh: usize, assign: &[usize]) -> Vec<usize> {
    let mut counts = vec![0usize; nh];
    let mut order: Vec<usize> = Vec::new();
    for &h in assign {
        if counts[h] == 0 {
            order.push(h);
        }
        counts[h] += 1;
    }
    let mut out = Vec::with_capacity(assign.len());
    while out.len() < assign.len() {
        for &h in &order {
            if counts[h] > 0 {
                counts[h] -= 1;
                out.push(h);
            }
        }
    }
    out
}

/// Hydra's placement over a hostfile's lines: each line takes its count of consecutive
/// ranks, cycling over the lines until every rank is placed (slot counts never stop it).
fn assign_cycle(src: &HostSource, np: Option<usize>) -> Result<Vec<usize>, PlacementError> {
    let total: usize = src.lines.iter().fold(0usize, |a, l| a.saturating_add(l.1));
    let np = check_np(np.unwrap_or(total))?;
    if src.lines.is_empty() || total == 0 {
        return Err(PlacementError::NoHosts);
    }
    let mut out = Vec::with_capacity(np);
    'outer: loop {
        for &(h, c) in &src.lines {
            for _ in 0..c {
                if out.len() == np {
                    break 'outer;
                }
                out.push(h);
            }
        }
    }
    Ok(out)
}

/// `--map-by seq`: rank i on the host of line i.
fn assign_seq(src: &HostSource, np: Option<usize>) -> Result<Vec<usize>, PlacementError> {
    let lines = src.lines.len();
    let np = check_np(np.unwrap_or(lines))?;
    if np > lines {
        return Err(PlacementError::SeqTooManyRanks {
            requested: np,
            lines,
            from: src.kind.to_string(),
        });
    }
    Ok(src.lines[..np].iter().map(|l| l.0).collect())
}

/// `--ppn N`: N consecutive ranks per host, wrapping around; only `max_slots` limits it.
/// Returns the host index of every rank, in rank order.
fn assign_ppn(
    hosts: &[HostEntry],
    req: &PlacementRequest,
    ppn: usize,
) -> Result<Vec<usize>, PlacementError> {
    let nh = hosts.len();
    if ppn == 0 {
        return Err(PlacementError::ZeroPpn);
    }
    if let Some(m) = req.map_by.filter(|m| *m != MapBy::Slot) {
        return Err(PlacementError::Conflict(format!(
            "--ppn {ppn} cannot be combined with --map-by {m}; use one of them"
        )));
    }
    let np = check_np(req.np.unwrap_or(ppn.saturating_mul(nh)))?;
    let assign: Vec<usize> = (0..np).map(|r| (r / ppn) % nh).collect();
    let mut counts = vec![0usize; nh];
    for &h in &assign {
        counts[h] += 1;
    }
    for (h, &c) in hosts.iter().zip(&counts) {
        if let Some(m) = h.max_slots {
            if c > m {
                return Err(PlacementError::HostMaxSlots {
                    host: h.name.clone(),
                    count: c,
                    max_slots: m,
                    how: format!("--ppn {ppn}, -np {np}"),
                });
            }
        }
    }
    Ok(assign)
}

/// `--map-by ppr:N:node`: N consecutive ranks per host, at most N × hosts ranks.
/// Returns the host index of every rank, in rank order.
fn assign_ppr(
    hosts: &[HostEntry],
    np: Option<usize>,
    per: usize,
    allow_over: bool,
    shown_as: Option<MapBy>,
) -> Result<Vec<usize>, PlacementError> {
    let shown = shown_as.unwrap_or(MapBy::PprNode(per));
    let nh = hosts.len();
    let max = per.saturating_mul(nh);
    let np = np.unwrap_or(max);
    if np > max {
        return Err(PlacementError::PprTooManyRanks {
            spec: shown.to_string(),
            requested: np,
            per_node: per,
            nhosts: nh,
            max,
        });
    }
    let np = check_np(np)?;
    for (i, h) in hosts.iter().enumerate() {
        let count = per.min(np.saturating_sub(i.saturating_mul(per)));
        if count == 0 {
            break;
        }
        if let Some(m) = h.max_slots {
            if count > m {
                return Err(PlacementError::HostMaxSlots {
                    host: h.name.clone(),
                    count,
                    max_slots: m,
                    how: format!("--map-by {shown}"),
                });
            }
        }
        if count > h.slots && !allow_over {
            return Err(PlacementError::PprExceedsSlots {
                spec: shown.to_string(),
                host: h.name.clone(),
                per_node: per,
                count,
                slots: h.slots,
            });
        }
    }
    Ok((0..np).map(|r| r / per).collect())
}

/// `--map-by slot` / `node`: fill the slots (host by host, or round-robin), then oversubscribe
/// round-robin up to `max_slots`. Returns the host index of every rank, in rank order.
fn assign_slots(
    src: &HostSource,
    req: &PlacementRequest,
    allow_over: bool,
) -> Result<Vec<usize>, PlacementError> {
    let hosts = &src.hosts;
    let nh = hosts.len();
    let total = src.total_slots();
    let np = check_np(req.np.unwrap_or(total))?;
    if np > total && !allow_over {
        return Err(PlacementError::NotEnoughSlots {
            requested: np,
            available: total,
            nhosts: nh,
            summary: summary(hosts),
        });
    }
    // Hard capacity: sum of max_slots, unbounded if any host has none.
    if hosts.iter().all(|h| h.max_slots.is_some()) {
        let cap = hosts
            .iter()
            .fold(0usize, |a, h| a.saturating_add(h.max_slots.unwrap_or(0)));
        if np > cap {
            return Err(PlacementError::MaxSlotsExceeded {
                requested: np,
                max: cap,
                nhosts: nh,
                summary: summary(hosts),
            });
        }
    }
    let mut counts = vec![0usize; nh];
    let mut order = Vec::with_capacity(np);
    let mut remaining = np;
    // Phase 1: within slots.
    match req.map_by {
        Some(MapBy::Node) => round_robin(
            (0..nh).collect(),
            &mut counts,
            |h| Some(hosts[h].slots),
            &mut remaining,
            &mut order,
        ),
        _ => {
            for (h, e) in hosts.iter().enumerate() {
                let c = e.slots.min(remaining);
                counts[h] = c;
                remaining -= c;
                if remaining == 0 {
                    break;
                }
            }
        }
    }
    // Phase 2: oversubscription, round-robin up to max_slots.
    round_robin(
        (0..nh).collect(),
        &mut counts,
        |h| hosts[h].max_slots,
        &mut remaining,
        &mut order,
    );
    debug_assert_eq!(remaining, 0, "capacity was checked above");
    Ok(match req.map_by {
        Some(MapBy::Node) => order,
        _ => counts
            .iter()
            .enumerate()
            .flat_map(|(h, &c)| (0..c).map(move |_| h))
            .collect(),
    })
}

/// The placement of ranks whose host indices are `assign`: node ranks by first appearance,
/// local ranks by order within a host.
fn number_ranks(hosts: &[HostEntry], assign: &[usize]) -> Placement {
    let nh = hosts.len();
    let mut node_of = vec![usize::MAX; nh];
    let mut local_count = vec![0usize; nh];
    let mut node_hosts = Vec::new();
    for &h in assign {
        if node_of[h] == usize::MAX {
            node_of[h] = node_hosts.len();
            node_hosts.push(hosts[h].name.clone());
        }
        local_count[h] += 1;
    }
    let mut seen = vec![0usize; nh];
    let ranks = assign
        .iter()
        .enumerate()
        .map(|(rank, &h)| {
            let local_rank = seen[h];
            seen[h] += 1;
            RankPlacement {
                rank,
                host: hosts[h].name.clone(),
                user: hosts[h].user.clone(),
                node_rank: node_of[h],
                local_rank,
                local_size: local_count[h],
            }
        })
        .collect();
    Placement {
        ranks,
        hosts: node_hosts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_source::{parse_host_arg, parse_hostfile_str, SourceKind};

    fn src(text: &str) -> HostSource {
        HostSource::new(
            parse_hostfile_str(text, "hf").unwrap(),
            SourceKind::Hostfile("hf".into()),
        )
    }

    fn h_arg(arg: &str) -> HostSource {
        HostSource::new(parse_host_arg(arg).unwrap(), SourceKind::HostArg)
    }

    fn req(np: Option<usize>, map_by: MapBy) -> PlacementRequest {
        PlacementRequest {
            np,
            map_by: Some(map_by),
            ..Default::default()
        }
    }

    fn hosts_of(p: &Placement) -> Vec<&str> {
        p.ranks.iter().map(|r| r.host.as_str()).collect()
    }

    fn place_ok(s: &HostSource, r: &PlacementRequest) -> Placement {
        let p = place(s, r).unwrap_or_else(|e| panic!("{e}"));
        // Invariants for every placement.
        for (i, rp) in p.ranks.iter().enumerate() {
            assert_eq!(rp.rank, i);
            assert_eq!(p.hosts[rp.node_rank], rp.host);
            assert!(rp.local_rank < rp.local_size);
            let same = p.ranks.iter().filter(|x| x.host == rp.host).count();
            assert_eq!(same, rp.local_size);
        }
        p
    }

    #[test]
    fn map_by_parse() {
        assert_eq!(MapBy::parse("slot").unwrap(), MapBy::Slot);
        assert_eq!(MapBy::parse("NODE").unwrap(), MapBy::Node);
        assert_eq!(MapBy::parse("bynode").unwrap(), MapBy::Node);
        assert_eq!(MapBy::parse("ppr:4:node").unwrap(), MapBy::PprNode(4));
        assert_eq!("ppr:2:node".parse::<MapBy>().unwrap(), MapBy::PprNode(2));
        assert_eq!(MapBy::parse("core").unwrap(), MapBy::Obj(NodeObj::Core));
        assert_eq!(
            MapBy::parse("package").unwrap(),
            MapBy::Obj(NodeObj::Socket)
        );
        assert_eq!(MapBy::parse("NUMA").unwrap(), MapBy::Obj(NodeObj::Numa));
        assert_eq!(MapBy::parse("seq").unwrap(), MapBy::Seq);
        assert_eq!(
            MapBy::parse("ppr:2:package").unwrap(),
            MapBy::PprObj(2, NodeObj::Socket)
        );
        assert_eq!(
            MapBy::parse_with_modifiers("slot:OVERSUBSCRIBE").unwrap(),
            (MapBy::Slot, Some(true))
        );
        for bad in [
            "",
            "board",
            "ppr:0:node",
            "ppr:x:node",
            "ppr:2:core",
            "ppr:2",
            "ppr::node",
            "slot:oversubscribe",
        ] {
            let e = MapBy::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("expected slot, node, seq"),
                "{bad}: {e}"
            );
        }
        let e = MapBy::parse_with_modifiers("socket:PE=4").unwrap_err();
        assert!(e.to_string().contains("`pe=4` is not supported"), "{e}");
        assert_eq!(MapBy::PprNode(3).to_string(), "ppr:3:node");
        assert_eq!(MapBy::PprObj(1, NodeObj::Numa).to_string(), "ppr:1:numa");
        assert_eq!(MapBy::default(), MapBy::Slot);
        assert!(RankBy::parse("board").is_err());
    }

    fn req_full(
        np: Option<usize>,
        map_by: Option<MapBy>,
        rank_by: Option<RankBy>,
    ) -> PlacementRequest {
        PlacementRequest {
            np,
            map_by,
            rank_by,
            sockets: Some(2),
            numas: Some(4),
            ..Default::default()
        }
    }

    fn hydra(text: &str) -> HostSource {
        let hf = crate::host_source::parse_hostfile_text(
            text,
            "hf",
            &crate::host_source::HostfileRules::default(),
        )
        .unwrap();
        let mut s = HostSource::new(hf.hosts, SourceKind::Hostfile("hf".into()));
        s.family = hf.family;
        s.lines = hf.lines;
        s
    }

    #[test]
    fn ppr_per_socket_and_numa() {
        let s = src("a slots=4\nb slots=4\n");
        // 2 sockets per host: ppr:2:socket = 4 per host.
        let p = place_ok(
            &s,
            &req_full(None, Some(MapBy::PprObj(2, NodeObj::Socket)), None),
        );
        assert_eq!(hosts_of(&p), ["a", "a", "a", "a", "b", "b", "b", "b"]);
        let p = place_ok(
            &s,
            &req_full(Some(5), Some(MapBy::PprObj(2, NodeObj::Socket)), None),
        );
        assert_eq!(hosts_of(&p), ["a", "a", "a", "a", "b"]);
        // 4 NUMA nodes per host: ppr:1:numa = 4 per host; too many ranks names the mapping.
        let e = place(
            &s,
            &req_full(Some(9), Some(MapBy::PprObj(1, NodeObj::Numa)), None),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("--map-by ppr:1:numa (4 per host)"),
            "{e}"
        );
        // More per host than slots needs --oversubscribe, and says which mapping.
        let e = place(
            &s,
            &req_full(None, Some(MapBy::PprObj(3, NodeObj::Socket)), None),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("ppr:3:socket puts 6 ranks on a"),
            "{e}"
        );
        // Unknown socket count.
        let mut r = req_full(None, Some(MapBy::PprObj(1, NodeObj::Socket)), None);
        r.sockets = None;
        assert!(matches!(
            place(&s, &r),
            Err(PlacementError::UnknownObjects { .. })
        ));
    }

    #[test]
    fn core_socket_numa_fill_hosts_by_slot() {
        let s = src("a slots=2\nb slots=2\n");
        for o in [NodeObj::Core, NodeObj::Socket, NodeObj::Numa] {
            let p = place_ok(&s, &req_full(Some(3), Some(MapBy::Obj(o)), None));
            assert_eq!(hosts_of(&p), ["a", "a", "b"], "{o:?}");
        }
    }

    #[test]
    fn seq_follows_the_lines() {
        let s = hydra("b\na slots=2\nb\nc\n");
        let p = place_ok(&s, &req_full(None, Some(MapBy::Seq), None));
        assert_eq!(hosts_of(&p), ["b", "a", "b", "c"]);
        assert_eq!(p.ranks[2].local_rank, 1);
        let p = place_ok(&s, &req_full(Some(2), Some(MapBy::Seq), None));
        assert_eq!(hosts_of(&p), ["b", "a"]);
        let e = place(&s, &req_full(Some(5), Some(MapBy::Seq), None)).unwrap_err();
        assert!(e.to_string().contains("lists 4 host line(s)"), "{e}");
    }

    #[test]
    fn hydra_hostfiles_cycle_over_their_lines() {
        // Bare names: one rank per host per pass, wrapping (Hydra never runs out of slots).
        let s = hydra("a:1\nb\nc\n");
        assert_eq!(s.family, Family::Hydra);
        let p = place_ok(&s, &req_full(Some(7), None, None));
        assert_eq!(hosts_of(&p), ["a", "b", "c", "a", "b", "c", "a"]);
        // Counts: blocks of that size per pass; no -np: one pass.
        let s = hydra("a:2\nb:2\n");
        let p = place_ok(&s, &req_full(Some(6), None, None));
        assert_eq!(hosts_of(&p), ["a", "a", "b", "b", "a", "a"]);
        assert_eq!(place_ok(&s, &req_full(None, None, None)).np(), 4);
        // A host on two lines keeps both places in the cycle.
        let s = hydra("a:1\nb:1\na:1\n");
        let p = place_ok(&s, &req_full(Some(4), None, None));
        assert_eq!(hosts_of(&p), ["a", "b", "a", "a"]);
        // An explicit --map-by applies Open MPI's rule instead (slots are the counts).
        let s = hydra("a:2\nb:2\n");
        let p = place_ok(&s, &req_full(Some(4), Some(MapBy::Node), None));
        assert_eq!(hosts_of(&p), ["a", "b", "a", "b"]);
        // An Open MPI file with the same counts fills by slot and refuses to oversubscribe.
        let s = src("a slots=2\nb slots=2\n");
        assert!(place(&s, &req_full(Some(6), None, None)).is_err());
    }

    #[test]
    fn rank_by_reorders_the_same_counts() {
        let s = src("a slots=2\nb slots=2\n");
        let p = place_ok(
            &s,
            &req_full(Some(4), Some(MapBy::Slot), Some(RankBy::Node)),
        );
        assert_eq!(hosts_of(&p), ["a", "b", "a", "b"]);
        let p = place_ok(
            &s,
            &req_full(Some(4), Some(MapBy::Node), Some(RankBy::Slot)),
        );
        assert_eq!(hosts_of(&p), ["a", "a", "b", "b"]);
        let p = place_ok(
            &s,
            &req_full(
                Some(3),
                Some(MapBy::Node),
                Some(RankBy::Obj(NodeObj::Socket)),
            ),
        );
        assert_eq!(hosts_of(&p), ["a", "a", "b"]);
    }

    #[test]
    fn node_spread_for_the_runtime() {
        use MapBy::*;
        let sock = NodeObj::Socket;
        assert_eq!(node_spread(None, None), None);
        assert_eq!(node_spread(Some(Slot), None), None);
        assert_eq!(
            node_spread(Some(Obj(NodeObj::Core)), None).as_deref(),
            Some("core")
        );
        assert_eq!(
            node_spread(Some(Obj(sock)), None).as_deref(),
            Some("socket")
        );
        assert_eq!(
            node_spread(Some(Obj(sock)), Some(RankBy::Obj(NodeObj::Core))).as_deref(),
            Some("socket:fill")
        );
        assert_eq!(
            node_spread(Some(PprObj(2, sock)), None).as_deref(),
            Some("ppr:2:socket")
        );
        assert_eq!(
            node_spread(Some(PprObj(2, sock)), Some(RankBy::Obj(sock))).as_deref(),
            Some("socket")
        );
        assert_eq!(
            node_spread(Some(Node), Some(RankBy::Obj(NodeObj::Numa))).as_deref(),
            Some("numa")
        );
        // Every spelling the runtime must read.
        for m in [
            "core",
            "socket",
            "socket:fill",
            "ppr:2:socket",
            "numa",
            "numa:fill",
            "ppr:1:numa",
        ] {
            railring::topology::NodeMap::parse(m).unwrap();
        }
    }

    #[test]
    fn openmpi_slot_and_node_examples() {
        let s = src("a slots=2\nb slots=2\n");
        let p = place_ok(&s, &req(Some(4), MapBy::Slot));
        assert_eq!(hosts_of(&p), ["a", "a", "b", "b"]);
        assert_eq!(
            p.ranks
                .iter()
                .map(|r| (r.node_rank, r.local_rank, r.local_size))
                .collect::<Vec<_>>(),
            [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
        );
        let p = place_ok(&s, &req(Some(4), MapBy::Node));
        assert_eq!(hosts_of(&p), ["a", "b", "a", "b"]);
        assert_eq!(
            p.ranks
                .iter()
                .map(|r| (r.node_rank, r.local_rank))
                .collect::<Vec<_>>(),
            [(0, 0), (1, 0), (0, 1), (1, 1)]
        );
        assert_eq!(p.nnodes(), 2);
        assert_eq!(p.hosts, ["a", "b"]);
    }

    #[test]
    fn default_np_is_total_slots() {
        let s = src("a slots=3\nb slots=1\n");
        let p = place_ok(&s, &PlacementRequest::default());
        assert_eq!(hosts_of(&p), ["a", "a", "a", "b"]);
        let p = place_ok(&s, &req(None, MapBy::Node));
        assert_eq!(hosts_of(&p), ["a", "b", "a", "a"]);
    }

    #[test]
    fn fewer_ranks_than_slots() {
        let s = src("a slots=4\nb slots=4\n");
        let p = place_ok(&s, &req(Some(3), MapBy::Slot));
        assert_eq!(hosts_of(&p), ["a", "a", "a"]);
        assert_eq!(p.nnodes(), 1);
        let p = place_ok(&s, &req(Some(3), MapBy::Node));
        assert_eq!(hosts_of(&p), ["a", "b", "a"]);
        assert_eq!(p.ranks[2].local_size, 2);
    }

    #[test]
    fn node_map_skips_full_hosts() {
        let s = src("a slots=1\nb slots=3\nc slots=2\n");
        let p = place_ok(&s, &req(Some(6), MapBy::Node));
        assert_eq!(hosts_of(&p), ["a", "b", "c", "b", "c", "b"]);
    }

    #[test]
    fn ppr() {
        let s = src("a slots=2\nb slots=2\n");
        let p = place_ok(&s, &req(None, MapBy::PprNode(2)));
        assert_eq!(hosts_of(&p), ["a", "a", "b", "b"]);
        let p = place_ok(&s, &req(None, MapBy::PprNode(1)));
        assert_eq!(hosts_of(&p), ["a", "b"]);
        let p = place_ok(&s, &req(Some(3), MapBy::PprNode(2)));
        assert_eq!(hosts_of(&p), ["a", "a", "b"]);
        // Open MPI: -np 3 with ppr:1:node on 2 hosts is an error.
        let e = place(&s, &req(Some(3), MapBy::PprNode(1))).unwrap_err();
        assert_eq!(
            e,
            PlacementError::PprTooManyRanks {
                spec: "ppr:1:node".into(),
                requested: 3,
                per_node: 1,
                nhosts: 2,
                max: 2
            }
        );
        assert!(e.to_string().contains("-np 3"), "{e}");
        // More per node than slots needs --oversubscribe.
        let e = place(&s, &req(None, MapBy::PprNode(3))).unwrap_err();
        assert!(matches!(e, PlacementError::PprExceedsSlots { .. }), "{e}");
        let mut r = req(None, MapBy::PprNode(3));
        r.oversubscribe = true;
        let p = place_ok(&s, &r);
        assert_eq!(hosts_of(&p), ["a", "a", "a", "b", "b", "b"]);
        // ... but never past max_slots.
        let s = src("a slots=2 max_slots=2\nb slots=2\n");
        let e = place(&s, &r).unwrap_err();
        assert!(matches!(e, PlacementError::HostMaxSlots { .. }), "{e}");
    }

    #[test]
    fn ppn_hydra() {
        // -H a,b,c --ppn 2 -np 6 -> a a b b c c (ppn ignores slot counts).
        let s = h_arg("a,b,c");
        let r = PlacementRequest {
            np: Some(6),
            ppn: Some(2),
            ..Default::default()
        };
        let p = place_ok(&s, &r);
        assert_eq!(hosts_of(&p), ["a", "a", "b", "b", "c", "c"]);
        // Wraps around.
        let r = PlacementRequest {
            np: Some(8),
            ppn: Some(2),
            ..Default::default()
        };
        let p = place_ok(&s, &r);
        assert_eq!(hosts_of(&p), ["a", "a", "b", "b", "c", "c", "a", "a"]);
        assert_eq!(p.ranks[6].local_rank, 2);
        assert_eq!(p.ranks[0].local_size, 4);
        // No -np: ppn x hosts.
        let r = PlacementRequest {
            ppn: Some(1),
            ..Default::default()
        };
        assert_eq!(hosts_of(&place_ok(&s, &r)), ["a", "b", "c"]);
        // max_slots still binds.
        let s = src("a max_slots=1\nb\n");
        let r = PlacementRequest {
            ppn: Some(2),
            ..Default::default()
        };
        assert!(matches!(
            place(&s, &r),
            Err(PlacementError::HostMaxSlots { .. })
        ));
        // Conflicts and zero.
        let r = PlacementRequest {
            ppn: Some(2),
            map_by: Some(MapBy::Node),
            ..Default::default()
        };
        assert!(matches!(place(&s, &r), Err(PlacementError::Conflict(_))));
        let r = PlacementRequest {
            ppn: Some(0),
            ..Default::default()
        };
        assert_eq!(place(&s, &r), Err(PlacementError::ZeroPpn));
    }

    #[test]
    fn not_enough_slots_names_requested_and_available() {
        let s = src("a slots=2\nb slots=2\n");
        let e = place(&s, &req(Some(5), MapBy::Slot)).unwrap_err();
        assert_eq!(
            e,
            PlacementError::NotEnoughSlots {
                requested: 5,
                available: 4,
                nhosts: 2,
                summary: "a: 2, b: 2".into()
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("5 ranks requested") && msg.contains("only 4 slots"),
            "{msg}"
        );
        assert!(msg.contains("--oversubscribe"), "{msg}");
        assert!(place(&s, &req(Some(5), MapBy::Node)).is_err());
    }

    #[test]
    fn oversubscribe_round_robin() {
        let s = src("a slots=2\nb slots=2\n");
        let mut r = req(Some(5), MapBy::Slot);
        r.oversubscribe = true;
        assert_eq!(hosts_of(&place_ok(&s, &r)), ["a", "a", "a", "b", "b"]);
        r.np = Some(7);
        assert_eq!(
            hosts_of(&place_ok(&s, &r)),
            ["a", "a", "a", "a", "b", "b", "b"]
        );
        r.map_by = Some(MapBy::Node);
        assert_eq!(
            hosts_of(&place_ok(&s, &r)),
            ["a", "b", "a", "b", "a", "b", "a"]
        );
    }

    #[test]
    fn oversubscribe_respects_max_slots() {
        let s = src("a slots=2 max_slots=2\nb slots=2 max_slots=4\n");
        let mut r = req(Some(6), MapBy::Slot);
        r.oversubscribe = true;
        assert_eq!(hosts_of(&place_ok(&s, &r)), ["a", "a", "b", "b", "b", "b"]);
        r.map_by = Some(MapBy::Node);
        assert_eq!(hosts_of(&place_ok(&s, &r)), ["a", "b", "a", "b", "b", "b"]);
        r.np = Some(7);
        let e = place(&s, &r).unwrap_err();
        assert!(
            matches!(
                e,
                PlacementError::MaxSlotsExceeded {
                    requested: 7,
                    max: 6,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("even with --oversubscribe"), "{e}");
        // A host without max_slots absorbs the rest.
        let s = src("a slots=1 max_slots=1\nb slots=1\n");
        let mut r = req(Some(4), MapBy::Slot);
        r.oversubscribe = true;
        assert_eq!(hosts_of(&place_ok(&s, &r)), ["a", "b", "b", "b"]);
    }

    #[test]
    fn implicit_localhost_oversubscribes() {
        let s = HostSource::implicit_localhost(2);
        let p = place_ok(&s, &req(Some(4), MapBy::Slot));
        assert_eq!(hosts_of(&p), ["localhost"; 4]);
        assert_eq!(p.ranks[3].local_rank, 3);
        assert_eq!(p.ranks[3].local_size, 4);
        assert_eq!(p.nnodes(), 1);
        // Default np = CPUs (slots).
        assert_eq!(place_ok(&s, &PlacementRequest::default()).np(), 2);
        // An explicit localhost host source does not.
        let s = h_arg("localhost:2");
        assert!(matches!(
            place(&s, &req(Some(4), MapBy::Slot)),
            Err(PlacementError::NotEnoughSlots { .. })
        ));
    }

    #[test]
    fn bad_counts() {
        let s = src("a slots=2\n");
        assert_eq!(
            place(&s, &req(Some(0), MapBy::Slot)),
            Err(PlacementError::ZeroRanks)
        );
        let mut r = req(Some(MAX_RANKS + 1), MapBy::Slot);
        r.oversubscribe = true;
        assert!(matches!(
            place(&s, &r),
            Err(PlacementError::TooManyRanks { .. })
        ));
        let empty = HostSource::new(vec![], SourceKind::HostArg);
        assert_eq!(
            place(&empty, &PlacementRequest::default()),
            Err(PlacementError::NoHosts)
        );
    }

    #[test]
    fn node_rank_by_first_appearance() {
        // With ppn wrap-around and hosts in hostfile order, node_rank follows
        // first appearance in rank order.
        let s = src("b slots=1\na slots=1\n");
        let p = place_ok(&s, &req(None, MapBy::Node));
        assert_eq!(p.hosts, ["b", "a"]);
        assert_eq!(p.ranks[0].node_rank, 0);
        assert_eq!(p.ranks[1].node_rank, 1);
    }

    #[test]
    fn output_formats() {
        let s = src("alice@a slots=2\nb slots=1\n");
        let p = place_ok(&s, &PlacementRequest::default());
        let json: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        let arr = json.as_array().unwrap();
        assert_eq!(arr.len(), 3);
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&arr[2]),
            ["host", "local_rank", "local_size", "node_rank", "rank"]
        );
        assert_eq!(arr[0]["user"], "alice");
        assert_eq!(arr[2]["host"], "b");
        assert_eq!(arr[2]["node_rank"], 1);
        assert_eq!(arr[1]["local_rank"], 1);
        assert_eq!(arr[1]["local_size"], 2);
        // Serializing the Placement itself gives the same array.
        assert_eq!(serde_json::to_value(&p).unwrap(), json);

        let t = p.table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["rank", "host", "node_rank", "local_rank", "local_size"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["0", "alice@a", "0", "0", "2"]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["2", "b", "1", "0", "1"]
        );
        assert_eq!(lines[4], "3 ranks on 2 nodes");
    }

    #[test]
    fn large_placement_is_linear() {
        // 1000 hosts x 1000 slots, map-by node over a million ranks.
        let hosts = (0..1000)
            .map(|i| crate::host_source::HostEntry::new(format!("n{i}"), 1000))
            .collect();
        let s = HostSource::new(hosts, SourceKind::HostArg);
        let p = place_ok_fast(&s, &req(None, MapBy::Node));
        assert_eq!(p.np(), 1_000_000);
        assert_eq!(p.ranks[1000].host, "n0");
        assert_eq!(p.ranks[999_999].local_rank, 999);
    }

    fn place_ok_fast(s: &HostSource, r: &PlacementRequest) -> Placement {
        place(s, r).unwrap()
    }
}
