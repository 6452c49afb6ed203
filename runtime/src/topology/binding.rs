//! Per-local-rank binding: GPU, NIC(s), CPUs, and the reason for each (one concern: choosing
//! bindings, with the binding options it is asked with and applying the CPU mask).
//!
//! # How a binding is chosen
//!
//! 1. **GPU.** Local rank `r` gets visible GPU `r mod n`. Visible GPUs are
//!    all GPUs in PCI bus order, or the ones `CUDA_VISIBLE_DEVICES` lists
//!    (indices in that order or `GPU-<uuid>` prefixes; as in CUDA, the list
//!    ends at the first entry that is not a valid, unused device).
//!    `GpuRef::cuda_ordinal` is the device number the rank passes to CUDA.
//! 2. **NIC.** Candidates are the PCI NICs; only when the node has none are
//!    virtual NICs (veth, no PCI device) used, as host-attached (PHB). For
//!    each rank, the candidates are ranked by path class from its GPU (from
//!    its NUMA node when it has no GPU), then by bandwidth (the lower of port
//!    speed and PCIe link). The NICs sharing the best class *and* the best
//!    bandwidth form the rank's *nearest tier*. Ranks with fewer tier NICs
//!    choose first (then by local rank); each takes the tier NIC serving
//!    the fewest ranks so far, the lowest NIC index on a tie. So no NIC
//!    serves two ranks while another NIC of their tier is idle, and on a
//!    rail-aligned box (8 GPUs, 8 NICs, pairs under one switch) GPU i gets
//!    NIC i. Tier NICs nobody got are then added as extra rails (`nics[1..]`)
//!    to the rank whose tier holds them (fewest NICs first). `nics[0]` is
//!    the primary rail.
//! 3. **CPUs.** The CPUs of the GPU's NUMA node (of the rank's NUMA node
//!    when there is no GPU: ranks go round-robin over the NUMA nodes that
//!    have CPUs this process may use), intersected with the allowed CPUs
//!    (`sched_getaffinity`, i.e. cgroup/cpuset). With `--bind-to core`, the
//!    ranks sharing a NUMA node split its cores into disjoint contiguous
//!    chunks (hyper-threads stay with their core). With `--bind-to none`
//!    the list is empty: affinity is left as it is.
//!
//! `RAILRING_NIC_MAP` (see [`NicMap`]) replaces step 2 for the ranks it
//! names; their NICs count as taken for the others.

use serde::Serialize;
use std::collections::BTreeMap;

use std::str::FromStr;

pub use super::cpus::BindTo;
use super::cpus::{CpuPlan, Loc, NodeMap};
use super::model::{DeviceId, Topology};
use super::paths::PathClass;
use super::util::{format_cpulist, intersect};
use super::TopoError;
use crate::vars;

/// Most local ranks a binding is computed for.
pub const MAX_LOCAL_SIZE: usize = 4096;
/// Longest environment value accepted (`RAILRING_NIC_MAP`, `CUDA_VISIBLE_DEVICES`).
const MAX_ENV_LEN: usize = 64 * 1024;

/// An explicit local-rank → NIC list (`RAILRING_NIC_MAP`).
///
/// Grammar:
///
/// ```text
/// map   := entry ( ( ';' | ',' ) entry )*
/// entry := ranks ':' nic ( '+' nic )*
/// ranks := '*' | N | N '-' M          (local ranks, inclusive range)
/// nic   := a NIC name, interface name, RDMA name or PCI bus id
/// ```
///
/// Examples: `0:mlx5_0,1:mlx5_1`; `0-3:mlx5_0;4-7:mlx5_1`;
/// `0:mlx5_0+mlx5_1;*:eth0` (`*` covers ranks no other entry names).
/// The entry is split at its first `:`, so bus ids work as NIC names
/// (`0:0000:10:1b.0`). Whitespace around items is ignored; empty entries are
/// skipped; a rank named twice is an error. Ranks the map does not cover
/// are bound automatically.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct NicMap {
    pub ranks: BTreeMap<usize, Vec<String>>,
    pub default: Option<Vec<String>>,
}

