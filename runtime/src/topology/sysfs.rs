//! Live discovery from sysfs (or a copy of it under another root, for tests).
//!
//! Read, all relative to the root:
//! - `sys/devices/system/node/node*/cpulist` (NUMA nodes; without them one
//!   node 0 with `sys/devices/system/cpu/online`),
//! - `sys/devices/system/cpu/cpu*/topology/{physical_package_id,thread_siblings_list}`,
//! - `sys/bus/pci/devices/*` → the device path `…/pciDDDD:BB/<bdf>/<bdf>/…`
//!   gives the PCI tree; each function's `class`, `vendor`, `device`,
//!   `numa_node`, `local_cpulist`, `current_link_speed`, `current_link_width`,
//! - GPUs: PCI class 0x0300/0x0302 with vendor 0x10de (NVML is not needed;
//!   TODO: optionally dlopen libnvidia-ml.so.1 for NVLink counts),
//! - NICs: `sys/class/net/*` (`device` link, `flags`, `type`, `speed`) and
//!   `sys/class/infiniband/*` (`device` link, `ports/*/rate`).
//!
//! Network interfaces: loopback, bridges, tun/tap and interfaces that are
//! not up are left out; an interface without a PCI device (veth) becomes a
//! virtual NIC. A PCI function becomes one NIC carrying its RDMA name and
//! its interface names.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

use super::model::{
    is_gpu_class, Builder, Gpu, Nic, NumaNode, PciKind, PciNode, Topology, MAX_DEVICES,
};
use super::util::{
    ib_rate_mbps, natural_cmp, normalize_busid, parse_cpulist, parse_hex, pcie_link_mbps,
    read_attr, MAX_CPU_ID,
};
use super::TopoError;

/// Most directory entries read from one sysfs directory.
const MAX_DIR_ENTRIES: usize = 16_384;
/// Most path components followed below `sys/devices`.
const MAX_PATH_DEPTH: usize = 64;

const IFF_UP: u64 = 0x1;
const IFF_LOOPBACK: u64 = 0x8;
const ARPHRD_ETHER: u64 = 1;
const ARPHRD_INFINIBAND: u64 = 32;
const ARPHRD_LOOPBACK: u64 = 772;

fn list_dir(p: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = fs::read_dir(p) else {
        return Vec::new();
    };
    let mut v: Vec<(String, PathBuf)> = rd
        .filter_map(Result::ok)
        .take(MAX_DIR_ENTRIES)
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    v.sort_by(|a, b| natural_cmp(&a.0, &b.0));
    v
}

struct Sysfs {
    /// `<root>/sys/devices`, canonical.
    devices: PathBuf,
    b: Builder,
    /// PCI node index by bus id (functions) or `pciDDDD:BB` (host bridges).
    by_key: HashMap<String, usize>,
}

