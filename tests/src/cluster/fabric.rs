//! Emulated leaf/spine fabrics: hosts under several leaf switches joined by spine switches, built
//! from a [`Fabric`] (the same description `railrun plan` prices; docs/fabric.md).
//!
//! - Leaves and spines are network namespaces that route (L3): `rrT-l<i>`, `rrT-s<j>`, with
//!   `ip_forward=1`, `rp_filter=0` and IPv6 off.
//! - NIC r of host nK is `rail<r>` = 10.77.(10+r).(10+K)/24 (as on a flat cluster, so the runtime
//!   matches rails by subnet), without the on-link route: the /24 goes via the gateway
//!   10.77.(10+r).1, which every leaf port answers for. Its leaf port is `h<K>r<r>` with a /32
//!   route back to the host. Rail-optimized wiring puts NIC r of every node of a scalable unit
//!   on the unit's leaf r; otherwise every NIC of a node is on the node's leaf.
//! - Leaf i and spine j are joined by a veth pair (`s<j>` on the leaf, `l<i>` on the spine) with
//!   a /30 from 10.77.128.0/17. A leaf reaches the rest of the fabric through one multipath
//!   route over all its spines, hashed on the 5-tuple (`fib_multipath_hash_policy=1`): real
//!   ECMP, real collisions. A spine has a /32 route to every NIC via the NIC's leaf.
//! - Every link is shaped with `tc tbf` in both directions at its own rate: host → leaf and
//!   leaf → host at the NIC rate, leaf → spine and spine → leaf at the spine link rate, so 1:1
//!   and 3:1 oversubscription are real.
//!
//! Two tiers only (leaves and spines); 3-tier fabrics are for `railrun plan`. The fabric's ECMP
//! mode and efficiency are the planner's: the emulation hashes like Linux does.

use super::cmd::run_cmd;
use super::{Cluster, MAX_HOSTS, MAX_RAILS};
use railring_collectives::fabric::Fabric;
use std::net::Ipv4Addr;
use std::process::Command;

/// Most leaf–spine links an emulated fabric may have (each gets a /30 in 10.77.128.0/17).
pub const MAX_UPLINKS: usize = 8000;

/// What the emulation needs of a fabric.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Emu {
    pub(super) nodes: usize,
    pub(super) nics: usize,
    pub(super) leaves: usize,
    pub(super) spines: usize,
    /// `leaf_of[node][nic]`.
    pub(super) leaf_of: Vec<Vec<usize>>,
    /// Bytes per second.
    pub(super) nic_rate: f64,
    pub(super) up_rate: f64,
}

impl Emu {
    /// The emulation of `f`, or why it cannot be emulated.
    pub(super) fn of(f: &Fabric) -> Result<Emu, String> {
        f.validate().map_err(|e| e.to_string())?;
        if f.core.is_some() {
            return Err(format!(
                "fabric {}: the emulation builds leaf/spine fabrics (2 tiers); a core tier is for railrun plan only",
                f.name
            ));
        }
        if f.nodes > MAX_HOSTS || f.nics > MAX_RAILS {
            return Err(format!(
                "fabric {}: {} nodes x {} NICs; the emulation has at most {MAX_HOSTS} hosts and {MAX_RAILS} rails",
                f.name, f.nodes, f.nics
            ));
        }
        let leaves = f.leaves();
        let spines = f.spines();
        if leaves * spines > MAX_UPLINKS || leaves > 4096 || spines > 1024 {
            return Err(format!(
                "fabric {}: {leaves} leaves x {spines} spines is too many to emulate",
                f.name
            ));
        }
        let leaf_of = (0..f.nodes)
            .map(|n| (0..f.nics).map(|r| f.leaf_of(n, r)).collect())
            .collect();
        Ok(Emu {
            nodes: f.nodes,
            nics: f.nics,
            leaves,
            spines,
            leaf_of,
            nic_rate: f.nic.bw,
            up_rate: f.spine.map_or(0.0, |s| s.link_bw),
        })
    }