impl NicMap {
    /// Parses the grammar above.
    pub fn parse(s: &str) -> Result<NicMap, TopoError> {
        let err = |msg: String| TopoError::NicMap {
            input: s.chars().take(200).collect(),
            msg,
        };
        if s.len() > MAX_ENV_LEN {
            return Err(err(format!("longer than {MAX_ENV_LEN} bytes")));
        }
        let mut map = NicMap::default();
        for entry in s.split([';', ',']) {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let (ranks, nics) = entry
                .split_once(':')
                .ok_or_else(|| err(format!("entry {entry:?}: expected RANKS:NIC[+NIC...]")))?;
            let nics: Vec<String> = nics.split('+').map(|n| n.trim().to_string()).collect();
            if nics.iter().any(String::is_empty) {
                return Err(err(format!("entry {entry:?}: empty NIC name")));
            }
            let ranks = ranks.trim();
            if ranks == "*" {
                if map.default.is_some() {
                    return Err(err("'*' given twice".into()));
                }
                map.default = Some(nics);
                continue;
            }
            let num = |t: &str| -> Result<usize, TopoError> {
                t.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|v| *v < MAX_LOCAL_SIZE)
                    .ok_or_else(|| {
                        err(format!(
                            "entry {entry:?}: {t:?} is not a local rank (0-{})",
                            MAX_LOCAL_SIZE - 1
                        ))
                    })
            };
            let (lo, hi) = match ranks.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(ranks)?, num(ranks)?),
            };
            if lo > hi {
                return Err(err(format!("entry {entry:?}: range {lo}-{hi} is reversed")));
            }
            for r in lo..=hi {
                if map.ranks.insert(r, nics.clone()).is_some() {
                    return Err(err(format!("local rank {r} is named twice")));
                }
            }
        }
        Ok(map)
    }

    /// The NICs named for `local_rank`, if any.
    pub fn nics_for(&self, local_rank: usize) -> Option<&[String]> {
        self.ranks
            .get(&local_rank)
            .or(self.default.as_ref())
            .map(Vec::as_slice)
    }
}

impl FromStr for NicMap {
    type Err = TopoError;
    fn from_str(s: &str) -> Result<Self, TopoError> {
        NicMap::parse(s)
    }
}

/// Inputs to [`Topology::bindings`] besides the topology.
#[derive(Debug, Clone, Default)]
pub struct BindOptions {
    pub bind_to: BindTo,
    pub nic_map: Option<NicMap>,
    /// `CUDA_VISIBLE_DEVICES` as set for the job (`None`: all GPUs).
    pub cuda_visible_devices: Option<String>,
    /// CPUs the process may use (`None`: all CPUs of the topology).
    pub allowed_cpus: Option<Vec<usize>>,
    /// Only these NICs may be chosen (by NIC name or network interface name): the runtime
    /// passes its rail interfaces (`RAILRING_SOCKET_IFNAME`) so the chosen NIC is a rail.
    /// Ignored when none of the topology's NICs matches. `None`: every NIC.
    pub nic_allow: Option<Vec<String>>,
    /// `RAILRING_MAP_BY`: how ranks without a GPU spread over cores, sockets or NUMA nodes
    /// (see [`NodeMap`]); `None`: round-robin over NUMA nodes.
    pub map: Option<NodeMap>,
}

/// The raw values the binding options come from: `RAILRING_BIND_TO` (the launcher exports
/// `--bind-to` as this), `RAILRING_NIC_MAP` and `CUDA_VISIBLE_DEVICES`, as read by
/// [`crate::config`] (this module never reads the environment).
#[derive(Clone, Debug, Default)]
pub struct BindVars {
    pub bind_to: Option<std::ffi::OsString>,
    pub map_by: Option<std::ffi::OsString>,
    pub nic_map: Option<std::ffi::OsString>,
    pub cuda_visible_devices: Option<std::ffi::OsString>,
}