impl Sysfs {
    /// Inserts the PCI chain of the device at canonical path `p` and returns
    /// the index of its last PCI function, or `None` when `p` is not below a
    /// PCI host bridge.
    fn insert_path(&mut self, p: &Path) -> Option<usize> {
        let rel = p.strip_prefix(&self.devices).ok()?;
        let comps: Vec<String> = rel
            .components()
            .take(MAX_PATH_DEPTH)
            .filter_map(|c| match c {
                Component::Normal(s) => s.to_str().map(str::to_string),
                _ => None,
            })
            .collect();
        // The host bridge may sit below other buses (Hyper-V: LNXSYSTM:00/…/pci0001:00).
        let start = comps
            .iter()
            .position(|c| c.starts_with("pci") && c.contains(':'))?;
        let mut dir = self.devices.clone();
        for c in &comps[..start] {
            dir.push(c);
        }
        dir.push(&comps[start]);
        let hb_key = comps[start].clone();
        let mut parent = match self.by_key.get(&hb_key) {
            Some(&i) => i,
            None => {
                let i = self.b.add_pci(PciNode {
                    busid: None,
                    kind: PciKind::HostBridge,
                    class: None,
                    vendor: None,
                    device: None,
                    parent: None,
                    numa: None,
                    link_mbps: None,
                })?;
                self.by_key.insert(hb_key, i);
                i
            }
        };
        let mut last = None;
        for c in &comps[start + 1..] {
            let Some(busid) = normalize_busid(c) else {
                break;
            };
            dir.push(c);
            let idx = match self.by_key.get(&busid) {
                Some(&i) => i,
                None => {
                    let class = read_attr(&dir.join("class"))
                        .and_then(|s| parse_hex(&s))
                        .map(|c| (c & 0xff_ffff) as u32);
                    let vendor = read_attr(&dir.join("vendor"))
                        .and_then(|s| parse_hex(&s))
                        .map(|v| v as u16);
                    let device = read_attr(&dir.join("device"))
                        .and_then(|s| parse_hex(&s))
                        .map(|v| v as u16);
                    let numa = self.numa_of(&dir);
                    let link_mbps = match (
                        read_attr(&dir.join("current_link_speed")),
                        read_attr(&dir.join("current_link_width")),
                    ) {
                        (Some(s), Some(w)) => pcie_link_mbps(&s, &w),
                        _ => None,
                    };
                    let is_bridge = class.is_some_and(|c| c >> 8 == 0x0604);
                    let i = self.b.add_pci(PciNode {
                        busid: Some(busid.clone()),
                        kind: if is_bridge {
                            PciKind::Bridge
                        } else {
                            PciKind::Device
                        },
                        class,
                        vendor,
                        device,
                        parent: Some(parent),
                        numa,
                        link_mbps,
                    })?;
                    self.by_key.insert(busid, i);
                    i
                }
            };
            parent = idx;
            last = Some(idx);
        }
        last
    }

    /// `numa_node`, or the single NUMA node whose CPUs cover `local_cpulist`.
    fn numa_of(&self, dir: &Path) -> Option<usize> {
        if let Some(n) = read_attr(&dir.join("numa_node")).and_then(|s| s.parse::<i64>().ok()) {
            if n >= 0 && self.b.numa.iter().any(|x| x.id as i64 == n) {
                return Some(n as usize);
            }
        }
        let local = read_attr(&dir.join("local_cpulist")).and_then(|s| parse_cpulist(&s).ok())?;
        if local.is_empty()
            || local.len() == self.b.numa.iter().map(|n| n.cpus.len()).sum::<usize>()
        {
            return None;
        }
        let hits: Vec<usize> = self
            .b
            .numa
            .iter()
            .filter(|n| local.iter().any(|c| n.cpus.binary_search(c).is_ok()))
            .map(|n| n.id)
            .collect();
        match hits.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// The canonical target of `link`, when it lies below `sys/devices`.
    fn resolve(&self, link: &Path) -> Option<PathBuf> {
        let p = fs::canonicalize(link).ok()?;
        p.starts_with(&self.devices).then_some(p)
    }
}

/// The bus id of the last PCI function in a canonical device path.
fn last_busid(p: &Path) -> Option<String> {
    p.components().rev().find_map(|c| match c {
        Component::Normal(s) => s.to_str().and_then(normalize_busid),
        _ => None,
    })
}

#[derive(Default)]
struct NicDraft {
    netdevs: Vec<String>,
    rdma: Vec<String>,
    speed: Option<u64>,
    path: PathBuf,
}

pub(crate) fn load(root: &Path) -> Result<Topology, TopoError> {
    let root_c = fs::canonicalize(root).map_err(|e| TopoError::Sysfs {
        path: root.display().to_string(),
        msg: format!("cannot open: {e}"),
    })?;
    let sys = root_c.join("sys");
    let mut s = Sysfs {
        devices: sys.join("devices"),
        b: Builder::new(format!("sysfs:{}", root.display())),
        by_key: HashMap::new(),
    };
    if !s.devices.is_dir() {
        return Err(TopoError::Sysfs {
            path: s.devices.display().to_string(),
            msg: "not a directory: is sysfs mounted?".into(),
        });
    }

    // NUMA nodes and CPUs.
    let node_dir = sys.join("devices/system/node");
    for (name, path) in list_dir(&node_dir) {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if id >= super::model::MAX_NUMA_NODES {
            continue;
        }
        let cpus = match read_attr(&path.join("cpulist")).map(|t| parse_cpulist(&t)) {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                s.b.warn(format!(
                    "{}: {e}: node skipped",
                    path.join("cpulist").display()
                ));
                continue;
            }
            None => Vec::new(),
        };
        if !s.b.charge_cpus(cpus.len()) {
            s.b.warn(format!(
                "{}: too many CPUs listed: node skipped",
                path.display()
            ));
            continue;
        }
        s.b.numa.push(NumaNode {
            id,
            package: None,
            cpus,
        });
    }
    let cpu_dir = sys.join("devices/system/cpu");
    if s.b.numa.is_empty() {
        if let Some(Ok(cpus)) = read_attr(&cpu_dir.join("online")).map(|t| parse_cpulist(&t)) {
            s.b.numa.push(NumaNode {
                id: 0,
                package: None,
                cpus,
            });
        }
    }
    let mut seen: Vec<bool> = Vec::new();
    for nn in &mut s.b.numa {
        if let Some(&first) = nn.cpus.first() {
            nn.package =
                read_attr(&cpu_dir.join(format!("cpu{first}/topology/physical_package_id")))
                    .and_then(|t| t.parse().ok());
        }
        for &c in &nn.cpus {
            if c >= MAX_CPU_ID {
                continue;
            }
            if seen.len() <= c {
                seen.resize(c + 1, false);
            }
            if seen[c] {
                continue;
            }
            let sib = read_attr(&cpu_dir.join(format!("cpu{c}/topology/thread_siblings_list")))
                .and_then(|t| parse_cpulist(&t).ok())
                .filter(|v| v.contains(&c))
                .unwrap_or_else(|| vec![c]);
            for &x in &sib {
                if x < MAX_CPU_ID {
                    if seen.len() <= x {
                        seen.resize(x + 1, false);
                    }
                    seen[x] = true;
                }
            }
            s.b.cores.push(sib);
        }
    }