    /// `key=value` lines for the cluster's state file.
    pub(super) fn state(&self) -> String {
        let leaf_of: Vec<String> = self
            .leaf_of
            .iter()
            .map(|v| {
                v.iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        format!(
            "fabric.nodes={}\nfabric.nics={}\nfabric.leaves={}\nfabric.spines={}\nfabric.nic_rate={}\nfabric.up_rate={}\nfabric.leaf_of={}\n",
            self.nodes,
            self.nics,
            self.leaves,
            self.spines,
            self.nic_rate,
            self.up_rate,
            leaf_of.join(";")
        )
    }

    /// Back from the state file's key-value pairs (`None` for a flat cluster).
    pub(super) fn from_state(kv: &[(String, String)]) -> Option<Emu> {
        let get = |k: &str| kv.iter().find(|(a, _)| a == k).map(|(_, b)| b.as_str());
        let num = |k: &str| get(k)?.parse::<usize>().ok();
        let rate = |k: &str| get(k)?.parse::<f64>().ok();
        let leaf_of: Vec<Vec<usize>> = get("fabric.leaf_of")?
            .split(';')
            .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
            .collect();
        Some(Emu {
            nodes: num("fabric.nodes")?,
            nics: num("fabric.nics")?,
            leaves: num("fabric.leaves")?,
            spines: num("fabric.spines")?,
            leaf_of,
            nic_rate: rate("fabric.nic_rate")?,
            up_rate: rate("fabric.up_rate")?,
        })
    }
}

/// The leaf side (.1) and spine side (.2) of the /30 of the link between leaf `l` and spine `s`.
fn uplink_addrs(e: &Emu, l: usize, s: usize) -> (Ipv4Addr, Ipv4Addr) {
    let i = l * e.spines + s;
    let (hi, lo) = (128 + i / 64, 4 * (i % 64));
    (
        Ipv4Addr::new(10, 77, hi as u8, (lo + 1) as u8),
        Ipv4Addr::new(10, 77, hi as u8, (lo + 2) as u8),
    )
}

fn gateway(rail: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (10 + rail) as u8, 1)
}

/// A `tc` rate in bits per second.
fn tc_rate(bytes_per_s: f64) -> String {
    format!("{}bit", (bytes_per_s * 8.0).round() as u64)
}

/// `qdisc add dev DEV root tbf ...` at `bytes_per_s`, with the flat cluster's burst rule.
fn tbf(dev: &str, bytes_per_s: f64) -> String {
    let burst = ((bytes_per_s * 0.010) as u64).max(128 * 1024);
    format!(
        "qdisc add dev {dev} root tbf rate {} burst {burst} latency 50ms\n",
        tc_rate(bytes_per_s)
    )
}

const ROUTER_SYSCTLS: &str = "for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do [ -e $f ] && echo 1 > $f; done; \
     echo 1 > /proc/sys/net/ipv4/ip_forward; \
     echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter; echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter; \
     echo 1 > /proc/sys/net/ipv4/fib_multipath_hash_policy";

impl Cluster {
    fn leaf_ns(&self, l: usize) -> String {
        format!("rr{}-l{l}", self.tag)
    }

    fn spine_ns(&self, s: usize) -> String {
        format!("rr{}-s{s}", self.tag)
    }

