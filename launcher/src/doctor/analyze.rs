//! From a report to findings: interfaces down or missing, MTUs and subnets that differ from
//! their rail's, pairs that cannot connect, and links, rails, memory or in-node bandwidth more
//! than 20 % below their median. Pure functions over [`Report`], tested without a cluster.

use super::report::{fmt_bps, Finding, Report};
use std::collections::{BTreeMap, HashSet};

/// A figure this far below its median is named.
pub const SLOW: f64 = 0.8;

const CHECK_DOWN: &str = "the cable and the switch port (link lights), `ip link show IF` and `ip link set IF up`, `dmesg` for NIC errors";
const CHECK_MTU: &str = "set the same MTU on every interface of the rail and on the switch ports (`ip link set IF mtu N`); a mismatch drops or fragments large packets";
const CHECK_SUBNET: &str =
    "railring matches rails by subnet: give IF an address in the rail's subnet (`ip addr`)";
const CHECK_REACH: &str = "the cable, the switch port and its VLAN, both ends' address and netmask, routes and firewalls on the rail";
const CHECK_SLOW: &str = "the cable and transceiver, the switch port (speed, errors, PFC pause counters), the NIC's negotiated speed (`ethtool IF`) and error counters (`ethtool -S IF`, `ip -s link show IF`), PFC/ECN settings";
const CHECK_RAIL: &str =
    "the rail's switch (its uplinks, congestion, PFC pauses) and the NICs' settings on every node";
const CHECK_MEM: &str =
    "DIMM population and speed, NUMA and BIOS power settings, the CPU frequency governor, other load";
const CHECK_INNODE: &str = "other load on the node, CPU binding (`railrun --report-bindings`), /dev/shm size, NUMA placement";

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The value most nodes have (ties: the largest value).
fn mode<T: Ord + Clone>(v: &[T]) -> Option<T> {
    let mut c: BTreeMap<T, usize> = BTreeMap::new();
    for x in v {
        *c.entry(x.clone()).or_default() += 1;
    }
    c.into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(k, _)| k)
}

/// `10.77.10.11/24` → (network, prefix).
fn subnet(a: &str) -> Option<(u32, u8)> {
    let (ip, p) = a.split_once('/')?;
    let ip: std::net::Ipv4Addr = ip.parse().ok()?;
    let p: u8 = p.parse().ok()?;
    let mask = if p == 0 {
        0
    } else {
        u32::MAX << (32 - p.min(32))
    };
    Some((u32::from(ip) & mask, p))
}

fn fmt_subnet((n, p): (u32, u8)) -> String {
    format!("{}/{p}", std::net::Ipv4Addr::from(n))
}

fn pct_below(x: f64, m: f64) -> f64 {
    if m > 0.0 {
        (1.0 - x / m) * 100.0
    } else {
        0.0
    }
}

