//! The fabric's directed links and the path of one flow.
//!
//! Links, numbered in blocks: NIC up (node → its leaf), NIC down (leaf → node), leaf up (leaf →
//! spine), leaf down (spine → leaf), spine up (spine → core), spine down (core → spine). With
//! [`Ecmp::Ideal`] the uplinks of one leaf (and of one pod) are one bundle id; with [`Ecmp::Hash`] each flow takes the uplink its hash
//! picks (and the same spine index down the other side, as in a Clos where core plane j joins
//! spine j of every pod); with [`Ecmp::Worst`] every flow takes uplink 0. A bundle spreads its
//! flows evenly: k flows on a bundle of w links load each link with ⌈k / w⌉.
//!
//! A flow from a NIC to a NIC under the same leaf crosses 1 switch; under two leaves of one pod,
//! 3; across pods, 5.

use super::{Ecmp, Fabric};

/// What kind of link a link is (for bottleneck reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    NicUp,
    NicDown,
    LeafUp,
    LeafDown,
    SpineUp,
    SpineDown,
}

impl LinkClass {
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::NicUp => "NIC -> leaf",
            LinkClass::NicDown => "leaf -> NIC",
            LinkClass::LeafUp => "leaf -> spine",
            LinkClass::LeafDown => "spine -> leaf",
            LinkClass::SpineUp => "spine -> core",
            LinkClass::SpineDown => "core -> spine",
        }
    }
    /// Links whose load ECMP decides (uplinks and the links down the other side).
    pub fn ecmp(self) -> bool {
        !matches!(self, LinkClass::NicUp | LinkClass::NicDown)
    }
}

/// The path of one flow: up to 6 link ids, and the number of switches it crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    pub links: [u32; 6],
    pub len: u8,
    pub hops: u8,
}

impl Path {
    pub fn links(&self) -> &[u32] {
        &self.links[..self.len as usize]
    }
}

/// The link table of a fabric: where each block of ids starts, and each link's capacity.
#[derive(Clone, Debug)]
pub struct Routes {
    nics: usize,
    spines: usize,
    uplinks: usize,
    ecmp: Ecmp,
    /// Start of each block: NicUp, NicDown, LeafUp, LeafDown, SpineUp, SpineDown, end.
    base: [usize; 7],
    /// Payload bytes per second of one link of each class.
    cap: [f64; 6],
    /// Links one id stands for (an ideal bundle of equal-cost links), per class.
    bundle: [usize; 6],
}

impl Routes {
    /// The link table of a validated fabric.
    pub fn new(f: &Fabric) -> Routes {
        let nic_links = f.nodes * f.nics;
        let leaves = f.leaves();
        let pods = f.pods();
        let s = f.spines();
        let c = f.core.map_or(0, |c| c.uplinks);
        let bundle = f.ecmp == Ecmp::Ideal;
        let leaf_links = if bundle { leaves } else { leaves * s };
        let core_links = match f.core {
            None => 0,
            Some(_) if bundle => pods,
            Some(_) => pods * s * c,
        };
        let sizes = [
            nic_links, nic_links, leaf_links, leaf_links, core_links, core_links,
        ];
        let mut base = [0usize; 7];
        for i in 0..6 {
            base[i + 1] = base[i] + sizes[i];
        }
        let e = f.efficiency;
        let leaf_bw = f.spine.map_or(0.0, |t| t.link_bw) * e;
        let core_bw = f.core.map_or(0.0, |t| t.link_bw) * e;
        let bundle_w = if bundle {
            [1, 1, s, s, s * c, s * c]
        } else {
            [1; 6]
        };
        let nic_cap = f.nic.bw * e;
        Routes {
            nics: f.nics,
            spines: s,
            uplinks: c,
            ecmp: f.ecmp,
            base,
            cap: [nic_cap, nic_cap, leaf_bw, leaf_bw, core_bw, core_bw],
            bundle: bundle_w,
        }
    }

