//! Fabric files: a JSON description of a cluster's network (docs/fabric.md), read into the
//! collectives crate's [`Fabric`] plus the host names of its nodes (for fabric-aware placement).
//!
//! Every number is checked where it is read, so a bad value is reported as
//! `FILE:LINE:COLUMN: what is wrong`; unknown keys are errors (a typo must not silently become
//! a default). The file is read up to [`MAX_FILE_BYTES`]; counts and the fabric's size are
//! bounded ([`railring_collectives::fabric::MAX_RANKS`], `MAX_LINKS`) before anything is
//! allocated for them.

use railring_collectives::fabric::{
    CoreTier, Ecmp, Fabric, LinkSpec, SpineTier, Wiring, MAX_RANKS,
};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::io::Read;
use std::path::Path;

/// Largest fabric file read.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// Largest count (nodes, ranks per node, NICs, spines, ...) in a file.
pub const MAX_COUNT: u64 = 4_000_000;

/// A fabric file, read.
#[derive(Clone, Debug, PartialEq)]
pub struct FabricFile {
    pub fabric: Fabric,
    /// Host names of nodes 0.. (when the file names its hosts).
    pub hosts: Option<Vec<String>>,
    pub description: String,
}

/// A whole number in 1..=[`MAX_COUNT`].
#[derive(Clone, Copy, Debug, PartialEq)]
struct Count(usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u64::deserialize(d)?;
        if v == 0 || v > MAX_COUNT {
            return Err(de::Error::custom(format!(
                "{v}: expected a whole number from 1 to {MAX_COUNT}"
            )));
        }
        Ok(Count(v as usize))
    }
}

/// A finite number > 0 (`zero_ok`: ≥ 0) and at most 1e9.
fn number<'de, D: Deserializer<'de>>(d: D, zero_ok: bool) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    let ok = v.is_finite() && v <= 1e9 && if zero_ok { v >= 0.0 } else { v > 0.0 };
    if !ok {
        return Err(de::Error::custom(format!(
            "{v}: expected a number {} 0 and at most 1e9",
            if zero_ok { ">=" } else { ">" }
        )));
    }
    Ok(v)
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Positive(f64);
impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number(d, false).map(Positive)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct NonNeg(f64);
impl<'de> Deserialize<'de> for NonNeg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number(d, true).map(NonNeg)
    }
}

/// A link's rate: exactly one of `gbit_per_s` or `gbyte_per_s`, and a latency.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    gbit_per_s: Option<Positive>,
    gbyte_per_s: Option<Positive>,
    latency_us: Option<NonNeg>,
}

#[derive(Clone, Copy, Debug)]
struct Link {
    bw: f64,
    latency: Option<f64>,
}