/// Everything wrong in `r` (and notes on what could not be compared).
pub fn analyze(r: &Report) -> (Vec<Finding>, Vec<String>) {
    let mut f = Vec::new();
    let mut notes = Vec::new();
    let host = |i: usize| {
        r.nodes
            .get(i)
            .map(|n| n.host.clone())
            .unwrap_or_else(|| format!("node {i}"))
    };
    // (node, rail) already named for its interface: its failed pairs are explained
    let mut broken: HashSet<(usize, String)> = HashSet::new();
    for rail in &r.rails {
        let nics: Vec<(usize, Option<&super::report::NicReport>)> = r
            .nodes
            .iter()
            .map(|n| (n.node, n.nics.iter().find(|x| &x.name == rail)))
            .collect();
        for (i, nic) in &nics {
            match nic {
                None => {
                    broken.insert((*i, rail.clone()));
                    f.push(Finding {
                        kind: "missing".into(),
                        host: host(*i),
                        interface: Some(rail.clone()),
                        expected: format!("an interface {rail}, as on the other nodes"),
                        measured: "no such interface".into(),
                        check: "the NIC is present and named alike on every node (udev rules), its driver loaded".into(),
                    });
                }
                Some(n) if n.state != "up" => {
                    broken.insert((*i, rail.clone()));
                    f.push(Finding {
                        kind: "down".into(),
                        host: host(*i),
                        interface: Some(rail.clone()),
                        expected: "operstate up".into(),
                        measured: format!("operstate {}", n.state),
                        check: CHECK_DOWN.replace("IF", rail),
                    });
                }
                _ => {}
            }
        }
        let present: Vec<(usize, &super::report::NicReport)> = nics
            .iter()
            .filter_map(|(i, n)| n.map(|n| (*i, n)))
            .collect();
        let mtus: Vec<u32> = present.iter().filter_map(|(_, n)| n.mtu).collect();
        if let Some(m) = mode(&mtus) {
            for (i, n) in &present {
                if let Some(x) = n.mtu.filter(|x| *x != m) {
                    f.push(Finding {
                        kind: "mtu".into(),
                        host: host(*i),
                        interface: Some(rail.clone()),
                        expected: format!("MTU {m}, as its peers on {rail}"),
                        measured: format!("MTU {x}"),
                        check: CHECK_MTU
                            .replace("IF", rail)
                            .replace(" N`", &format!(" {m}`")),
                    });
                }
            }
        }
        type Net<'a> = (usize, Option<(u32, u8)>, Option<&'a String>);
        let nets: Vec<Net> = present
            .iter()
            .map(|(i, n)| (*i, n.addrs.first().and_then(|a| subnet(a)), n.addrs.first()))
            .collect();
        let all: Vec<(u32, u8)> = nets.iter().filter_map(|x| x.1).collect();
        if let Some(m) = mode(&all) {
            for (i, net, addr) in &nets {
                if *net != Some(m) {
                    broken.insert((*i, rail.clone()));
                    f.push(Finding {
                        kind: "subnet".into(),
                        host: host(*i),
                        interface: Some(rail.clone()),
                        expected: format!(
                            "an address in {}, the subnet of {rail} on the other nodes",
                            fmt_subnet(m)
                        ),
                        measured: match addr {
                            Some(a) => format!("address {a}"),
                            None => "no IPv4 address".into(),
                        },
                        check: CHECK_SUBNET.replace("IF", rail),
                    });
                }
            }
        }
        // pairs that did not connect, beyond what a named interface explains
        let pairs: Vec<&super::report::Pair> = r.pairs.iter().filter(|p| &p.rail == rail).collect();
        let failed: Vec<&&super::report::Pair> = pairs
            .iter()
            .filter(|p| {
                p.bps.is_none()
                    && !broken.contains(&(p.from, rail.clone()))
                    && !broken.contains(&(p.to, rail.clone()))
            })
            .collect();
        let mut fails: BTreeMap<usize, usize> = BTreeMap::new();
        let mut tested: BTreeMap<usize, usize> = BTreeMap::new();
        for p in &pairs {
            *tested.entry(p.from).or_default() += 1;
            *tested.entry(p.to).or_default() += 1;
        }
        for p in &failed {
            *fails.entry(p.from).or_default() += 1;
            *fails.entry(p.to).or_default() += 1;
        }
        let isolated: HashSet<usize> = fails
            .iter()
            .filter(|(i, k)| r.nodes.len() > 2 && Some(*k) == tested.get(i))
            .map(|(i, _)| *i)
            .collect();
        for i in &isolated {
            let why: Vec<String> = failed
                .iter()
                .filter(|p| p.from == *i)
                .take(2)
                .map(|p| format!("to {}: {}", host(p.to), p.error.clone().unwrap_or_default()))
                .collect();
            f.push(Finding {
                kind: "unreachable".into(),
                host: host(*i),
                interface: Some(rail.clone()),
                expected: format!("connections to and from every peer on {rail}"),
                measured: format!("no connection with any peer ({})", why.join("; ")),
                check: CHECK_REACH.to_string(),
            });
        }
        for p in failed
            .iter()
            .filter(|p| !isolated.contains(&p.from) && !isolated.contains(&p.to))
        {
            f.push(Finding {
                kind: "unreachable".into(),
                host: host(p.from),
                interface: Some(rail.clone()),
                expected: format!("a connection to {} on {rail}", host(p.to)),
                measured: p.error.clone().unwrap_or_else(|| "no connection".into()),
                check: CHECK_REACH.to_string(),
            });
        }
    }
    // bandwidth: a node's rail link against the rail's median node, then rails against each other
    let mut rail_scores: Vec<(String, f64)> = Vec::new();
    for rail in &r.rails {
        let ok: Vec<&super::report::Pair> = r
            .pairs
            .iter()
            .filter(|p| &p.rail == rail && p.bps.is_some())
            .collect();
        let mut scores: Vec<(usize, f64, f64, f64)> = Vec::new();
        for n in &r.nodes {
            let mut s: Vec<f64> = ok
                .iter()
                .filter(|p| p.from == n.node)
                .filter_map(|p| p.bps)
                .collect();
            let mut v: Vec<f64> = ok
                .iter()
                .filter(|p| p.to == n.node)
                .filter_map(|p| p.bps)
                .collect();
            if let (Some(s), Some(v)) = (median(&mut s), median(&mut v)) {
                scores.push((n.node, s.min(v), s, v));
            }
        }
        let mut all: Vec<f64> = scores.iter().map(|x| x.1).collect();
        let Some(m) = median(&mut all) else { continue };
        rail_scores.push((rail.clone(), m));
        if scores.len() < 3 {
            notes.push(format!(
                "{rail}: {} nodes measured — a slow node needs at least 3 to be told from a slow peer",
                scores.len()
            ));
            continue;
        }
        for (i, score, s, v) in &scores {
            if *score < SLOW * m {
                f.push(Finding {
                    kind: "slow-link".into(),
                    host: host(*i),
                    interface: Some(rail.clone()),
                    expected: format!("about {} (the median node on {rail})", fmt_bps(m)),
                    measured: format!(
                        "sends at {}, receives at {} (medians of its pairs; {:.0} % below)",
                        fmt_bps(*s),
                        fmt_bps(*v),
                        pct_below(*score, m)
                    ),
                    check: CHECK_SLOW.replace("IF", rail),
                });
            }
        }
    }
    if rail_scores.len() >= 2 {
        let mut v: Vec<f64> = rail_scores.iter().map(|x| x.1).collect();
        let m = median(&mut v).unwrap_or(0.0);
        for (rail, s) in &rail_scores {
            if *s < SLOW * m {
                f.push(Finding {
                    kind: "slow-rail".into(),
                    host: "*".into(),
                    interface: Some(rail.clone()),
                    expected: format!("about {} (the median rail)", fmt_bps(m)),
                    measured: format!(
                        "{} for its median node ({:.0} % below)",
                        fmt_bps(*s),
                        pct_below(*s, m)
                    ),
                    check: CHECK_RAIL.to_string(),
                });
            }
        }
    }
    // node figures: only between nodes on different machines
    let kernels: HashSet<&str> = r.nodes.iter().map(|n| n.kernel.as_str()).collect();
    if r.nodes.len() >= 3 && kernels.len() < r.nodes.len() {
        notes.push(format!(
            "{} nodes share {} machine(s) (same boot id): memory and in-node figures are not compared",
            r.nodes.len(),
            kernels.len()
        ));
    } else if r.nodes.len() >= 3 {
        for (kind, get, unit, check) in [
            (
                "slow-memory",
                (|n: &super::report::NodeReport| n.mem_gbs)
                    as fn(&super::report::NodeReport) -> Option<f64>,
                "memory bandwidth",
                CHECK_MEM,
            ),
            (
                "slow-in-node",
                |n: &super::report::NodeReport| n.allreduce_gbs,
                "in-node all-reduce bus bandwidth",
                CHECK_INNODE,
            ),
        ] {
            let mut v: Vec<f64> = r.nodes.iter().filter_map(get).collect();
            let Some(m) = median(&mut v) else { continue };
            for n in &r.nodes {
                if let Some(x) = get(n).filter(|x| *x < SLOW * m) {
                    f.push(Finding {
                        kind: kind.into(),
                        host: n.host.clone(),
                        interface: None,
                        expected: format!("{unit} about {m:.1} GB/s (the median node)"),
                        measured: format!("{x:.1} GB/s ({:.0} % below)", pct_below(x, m)),
                        check: check.to_string(),
                    });
                }
            }
        }
    }
    (f, notes)
}

