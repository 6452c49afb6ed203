//! Path classes between devices, as `nvidia-smi topo -m` prints them.
//!
//! | class | meaning |
//! |---|---|
//! | `X`    | the device itself |
//! | `NV#`  | `#` NVLinks (directly, or each GPU's links into an NVSwitch fabric) |
//! | `PIX`  | at most one PCIe switch between them |
//! | `PXB`  | several PCIe switches, without the host bridge |
//! | `PHB`  | through a PCIe host bridge (the CPU) |
//! | `NODE` | between host bridges inside one NUMA node |
//! | `SYS`  | across the socket interconnect (different NUMA nodes) |
//!
//! How the model maps onto this: the lowest common ancestor of the two
//! devices in the PCI tree decides. A host bridge as common ancestor is
//! PHB; otherwise the switches on the path are counted (a switch is an
//! upstream port together with its downstream ports; root ports are not
//! switches): 0 or 1 is PIX, more is PXB. Without a common ancestor the
//! devices hang off different host bridges: NODE within one NUMA node, SYS
//! across. NCCL files give no host bridges; every PCI domain under one
//! `<cpu>` is treated as one host bridge (Hyper-V VMs give each device its
//! own domain, so their devices are NODE apart, as on the real VM).
//! A device and a NUMA node: PHB when the device is on that node, SYS when
//! not. NICs without a PCI device (veth) count as host-attached: PHB to
//! everything.

use serde::{Serialize, Serializer};
use std::cmp::Ordering;
use std::fmt;

use super::model::{DeviceId, PciKind, Topology};

/// How two devices are connected, best first: `X < NV# (more links first)
/// < PIX < PXB < PHB < NODE < SYS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathClass {
    /// The device itself (`X`).
    Same,
    /// This many NVLinks (`NV#`).
    Nv(u32),
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl PathClass {
    fn key(self) -> (u8, u32) {
        match self {
            PathClass::Same => (0, 0),
            PathClass::Nv(n) => (1, u32::MAX - n),
            PathClass::Pix => (2, 0),
            PathClass::Pxb => (3, 0),
            PathClass::Phb => (4, 0),
            PathClass::Node => (5, 0),
            PathClass::Sys => (6, 0),
        }
    }

    /// Parses `X`, `NV12`, `PIX`, … (case-insensitive).
    pub fn parse(s: &str) -> Option<PathClass> {
        let u = s.trim().to_ascii_uppercase();
        Some(match u.as_str() {
            "X" => PathClass::Same,
            "PIX" => PathClass::Pix,
            "PXB" => PathClass::Pxb,
            "PHB" => PathClass::Phb,
            "NODE" => PathClass::Node,
            "SYS" => PathClass::Sys,
            _ => PathClass::Nv(u.strip_prefix("NV")?.parse().ok()?),
        })
    }
}

impl Ord for PathClass {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for PathClass {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathClass::Same => f.write_str("X"),
            PathClass::Nv(n) => write!(f, "NV{n}"),
            PathClass::Pix => f.write_str("PIX"),
            PathClass::Pxb => f.write_str("PXB"),
            PathClass::Phb => f.write_str("PHB"),
            PathClass::Node => f.write_str("NODE"),
            PathClass::Sys => f.write_str("SYS"),
        }
    }
}

impl Serialize for PathClass {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where a device sits.
#[derive(Debug, Clone, Copy)]
enum Loc {
    Pci(usize, Option<usize>),
    Host(Option<usize>),
    Virtual,
}

impl Topology {
    /// The path class between two devices, NVLink included (`NV#` for GPU
    /// pairs with known NVLinks), as `nvidia-smi topo -m` prints it.
    pub fn path_class(&self, a: DeviceId, b: DeviceId) -> PathClass {
        if a == b {
            return PathClass::Same;
        }
        if let (DeviceId::Gpu(x), DeviceId::Gpu(y)) = (a, b) {
            if let Some(&n) = self.nvlinks.get(&(x.min(y), x.max(y))) {
                return PathClass::Nv(n);
            }
        }
        self.pcie_path_class(a, b)
    }

