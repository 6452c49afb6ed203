//! Which network interfaces carry TCP rails ([`discover_rails`]), and the rail vocabulary
//! ([`Rail`], the `RAILRING_SOCKET_IFNAME` grammar [`IfFilter`]).
//!
//! With `RAILRING_SOCKET_IFNAME` the rails are exactly the interfaces it names. Without it:
//!
//! 1. Candidates are the IPv4 interfaces that are up, except loopback and container bridges
//!    (`docker`, `virbr`, `veth`, `br-`, `cni`, `flannel`, `cali`).
//! 2. **Management** interfaces are not rails while another candidate exists: the one holding
//!    the address of the ssh connection that started this process (`SSH_CONNECTION`: railrun's
//!    agents and the launcher's own login), the one carrying the default route, and the one
//!    holding the address this host's name has in `/etc/hosts` (the name railrun and ssh
//!    reach it by). Collective traffic belongs on its own network, apart from management and
//!    storage traffic. They are still listened on and published as *fallback* addresses, so
//!    a node without rail interfaces (a login node) can still reach this one.
//! 3. Rails are ordered by subnet, then name, so rail i is the same fabric on every node
//!    (rail i ↔ rail i) even when interface names differ; a rank connects to the peer's
//!    address on its own rail's subnet.
//!
//! What was chosen and why is logged at INFO (`railring::net`).

use serde::{Deserialize, Serialize};
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;

/// One network interface usable as a rail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rail {
    pub ifname: String,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    /// A management interface kept only as a fallback address for peers that share no rail
    /// subnet with this node: listened on and published, never a rail of its own.
    #[serde(default)]
    pub fallback: bool,
}

impl Rail {
    /// A rail (not a fallback).
    pub fn new(ifname: impl Into<String>, ip: Ipv4Addr, prefix: u8) -> Rail {
        Rail {
            ifname: ifname.into(),
            ip,
            prefix,
            fallback: false,
        }
    }
    pub fn subnet(&self) -> (u32, u8) {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix.min(32))
        };
        (u32::from(self.ip) & mask, self.prefix)
    }
    pub fn same_subnet(&self, ip: Ipv4Addr) -> bool {
        let (net, p) = self.subnet();
        let mask = if p == 0 {
            0
        } else {
            u32::MAX << (32 - p.min(32))
        };
        u32::from(ip) & mask == net
    }
}

/// An `RAILRING_SOCKET_IFNAME`-style filter (NCCL grammar): comma-separated prefixes; a leading
/// `^` excludes the listed prefixes instead; a leading `=` (after `^` if any) makes the names exact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfFilter {
    pub fn parse(s: &str) -> IfFilter {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s
            .split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect();
        IfFilter {
            exclude,
            exact,
            names,
        }
    }
    pub fn matches(&self, ifname: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                ifname == n
            } else {
                ifname.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// Container bridges and virtual links that never carry rails automatically.
const CONTAINER_PREFIXES: [&str; 7] = ["docker", "virbr", "veth", "br-", "cni", "flannel", "cali"];

/// What marks an interface as management (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MgmtHints {
    /// The server address of `SSH_CONNECTION`.
    pub ssh_server: Option<Ipv4Addr>,
    /// Interfaces carrying the default route (`/proc/net/route`).
    pub default_route: Vec<String>,
    /// Addresses this host's name has in `/etc/hosts`.
    pub hostname_addrs: Vec<Ipv4Addr>,
}

impl MgmtHints {
    /// This process's hints: `SSH_CONNECTION` (read by `config`), `/proc/net/route`,
    /// `/etc/hosts` and the host name.
    pub fn of_this_process() -> MgmtHints {
        let name = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        MgmtHints {
            ssh_server: crate::config::ssh_server_addr(),
            default_route: read_small(Path::new("/proc/net/route"))
                .map(|t| default_route_ifaces(&t))
                .unwrap_or_default(),
            hostname_addrs: read_small(Path::new("/etc/hosts"))
                .map(|t| hosts_addrs(&t, &name))
                .unwrap_or_default(),
        }
    }