    /// Number of link ids.
    pub fn len(&self) -> usize {
        self.base[6]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class of a link id.
    pub fn class(&self, link: u32) -> LinkClass {
        let l = link as usize;
        const C: [LinkClass; 6] = [
            LinkClass::NicUp,
            LinkClass::NicDown,
            LinkClass::LeafUp,
            LinkClass::LeafDown,
            LinkClass::SpineUp,
            LinkClass::SpineDown,
        ];
        let i = (0..6).rev().find(|&i| l >= self.base[i]).unwrap_or(0);
        C[i]
    }

    /// Payload bytes per second of one link of `link`'s class.
    pub fn capacity(&self, link: u32) -> f64 {
        self.cap[self.class(link) as usize]
    }

    /// A flow's rate on `link` when `load` flows cross it: the link's rate over the flows on
    /// it; on an ideal bundle the flows are spread evenly over its links (a flow takes one
    /// link: it is never split).
    pub fn rate(&self, link: u32, load: u32) -> f64 {
        let c = self.class(link) as usize;
        self.cap[c] / load.div_ceil(self.bundle[c].max(1) as u32).max(1) as f64
    }

    /// What a link joins: its class, and (node, NIC) for NIC links, (leaf, spine) for leaf
    /// links, (pod, spine × core-uplinks + uplink) for core links; on an ideal bundle the second
    /// number is `None` (the bundle stands for all the equal-cost links).
    pub fn ends(&self, link: u32) -> (LinkClass, usize, Option<usize>) {
        let class = self.class(link);
        let off = link as usize - self.base[class as usize];
        match class {
            LinkClass::NicUp | LinkClass::NicDown => {
                (class, off / self.nics.max(1), Some(off % self.nics.max(1)))
            }
            _ if self.ecmp == Ecmp::Ideal => (class, off, None),
            LinkClass::LeafUp | LinkClass::LeafDown => (
                class,
                off / self.spines.max(1),
                Some(off % self.spines.max(1)),
            ),
            LinkClass::SpineUp | LinkClass::SpineDown => {
                let w = self.spines.max(1) * self.uplinks.max(1);
                (class, off / w, Some(off % w))
            }
        }
    }

    /// Equal-cost links a flow on `link` could have taken (1 for NIC links).
    pub fn ecmp_width(&self, link: u32) -> usize {
        match self.class(link) {
            LinkClass::LeafUp | LinkClass::LeafDown => self.spines,
            LinkClass::SpineUp | LinkClass::SpineDown => self.uplinks,
            _ => 1,
        }
    }

    /// The bundle a link belongs to (its leaf or pod-spine group), for ECMP reports: links of
    /// one bundle are the equal-cost choices of one switch.
    pub fn bundle_of(&self, link: u32) -> (LinkClass, usize) {
        let class = self.class(link);
        let off = link as usize - self.base[class as usize];
        let w = if self.ecmp == Ecmp::Ideal {
            1
        } else {
            self.ecmp_width(link).max(1)
        };
        (class, off / w)
    }

    /// The path of a flow from NIC `src_nic` of `src_node` to NIC `dst_nic` of `dst_node`;
    /// `key` identifies the flow for the ECMP hash. `None` for a flow inside one node.
    pub fn path(
        &self,
        f: &Fabric,
        (src_node, src_nic): (usize, usize),
        (dst_node, dst_nic): (usize, usize),
        key: u64,
    ) -> Option<Path> {
        if src_node == dst_node {
            return None;
        }
        let mut p = Path {
            links: [0; 6],
            len: 0,
            hops: 1,
        };
        let mut push = |l: usize| {
            p.links[p.len as usize] = l as u32;
            p.len += 1;
        };
        push(self.base[0] + src_node * self.nics + src_nic);
        let (la, lb) = (f.leaf_of(src_node, src_nic), f.leaf_of(dst_node, dst_nic));
        if la != lb {
            let (pa, pb) = (f.pod_of(la), f.pod_of(lb));
            let s = self.spines.max(1);
            let c = self.uplinks.max(1);
            match self.ecmp {
                Ecmp::Ideal => {
                    push(self.base[2] + la);
                    if pa != pb {
                        push(self.base[4] + pa);
                        push(self.base[5] + pb);
                    }
                    push(self.base[3] + lb);
                }
                Ecmp::Hash { .. } | Ecmp::Worst => {
                    let (j, k) = match self.ecmp {
                        Ecmp::Hash { seed } => (
                            (mix(seed ^ key ^ 0x5151) % s as u64) as usize,
                            (mix(seed ^ key ^ 0xc0de) % c as u64) as usize,
                        ),
                        _ => (0, 0),
                    };
                    push(self.base[2] + la * s + j);
                    if pa != pb {
                        push(self.base[4] + (pa * s + j) * c + k);
                        push(self.base[5] + (pb * s + j) * c + k);
                    }
                    push(self.base[3] + lb * s + j);
                }
            }
            p.hops = if pa != pb { 5 } else { 3 };
        }
        push(self.base[1] + dst_node * self.nics + dst_nic);
        Some(p)
    }
}

/// The ECMP key of the flow `src → dst` on channel `chan` (ranks).
pub fn flow_key(src: usize, dst: usize, chan: usize) -> u64 {
    mix((src as u64) << 40 ^ (dst as u64) << 16 ^ chan as u64)
}

/// SplitMix64's finaliser: a well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