    /// The PCIe/CPU path class, ignoring NVLink.
    pub fn pcie_path_class(&self, a: DeviceId, b: DeviceId) -> PathClass {
        if a == b {
            return PathClass::Same;
        }
        match (self.loc(a), self.loc(b)) {
            (Loc::Virtual, _) | (_, Loc::Virtual) => PathClass::Phb,
            (Loc::Pci(x, _), Loc::Pci(y, _)) => self.pci_class(x, y),
            (Loc::Pci(_, na), Loc::Host(nb))
            | (Loc::Host(na), Loc::Pci(_, nb))
            | (Loc::Host(na), Loc::Host(nb)) => match self.same_numa(na, nb) {
                Some(true) => PathClass::Phb,
                _ => PathClass::Sys,
            },
        }
    }

    fn loc(&self, d: DeviceId) -> Loc {
        match d {
            DeviceId::Gpu(i) => match self.gpus.get(i) {
                Some(g) => match g.pci {
                    Some(p) if p < self.pci.len() => Loc::Pci(p, g.numa),
                    _ => Loc::Host(g.numa),
                },
                None => Loc::Host(None),
            },
            DeviceId::Nic(i) => match self.nics.get(i) {
                // No PCI device: attached to its NUMA node's host when that
                // is known (NCCL <nic> under <cpu>), else to every host (veth).
                Some(n) => match n.pci {
                    Some(p) if p < self.pci.len() => Loc::Pci(p, n.numa),
                    _ if n.numa.is_some() => Loc::Host(n.numa),
                    _ => Loc::Virtual,
                },
                None => Loc::Host(None),
            },
            DeviceId::Numa(n) => Loc::Host(Some(n)),
        }
    }

    /// `Some(true)` same node, `Some(false)` different, `None` unknown. With
    /// at most one NUMA node in the model, everything is on the same node.
    fn same_numa(&self, a: Option<usize>, b: Option<usize>) -> Option<bool> {
        match (a, b) {
            (Some(x), Some(y)) => Some(x == y),
            _ if self.numa_nodes.len() <= 1 => Some(true),
            _ => None,
        }
    }

    fn chain(&self, mut i: usize) -> Vec<usize> {
        let mut v = vec![i];
        // Parents always have lower indices (see Builder::finish), so this ends.
        while let Some(p) = self.pci[i].parent {
            if p >= i || v.len() > self.pci.len() {
                break;
            }
            v.push(p);
            i = p;
        }
        v
    }

    fn pci_class(&self, x: usize, y: usize) -> PathClass {
        if x == y {
            // Two NICs on one PCI function (several NCCL <net>s).
            return PathClass::Pix;
        }
        let ca = self.chain(x);
        let cb = self.chain(y);
        let lca = cb.iter().position(|n| ca.contains(n));
        match lca {
            Some(jb) => {
                let l = cb[jb];
                if self.pci[l].kind == PciKind::HostBridge {
                    return PathClass::Phb;
                }
                let ja = ca.iter().position(|&n| n == l).unwrap_or(0);
                // Switches strictly between the endpoints, LCA included.
                let switches = ca
                    .iter()
                    .take(ja + 1)
                    .skip(1)
                    .chain(cb.iter().take(jb).skip(1))
                    .filter(|&&n| self.pci[n].kind == PciKind::Switch)
                    .count();
                if switches <= 1 {
                    PathClass::Pix
                } else {
                    PathClass::Pxb
                }
            }
            None => {
                let na = self.pci[x].numa.or(self.pci[*ca.last().unwrap_or(&x)].numa);
                let nb = self.pci[y].numa.or(self.pci[*cb.last().unwrap_or(&y)].numa);
                match self.same_numa(na, nb) {
                    Some(true) => PathClass::Node,
                    _ => PathClass::Sys,
                }
            }
        }
    }
}