impl<'de> Deserialize<'de> for Link {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RawLink::deserialize(d)?;
        let bw = match (r.gbit_per_s, r.gbyte_per_s) {
            (Some(g), None) => g.0 * 1e9 / 8.0,
            (None, Some(g)) => g.0 * 1e9,
            _ => {
                return Err(de::Error::custom(
                    "give the rate as exactly one of gbit_per_s or gbyte_per_s",
                ))
            }
        };
        Ok(Link {
            bw,
            latency: r.latency_us.map(|l| l.0 * 1e-6),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWiring {
    #[serde(default)]
    rail_optimized: bool,
    nodes_per_unit: Option<Count>,
    nodes_per_leaf: Option<Count>,
}

/// The uplinks of a tier: their count, and either their rate or the oversubscription ratio
/// (the rate that gives it).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpine {
    spines: Count,
    gbit_per_s: Option<Positive>,
    oversubscription: Option<Positive>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCore {
    leaves_per_pod: Count,
    uplinks_per_spine: Count,
    gbit_per_s: Option<Positive>,
    oversubscription: Option<Positive>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum EcmpMode {
    Hash,
    Ideal,
    Worst,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEcmp {
    mode: EcmpMode,
    #[serde(default)]
    seed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFabric {
    name: String,
    #[serde(default)]
    description: String,
    nodes: Option<Count>,
    hosts: Option<String>,
    #[serde(alias = "gpus_per_node")]
    ranks_per_node: Count,
    node_link: Link,
    nics_per_node: Count,
    nic: Link,
    wiring: RawWiring,
    spine: Option<RawSpine>,
    core: Option<RawCore>,
    ecmp: Option<RawEcmp>,
    hop_latency_us: Option<NonNeg>,
    efficiency: Option<Positive>,
    reduce_gbyte_per_s: Option<Positive>,
}

/// Reads and checks a fabric file.
pub fn load(path: &Path) -> Result<FabricFile, String> {
    let name = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|e| format!("{name}: {e}"))?;
    let mut text = String::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{name}: {e}"))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{name}: larger than {} MiB; not a fabric file",
            MAX_FILE_BYTES >> 20
        ));
    }
    parse(&text, &name)
}

/// Parses a fabric file's text; `name` prefixes every error (`name:line:column: ...`).
pub fn parse(text: &str, name: &str) -> Result<FabricFile, String> {
    let raw: RawFabric = serde_json::from_str(text).map_err(|e| {
        if e.line() > 0 {
            // A value's check fails after the parser looked one character past it: for the
            // last value of a line that is the next line's column 0 or 1.
            let (mut line, mut col) = (e.line(), e.column());
            if e.classify() == serde_json::error::Category::Data && col <= 1 && line > 1 {
                line -= 1;
                col = text.lines().nth(line - 1).map_or(0, |l| l.trim_end().len());
            }
            format!("{name}:{line}:{col}: {}", strip_position(&e.to_string()))
        } else {
            format!("{name}: {e}")
        }
    })?;
    // where a top-level key sits, for errors found after parsing
    let at = |key: &str| match line_of(text, key) {
        Some(l) => format!("{name}:{l}"),
        None => name.to_string(),
    };
    let hosts = match &raw.hosts {
        Some(h) => {
            let v = railring::hostlist::expand(h)
                .map_err(|e| format!("{}: hosts: {e}", at("hosts")))?;
            if v.is_empty() {
                return Err(format!("{}: hosts: the list is empty", at("hosts")));
            }
            if v.len() as u64 > MAX_COUNT {
                return Err(format!(
                    "{}: hosts: more than {MAX_COUNT} hosts",
                    at("hosts")
                ));
            }
            let mut seen = std::collections::HashSet::new();
            if let Some(d) = v.iter().find(|h| !seen.insert(h.as_str())) {
                return Err(format!("{}: hosts: {d} appears twice", at("hosts")));
            }
            Some(v)
        }
        None => None,
    };
    let nodes = match (raw.nodes, &hosts) {
        (Some(n), Some(h)) if n.0 != h.len() => {
            return Err(format!(
                "{}: nodes = {} but hosts names {} hosts",
                at("nodes"),
                n.0,
                h.len()
            ))
        }
        (Some(n), _) => n.0,
        (None, Some(h)) => h.len(),
        (None, None) => {
            return Err(format!(
                "{name}: give nodes (a count) or hosts (a hostlist)"
            ))
        }
    };
    if (nodes as u64).saturating_mul(raw.ranks_per_node.0 as u64) > MAX_RANKS as u64 {
        return Err(format!(
            "{}: {nodes} nodes x {} ranks per node is more than {MAX_RANKS} ranks",
            at("ranks_per_node"),
            raw.ranks_per_node.0
        ));
    }
    let nics = raw.nics_per_node.0;
    let wiring = match (
        raw.wiring.rail_optimized,
        raw.wiring.nodes_per_unit,
        raw.wiring.nodes_per_leaf,
    ) {
        (true, Some(u), None) => Wiring::RailOptimized {
            nodes_per_su: u.0,
        },
        (false, None, Some(l)) => Wiring::NodeOnLeaf {
            nodes_per_leaf: l.0,
        },
        _ => {
            return Err(format!(
                "{}: wiring: either {{\"rail_optimized\": true, \"nodes_per_unit\": N}} or {{\"nodes_per_leaf\": N}}",
                at("wiring")
            ))
        }
    };
    let nic = LinkSpec {
        bw: raw.nic.bw,
        latency: raw.nic.latency.unwrap_or(5e-6),
    };
    let node_link = LinkSpec {
        bw: raw.node_link.bw,
        latency: raw.node_link.latency.unwrap_or(1e-6),
    };
    let mut fabric = Fabric {
        name: raw.name.chars().take(200).collect(),
        nodes,
        ranks_per_node: raw.ranks_per_node.0,
        node_link,
        nics,
        nic,
        wiring,
        spine: None,
        core: None,
        ecmp: match raw.ecmp {
            None => Ecmp::Hash { seed: 0 },
            Some(e) => match e.mode {
                EcmpMode::Hash => Ecmp::Hash { seed: e.seed },
                EcmpMode::Ideal => Ecmp::Ideal,
                EcmpMode::Worst => Ecmp::Worst,
            },
        },
        hop_latency: raw.hop_latency_us.map_or(0.5e-6, |h| h.0 * 1e-6),
        efficiency: raw.efficiency.map_or(1.0, |e| e.0),
        reduce_bw: raw.reduce_gbyte_per_s.map_or(8e9, |r| r.0 * 1e9),
    };
    if fabric.efficiency > 1.0 {
        return Err(format!(
            "{}: efficiency = {}: must be at most 1",
            at("efficiency"),
            fabric.efficiency
        ));
    }
    if let Some(s) = raw.spine {
        let link_bw = match (s.gbit_per_s, s.oversubscription) {
            (Some(g), None) => g.0 * 1e9 / 8.0,
            // down capacity of a leaf / (spines x ratio)
            (None, Some(o)) => fabric.leaf_ports() as f64 * nic.bw / (s.spines.0 as f64 * o.0),
            _ => {
                return Err(format!(
                    "{}: spine: give exactly one of gbit_per_s or oversubscription",
                    at("spine")
                ))
            }
        };
        fabric.spine = Some(SpineTier {
            spines: s.spines.0,
            link_bw,
        });
    }
    if let Some(c) = raw.core {
        let Some(sp) = fabric.spine else {
            return Err(format!("{}: a core tier needs a spine tier", at("core")));
        };
        let link_bw = match (c.gbit_per_s, c.oversubscription) {
            (Some(g), None) => g.0 * 1e9 / 8.0,
            (None, Some(o)) => {
                c.leaves_per_pod.0.min(fabric.leaves()) as f64 * sp.link_bw
                    / (c.uplinks_per_spine.0 as f64 * o.0)
            }
            _ => {
                return Err(format!(
                    "{}: core: give exactly one of gbit_per_s or oversubscription",
                    at("core")
                ))
            }
        };
        fabric.core = Some(CoreTier {
            leaves_per_pod: c.leaves_per_pod.0,
            uplinks: c.uplinks_per_spine.0,
            link_bw,
        });
    }
    fabric.validate().map_err(|e| format!("{name}: {e}"))?;
    Ok(FabricFile {
        fabric,
        hosts,
        description: raw.description.chars().take(2000).collect(),
    })
}

/// serde_json's message without its trailing " at line L column C".
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// The 1-based line of the first `"key":` in `text`.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let pat = format!("\"{key}\"");
    text.lines().position(|l| l.contains(&pat)).map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
  "name": "two leaves",
  "hosts": "n[1-4]",
  "ranks_per_node": 2,
  "node_link": {"gbyte_per_s": 5, "latency_us": 1},
  "nics_per_node": 1,
  "nic": {"gbit_per_s": 0.3, "latency_us": 50},
  "wiring": {"nodes_per_leaf": 2},
  "spine": {"spines": 2, "oversubscription": 3},
  "ecmp": {"mode": "hash", "seed": 3},
  "efficiency": 0.956
}"#;