    /// Why `r` is management, if it is.
    fn why(&self, r: &Rail) -> Option<String> {
        let mut why = Vec::new();
        if self.ssh_server == Some(r.ip) {
            why.push("it holds the address of the ssh connection that started this process (SSH_CONNECTION)");
        }
        if self.default_route.contains(&r.ifname) {
            why.push("it carries the default route");
        }
        if self.hostname_addrs.contains(&r.ip) {
            why.push("it holds this host's name in /etc/hosts");
        }
        (!why.is_empty()).then(|| why.join(" and "))
    }
}

/// A text file of at most 1 MiB.
fn read_small(p: &Path) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(p)
        .ok()?
        .take(1 << 20)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// Interfaces of `/proc/net/route` lines whose destination and mask are 0 (default routes).
pub fn default_route_ifaces(route: &str) -> Vec<String> {
    let mut v: Vec<String> = route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
        })
        .collect();
    v.dedup();
    v
}

/// The IPv4 addresses `/etc/hosts` gives host `name` (full or short form).
pub fn hosts_addrs(hosts: &str, name: &str) -> Vec<Ipv4Addr> {
    if name.is_empty() {
        return Vec::new();
    }
    let short = name.split('.').next().unwrap_or(name);
    let mut v = Vec::new();
    for line in hosts.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut it = line.split_whitespace();
        let Some(ip) = it.next().and_then(|a| a.parse::<Ipv4Addr>().ok()) else {
            continue;
        };
        if ip.is_loopback() {
            continue;
        }
        if it.any(|n| n.eq_ignore_ascii_case(name) || n.eq_ignore_ascii_case(short))
            && !v.contains(&ip)
        {
            v.push(ip);
        }
    }
    v
}

/// The IPv4 interfaces that are up, one address each (the lowest), sorted by name.
fn up_interfaces() -> io::Result<Vec<Rail>> {
    let mut rails = Vec::new();
    let addrs = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    for ifa in addrs {
        let Some(addr) = ifa
            .address
            .as_ref()
            .and_then(|a| a.as_sockaddr_in().map(|s| s.ip()))
        else {
            continue;
        };
        if !ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP) {
            continue;
        }
        let prefix = ifa
            .netmask
            .as_ref()
            .and_then(|m| {
                m.as_sockaddr_in()
                    .map(|s| u32::from(s.ip()).count_ones() as u8)
            })
            .unwrap_or(32);
        rails.push(Rail::new(ifa.interface_name.clone(), addr, prefix));
    }
    rails.sort_by(|a, b| a.ifname.cmp(&b.ifname).then(a.ip.cmp(&b.ip)));
    rails.dedup_by(|a, b| a.ifname == b.ifname);
    Ok(rails)
}

/// The interfaces that carry rails (see the module docs), rails first in subnet order, then
/// the fallback (management) addresses; loopback when nothing else exists.
pub fn discover_rails(filter: Option<&str>) -> io::Result<Vec<Rail>> {
    let ifaces = up_interfaces()?;
    let hints = if filter.is_none() {
        MgmtHints::of_this_process()
    } else {
        MgmtHints::default()
    };
    let (rails, why) = choose_rails(ifaces, filter, &hints)?;
    tracing::info!(target: "railring::net", "{why}");
    Ok(rails)
}