    /// Leaves, spines, their links and routes, the hosts' rails, and the shaping. Runs after
    /// the management network is up (the hosts' namespaces exist).
    pub(super) fn add_fabric(&self, e: &Emu) -> Result<(), String> {
        let ip = self.tools.ip.clone();
        let tc = self.tools.tc.clone().ok_or("tc not found (iproute2)")?;
        let ns_all: Vec<String> = (0..e.leaves)
            .map(|l| self.leaf_ns(l))
            .chain((0..e.spines).map(|s| self.spine_ns(s)))
            .collect();
        for ns in &ns_all {
            run_cmd(Command::new(&ip).args(["netns", "add", ns]), None)?;
            run_cmd(
                Command::new(&ip).args(["netns", "exec", ns, "sh", "-c", ROUTER_SYSCTLS]),
                None,
            )?;
        }
        // links: host NICs to leaves, leaves to spines
        let mut leaf_batch = vec![String::from("link set lo up\n"); e.leaves];
        let mut spine_batch = vec![String::from("link set lo up\n"); e.spines];
        let mut leaf_tc = vec![String::new(); e.leaves];
        let mut spine_tc = vec![String::new(); e.spines];
        let mut host_batches: Vec<(String, String, String)> = Vec::new();
        for h in self.hosts.iter().filter(|h| h.index > 0) {
            let k = h.index;
            let node = k - 1;
            let mut hb = String::new();
            let mut ht = String::new();
            for r in 0..e.nics {
                let l = e.leaf_of[node][r];
                let port = format!("h{k}r{r}");
                leaf_batch[l].push_str(&format!(
                    "link add {port} type veth peer name rail{r} netns {ns}\n\
                     addr add {gw}/32 dev {port}\n\
                     link set {port} up\n\
                     route add {host}/32 dev {port} scope link\n",
                    ns = h.ns,
                    gw = gateway(r),
                    host = super::net::rail_addr_of(k, r),
                ));
                leaf_tc[l].push_str(&tbf(&port, e.nic_rate));
                hb.push_str(&format!(
                    "addr add {a}/24 dev rail{r} noprefixroute\n\
                     link set rail{r} up\n\
                     route add {gw}/32 dev rail{r} scope link\n\
                     route add 10.77.{sub}.0/24 via {gw} dev rail{r}\n",
                    a = super::net::rail_addr_of(k, r),
                    gw = gateway(r),
                    sub = 10 + r
                ));
                ht.push_str(&tbf(&format!("rail{r}"), e.nic_rate));
            }
            // the leaf side makes the veth; the host configures its end afterwards
            host_batches.push((h.ns.clone(), hb, ht));
        }
        for l in 0..e.leaves {
            for s in 0..e.spines {
                let (la, sa) = uplink_addrs(e, l, s);
                leaf_batch[l].push_str(&format!(
                    "link add s{s} type veth peer name l{l} netns {sns}\n\
                     addr add {la}/30 dev s{s}\n\
                     link set s{s} up\n",
                    sns = self.spine_ns(s)
                ));
                spine_batch[s].push_str(&format!("addr add {sa}/30 dev l{l}\nlink set l{l} up\n"));
                leaf_tc[l].push_str(&tbf(&format!("s{s}"), e.up_rate));
                spine_tc[s].push_str(&tbf(&format!("l{l}"), e.up_rate));
            }
        }
        for (l, b) in leaf_batch.iter().enumerate() {
            run_cmd(
                Command::new(&ip).args(["-n", &self.leaf_ns(l), "-batch", "-"]),
                Some(b),
            )?;
        }
        for (s, b) in spine_batch.iter().enumerate() {
            run_cmd(
                Command::new(&ip).args(["-n", &self.spine_ns(s), "-batch", "-"]),
                Some(b),
            )?;
        }
        // routes: each leaf to everything else over all its spines (ECMP); each spine to every
        // NIC via the NIC's leaf
        if e.spines > 0 {
            for l in 0..e.leaves {
                let hops: Vec<String> = (0..e.spines)
                    .map(|s| format!("nexthop via {} dev s{s} weight 1", uplink_addrs(e, l, s).1))
                    .collect();
                run_cmd(
                    Command::new(&ip).args(["-n", &self.leaf_ns(l), "-batch", "-"]),
                    Some(&format!("route add 10.77.0.0/16 {}\n", hops.join(" "))),
                )?;
            }
            for s in 0..e.spines {
                let mut b = String::new();
                for (node, nics) in e.leaf_of.iter().enumerate() {
                    for (r, &l) in nics.iter().enumerate() {
                        b.push_str(&format!(
                            "route add {}/32 via {} dev l{l}\n",
                            super::net::rail_addr_of(node + 1, r),
                            uplink_addrs(e, l, s).0
                        ));
                    }
                }
                run_cmd(
                    Command::new(&ip).args(["-n", &self.spine_ns(s), "-batch", "-"]),
                    Some(&b),
                )?;
            }
        }
        // the hosts' ends, now that the leaves made them
        for (h, hb, ht) in host_batches {
            run_cmd(Command::new(&ip).args(["-n", &h, "-batch", "-"]), Some(&hb))?;
            run_cmd(Command::new(&tc).args(["-n", &h, "-batch", "-"]), Some(&ht))?;
        }
        for (l, t) in leaf_tc.iter().enumerate() {
            if !t.is_empty() {
                run_cmd(
                    Command::new(&tc).args(["-n", &self.leaf_ns(l), "-batch", "-"]),
                    Some(t),
                )?;
            }
        }
        for (s, t) in spine_tc.iter().enumerate() {
            if !t.is_empty() {
                run_cmd(
                    Command::new(&tc).args(["-n", &self.spine_ns(s), "-batch", "-"]),
                    Some(t),
                )?;
            }
        }
        Ok(())
    }