#[cfg(test)]
mod tests {
    use super::super::report::{NicReport, NodeReport, Pair};
    use super::*;

    fn node(i: usize, kernel: &str) -> NodeReport {
        NodeReport {
            node: i,
            host: format!("n{}", i + 1),
            kernel: kernel.into(),
            cpus: 2,
            numa_nodes: 1,
            nics: (0..2)
                .map(|r| NicReport {
                    name: format!("rail{r}"),
                    rail: true,
                    state: "up".into(),
                    speed_mbps: Some(10000),
                    mtu: Some(1500),
                    addrs: vec![format!("10.77.{}.{}/24", 10 + r, 11 + i)],
                })
                .collect(),
            mem_gbs: Some(20.0),
            allreduce_gbs: Some(5.0),
            local_ranks: 2,
            ..Default::default()
        }
    }

    fn healthy(n: usize) -> Report {
        let mut r = Report {
            nodes: (0..n).map(|i| node(i, "k")).collect(),
            rails: vec!["rail0".into(), "rail1".into()],
            ..Default::default()
        };
        for rail in ["rail0", "rail1"] {
            for i in 0..n {
                for j in 0..n {
                    if i != j {
                        r.pairs.push(Pair {
                            rail: rail.into(),
                            from: i,
                            to: j,
                            bps: Some(200e6 + (i * 7 + j) as f64 * 1e5),
                            lat_us: Some(40.0),
                            error: None,
                        });
                    }
                }
            }
        }
        r
    }