impl BindVars {
    /// The binding options these values ask for, with the allowed CPUs from
    /// `sched_getaffinity`. A value that is not UTF-8 or too long is an error naming its
    /// variable.
    pub fn options(&self) -> Result<BindOptions, TopoError> {
        let get = |k: &str, v: &Option<std::ffi::OsString>| -> Result<Option<String>, TopoError> {
            match v {
                None => Ok(None),
                Some(v) => match v.clone().into_string() {
                    Ok(s) if s.len() <= MAX_ENV_LEN => Ok(Some(s)),
                    _ => Err(TopoError::Env {
                        var: k.to_string(),
                        msg: format!("not UTF-8 or longer than {MAX_ENV_LEN} bytes"),
                    }),
                },
            }
        };
        let mut o = BindOptions::from_values(
            get(vars::BIND_TO, &self.bind_to)?.as_deref(),
            get(vars::NIC_MAP, &self.nic_map)?.as_deref(),
            get("CUDA_VISIBLE_DEVICES", &self.cuda_visible_devices)?.as_deref(),
            process_allowed_cpus().ok(),
        )?;
        if let Some(m) = get(vars::MAP_BY, &self.map_by)?.filter(|m| !m.trim().is_empty()) {
            o.map = Some(NodeMap::parse(&m)?);
        }
        Ok(o)
    }
}

impl BindOptions {
    /// From explicit values (empty strings count as unset for the bind
    /// mode and the NIC map; an empty `CUDA_VISIBLE_DEVICES` hides all GPUs).
    pub fn from_values(
        bind_to: Option<&str>,
        nic_map: Option<&str>,
        cuda_visible_devices: Option<&str>,
        allowed_cpus: Option<Vec<usize>>,
    ) -> Result<BindOptions, TopoError> {
        let bind_to = match bind_to.map(str::trim).filter(|s| !s.is_empty()) {
            Some(s) => s.parse()?,
            None => BindTo::default(),
        };
        let nic_map = match nic_map.map(str::trim).filter(|s| !s.is_empty()) {
            Some(s) => Some(NicMap::parse(s)?),
            None => None,
        };
        Ok(BindOptions {
            bind_to,
            nic_map,
            cuda_visible_devices: cuda_visible_devices
                .map(|s| s.chars().take(MAX_ENV_LEN).collect()),
            allowed_cpus: allowed_cpus.map(|mut v| {
                v.sort_unstable();
                v.dedup();
                v
            }),
            nic_allow: None,
            map: None,
        })
    }
}

/// The GPU of a binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuRef {
    /// Index in [`Topology::gpus`] (PCI bus order, as `nvidia-smi`).
    pub index: usize,
    /// The CUDA device number inside the process (position in
    /// `CUDA_VISIBLE_DEVICES`; equal to `index` when it is unset).
    pub cuda_ordinal: usize,
    pub busid: Option<String>,
}

/// A NIC of a binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicRef {
    /// Index in [`Topology::nics`] (`NIC<index>` in the matrix legend).
    pub index: usize,
    pub name: String,
    /// The interface name for the TCP transport: the NIC's first interface; empty when none
    /// is known (an RDMA device from a topology file: its name is not an interface name).
    pub netdev: String,
    /// Path class from the rank's GPU (from its NUMA node without GPU).
    pub path_class: PathClass,
    /// Bandwidth used for tie-breaking, Mbit/s, when known.
    pub speed_mbps: Option<u64>,
}

/// Where one local rank runs, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub local_rank: usize,
    pub gpu: Option<GpuRef>,
    /// Primary rail first; empty when the node has no NIC.
    pub nics: Vec<NicRef>,
    /// CPUs to bind to, sorted; empty means "leave affinity unchanged"
    /// (`--bind-to none`, or nothing known about CPUs).
    pub cpus: Vec<usize>,
    pub numa: Option<usize>,
    pub reason: String,
}

/// The bandwidth the NIC choice uses for one NIC ([`Topology::nic_speeds`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicSpeed {
    /// Mbit/s; 0 when nothing is known about any NIC.
    pub mbps: u64,
    /// How `mbps` was assumed, when the port speed is unknown (`from its PCIe link`, ...).
    pub assumed: Option<String>,
}

