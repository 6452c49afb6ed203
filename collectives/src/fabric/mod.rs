//! Fabrics: the network a job runs on (nodes, their in-node link, NICs, leaf / spine / core
//! switches, the wiring of NICs to leaves, oversubscription, ECMP), and the fabric cost model
//! that prices the runtime's own plans on it. Pure data and arithmetic; the file format lives in
//! the launcher (`railrun plan`, docs/fabric.md).
//!
//! - this file: the description ([`Fabric`]), its validation and derived quantities (leaves,
//!   pods, which leaf a NIC hangs off, which NIC a rank uses);
//! - [`route`]: the fabric's directed links and the path of one flow (ECMP by hash, ideal or
//!   worst case);
//! - [`schedule`]: the plans' rounds (a unit-time run of every rank's plan: which transfers
//!   happen together), for every rank or — using the plans' rotation symmetry — one rank per
//!   class;
//! - [`price`]: the census of each round (flows per link), each flow's rate and latency, the
//!   time of a call, its bottleneck, and the table over sizes.

pub mod price;
pub mod route;
pub mod schedule;
#[cfg(test)]
mod tests;

pub use price::{Bottleneck, FabricPlanner, Prediction, Tier};
pub use route::{LinkClass, Path, Routes};

/// Most ranks a fabric may describe.
pub const MAX_RANKS: usize = 4_000_000;
/// Most directed links (NICs, leaf, spine and core links together) a fabric may have.
pub const MAX_LINKS: usize = 64_000_000;

/// Latency and bandwidth of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// Bytes per second, one direction.
    pub bw: f64,
    /// Seconds per message: on a NIC the software and NIC latency of one transfer; on the
    /// in-node link the latency of one in-node transfer.
    pub latency: f64,
}

/// How NICs are wired to leaf switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// NIC i of every node of a scalable unit (`nodes_per_su` consecutive nodes) on the unit's
    /// leaf i: one leaf per rail per unit.
    RailOptimized { nodes_per_su: usize },
    /// Every NIC of a node on the same leaf; `nodes_per_leaf` consecutive nodes per leaf.
    NodeOnLeaf { nodes_per_leaf: usize },
}

/// The leaf → spine tier: inside a pod, every leaf has one link to each of `spines` spines.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpineTier {
    pub spines: usize,
    /// Bytes per second of one leaf–spine link, each direction.
    pub link_bw: f64,
}

/// The spine → core tier of a 3-tier Clos: leaves are grouped into pods of `leaves_per_pod`;
/// spine j of every pod has `uplinks` links to the core switches of plane j.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoreTier {
    pub leaves_per_pod: usize,
    pub uplinks: usize,
    /// Bytes per second of one spine–core link, each direction.
    pub link_bw: f64,
}

/// How a switch picks one of its equal-cost uplinks for a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecmp {
    /// Hash of the flow (source, destination, channel) with a seed, like a 5-tuple hash: flows
    /// can collide on one uplink while another idles.
    Hash { seed: u64 },
    /// An even spread: k flows over w equal-cost uplinks put ⌈k / w⌉ on each (the best a
    /// hash can do; one flow still takes one link).
    Ideal,
    /// Every flow on the first uplink: the worst case a hash can produce.
    Worst,
}

impl Ecmp {
    pub fn name(&self) -> String {
        match self {
            Ecmp::Hash { seed } => format!("hash (seed {seed})"),
            Ecmp::Ideal => "ideal spread".into(),
            Ecmp::Worst => "worst case (one uplink)".into(),
        }
    }
}

/// A fabric: `nodes` nodes of `ranks_per_node` ranks (GPUs), an in-node link, `nics` NICs per
/// node wired to leaves, an optional spine tier (needed when there is more than one leaf) and an
/// optional core tier (pods).
#[derive(Clone, Debug, PartialEq)]
pub struct Fabric {
    pub name: String,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub node_link: LinkSpec,
    pub nics: usize,
    pub nic: LinkSpec,
    pub wiring: Wiring,
    pub spine: Option<SpineTier>,
    pub core: Option<CoreTier>,
    pub ecmp: Ecmp,
    /// Seconds per switch traversal.
    pub hop_latency: f64,
    /// Fraction of a network link's rate that carries payload (headers, framing), in (0, 1].
    pub efficiency: f64,
    /// Bytes per second one rank combines in a reduction.
    pub reduce_bw: f64,
}

/// A fabric that cannot be priced, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FabricError(pub String);

fn bad<T>(s: impl Into<String>) -> Result<T, FabricError> {
    Err(FabricError(s.into()))
}