    #[test]
    fn reads_a_fabric() {
        let f = parse(GOOD, "f.json").unwrap();
        assert_eq!(f.hosts.as_ref().unwrap(), &["n1", "n2", "n3", "n4"]);
        let fab = &f.fabric;
        assert_eq!((fab.nodes, fab.ranks_per_node, fab.leaves()), (4, 2, 2));
        assert!((fab.leaf_oversubscription().unwrap() - 3.0).abs() < 1e-9);
        assert!((fab.nic.bw - 0.3e9 / 8.0).abs() < 1e-3);
        assert_eq!(fab.ecmp, Ecmp::Hash { seed: 3 });
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            (GOOD.replace("\"spines\": 2", "\"spines\": 0"), "f.json:9:"),
            (GOOD.replace("0.956", "-1"), "f.json:11:"),
            (GOOD.replace("\"seed\": 3", "\"sed\": 3"), "f.json:10:"),
            (
                GOOD.replace("0.3, ", "0.3, \"gbyte_per_s\": 1, "),
                "f.json:7:",
            ),
            (
                GOOD.replace(
                    "\"nodes_per_leaf\": 2",
                    "\"nodes_per_leaf\": 2, \"rail_optimized\": true",
                ),
                "f.json:8",
            ),
            (GOOD.replace("n[1-4]", "n[1-4],n2"), "f.json:3"),
            (GOOD.replace("0.956", "1.5"), "f.json:11"),
            (
                GOOD.replace("\"nics_per_node\": 1", "\"nics_per_node\": 99999999999"),
                "f.json:6:",
            ),
            (GOOD.replace("{\n", "{\n \"nodes\": 5,\n"), "f.json:2"),
            ("{".to_string(), "f.json:1:"),
        ];
        for (text, want) in cases {
            let e = parse(&text, "f.json").unwrap_err();
            assert!(e.starts_with(want), "{want}: {e}");
        }
        // absurd sizes: refused, not allocated
        let huge = GOOD
            .replace("\"hosts\": \"n[1-4]\"", "\"nodes\": 4000000")
            .replace("\"ranks_per_node\": 2", "\"ranks_per_node\": 4000000");
        assert!(parse(&huge, "f.json").unwrap_err().contains("ranks"));
        let huge = GOOD.replace("\"hosts\": \"n[1-4]\"", "\"hosts\": \"n[1-99999999999]\"");
        assert!(parse(&huge, "f.json").unwrap_err().contains("hosts"));
    }
}