/// Path classes that are comparable for the NIC choice: 0 behind the GPU's PCIe switches
/// (`X`, `NV#`, `PIX`, `PXB`), 1 through the CPU inside the NUMA node (`PHB`, `NODE`),
/// 2 across sockets (`SYS`).
fn path_level(c: PathClass) -> u8 {
    match c {
        PathClass::Same | PathClass::Nv(_) | PathClass::Pix | PathClass::Pxb => 0,
        PathClass::Phb | PathClass::Node => 1,
        PathClass::Sys => 2,
    }
}

/// One local rank's binding while it is chosen.
pub(super) struct Plan {
    pub(super) gpu: Option<(usize, usize)>, // (index, cuda ordinal)
    pub(super) numa: Option<usize>,
    /// The core `RAILRING_MAP_BY` put the rank on.
    pub(super) loc: Option<Loc>,
    pub(super) src: Option<DeviceId>,
    /// (nic, class, bandwidth) for every candidate, best first.
    pub(super) ranked: Vec<(usize, PathClass, u64)>,
    pub(super) tier: Vec<usize>,
    pub(super) nics: Vec<usize>,
    pub(super) cpus: Vec<usize>,
    pub(super) mapped: bool,
    pub(super) why_gpu: String,
    pub(super) why_nic: String,
    pub(super) why_cpu: String,
}

impl Topology {
    /// The GPUs `CUDA_VISIBLE_DEVICES` makes visible, in CUDA order, and a
    /// note on what was dropped.
    pub fn visible_gpus(&self, cuda_visible_devices: Option<&str>) -> (Vec<usize>, String) {
        let Some(s) = cuda_visible_devices else {
            return ((0..self.gpus.len()).collect(), String::new());
        };
        let mut out: Vec<usize> = Vec::new();
        let mut note = String::new();
        for tok in s.split(',') {
            let tok = tok.trim();
            let found = if let Ok(i) = tok.parse::<usize>() {
                (i < self.gpus.len()).then_some(i)
            } else if tok.len() > 4 && tok.starts_with("GPU-") {
                let hits: Vec<usize> = self
                    .gpus
                    .iter()
                    .filter(|g| g.uuid.as_deref().is_some_and(|u| u.starts_with(tok)))
                    .map(|g| g.index)
                    .collect();
                (hits.len() == 1).then(|| hits[0])
            } else {
                None
            };
            match found {
                Some(i) if !out.contains(&i) => out.push(i),
                _ => {
                    if !(tok.is_empty() && out.is_empty() && s.trim().is_empty()) {
                        note = format!(
                            " (entry {:?} is not a usable GPU: the list ends there)",
                            tok.chars().take(40).collect::<String>()
                        );
                    }
                    break;
                }
            }
            if out.len() >= self.gpus.len() {
                break;
            }
        }
        (out, note)
    }