    // GPUs by PCI class and vendor.
    for (_, path) in list_dir(&sys.join("bus/pci/devices")) {
        let class = read_attr(&path.join("class"))
            .and_then(|t| parse_hex(&t))
            .map(|c| (c & 0xff_ffff) as u32);
        let vendor = read_attr(&path.join("vendor"))
            .and_then(|t| parse_hex(&t))
            .map(|v| v as u16);
        let (Some(class), Some(vendor)) = (class, vendor) else {
            continue;
        };
        if !is_gpu_class(class, Some(vendor)) || s.b.gpus.len() >= MAX_DEVICES {
            continue;
        }
        let Some(real) = s.resolve(&path) else {
            continue;
        };
        let Some(pci) = s.insert_path(&real) else {
            continue;
        };
        s.b.gpus.push(Gpu {
            index: 0,
            busid: s.b.pci[pci].busid.clone(),
            pci: Some(pci),
            numa: None,
            model: None,
            uuid: None,
        });
    }

    // NICs: network interfaces and RDMA devices, grouped by PCI function.
    let mut drafts: BTreeMap<String, NicDraft> = BTreeMap::new();
    let mut virtuals: Vec<Nic> = Vec::new();
    for (name, path) in list_dir(&sys.join("class/net")) {
        let flags = read_attr(&path.join("flags")).and_then(|t| parse_hex(&t));
        let ty = read_attr(&path.join("type")).and_then(|t| t.parse::<u64>().ok());
        if name == "lo"
            || flags.is_some_and(|f| f & IFF_LOOPBACK != 0)
            || ty == Some(ARPHRD_LOOPBACK)
        {
            continue;
        }
        let up = !matches!(flags, Some(f) if f & IFF_UP == 0);
        let speed = read_attr(&path.join("speed"))
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|v| *v > 0)
            .map(|v| v as u64);
        let dev = s.resolve(&path.join("device"));
        match dev.as_deref().and_then(last_busid).zip(dev.clone()) {
            Some((busid, devpath)) => {
                let d = drafts.entry(busid).or_default();
                d.path = devpath;
                if up {
                    d.netdevs.push(name);
                    d.speed = d.speed.max(speed);
                }
            }
            None => {
                let is_bridge = path.join("bridge").is_dir();
                let is_tun = path.join("tun_flags").exists();
                let usable_type = matches!(ty, None | Some(ARPHRD_ETHER) | Some(ARPHRD_INFINIBAND));
                if !up || is_bridge || is_tun || !usable_type || virtuals.len() >= MAX_DEVICES {
                    continue;
                }
                virtuals.push(Nic {
                    index: 0,
                    name: name.clone(),
                    netdevs: vec![name],
                    rdma: None,
                    busid: None,
                    pci: None,
                    numa: None,
                    speed_mbps: speed,
                    is_virtual: true,
                });
            }
        }
    }
    for (name, path) in list_dir(&sys.join("class/infiniband")) {
        let Some(devpath) = s.resolve(&path.join("device")) else {
            continue;
        };
        let Some(busid) = last_busid(&devpath) else {
            continue;
        };
        let rate = list_dir(&path.join("ports"))
            .into_iter()
            .filter_map(|(_, p)| read_attr(&p.join("rate")).and_then(|r| ib_rate_mbps(&r)))
            .max();
        let d = drafts.entry(busid).or_default();
        d.path = devpath;
        d.rdma.push(name);
        d.speed = d.speed.max(rate);
    }
    for (busid, mut d) in drafts {
        if d.netdevs.is_empty() && d.rdma.is_empty() {
            continue; // only down interfaces: nothing a transport could use
        }
        if s.b.nics.len() >= MAX_DEVICES {
            break;
        }
        let Some(pci) = s.insert_path(&d.path) else {
            continue;
        };
        d.netdevs.sort_by(|a, b| natural_cmp(a, b));
        d.rdma.sort_by(|a, b| natural_cmp(a, b));
        let rdma = d.rdma.first().cloned();
        let name = rdma
            .clone()
            .or_else(|| d.netdevs.first().cloned())
            .unwrap_or_else(|| busid.clone());
        s.b.nics.push(Nic {
            index: 0,
            name,
            netdevs: d.netdevs,
            rdma,
            busid: Some(busid),
            pci: Some(pci),
            numa: None,
            speed_mbps: d.speed,
            is_virtual: false,
        });
    }
    s.b.nics.extend(virtuals);
    Ok(s.b.finish())
}

