//! The one topology model all three loaders produce.

use serde::Serialize;
use std::collections::BTreeMap;

use super::util::{busid_domain, natural_cmp};

/// A NUMA node: its OS id, the socket (package) it belongs to when known,
/// and its CPUs (OS CPU numbers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    pub id: usize,
    pub package: Option<usize>,
    pub cpus: Vec<usize>,
}

/// What a node of the PCI tree is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PciKind {
    /// A PCI host bridge (root complex, `pciDDDD:BB` in sysfs, hwloc bridge
    /// type `0-1`, or one synthesized per `<cpu>` and PCI domain for NCCL files).
    HostBridge,
    /// A bridge directly below a host bridge (root port). Not a switch.
    RootPort,
    /// A PCIe switch: its upstream port in sysfs/hwloc, or an NCCL
    /// `<pci class="0x0604..">` element (NCCL already collapses switches).
    Switch,
    /// A downstream port of a switch. Not counted as a switch of its own.
    SwitchPort,
    /// A bridge whose role is not known yet (loaders use it; the model never
    /// contains it once built).
    Bridge,
    /// An endpoint function (GPU, NIC, anything else).
    Device,
}

/// One node of the PCI tree. `parent` indexes [`Topology::pci`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PciNode {
    pub busid: Option<String>,
    pub kind: PciKind,
    /// 24-bit class code (`0x030200` for a 3D controller).
    pub class: Option<u32>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    pub parent: Option<usize>,
    /// NUMA node id (OS numbering), when known.
    pub numa: Option<usize>,
    /// Link bandwidth in Mbit/s after line coding, when known.
    pub link_mbps: Option<u64>,
}

/// A GPU. GPUs are ordered by PCI bus id (the order of `nvidia-smi` and of
/// CUDA with `CUDA_DEVICE_ORDER=PCI_BUS_ID`); `index` is that position.
///
/// GPUs are found by PCI class 0x0300/0x0302 with vendor 0x10de (NVIDIA).
/// TODO: optional NVML (dlopen of libnvidia-ml.so.1) for NVLink counts and
/// UUIDs on live systems; it must never be required, so it is not used yet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    pub index: usize,
    pub busid: Option<String>,
    /// Index into [`Topology::pci`] of the GPU's own PCI function.
    #[serde(skip)]
    pub pci: Option<usize>,
    pub numa: Option<usize>,
    pub model: Option<String>,
    pub uuid: Option<String>,
}

/// A network device. One entry per PCI function (sysfs, hwloc) or per
/// `<net>` (NCCL). `name` is the RDMA device name when there is one
/// (`mlx5_0`, as `nvidia-smi` shows), else the first interface name, else
/// the PCI bus id (NCCL files that carry no `<net name>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Nic {
    pub index: usize,
    pub name: String,
    /// Network interface names (`eth0`, `ib0`) the TCP transport can use.
    pub netdevs: Vec<String>,
    /// RDMA device name (`mlx5_0`), when known.
    pub rdma: Option<String>,
    pub busid: Option<String>,
    #[serde(skip)]
    pub pci: Option<usize>,
    pub numa: Option<usize>,
    /// Port speed in Mbit/s (`/sys/class/net/*/speed`, IB port rate,
    /// NCCL `<net speed>`), when known.
    pub speed_mbps: Option<u64>,
    /// True for a NIC without a PCI device (veth, NCCL `<nic>` directly
    /// under `<cpu>`, hwloc network OS device outside any PCI device). Such
    /// NICs count as host-attached (PHB).
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
}

impl Nic {
    /// Bandwidth used to break path-class ties: the lower of port speed and
    /// PCIe link bandwidth when both are known; 0 when neither is.
    pub fn bandwidth_mbps(&self, topo: &Topology) -> u64 {
        let link = self
            .pci
            .and_then(|p| topo.pci.get(p))
            .and_then(|p| p.link_mbps);
        match (self.speed_mbps, link) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => 0,
        }
    }

    /// The interface name the TCP transport can use: the first network interface. `None`
    /// for an RDMA device or a bus id known without any interface (a topology file's
    /// `<net name="mlx5_7">`): its name is not an interface name.
    pub fn netdev(&self) -> Option<&str> {
        self.netdevs.first().map(String::as_str)
    }

    /// Whether `name` designates this NIC (its name, an interface name, its
    /// RDMA name or its PCI bus id).
    pub fn matches(&self, name: &str) -> bool {
        self.name == name
            || self.netdevs.iter().any(|n| n == name)
            || self.rdma.as_deref() == Some(name)
            || self.busid.as_deref() == Some(name)
    }
}

/// Which device a path class is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceId {
    /// Index into [`Topology::gpus`].
    Gpu(usize),
    /// Index into [`Topology::nics`].
    Nic(usize),
    /// A NUMA node (OS id): the CPUs and memory of that node.
    Numa(usize),
}