    /// Computes the binding of each of `local_size` local ranks.
    pub fn bindings(
        &self,
        local_size: usize,
        opts: &BindOptions,
    ) -> Result<Vec<Binding>, TopoError> {
        if local_size > MAX_LOCAL_SIZE {
            return Err(TopoError::LocalSize {
                found: local_size,
                max: MAX_LOCAL_SIZE,
            });
        }
        let all = self.all_cpus();
        let allowed: Vec<usize> = match &opts.allowed_cpus {
            Some(a) => {
                let mut a = a.clone();
                a.sort_unstable();
                a.dedup();
                a
            }
            None => all.clone(),
        };
        let (visible, cvd_note) = self.visible_gpus(opts.cuda_visible_devices.as_deref());
        let usable_numa: Vec<usize> = {
            let with_cpus: Vec<usize> = self
                .numa_nodes
                .iter()
                .filter(|n| !intersect(&n.cpus, &allowed).is_empty())
                .map(|n| n.id)
                .collect();
            if with_cpus.is_empty() {
                self.numa_nodes.iter().map(|n| n.id).collect()
            } else {
                with_cpus
            }
        };

        // 1. GPU and NUMA node.
        let mut plans: Vec<Plan> = (0..local_size)
            .map(|r| {
                let mut p = Plan {
                    gpu: None,
                    numa: None,
                    loc: None,
                    src: None,
                    ranked: Vec::new(),
                    tier: Vec::new(),
                    nics: Vec::new(),
                    cpus: Vec::new(),
                    mapped: false,
                    why_gpu: String::new(),
                    why_nic: String::new(),
                    why_cpu: String::new(),
                };
                if !visible.is_empty() {
                    let ord = r % visible.len();
                    let g = visible[ord];
                    p.gpu = Some((g, ord));
                    p.numa = self.gpus[g].numa;
                    p.src = Some(DeviceId::Gpu(g));
                    let src = match &opts.cuda_visible_devices {
                        Some(c) => format!("CUDA_VISIBLE_DEVICES={c:?}{cvd_note}"),
                        None => "all GPUs in PCI bus order".to_string(),
                    };
                    p.why_gpu = format!(
                        "GPU{g} ({}): local rank {r} takes visible GPU {ord} of {} ({src})",
                        self.gpus[g].busid.as_deref().unwrap_or("no bus id"),
                        visible.len()
                    );
                } else if !usable_numa.is_empty() {
                    let n = usable_numa[r % usable_numa.len()];
                    p.numa = Some(n);
                    p.src = Some(DeviceId::Numa(n));
                    let why = if self.gpus.is_empty() {
                        "no GPU".to_string()
                    } else {
                        format!(
                            "no visible GPU (CUDA_VISIBLE_DEVICES={:?}{cvd_note})",
                            opts.cuda_visible_devices.as_deref().unwrap_or("")
                        )
                    };
                    p.why_gpu = format!(
                        "{why}: NUMA node {n} by round-robin over {} NUMA node(s)",
                        usable_numa.len()
                    );
                } else {
                    p.why_gpu = "no GPU and no NUMA information".to_string();
                }
                p
            })
            .collect();

        // 1b. Ranks without a GPU: the cores RAILRING_MAP_BY puts them on.
        if let (Some(map), true) = (opts.map, visible.is_empty()) {
            let locs = self.map_ranks(local_size, map, &allowed)?;
            for (p, loc) in plans.iter_mut().zip(locs) {
                if let Some(n) = loc.core.first().and_then(|&c| self.numa_of_cpu(c)) {
                    p.numa = Some(n);
                    p.src = Some(DeviceId::Numa(n));
                }
                p.why_gpu = format!(
                    "no GPU: NUMA node {} by the mapping",
                    p.numa.map_or("?".into(), |n| n.to_string())
                );
                p.loc = Some(loc);
            }
        }

        // 2. NICs.
        self.choose_nics(&mut plans, opts)?;

        // 3. CPUs.
        let mut cpu_plans: Vec<CpuPlan> = plans
            .iter_mut()
            .map(|p| CpuPlan {
                numa: p.numa,
                loc: p.loc.take(),
                cpus: Vec::new(),
                why: String::new(),
            })
            .collect();
        self.choose_cpus(
            &mut cpu_plans,
            opts.bind_to,
            &allowed,
            opts.allowed_cpus.is_some(),
        );
        for (p, c) in plans.iter_mut().zip(cpu_plans) {
            p.cpus = c.cpus;
            p.why_cpu = c.why;
        }

        Ok(plans
            .into_iter()
            .enumerate()
            .map(|(r, p)| {
                let nics = p
                    .nics
                    .iter()
                    .map(|&n| {
                        let nic = &self.nics[n];
                        let bw = nic.bandwidth_mbps(self);
                        NicRef {
                            index: n,
                            name: nic.name.clone(),
                            netdev: nic.netdev().unwrap_or_default().to_string(),
                            path_class: self.class_from(p.src, n),
                            speed_mbps: (bw > 0).then_some(bw),
                        }
                    })
                    .collect();
                Binding {
                    local_rank: r,
                    gpu: p.gpu.map(|(g, ord)| GpuRef {
                        index: g,
                        cuda_ordinal: ord,
                        busid: self.gpus[g].busid.clone(),
                    }),
                    nics,
                    cpus: p.cpus,
                    numa: p.numa,
                    reason: format!("{}; {}; {}", p.why_gpu, p.why_nic, p.why_cpu),
                }
            })
            .collect())
    }