/// For a topology read from a file on a live machine: give NICs that the
/// file names only by bus id (or by RDMA name) their interface and RDMA
/// names from the live sysfs under `root`.
pub(crate) fn enrich_names(topo: &mut Topology, root: &Path) {
    let sys = root.join("sys");
    for nic in &mut topo.nics {
        if !nic.netdevs.is_empty() {
            continue;
        }
        // Bus ids are normalized hex; a name from a file must be a plain
        // file name before it goes into a path.
        let plain = !nic.name.is_empty()
            && nic.name != "."
            && nic.name != ".."
            && !nic.name.contains(['/', '\\', '\0']);
        let dir = match &nic.busid {
            Some(b) => sys.join("bus/pci/devices").join(b),
            None if plain => sys.join("class/infiniband").join(&nic.name).join("device"),
            None => continue,
        };
        if !dir.is_dir() {
            continue;
        }
        let mut nets: Vec<String> = list_dir(&dir.join("net"))
            .into_iter()
            .filter(|(_, p)| {
                let flags = read_attr(&p.join("flags")).and_then(|t| parse_hex(&t));
                !matches!(flags, Some(f) if f & IFF_UP == 0)
            })
            .map(|(n, _)| n)
            .collect();
        nets.truncate(16);
        let rdma = list_dir(&dir.join("infiniband"))
            .into_iter()
            .map(|(n, _)| n)
            .next();
        if nic.rdma.is_none() {
            nic.rdma = rdma;
        }
        if nic.busid.as_deref() == Some(nic.name.as_str()) {
            if let Some(better) = nic.rdma.clone().or_else(|| nets.first().cloned()) {
                nic.name = better;
            }
        }
        nic.netdevs = nets;
    }
}