/// The machine: NUMA nodes, the PCI tree, GPUs, NICs.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// Where it came from: `sysfs:/`, `nccl-xml:FILE`, `hwloc-xml:FILE`.
    pub source: String,
    pub numa_nodes: Vec<NumaNode>,
    #[serde(skip)]
    pub pci: Vec<PciNode>,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    /// Hardware threads grouped by physical core, when known (used by
    /// `--bind-to core`); CPUs missing here count as one core each.
    #[serde(skip)]
    pub cores: Vec<Vec<usize>>,
    /// NVLink count between GPU pairs (key: lower index first).
    #[serde(skip)]
    pub nvlinks: BTreeMap<(usize, usize), u32>,
    /// Things skipped while loading (partial files), for the user to see.
    pub warnings: Vec<String>,
}

impl Topology {
    /// The NUMA node with OS id `id`.
    pub fn numa_node(&self, id: usize) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.id == id)
    }

    /// All CPUs of all NUMA nodes, sorted.
    pub fn all_cpus(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .numa_nodes
            .iter()
            .flat_map(|n| n.cpus.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The CPUs local to a device (its NUMA node's CPUs), empty when unknown.
    pub fn local_cpus(&self, dev: DeviceId) -> Vec<usize> {
        self.device_numa(dev)
            .and_then(|n| self.numa_node(n))
            .map(|n| n.cpus.clone())
            .unwrap_or_default()
    }

    /// The NUMA node of a device, when known.
    pub fn device_numa(&self, dev: DeviceId) -> Option<usize> {
        match dev {
            DeviceId::Gpu(i) => self.gpus.get(i).and_then(|g| g.numa),
            DeviceId::Nic(i) => self.nics.get(i).and_then(|n| n.numa),
            DeviceId::Numa(n) => Some(n),
        }
    }

    /// The NIC designated by `name` (see [`Nic::matches`]).
    pub fn nic_by_name(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.matches(name))
    }
}

/// What loaders fill in; [`Builder::finish`] derives the rest.
#[derive(Debug, Default)]
pub(crate) struct Builder {
    pub source: String,
    pub numa: Vec<NumaNode>,
    pub pci: Vec<PciNode>,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    pub cores: Vec<Vec<usize>>,
    /// GPU bus id pairs with NVLink counts (direct links).
    pub nvlink_direct: Vec<(String, String, u32)>,
    /// GPU bus id → links into an NVSwitch fabric.
    pub nvlink_switch: Vec<(String, u32)>,
    pub warnings: Vec<String>,
    /// Synthesized host bridges: (NUMA node, PCI domain, index).
    synth_bridges: Vec<(Option<usize>, String, usize)>,
    /// CPU numbers stored so far (NUMA nodes and cores).
    cpu_entries: usize,
}

/// Most PCI nodes / GPUs / NICs accepted from any source.
pub const MAX_PCI_NODES: usize = 65_536;
pub const MAX_DEVICES: usize = 4_096;
pub const MAX_NUMA_NODES: usize = 1_024;
/// Most CPU numbers stored over all NUMA nodes and cores of one model.
pub const MAX_CPU_ENTRIES: usize = 1 << 20;
/// Most warnings kept (the rest are counted).
const MAX_WARNINGS: usize = 64;

impl Builder {
    pub fn new(source: String) -> Self {
        Builder {
            source,
            ..Default::default()
        }
    }

    pub fn warn(&mut self, msg: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(msg);
        }
    }

    /// Accounts for `n` more stored CPU numbers; false once over
    /// [`MAX_CPU_ENTRIES`].
    pub fn charge_cpus(&mut self, n: usize) -> bool {
        self.cpu_entries = self.cpu_entries.saturating_add(n);
        self.cpu_entries <= MAX_CPU_ENTRIES
    }

    /// Adds a PCI node, returning its index; `None` once the limit is hit.
    pub fn add_pci(&mut self, node: PciNode) -> Option<usize> {
        if self.pci.len() >= MAX_PCI_NODES {
            return None;
        }
        self.pci.push(node);
        Some(self.pci.len() - 1)
    }

    /// Adds a host bridge for `(numa, domain)` unless one exists already
    /// among the synthesized top-level bridges; returns its index.
    pub fn synth_host_bridge(&mut self, numa: Option<usize>, domain: &str) -> Option<usize> {
        if let Some(&(_, _, i)) = self
            .synth_bridges
            .iter()
            .find(|(n, d, _)| *n == numa && d == domain)
        {
            return Some(i);
        }
        let i = self.add_pci(PciNode {
            busid: None,
            kind: PciKind::HostBridge,
            class: None,
            vendor: None,
            device: None,
            parent: None,
            numa,
            link_mbps: None,
        })?;
        self.synth_bridges.push((numa, domain.to_string(), i));
        Some(i)
    }

    /// Derives bridge roles, NUMA inheritance, device order and NVLink
    /// counts, and returns the model.
    pub fn finish(mut self) -> Topology {
        let n = self.pci.len();
        // Parents must come before children for the passes below; loaders
        // guarantee it, but do not trust it blindly: drop bad links.
        for i in 0..n {
            if let Some(p) = self.pci[i].parent {
                if p >= i {
                    self.pci[i].parent = None;
                }
            }
        }
        // Bridge roles, top-down.
        for i in 0..n {
            if self.pci[i].kind != PciKind::Bridge {
                continue;
            }
            let parent_kind = self.pci[i].parent.map(|p| self.pci[p].kind);
            self.pci[i].kind = match parent_kind {
                None | Some(PciKind::HostBridge) => PciKind::RootPort,
                Some(PciKind::Switch) => PciKind::SwitchPort,
                Some(_) => PciKind::Switch,
            };
        }
        // Only one NUMA node: everything is on it.
        let single_numa = if self.numa.len() == 1 {
            Some(self.numa[0].id)
        } else {
            None
        };
        // Host bridges without a NUMA node take their first child's.
        for i in (0..n).rev() {
            if let (Some(p), Some(numa)) = (self.pci[i].parent, self.pci[i].numa) {
                if self.pci[p].numa.is_none() {
                    self.pci[p].numa = Some(numa);
                }
            }
        }
        for i in 0..n {
            if self.pci[i].numa.is_none() {
                self.pci[i].numa = self.pci[i]
                    .parent
                    .and_then(|p| self.pci[p].numa)
                    .or(single_numa);
            }
        }
        for g in &mut self.gpus {
            if let Some(p) = g.pci {
                g.numa = g.numa.or(self.pci[p].numa);
            }
            g.numa = g.numa.or(single_numa);
        }
        for nic in &mut self.nics {
            if let Some(p) = nic.pci {
                nic.numa = nic.numa.or(self.pci[p].numa);
            }
            if !nic.is_virtual {
                nic.numa = nic.numa.or(single_numa);
            }
        }

        // Order: GPUs by bus id; NICs PCI first by bus id, then by name.
        self.gpus.sort_by(|a, b| match (&a.busid, &b.busid) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        self.gpus.truncate(MAX_DEVICES);
        for (i, g) in self.gpus.iter_mut().enumerate() {
            g.index = i;
        }
        self.nics.sort_by(|a, b| {
            a.is_virtual
                .cmp(&b.is_virtual)
                .then_with(|| match (&a.busid, &b.busid) {
                    (Some(x), Some(y)) => x.cmp(y),
                    _ => std::cmp::Ordering::Equal,
                })
                .then_with(|| natural_cmp(&a.name, &b.name))
        });
        self.nics.truncate(MAX_DEVICES);
        for (i, nic) in self.nics.iter_mut().enumerate() {
            nic.index = i;
        }
        self.numa.sort_by_key(|n| n.id);
        self.numa.dedup_by_key(|n| n.id);

        // NVLink counts.
        let gpu_of =
            |busid: &str, gpus: &[Gpu]| gpus.iter().position(|g| g.busid.as_deref() == Some(busid));
        let mut nvlinks: BTreeMap<(usize, usize), u32> = BTreeMap::new();
        for (a, b, c) in &self.nvlink_direct {
            if let (Some(x), Some(y)) = (gpu_of(a, &self.gpus), gpu_of(b, &self.gpus)) {
                if x != y {
                    let e = nvlinks.entry((x.min(y), x.max(y))).or_insert(0);
                    // Each direction may be listed; keep the larger count.
                    *e = (*e).max(*c);
                }
            }
        }
        let mut to_switch: BTreeMap<usize, u32> = BTreeMap::new();
        for (a, c) in &self.nvlink_switch {
            if let Some(x) = gpu_of(a, &self.gpus) {
                let e = to_switch.entry(x).or_insert(0);
                *e = e.saturating_add(*c);
            }
        }
        let sw: Vec<(usize, u32)> = to_switch.into_iter().collect();
        for (i, &(a, ca)) in sw.iter().enumerate() {
            for &(b, cb) in &sw[i + 1..] {
                let e = nvlinks.entry((a.min(b), a.max(b))).or_insert(0);
                *e = e.saturating_add(ca.min(cb));
            }
        }
        nvlinks.retain(|_, c| *c > 0);

        Topology {
            source: self.source,
            numa_nodes: self.numa,
            pci: self.pci,
            gpus: self.gpus,
            nics: self.nics,
            cores: self.cores,
            nvlinks,
            warnings: self.warnings,
        }
    }
}

/// Whether a 24-bit PCI class and vendor describe an NVIDIA GPU.
pub fn is_gpu_class(class: u32, vendor: Option<u16>) -> bool {
    let base = class >> 8;
    (base == 0x0300 || base == 0x0302) && matches!(vendor, None | Some(0x10de))
}

/// Whether a 24-bit PCI class is a network controller (0x02xx) or an
/// InfiniBand controller on the serial bus class (0x0c06).
pub fn is_nic_class(class: u32) -> bool {
    (class >> 16) == 0x02 || (class >> 8) == 0x0c06
}

/// The PCI domain of a bus id, for grouping top-level devices into host bridges.
pub fn domain_of(busid: Option<&str>) -> String {
    busid.map(busid_domain).unwrap_or("").to_string()
}