    /// The bandwidth the NIC choice uses for every NIC ([`Topology::nics`] order), and what
    /// was assumed where the port speed is unknown: the PCIe link's bandwidth when that is
    /// known; else, for an RDMA NIC, the fastest known NIC or 100 Gb/s, whichever is more;
    /// else as fast as the fastest known NIC (all equal when none is known).
    pub fn nic_speeds(&self) -> Vec<NicSpeed> {
        let fastest = self
            .nics
            .iter()
            .map(|n| n.bandwidth_mbps(self))
            .max()
            .unwrap_or(0);
        self.nics
            .iter()
            .map(|n| {
                let bw = n.bandwidth_mbps(self);
                if n.speed_mbps.is_some() {
                    NicSpeed {
                        mbps: bw,
                        assumed: None,
                    }
                } else if bw > 0 {
                    NicSpeed {
                        mbps: bw,
                        assumed: Some("from its PCIe link".into()),
                    }
                } else if n.rdma.is_some() {
                    let b = fastest.max(100_000);
                    NicSpeed {
                        mbps: b,
                        assumed: Some(
                            "an RDMA NIC: the fastest known NIC's or 100 Gb/s, whichever is more"
                                .into(),
                        ),
                    }
                } else if fastest > 0 {
                    NicSpeed {
                        mbps: fastest,
                        assumed: Some("as fast as the fastest known NIC".into()),
                    }
                } else {
                    NicSpeed {
                        mbps: 0,
                        assumed: Some("no NIC's speed is known: bandwidth does not decide".into()),
                    }
                }
            })
            .collect()
    }

    fn class_from(&self, src: Option<DeviceId>, nic: usize) -> PathClass {
        match src {
            Some(s) => self.path_class(s, DeviceId::Nic(nic)),
            None => PathClass::Phb,
        }
    }

