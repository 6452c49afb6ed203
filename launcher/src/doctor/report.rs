//! What `railrun doctor` measures and concludes, as data: the report the probe ranks assemble
//! (nodes, rail interfaces, pairwise results) and the findings the launcher derives from it.
//! The JSON of `--json` is this structure.

use serde::{Deserialize, Serialize};

/// The whole sweep.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// One entry per node, in node order (node i = the i-th host of the job).
    pub nodes: Vec<NodeReport>,
    /// The rail interface names found on any node, sorted.
    pub rails: Vec<String>,
    /// One entry per tested (rail, sender, receiver).
    pub pairs: Vec<Pair>,
    /// Ranks started per node (the in-node all-reduce runs over them).
    pub ppn: usize,
    /// Seconds of bulk transfer per pair test.
    pub duration_s: f64,
    /// The shifts of the sweep: in round k node i sends to node (i + shift_k) mod n.
    pub shifts: Vec<usize>,
    /// Seconds the pairwise sweep took.
    pub sweep_s: f64,
    /// Seconds the whole doctor run took (launcher side).
    #[serde(default)]
    pub run_s: f64,
    /// What is wrong (empty: nothing found).
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// What the analysis could not compare, and why.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One node's inventory and local measurements.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeReport {
    pub node: usize,
    pub host: String,
    /// The kernel's boot id: nodes with the same one share a machine.
    pub kernel: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub numa_nodes: usize,
    pub gpus: Vec<String>,
    /// Every network interface but loopback.
    pub nics: Vec<NicReport>,
    /// Memory bandwidth of one core (copy; read + write bytes per second / 1e9).
    pub mem_gbs: Option<f64>,
    /// In-node all-reduce bus bandwidth over the node's ranks (GB/s; none with one rank).
    pub allreduce_gbs: Option<f64>,
    pub local_ranks: usize,
}

/// One network interface.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NicReport {
    pub name: String,
    /// Whether it carries a rail (matches the rail filter).
    pub rail: bool,
    /// `/sys/class/net/IF/operstate`.
    pub state: String,
    pub speed_mbps: Option<i64>,
    pub mtu: Option<u32>,
    /// IPv4 addresses with prefix ("10.77.10.11/24").
    pub addrs: Vec<String>,
}

/// One pairwise test on one rail.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Pair {
    pub rail: String,
    pub from: usize,
    pub to: usize,
    /// Bits per second received, if the test ran.
    pub bps: Option<f64>,
    /// Half the median round trip of 1-byte ping-pongs (µs).
    pub lat_us: Option<f64>,
    /// Why the test did not run (no address, connect failed, ...).
    pub error: Option<String>,
}

/// One thing `railrun doctor` names: where, what was expected, what was measured, what to check.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// `down`, `missing`, `mtu`, `subnet`, `unreachable`, `slow-link`, `slow-rail`,
    /// `slow-memory`, `slow-in-node`.
    pub kind: String,
    /// The host, or `*` for a whole rail.
    pub host: String,
    pub interface: Option<String>,
    pub expected: String,
    pub measured: String,
    pub check: String,
}

impl Finding {
    /// One line for the table.
    pub fn line(&self) -> String {
        let place = match &self.interface {
            Some(i) => format!("{} {i}", self.host),
            None => self.host.clone(),
        };
        format!(
            "{place}: {} — measured {}; expected {}. Check: {}",
            self.kind, self.measured, self.expected, self.check
        )
    }
}

/// Bits per second as text (Mbit/s below 1 Gbit/s).
pub fn fmt_bps(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else {
        format!("{:.0} Mbit/s", bps / 1e6)
    }
}