/// [`discover_rails`] over given interfaces and hints: the rails and a sentence saying why.
pub fn choose_rails(
    ifaces: Vec<Rail>,
    filter: Option<&str>,
    hints: &MgmtHints,
) -> io::Result<(Vec<Rail>, String)> {
    let show = |v: &[Rail]| {
        v.iter()
            .map(|r| format!("{} {}/{}", r.ifname, r.ip, r.prefix))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let by_subnet = |v: &mut Vec<Rail>| {
        v.sort_by(|a, b| a.subnet().cmp(&b.subnet()).then(a.ifname.cmp(&b.ifname)))
    };
    if let Some(f) = filter {
        let fl = IfFilter::parse(f);
        let mut chosen: Vec<Rail> = ifaces
            .iter()
            .filter(|r| fl.matches(&r.ifname))
            .cloned()
            .collect();
        if chosen.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "RAILRING_SOCKET_IFNAME={f} matches no IPv4 interface that is up (have: {})",
                    ifaces
                        .iter()
                        .map(|r| r.ifname.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        by_subnet(&mut chosen);
        let why = format!("rails from RAILRING_SOCKET_IFNAME={f}: {}", show(&chosen));
        return Ok((chosen, why));
    }
    let mut skipped: Vec<String> = Vec::new();
    let mut candidates = Vec::new();
    for r in ifaces {
        if r.ip.is_loopback() {
            continue;
        }
        if CONTAINER_PREFIXES.iter().any(|p| r.ifname.starts_with(p)) {
            skipped.push(format!("{} (container bridge or link)", r.ifname));
            continue;
        }
        candidates.push(r);
    }
    if candidates.is_empty() {
        let why = "rails: no interface but loopback: rail lo 127.0.0.1/8".to_string();
        return Ok((vec![Rail::new("lo", Ipv4Addr::LOCALHOST, 8)], why));
    }
    /// An interface and why it is management (empty: it is not).
    type Judged = Vec<(Rail, String)>;
    let (mut mgmt, mut rails): (Judged, Judged) = candidates
        .into_iter()
        .map(|r| {
            let w = hints.why(&r).unwrap_or_default();
            (r, w)
        })
        .partition(|(_, w)| !w.is_empty());
    let mut why = String::new();
    if rails.is_empty() {
        // Management is all there is: it carries the rails.
        rails = std::mem::take(&mut mgmt);
        why.push_str(" (only management interfaces exist, so they carry the rails)");
    }
    let mut rails: Vec<Rail> = rails.into_iter().map(|x| x.0).collect();
    by_subnet(&mut rails);
    let mut out = rails.clone();
    let mut text = format!("rails (automatic, by subnet): {}{why}", show(&rails));
    if !mgmt.is_empty() {
        let mut fb: Vec<Rail> = Vec::new();
        let mut said = Vec::new();
        for (mut r, w) in mgmt {
            said.push(format!("{} {} ({w})", r.ifname, r.ip));
            r.fallback = true;
            fb.push(r);
        }
        by_subnet(&mut fb);
        out.extend(fb);
        text.push_str(&format!(
            "; not rails, management: {} — kept only as fallback addresses for peers without a rail subnet",
            said.join(", ")
        ));
    }
    if !skipped.is_empty() {
        text.push_str(&format!("; left out: {}", skipped.join(", ")));
    }
    text.push_str("; set RAILRING_SOCKET_IFNAME to choose");
    Ok((out, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifc(name: &str, ip: [u8; 4], prefix: u8) -> Rail {
        Rail::new(name, Ipv4Addr::from(ip), prefix)
    }

    fn names(v: &[Rail]) -> Vec<(&str, bool)> {
        v.iter().map(|r| (r.ifname.as_str(), r.fallback)).collect()
    }

    /// The emulated cluster's n1: mgmt0 (ssh), rail0, rail1.
    fn n1() -> Vec<Rail> {
        vec![
            ifc("lo", [127, 0, 0, 1], 8),
            ifc("mgmt0", [10, 77, 0, 11], 24),
            ifc("rail0", [10, 77, 10, 11], 24),
            ifc("rail1", [10, 77, 11, 11], 24),
        ]
    }

    #[test]
    fn management_is_not_a_rail_while_rails_exist() {
        let hints = MgmtHints {
            ssh_server: Some(Ipv4Addr::new(10, 77, 0, 11)),
            ..Default::default()
        };
        let (r, why) = choose_rails(n1(), None, &hints).unwrap();
        assert_eq!(
            names(&r),
            [("rail0", false), ("rail1", false), ("mgmt0", true)]
        );
        assert!(
            why.contains("SSH_CONNECTION") && why.contains("mgmt0"),
            "{why}"
        );
        // The same by the default route, or by the host name's address.
        let hints = MgmtHints {
            default_route: vec!["mgmt0".into()],
            ..Default::default()
        };
        let (r, why) = choose_rails(n1(), None, &hints).unwrap();
        assert_eq!(names(&r)[2], ("mgmt0", true));
        assert!(why.contains("default route"), "{why}");
        let hints = MgmtHints {
            hostname_addrs: vec![Ipv4Addr::new(10, 77, 0, 11)],
            ..Default::default()
        };
        assert_eq!(
            names(&choose_rails(n1(), None, &hints).unwrap().0)[2],
            ("mgmt0", true)
        );
        // No hint: every candidate is a rail, by subnet.
        let (r, _) = choose_rails(n1(), None, &MgmtHints::default()).unwrap();
        assert_eq!(
            names(&r),
            [("mgmt0", false), ("rail0", false), ("rail1", false)]
        );
    }

    #[test]
    fn only_management_still_carries_rails() {
        let v = vec![
            ifc("lo", [127, 0, 0, 1], 8),
            ifc("eth0", [192, 168, 1, 5], 24),
        ];
        let hints = MgmtHints {
            default_route: vec!["eth0".into()],
            ..Default::default()
        };
        let (r, why) = choose_rails(v, None, &hints).unwrap();
        assert_eq!(names(&r), [("eth0", false)]);
        assert!(why.contains("only management"), "{why}");
        let (r, _) = choose_rails(vec![ifc("lo", [127, 0, 0, 1], 8)], None, &hints).unwrap();
        assert_eq!(names(&r), [("lo", false)]);
    }

    #[test]
    fn rails_are_ordered_by_subnet_so_rail_i_is_one_fabric() {
        // Names differ between nodes; subnets do not.
        let a = vec![ifc("ib1", [10, 1, 1, 5], 24), ifc("ib0", [10, 1, 2, 5], 24)];
        let b = vec![
            ifc("ens7", [10, 1, 2, 6], 24),
            ifc("ens3", [10, 1, 1, 6], 24),
        ];
        let (ra, _) = choose_rails(a, None, &MgmtHints::default()).unwrap();
        let (rb, _) = choose_rails(b, None, &MgmtHints::default()).unwrap();
        for (x, y) in ra.iter().zip(&rb) {
            assert_eq!(x.subnet(), y.subnet());
        }
        assert_eq!(ra[0].ifname, "ib1");
        assert_eq!(rb[0].ifname, "ens3");
    }

    #[test]
    fn filter_and_containers() {
        let mut v = n1();
        v.push(ifc("docker0", [172, 17, 0, 1], 16));
        let (r, why) = choose_rails(v.clone(), None, &MgmtHints::default()).unwrap();
        assert!(!r.iter().any(|x| x.ifname == "docker0"));
        assert!(why.contains("docker0 (container"), "{why}");
        let (r, _) = choose_rails(v.clone(), Some("=mgmt0"), &MgmtHints::default()).unwrap();
        assert_eq!(names(&r), [("mgmt0", false)]);
        let e = choose_rails(v, Some("ib"), &MgmtHints::default()).unwrap_err();
        assert!(e.to_string().contains("RAILRING_SOCKET_IFNAME=ib"), "{e}");
    }

    #[test]
    fn proc_route_and_etc_hosts() {
        let route = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                     eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\n\
                     eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n\
                     ib0\t00000A0A\t00000000\t0001\t0\t0\t0\t0000FFFF\n";
        assert_eq!(default_route_ifaces(route), ["eth0"]);
        let hosts = "127.0.0.1 localhost\n127.0.1.1 n1.cluster n1\n10.77.0.11\tn1 # mgmt\n10.77.10.11 n1-rail0\n::1 localhost\n";
        assert_eq!(hosts_addrs(hosts, "n1"), [Ipv4Addr::new(10, 77, 0, 11)]);
        assert_eq!(
            hosts_addrs(hosts, "n1.cluster"),
            [Ipv4Addr::new(10, 77, 0, 11)]
        );
        assert!(hosts_addrs(hosts, "").is_empty());
    }

    #[test]
    fn ifname_grammar() {
        let f = IfFilter::parse("rail,eth");
        assert!(f.matches("rail0") && f.matches("eth1") && !f.matches("mgmt0"));
        let f = IfFilter::parse("^docker,lo");
        assert!(!f.matches("docker0") && !f.matches("lo") && f.matches("eth0"));
        let f = IfFilter::parse("=eth0");
        assert!(f.matches("eth0") && !f.matches("eth01"));
        let f = IfFilter::parse("^=eth0");
        assert!(!f.matches("eth0") && f.matches("eth01"));
    }

    #[test]
    fn subnets() {
        let r = ifc("rail0", [10, 77, 10, 11], 24);
        assert!(r.same_subnet(Ipv4Addr::new(10, 77, 10, 12)));
        assert!(!r.same_subnet(Ipv4Addr::new(10, 77, 11, 12)));
        // A fallback published by an older peer without the field still parses.
        let old: Rail =
            serde_json::from_str(r#"{"ifname":"a","ip":"10.0.0.1","prefix":8}"#).unwrap();
        assert!(!old.fallback);
    }
}