    fn choose_nics(&self, plans: &mut [Plan], opts: &BindOptions) -> Result<(), TopoError> {
        let physical: Vec<usize> = self
            .nics
            .iter()
            .filter(|n| !n.is_virtual)
            .map(|n| n.index)
            .collect();
        let only_virtual = physical.is_empty();
        let pool: Vec<usize> = if only_virtual {
            self.nics.iter().map(|n| n.index).collect()
        } else {
            physical
        };
        let allowed = |i: &usize| match &opts.nic_allow {
            None => true,
            Some(names) => {
                let n = &self.nics[*i];
                names
                    .iter()
                    .any(|a| *a == n.name || n.netdevs.iter().any(|d| d == a))
            }
        };
        let pool = if pool.iter().any(allowed) {
            pool.into_iter().filter(allowed).collect()
        } else {
            pool
        };
        let mut load = vec![0usize; self.nics.len()];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); self.nics.len()];

        // Explicit map first.
        if let Some(map) = &opts.nic_map {
            for (r, p) in plans.iter_mut().enumerate() {
                let Some(names) = map.nics_for(r) else {
                    continue;
                };
                let mut chosen = Vec::new();
                for name in names {
                    let nic = self.nic_by_name(name).ok_or_else(|| TopoError::NicMap {
                        input: name.clone(),
                        msg: format!(
                            "local rank {r}: no NIC named {name:?} (known: {})",
                            self.nics
                                .iter()
                                .map(|n| n.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })?;
                    if !chosen.contains(&nic.index) {
                        chosen.push(nic.index);
                    }
                }
                for &n in &chosen {
                    load[n] += 1;
                    users[n].push(r);
                }
                p.why_nic = format!(
                    "NIC from {}: {}",
                    vars::NIC_MAP,
                    chosen
                        .iter()
                        .map(|&n| format!("{} ({})", self.nics[n].name, self.class_from(p.src, n)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                p.nics = chosen;
                p.mapped = true;
            }
        }
        if pool.is_empty() {
            for p in plans.iter_mut().filter(|p| !p.mapped) {
                p.why_nic = "no NIC found".to_string();
            }
            return Ok(());
        }

        // Rank the candidates and find each rank's nearest tier (see the module docs): NICs
        // 4x or more slower than the fastest go last; then comparable paths (behind the GPU's
        // switches / through the CPU / across sockets); then bandwidth; then RDMA; then the
        // exact path class.
        let speeds = self.nic_speeds();
        let best = pool.iter().map(|&n| speeds[n].mbps).max().unwrap_or(0);
        let slow = |n: usize| best > 0 && speeds[n].mbps.saturating_mul(4) <= best;
        let rdma = |n: usize| self.nics[n].rdma.is_some();
        let key = |n: usize, c: PathClass| {
            (
                slow(n),
                path_level(c),
                std::cmp::Reverse(speeds[n].mbps),
                !rdma(n),
                c,
            )
        };
        for p in plans.iter_mut().filter(|p| !p.mapped) {
            let mut ranked: Vec<(usize, PathClass, u64)> = pool
                .iter()
                .map(|&n| (n, self.class_from(p.src, n), speeds[n].mbps))
                .collect();
            ranked.sort_by(|a, b| key(a.0, a.1).cmp(&key(b.0, b.1)).then(a.0.cmp(&b.0)));
            let k0 = key(ranked[0].0, ranked[0].1);
            p.tier = ranked
                .iter()
                .filter(|x| key(x.0, x.1) == k0)
                .map(|x| x.0)
                .collect();
            p.ranked = ranked;
        }
        let mut order: Vec<usize> = (0..plans.len()).filter(|&r| !plans[r].mapped).collect();
        order.sort_by_key(|&r| (plans[r].tier.len(), r));
        for r in order {
            let p = &mut plans[r];
            let pick = p
                .tier
                .iter()
                .copied()
                .min_by_key(|&n| (load[n], n))
                .unwrap_or(p.ranked[0].0);
            let name = |n: usize| self.nics[n].name.clone();
            let c0 = p.ranked[0].1;
            let mut why = if only_virtual {
                "no PCI NIC: virtual NICs count as host-attached (PHB); ".to_string()
            } else {
                String::new()
            };
            let bw = |n: usize| {
                let s = &speeds[n];
                match (s.mbps, &s.assumed) {
                    (0, _) => "unknown bandwidth".to_string(),
                    (b, None) => format!("{b} Mb/s"),
                    (b, Some(_)) => format!("{b} Mb/s assumed"),
                }
            };
            let from = match p.src {
                Some(DeviceId::Gpu(g)) => format!("GPU{g}"),
                Some(DeviceId::Numa(n)) => format!("NUMA node {n}"),
                _ => "the host".to_string(),
            };
            let runner = p.ranked.iter().find(|x| !p.tier.contains(&x.0)).copied();
            if pool.len() == 1 {
                why.push_str(&format!(
                    "NIC {} ({c0} from {from}): the only NIC",
                    name(pick)
                ));
            } else if let (1, Some((rn, rc, _))) = (p.tier.len(), runner) {
                let head = format!("NIC {} ({c0} from {from}, {})", name(pick), bw(pick));
                let (kp, kr) = (key(pick, c0), key(rn, rc));
                let text = if kp.0 != kr.0 {
                    format!(
                        "{head}: bandwidth decided: {} ({rc}, {}) is 4x or more slower than the fastest NIC, so it comes last",
                        name(rn),
                        bw(rn)
                    )
                } else if kp.1 != kr.1 {
                    format!(
                        "{head}: the only NIC at the best path class; next best is {} at {rc}",
                        name(rn)
                    )
                } else if kp.2 != kr.2 {
                    let others: Vec<String> = p
                        .ranked
                        .iter()
                        .filter(|x| x.0 != pick && !slow(x.0) && path_level(x.1) == path_level(c0))
                        .map(|x| format!("{} {}", name(x.0), bw(x.0)))
                        .collect();
                    format!(
                        "{head}: {} NICs at comparable paths, bandwidth decided: {} over {}",
                        others.len() + 1,
                        bw(pick),
                        others.join(", ")
                    )
                } else if kp.3 != kr.3 {
                    format!(
                        "{head}: RDMA-capable; {} ({rc}) at the same bandwidth is not",
                        name(rn)
                    )
                } else {
                    format!(
                        "{head}: the nearest of NICs alike; next best is {} at {rc}",
                        name(rn)
                    )
                };
                why.push_str(&text);
            } else {
                let tier_names: Vec<String> = p.tier.iter().map(|&n| name(n)).collect();
                why.push_str(&format!(
                    "NIC {} ({c0} from {from}): {} NICs tie at {c0} and {} ({}); took the one serving the fewest local ranks, lowest index first (rail alignment)",
                    name(pick),
                    p.tier.len(),
                    bw(pick),
                    tier_names.join(", ")
                ));
            }
            // What was assumed about the speeds that decided.
            let mut assumed: Vec<String> = Vec::new();
            let compared = if pool.len() > 1 {
                runner.map(|x| x.0)
            } else {
                None
            };
            for n in std::iter::once(pick)
                .chain(compared)
                .filter(|_| pool.len() > 1)
            {
                if speeds[n].mbps == 0 {
                    continue;
                }
                if let Some(a) = &speeds[n].assumed {
                    assumed.push(format!("{} {} Mb/s {a}", name(n), speeds[n].mbps));
                }
            }
            if !assumed.is_empty() {
                why.push_str(&format!(
                    " [port speeds unknown, assumed: {}]",
                    assumed.join(", ")
                ));
            }
            if self.nics[pick].netdevs.is_empty() {
                why.push_str(" (no network interface known for it: TCP cannot use it by name)");
            }
            if load[pick] > 0 {
                let with: Vec<String> = users[pick].iter().map(|u| u.to_string()).collect();
                if p.tier.len() == 1 {
                    why.push_str(&format!("; shared with local rank(s) {}", with.join(", ")));
                } else {
                    why.push_str(&format!(
                        "; every NIC of that tier already serves a local rank, so it is shared with local rank(s) {}",
                        with.join(", ")
                    ));
                }
            }
            load[pick] += 1;
            users[pick].push(r);
            p.nics = vec![pick];
            p.why_nic = why;
        }

        // Idle tier NICs become extra rails.
        for n in pool {
            if load[n] > 0 {
                continue;
            }
            let taker = (0..plans.len())
                .filter(|&r| !plans[r].mapped && plans[r].tier.contains(&n))
                .min_by_key(|&r| (plans[r].nics.len(), r));
            if let Some(r) = taker {
                load[n] += 1;
                plans[r].nics.push(n);
                let nm = self.nics[n].name.clone();
                plans[r].why_nic.push_str(&format!(
                    "; also {nm}: same tier and no other local rank uses it"
                ));
            }
        }
        Ok(())
    }
}

/// CPUs this process may run on (`sched_getaffinity`).
pub fn process_allowed_cpus() -> Result<Vec<usize>, TopoError> {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(|e| TopoError::Affinity {
        cpus: "(query)".into(),
        msg: e.to_string(),
    })?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Binds the calling thread (and the threads it starts later) to `cpus`.
/// An empty list leaves affinity unchanged.
pub fn apply_cpu_binding(cpus: &[usize]) -> Result<(), TopoError> {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    if cpus.is_empty() {
        return Ok(());
    }
    let err = |msg: String| TopoError::Affinity {
        cpus: format_cpulist(cpus),
        msg,
    };
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|_| {
            err(format!(
                "CPU {c} is beyond the {} CPUs sched_setaffinity supports",
                CpuSet::count()
            ))
        })?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| err(e.to_string()))
}