impl Fabric {
    /// Checks every field (counts ≥ 1, finite positive rates, non-negative latencies,
    /// efficiency in (0, 1]) and the sizes (at most [`MAX_RANKS`] ranks and [`MAX_LINKS`]
    /// links) before anything is allocated for it.
    pub fn validate(&self) -> Result<(), FabricError> {
        let pos = |what: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                bad(format!("{what} = {v}: must be a finite number > 0"))
            }
        };
        let nonneg = |what: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(format!("{what} = {v}: must be a finite number >= 0"))
            }
        };
        for (what, v) in [
            ("nodes", self.nodes),
            ("ranks per node", self.ranks_per_node),
            ("nics per node", self.nics),
        ] {
            if v == 0 {
                return bad(format!("{what} must be at least 1"));
            }
        }
        pos("node link bandwidth", self.node_link.bw)?;
        nonneg("node link latency", self.node_link.latency)?;
        pos("nic bandwidth", self.nic.bw)?;
        nonneg("nic latency", self.nic.latency)?;
        nonneg("hop latency", self.hop_latency)?;
        pos("reduce bandwidth", self.reduce_bw)?;
        if !(self.efficiency.is_finite() && self.efficiency > 0.0 && self.efficiency <= 1.0) {
            return bad(format!(
                "efficiency = {}: must be in (0, 1]",
                self.efficiency
            ));
        }
        let per = match self.wiring {
            Wiring::RailOptimized { nodes_per_su } => nodes_per_su,
            Wiring::NodeOnLeaf { nodes_per_leaf } => nodes_per_leaf,
        };
        if per == 0 {
            return bad("nodes per leaf / per scalable unit must be at least 1");
        }
        let ranks = self.nodes.checked_mul(self.ranks_per_node);
        if ranks.is_none_or(|r| r > MAX_RANKS) {
            return bad(format!(
                "{} nodes x {} ranks per node: more than {MAX_RANKS} ranks",
                self.nodes, self.ranks_per_node
            ));
        }
        if self.nics > 1024 {
            return bad(format!("{} NICs per node: at most 1024", self.nics));
        }
        if let Some(s) = &self.spine {
            if s.spines == 0 || s.spines > 65_536 {
                return bad(format!("spines = {}: must be 1..=65536", s.spines));
            }
            pos("spine link bandwidth", s.link_bw)?;
        }
        if let Some(c) = &self.core {
            if self.spine.is_none() {
                return bad("a core tier needs a spine tier");
            }
            if c.leaves_per_pod == 0 || c.uplinks == 0 || c.uplinks > 65_536 {
                return bad(
                    "core: leaves per pod and uplinks must be at least 1 (uplinks at most 65536)",
                );
            }
            pos("core link bandwidth", c.link_bw)?;
        }
        if self.leaves() > 1 && self.spine.is_none() {
            return bad(format!(
                "{} leaves but no spine tier: the leaves would not be connected",
                self.leaves()
            ));
        }
        if self.pods() > 1 && self.core.is_none() {
            return bad("more than one pod needs a core tier");
        }
        let links = self.link_count();
        if links.is_none_or(|l| l > MAX_LINKS as u128) {
            return bad(format!(
                "the fabric has more than {MAX_LINKS} links; refusing to model it"
            ));
        }
        Ok(())
    }

    /// Number of ranks when every node is full.
    pub fn ranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// Number of leaf switches.
    pub fn leaves(&self) -> usize {
        match self.wiring {
            Wiring::RailOptimized { nodes_per_su } => {
                self.nodes.div_ceil(nodes_per_su.max(1)) * self.nics
            }
            Wiring::NodeOnLeaf { nodes_per_leaf } => self.nodes.div_ceil(nodes_per_leaf.max(1)),
        }
    }

    /// Number of pods (1 without a core tier).
    pub fn pods(&self) -> usize {
        match &self.core {
            Some(c) => self.leaves().div_ceil(c.leaves_per_pod.max(1)),
            None => 1,
        }
    }

    /// Spines per pod (0 without a spine tier).
    pub fn spines(&self) -> usize {
        self.spine.map_or(0, |s| s.spines)
    }

    /// The leaf NIC `nic` of `node` hangs off.
    pub fn leaf_of(&self, node: usize, nic: usize) -> usize {
        match self.wiring {
            Wiring::RailOptimized { nodes_per_su } => (node / nodes_per_su) * self.nics + nic,
            Wiring::NodeOnLeaf { nodes_per_leaf } => node / nodes_per_leaf,
        }
    }

    /// The pod of a leaf.
    pub fn pod_of(&self, leaf: usize) -> usize {
        match &self.core {
            Some(c) => leaf / c.leaves_per_pod,
            None => 0,
        }
    }

    /// NIC ports of one leaf (down links).
    pub fn leaf_ports(&self) -> usize {
        match self.wiring {
            Wiring::RailOptimized { nodes_per_su } => nodes_per_su.min(self.nodes),
            Wiring::NodeOnLeaf { nodes_per_leaf } => nodes_per_leaf.min(self.nodes) * self.nics,
        }
    }

    /// Leaf oversubscription: NIC bandwidth below a leaf over its uplink bandwidth.
    pub fn leaf_oversubscription(&self) -> Option<f64> {
        self.spine
            .map(|s| self.leaf_ports() as f64 * self.nic.bw / (s.spines as f64 * s.link_bw))
    }

    /// Spine oversubscription (3-tier): a spine's leaf links over its core links.
    pub fn spine_oversubscription(&self) -> Option<f64> {
        match (&self.spine, &self.core) {
            (Some(s), Some(c)) => Some(
                c.leaves_per_pod.min(self.leaves()) as f64 * s.link_bw
                    / (c.uplinks as f64 * c.link_bw),
            ),
            _ => None,
        }
    }

    /// Directed links, counted in u128 so that absurd sizes are refused, not overflowed.
    fn link_count(&self) -> Option<u128> {
        let n = self.nodes as u128;
        let nic = n.checked_mul(self.nics as u128)?.checked_mul(2)?;
        let leaves = match self.wiring {
            Wiring::RailOptimized { nodes_per_su } => {
                n.div_ceil(nodes_per_su.max(1) as u128) * self.nics as u128
            }
            Wiring::NodeOnLeaf { nodes_per_leaf } => n.div_ceil(nodes_per_leaf.max(1) as u128),
        };
        let s = self.spine.map_or(0, |s| s.spines) as u128;
        let leaf = leaves.checked_mul(s)?.checked_mul(2)?;
        let core = match &self.core {
            Some(c) => leaves
                .div_ceil(c.leaves_per_pod.max(1) as u128)
                .checked_mul(s)?
                .checked_mul(c.uplinks as u128)?
                .checked_mul(2)?,
            None => 0,
        };
        nic.checked_add(leaf)?.checked_add(core)
    }

    /// The layout of `ranks` ranks on the fabric: `ranks_per_node` consecutive ranks per node
    /// (the last node may hold fewer).
    pub fn layout(&self, ranks: usize) -> crate::plan::Layout {
        crate::plan::Layout::block(ranks, self.ranks_per_node)
    }

    /// The node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// The rail (NIC index) `rank` uses: local rank i uses rail i mod NICs, as the runtime's
    /// fallback binding does (docs/topology.md).
    pub fn rail_of(&self, rank: usize) -> usize {
        (rank % self.ranks_per_node) % self.nics
    }

    /// One line: nodes, ranks, NICs, wiring, tiers.
    pub fn summary(&self) -> String {
        let gbit = |b: f64| format!("{} Gb/s", trim(b * 8.0 / 1e9));
        let mut s = format!(
            "{}: {} nodes x {} ranks = {} ranks; {} NIC(s) x {} per node; ",
            self.name,
            self.nodes,
            self.ranks_per_node,
            self.ranks(),
            self.nics,
            gbit(self.nic.bw)
        );
        s.push_str(&match self.wiring {
            Wiring::RailOptimized { nodes_per_su } => {
                format!("rail-optimized, {nodes_per_su} nodes per unit")
            }
            Wiring::NodeOnLeaf { nodes_per_leaf } => {
                format!("{nodes_per_leaf} nodes per leaf")
            }
        });
        s.push_str(&format!("; {} leaves", self.leaves()));
        if let Some(sp) = &self.spine {
            s.push_str(&format!(
                ", {} spines per pod x {} (leaf {}:1)",
                sp.spines,
                gbit(sp.link_bw),
                trim(self.leaf_oversubscription().unwrap_or(1.0))
            ));
        }
        if let Some(c) = &self.core {
            s.push_str(&format!(
                ", {} pods of {} leaves, {} core uplinks per spine x {} (spine {}:1)",
                self.pods(),
                c.leaves_per_pod,
                c.uplinks,
                gbit(c.link_bw),
                trim(self.spine_oversubscription().unwrap_or(1.0))
            ));
        }
        s.push_str(&format!("; ECMP {}", self.ecmp.name()));
        s
    }
}

/// A number with at most two decimals and no trailing zeros.
fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
