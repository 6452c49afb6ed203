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
//! * `--ppn N` (Hydra `-ppn`): N consecutive ranks per host, then the next
//!   host, wrapping around to the first host. Like Hydra it ignores slot
//!   counts; only `max_slots` limits it.
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

use crate::host_source::{HostEntry, HostSource};

/// Most ranks one job may have.
pub const MAX_RANKS: usize = 1_000_000;

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
}

impl MapBy {
    /// Parse `slot`, `node`, `ppr:N:node` (case-insensitive; `byslot` and
    /// `bynode` also accepted).
    pub fn parse(s: &str) -> Result<MapBy, PlacementError> {
        let bad = || PlacementError::BadMapBy(s.chars().take(60).collect());
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "slot" | "byslot" => Ok(MapBy::Slot),
            "node" | "bynode" => Ok(MapBy::Node),
            _ => {
                let mut it = t.split(':');
                match (it.next(), it.next(), it.next(), it.next()) {
                    (Some("ppr"), Some(n), Some("node"), None)
                        if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) =>
                    {
                        match n.parse::<usize>() {
                            Ok(v) if (1..=MAX_RANKS).contains(&v) => Ok(MapBy::PprNode(v)),
                            _ => Err(bad()),
                        }
                    }
                    _ => Err(bad()),
                }
            }
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
        }
    }
}

/// What the user asked for on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementRequest {
    /// `-np/-n`; `None` = derive from slots (or ppr/ppn × hosts).
    pub np: Option<usize>,
    /// `--ppn/-ppn`: ranks per host, consecutive, wrapping around.
    pub ppn: Option<usize>,
    /// `--map-by`.
    pub map_by: MapBy,
    /// `--oversubscribe`.
    pub oversubscribe: bool,
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
    #[error("--map-by `{0}`: unsupported; expected `slot`, `node` or `ppr:N:node` (N >= 1)")]
    BadMapBy(String),
    #[error("-np 0: expected at least 1 rank")]
    ZeroRanks,
    #[error("--ppn 0: expected at least 1 rank per host")]
    ZeroPpn,
    #[error("{0}")]
    Conflict(String),
    #[error("no hosts to place ranks on")]
    NoHosts,
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
    #[error("--map-by ppr:{per_node}:node on {nhosts} host(s) places at most {max} ranks, but -np {requested} was requested")]
    PprTooManyRanks {
        requested: usize,
        per_node: usize,
        nhosts: usize,
        max: usize,
    },
    #[error("--map-by ppr:{per_node}:node puts {count} ranks on {host}, which has {slots} slot(s); add --oversubscribe to run more ranks than slots")]
    PprExceedsSlots {
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
pub fn place(src: &HostSource, req: &PlacementRequest) -> Result<Placement, PlacementError> {
    let hosts = &src.hosts;
    if hosts.is_empty() {
        return Err(PlacementError::NoHosts);
    }
    if req.np == Some(0) {
        return Err(PlacementError::ZeroRanks);
    }
    let allow_over = req.oversubscribe || src.is_implicit();
    let assign = if let Some(ppn) = req.ppn {
        assign_ppn(hosts, req, ppn)?
    } else if let MapBy::PprNode(per) = req.map_by {
        assign_ppr(hosts, req.np, per, allow_over)?
    } else {
        assign_slots(src, req, allow_over)?
    };
    Ok(number_ranks(hosts, &assign))
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
    if req.map_by != MapBy::Slot {
        return Err(PlacementError::Conflict(format!(
            "--ppn {ppn} cannot be combined with --map-by {}; use one of them",
            req.map_by
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
) -> Result<Vec<usize>, PlacementError> {
    let nh = hosts.len();
    let max = per.saturating_mul(nh);
    let np = np.unwrap_or(max);
    if np > max {
        return Err(PlacementError::PprTooManyRanks {
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
                    how: format!("--map-by ppr:{per}:node"),
                });
            }
        }
        if count > h.slots && !allow_over {
            return Err(PlacementError::PprExceedsSlots {
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
        MapBy::Node => round_robin(
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
        MapBy::Node => order,
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
            map_by,
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
        for bad in [
            "",
            "core",
            "ppr:0:node",
            "ppr:x:node",
            "ppr:2:socket",
            "ppr:2",
            "ppr::node",
        ] {
            let e = MapBy::parse(bad).unwrap_err();
            assert!(e.to_string().contains("expected `slot`"), "{bad}: {e}");
        }
        assert_eq!(MapBy::PprNode(3).to_string(), "ppr:3:node");
        assert_eq!(MapBy::default(), MapBy::Slot);
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
            map_by: MapBy::Node,
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
        r.map_by = MapBy::Node;
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
        r.map_by = MapBy::Node;
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