    /// Bytes leaf `leaf` sent up to spine `spine` (tx of its `s<spine>`), for telling which
    /// uplink ECMP put the flows on. `Err` on a cluster without a fabric.
    pub fn uplink_tx_bytes(&self, leaf: usize, spine: usize) -> Result<u64, String> {
        let e = self.fabric.as_ref().ok_or("not a fabric cluster")?;
        if leaf >= e.leaves || spine >= e.spines {
            return Err(format!("no uplink leaf {leaf} -> spine {spine}"));
        }
        let out = run_cmd(
            Command::new(&self.tools.ip).args([
                "-n",
                &self.leaf_ns(leaf),
                "-s",
                "-j",
                "link",
                "show",
                "dev",
                &format!("s{spine}"),
            ]),
            None,
        )?;
        let v: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("ip -j link: {e}"))?;
        v[0]["stats64"]["tx"]["bytes"]
            .as_u64()
            .ok_or_else(|| format!("ip -j link: no tx bytes in {out}"))
    }

    /// (leaves, spines) of a fabric cluster.
    pub fn fabric_size(&self) -> Option<(usize, usize)> {
        self.fabric.as_ref().map(|e| (e.leaves, e.spines))
    }

    /// The leaf NIC `rail` of host `nK` hangs off (fabric clusters).
    pub fn leaf_of(&self, host: &str, rail: usize) -> Option<usize> {
        let k: usize = host.strip_prefix('n')?.parse().ok()?;
        self.fabric
            .as_ref()?
            .leaf_of
            .get(k.checked_sub(1)?)?
            .get(rail)
            .copied()
    }

    /// The leaves and spines, for `emucluster up` (empty for a flat cluster).
    pub fn describe_fabric(&self) -> String {
        let Some(e) = &self.fabric else {
            return String::new();
        };
        let mut s = format!(
            "fabric: {} leaves, {} spines; NICs at {}, leaf-spine links at {} each way; ECMP over the spines (L4 hash)\n",
            e.leaves,
            e.spines,
            tc_rate(e.nic_rate),
            tc_rate(e.up_rate)
        );
        for l in 0..e.leaves {
            let ports: Vec<String> = e
                .leaf_of
                .iter()
                .enumerate()
                .flat_map(|(n, v)| {
                    v.iter()
                        .enumerate()
                        .filter(move |(_, &x)| x == l)
                        .map(move |(r, _)| format!("n{}/rail{r}", n + 1))
                })
                .collect();
            s.push_str(&format!(
                "  leaf {l} (netns {}): {}\n",
                self.leaf_ns(l),
                ports.join(" ")
            ));
        }
        s
    }
}