    #[test]
    fn a_healthy_cluster_has_no_findings() {
        let (f, notes) = analyze(&healthy(4));
        assert!(f.is_empty(), "{f:?}");
        assert!(
            notes.iter().any(|n| n.contains("share 1 machine")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_slow_host_rail_is_named_and_nothing_else() {
        let mut r = healthy(4);
        for p in &mut r.pairs {
            if p.rail == "rail1" && (p.from == 2 || p.to == 2) {
                p.bps = Some(50e6);
            }
        }
        let (f, _) = analyze(&r);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].kind.as_str(), f[0].host.as_str()),
            ("slow-link", "n3")
        );
        assert_eq!(f[0].interface.as_deref(), Some("rail1"));
        assert!(f[0].measured.contains("75 % below"), "{}", f[0].measured);
    }

    #[test]
    fn a_slow_rail_everywhere_is_named_as_the_rail() {
        let mut r = healthy(4);
        for p in &mut r.pairs {
            if p.rail == "rail0" {
                p.bps = Some(40e6);
            }
        }
        let (f, _) = analyze(&r);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].kind.as_str(), f[0].host.as_str()), ("slow-rail", "*"));
    }

    #[test]
    fn mtu_down_subnet_and_unreachable_are_named_once() {
        let mut r = healthy(4);
        r.nodes[1].nics[0].mtu = Some(1400);
        r.nodes[3].nics[1].state = "down".into();
        r.nodes[2].nics[0].addrs = vec!["10.88.0.5/24".into()];
        for p in &mut r.pairs {
            if p.rail == "rail1" && (p.from == 3 || p.to == 3) {
                p.bps = None;
                p.error = Some("connect: No route to host".into());
            }
            if p.rail == "rail0" && (p.from == 2 || p.to == 2) {
                p.bps = None;
                p.error = Some("connect: timed out".into());
            }
        }
        let (f, _) = analyze(&r);
        let got: Vec<(&str, &str, &str)> = f
            .iter()
            .map(|x| {
                (
                    x.kind.as_str(),
                    x.host.as_str(),
                    x.interface.as_deref().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("mtu", "n2", "rail0"),
                ("subnet", "n3", "rail0"),
                ("down", "n4", "rail1")
            ],
            "{f:?}"
        );
        assert!(f[0].measured == "MTU 1400" && f[0].expected.contains("MTU 1500"));
        // a pair failure no interface explains is named on the sender
        let mut r = healthy(4);
        for p in &mut r.pairs {
            if p.rail == "rail0" && p.from == 0 && p.to == 1 {
                p.bps = None;
                p.error = Some("connect: timed out".into());
            }
        }
        let (f, _) = analyze(&r);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].kind.as_str(), f[0].host.as_str()),
            ("unreachable", "n1")
        );
    }

    #[test]
    fn node_figures_are_compared_across_machines_only() {
        let mut r = healthy(4);
        for (i, n) in r.nodes.iter_mut().enumerate() {
            n.kernel = format!("k{i}");
        }
        r.nodes[1].mem_gbs = Some(8.0);
        let (f, _) = analyze(&r);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].kind.as_str(), f[0].host.as_str()),
            ("slow-memory", "n2")
        );
        r.nodes[1].kernel = "k0".into();
        let (f, notes) = analyze(&r);
        assert!(f.is_empty() && !notes.is_empty());
    }
}
