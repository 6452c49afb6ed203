//! Loader for hwloc XML exports (`lstopo foo.xml`): format 2.0 (hwloc 2.x),
//! 3.0 (hwloc 3.x) and the 1.x layout (no version, `Socket` objects).
//!
//! Used: `Package`/`Socket`, `NUMANode` (`os_index`, `cpuset`), `Core`
//! (`cpuset`, for `--bind-to core`), `Bridge` (`bridge_type` `0-1` is a
//! host bridge), `PCIDev` (`pci_busid`, `pci_type`, `pci_link_speed` in
//! GB/s), `OSDev` (`name`, `osdev_type`: network, OpenFabrics, GPU; the
//! numbering changed from an enumeration in 1.x/2.x to bit flags in 3.x)
//! and the `NVLinkBandwidth` distance matrices (NVLink counts). The NUMA
//! node of an I/O object is its nearest non-I/O ancestor's `nodeset`.
//! Everything else is ignored.

use roxmltree::{Document, Node};
use std::collections::HashMap;

use super::model::{
    is_gpu_class, is_nic_class, Builder, Gpu, Nic, NumaNode, PciKind, PciNode, Topology,
};
use super::util::{normalize_busid, parse_hex, parse_mask};
use super::{xml_line, TopoError, XmlCtx, MAX_XML_DEPTH};

/// What an OS device is, independent of the format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OsDevKind {
    Network,
    OpenFabrics,
    Gpu,
    Other,
}

#[derive(Debug)]
struct OsDev {
    name: String,
    kind: OsDevKind,
    gp_index: Option<u64>,
    model: Option<String>,
    uuid: Option<String>,
}

#[derive(Debug)]
struct PciDev {
    pci: usize,
    busid: Option<String>,
    class: Option<u32>,
    vendor: Option<u16>,
    gp_index: Option<u64>,
    osdevs: Vec<OsDev>,
}

#[derive(Clone, Default)]
struct Locality {
    nodes: Option<Vec<usize>>,
    cpus: Option<Vec<usize>>,
}

struct Ctx<'a, 'input> {
    doc: &'a Document<'input>,
    file: &'a str,
    v3: bool,
    b: Builder,
    packages: Vec<(usize, Vec<usize>)>,
    pcidevs: Vec<PciDev>,
    orphan_osdevs: Vec<(OsDev, Locality)>,
    /// Top-level I/O nodes whose NUMA node must come from their cpuset.
    pending: Vec<(usize, Vec<usize>)>,
    /// hwloc gp_index of GPU PCI/OS devices → GPU bus id.
    gp_to_gpu: HashMap<u64, String>,
}

impl<'a, 'i> XmlCtx<'a, 'i> for Ctx<'a, 'i> {
    fn doc(&self) -> &'a Document<'i> {
        self.doc
    }
    fn file(&self) -> &str {
        self.file
    }
}

impl Ctx<'_, '_> {
    fn mask_attr(&self, n: Node, attr: &str) -> Result<Option<Vec<usize>>, TopoError> {
        match n.attribute(attr) {
            None => Ok(None),
            Some(v) => parse_mask(v).map(Some).map_err(|e| {
                self.invalid(
                    n,
                    &format!("<object {attr}>"),
                    &format!("an hwloc bitmap like 0x00ff00ff ({e})"),
                    v,
                )
            }),
        }
    }

    fn usize_attr(&self, n: Node, attr: &str) -> Result<Option<usize>, TopoError> {
        match n.attribute(attr) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|x| *x < 1 << 24)
                .map(Some)
                .ok_or_else(|| {
                    self.invalid(n, &format!("<object {attr}>"), "a non-negative integer", v)
                }),
        }
    }
}

pub(crate) fn load(doc: &Document, file: &str) -> Result<Topology, TopoError> {
    let root = doc.root_element();
    if root.tag_name().name() != "topology" {
        return Err(TopoError::UnknownFormat {
            file: file.to_string(),
            line: xml_line(doc, root),
            found: root.tag_name().name().chars().take(40).collect(),
            expected: "<topology> (hwloc)".into(),
        });
    }
    let version = root.attribute("version").unwrap_or("1.0");
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(1);
    let mut cx = Ctx {
        doc,
        file,
        v3: major >= 3,
        b: Builder::new(format!("hwloc-xml:{file}")),
        packages: Vec::new(),
        pcidevs: Vec::new(),
        orphan_osdevs: Vec::new(),
        pending: Vec::new(),
        gp_to_gpu: HashMap::new(),
    };
    if major > 3 {
        let line = cx.line(root);
        cx.b.warn(format!(
            "{file}:{line}: hwloc format {version} is newer than 3.0; reading it as 3.0"
        ));
    }
    for child in root.children().filter(Node::is_element) {
        if child.has_tag_name("object") {
            object(&mut cx, child, &Locality::default(), None, None, None, 1)?;
        }
    }
    resolve(&mut cx);
    // NVLink matrices come after the objects.
    for child in root.children().filter(Node::is_element) {
        let tag = child.tag_name().name();
        if (tag == "distances2hetero" || tag == "distances2")
            && child.attribute("name") == Some("NVLinkBandwidth")
        {
            nvlink_matrix(&mut cx, child)?;
        }
    }
    Ok(cx.b.finish())
}

fn is_io(t: &str) -> bool {
    matches!(t, "Bridge" | "PCIDev" | "OSDev")
}

fn object(
    cx: &mut Ctx,
    n: Node,
    loc: &Locality,
    package: Option<usize>,
    pci_parent: Option<usize>,
    pcidev: Option<usize>,
    depth: usize,
) -> Result<(), TopoError> {
    if depth > MAX_XML_DEPTH {
        return Err(cx.limit(n, "objects nested too deeply"));
    }
    let ty = n.attribute("type").unwrap_or("");
    let mut loc = loc.clone();
    let mut package = package;
    let mut pci_parent = pci_parent;
    let mut pcidev = pcidev;
    if !is_io(ty) {
        if let Some(nodes) = cx.mask_attr(n, "nodeset")? {
            loc.nodes = Some(nodes);
        }
        if let Some(cpus) = cx.mask_attr(n, "cpuset")? {
            loc.cpus = Some(cpus);
        }
    }
    match ty {
        "Package" | "Socket" => {
            let id = cx.usize_attr(n, "os_index")?.unwrap_or(cx.packages.len());
            cx.packages.push((id, loc.cpus.clone().unwrap_or_default()));
            package = Some(id);
        }
        "NUMANode" => match cx.usize_attr(n, "os_index")? {
            Some(id) if id < super::model::MAX_NUMA_NODES => {
                if cx.b.numa.len() >= super::model::MAX_NUMA_NODES {
                    return Err(cx.limit(n, "too many NUMA nodes"));
                }
                let cpus = cx.mask_attr(n, "cpuset")?.unwrap_or_default();
                if !cx.b.charge_cpus(cpus.len()) {
                    return Err(cx.limit(n, "too many CPUs listed"));
                }
                cx.b.numa.push(NumaNode { id, package, cpus });
            }
            _ => {
                let line = cx.line(n);
                cx.b.warn(format!(
                    "{}:{line}: NUMANode without a usable os_index: skipped",
                    cx.file
                ));
            }
        },
        "Core" => {
            if let Some(cpus) = cx.mask_attr(n, "cpuset")? {
                if !cpus.is_empty()
                    && cx.b.cores.len() < super::util::MAX_CPU_ID
                    && cx.b.charge_cpus(cpus.len())
                {
                    cx.b.cores.push(cpus);
                }
            }
        }
        "Bridge" => {
            let host = n
                .attribute("bridge_type")
                .is_some_and(|t| t.trim_start().starts_with('0'));
            let busid = busid_attr(cx, n)?;
            let link_mbps = link_attr(n);
            let numa = single(&loc.nodes);
            let parent = if host {
                None
            } else {
                top_parent(cx, n, pci_parent, numa, busid.as_deref(), &loc)?
            };
            let idx =
                cx.b.add_pci(PciNode {
                    busid,
                    kind: if host {
                        PciKind::HostBridge
                    } else {
                        PciKind::Bridge
                    },
                    class: Some(0x060400),
                    vendor: None,
                    device: None,
                    parent,
                    numa: if parent.is_none() { numa } else { None },
                    link_mbps,
                })
                .ok_or_else(|| cx.limit(n, "too many PCI objects"))?;
            if parent.is_none() && numa.is_none() {
                if let Some(c) = &loc.cpus {
                    cx.pending.push((idx, c.clone()));
                }
            }
            pci_parent = Some(idx);
        }
        "PCIDev" => {
            let busid = busid_attr(cx, n)?;
            let (class, vendor, device) = match n.attribute("pci_type") {
                Some(t) => parse_pci_type(t).ok_or_else(|| {
                    cx.invalid(
                        n,
                        "<object pci_type>",
                        "\"CCCC [VVVV:DDDD] [SSSS:SSSS] RR PP\"",
                        t,
                    )
                })?,
                None => (None, None, None),
            };
            let numa = single(&loc.nodes);
            let parent = top_parent(cx, n, pci_parent, numa, busid.as_deref(), &loc)?;
            let idx =
                cx.b.add_pci(PciNode {
                    busid: busid.clone(),
                    kind: PciKind::Device,
                    class,
                    vendor,
                    device,
                    parent,
                    numa: None,
                    link_mbps: link_attr(n),
                })
                .ok_or_else(|| cx.limit(n, "too many PCI objects"))?;
            if cx.pcidevs.len() >= super::model::MAX_PCI_NODES {
                return Err(cx.limit(n, "too many PCI objects"));
            }
            cx.pcidevs.push(PciDev {
                pci: idx,
                busid,
                class,
                vendor,
                gp_index: n.attribute("gp_index").and_then(|g| g.trim().parse().ok()),
                osdevs: Vec::new(),
            });
            pci_parent = Some(idx);
            pcidev = Some(cx.pcidevs.len() - 1);
        }
        "OSDev" => {
            let kind = match n.attribute("osdev_type") {
                Some(t) => match t.trim().parse::<u64>() {
                    Ok(v) => osdev_kind(v, cx.v3),
                    Err(_) => return Err(cx.invalid(n, "<object osdev_type>", "an integer", t)),
                },
                None => OsDevKind::Other,
            };
            let info = |key: &str| {
                n.children()
                    .filter(|c| c.has_tag_name("info") && c.attribute("name") == Some(key))
                    .find_map(|c| c.attribute("value"))
                    .map(|v| v.chars().take(128).collect::<String>())
            };
            let dev = OsDev {
                name: n.attribute("name").unwrap_or("").chars().take(64).collect(),
                kind,
                gp_index: n.attribute("gp_index").and_then(|g| g.trim().parse().ok()),
                model: info("GPUModel"),
                uuid: info("NVIDIAUUID"),
            };
            match pcidev.and_then(|p| cx.pcidevs.get_mut(p)) {
                Some(p) => {
                    if p.osdevs.len() < 64 {
                        p.osdevs.push(dev)
                    }
                }
                None => {
                    if cx.orphan_osdevs.len() < super::model::MAX_DEVICES {
                        cx.orphan_osdevs.push((dev, loc.clone()))
                    }
                }
            }
        }
        _ => {}
    }
    for child in n.children().filter(|c| c.has_tag_name("object")) {
        object(cx, child, &loc, package, pci_parent, pcidev, depth + 1)?;
    }
    Ok(())
}

/// The parent of a top-level I/O object: a synthesized host bridge (per
/// NUMA node and PCI domain) when the file has none above it.
fn top_parent(
    cx: &mut Ctx,
    n: Node,
    pci_parent: Option<usize>,
    numa: Option<usize>,
    busid: Option<&str>,
    loc: &Locality,
) -> Result<Option<usize>, TopoError> {
    if pci_parent.is_some() {
        return Ok(pci_parent);
    }
    let hb =
        cx.b.synth_host_bridge(numa, &super::model::domain_of(busid))
            .ok_or_else(|| cx.limit(n, "too many PCI objects"))?;
    if numa.is_none() {
        if let Some(c) = &loc.cpus {
            cx.pending.push((hb, c.clone()));
        }
    }
    Ok(Some(hb))
}

fn single(nodes: &Option<Vec<usize>>) -> Option<usize> {
    match nodes.as_deref() {
        Some([one]) => Some(*one),
        _ => None,
    }
}

fn busid_attr(cx: &Ctx, n: Node) -> Result<Option<String>, TopoError> {
    match n.attribute("pci_busid") {
        None => Ok(None),
        Some(v) => normalize_busid(v)
            .map(Some)
            .ok_or_else(|| cx.invalid(n, "<object pci_busid>", "a PCI bus id dddd:bb:dd.f", v)),
    }
}

/// `pci_link_speed` is in GB/s; the model uses Mbit/s.
fn link_attr(n: Node) -> Option<u64> {
    let v: f64 = n.attribute("pci_link_speed")?.trim().parse().ok()?;
    if v.is_finite() && v > 0.0 && v < 1.0e6 {
        Some((v * 8000.0).round() as u64)
    } else {
        None
    }
}

/// `"0302 [10de:1db8] [10de:131d] a1 00"` → (class 0x030200, vendor, device).
fn parse_pci_type(t: &str) -> Option<(Option<u32>, Option<u16>, Option<u16>)> {
    let mut it = t.split_whitespace();
    let class = it.next()?;
    if class.len() != 4 {
        return None;
    }
    let class = u32::from_str_radix(class, 16).ok()? << 8;
    let ids = match it.next() {
        Some(ids) => {
            let inner = ids.strip_prefix('[')?.strip_suffix(']')?;
            let (v, d) = inner.split_once(':')?;
            (Some(parse_hex(v)? as u16), Some(parse_hex(d)? as u16))
        }
        None => (None, None),
    };
    if ids.0.is_some_and(|v| v == 0) {
        // Unreadable config space ("0000 [0000:0000]"): keep the node, drop ids.
        return Some((None, None, None));
    }
    Some((Some(class), ids.0, ids.1))
}

fn osdev_kind(v: u64, v3: bool) -> OsDevKind {
    if v3 {
        // hwloc 3: bit flags STORAGE=1 MEMORY=2 GPU=4 COPROC=8 NETWORK=16 OPENFABRICS=32 DMA=64
        if v & 32 != 0 {
            OsDevKind::OpenFabrics
        } else if v & 16 != 0 {
            OsDevKind::Network
        } else if v & 4 != 0 {
            OsDevKind::Gpu
        } else {
            OsDevKind::Other
        }
    } else {
        // hwloc 1.x/2.x: BLOCK=0 GPU=1 NETWORK=2 OPENFABRICS=3 DMA=4 COPROC=5
        match v {
            1 => OsDevKind::Gpu,
            2 => OsDevKind::Network,
            3 => OsDevKind::OpenFabrics,
            _ => OsDevKind::Other,
        }
    }
}

/// Turns PCI devices and OS devices into GPUs and NICs; settles NUMA nodes
/// and packages that depend on objects read later.
fn resolve(cx: &mut Ctx) {
    // NUMA of top-level I/O nodes known only by cpuset.
    for (idx, cpus) in std::mem::take(&mut cx.pending) {
        let hits: Vec<usize> =
            cx.b.numa
                .iter()
                .filter(|nn| nn.cpus.iter().any(|c| cpus.binary_search(c).is_ok()))
                .map(|nn| nn.id)
                .collect();
        if let [one] = hits.as_slice() {
            cx.b.pci[idx].numa = Some(*one);
        }
    }
    // Packages of NUMA nodes found outside a Package (hwloc 1.x).
    for nn in &mut cx.b.numa {
        if nn.package.is_none() {
            if let Some(first) = nn.cpus.first() {
                nn.package = cx
                    .packages
                    .iter()
                    .find(|(_, c)| c.binary_search(first).is_ok())
                    .map(|(id, _)| *id);
            }
        }
    }
    for p in std::mem::take(&mut cx.pcidevs) {
        let class = p.class.unwrap_or(0);
        if p.class.is_some() && is_gpu_class(class, p.vendor) && p.vendor.is_some() {
            if cx.b.gpus.len() < super::model::MAX_DEVICES {
                cx.b.gpus.push(Gpu {
                    index: 0,
                    busid: p.busid.clone(),
                    pci: Some(p.pci),
                    numa: None,
                    model: p.osdevs.iter().find_map(|o| o.model.clone()),
                    uuid: p.osdevs.iter().find_map(|o| o.uuid.clone()),
                });
            }
            if let Some(b) = &p.busid {
                if let Some(g) = p.gp_index {
                    cx.gp_to_gpu.insert(g, b.clone());
                }
                for o in &p.osdevs {
                    if let Some(g) = o.gp_index {
                        cx.gp_to_gpu.insert(g, b.clone());
                    }
                }
            }
            continue;
        }
        let rdma: Vec<&OsDev> = p
            .osdevs
            .iter()
            .filter(|o| o.kind == OsDevKind::OpenFabrics && !o.name.is_empty())
            .collect();
        let nets: Vec<String> = p
            .osdevs
            .iter()
            .filter(|o| o.kind == OsDevKind::Network && !o.name.is_empty())
            .map(|o| o.name.clone())
            .collect();
        if rdma.is_empty() && nets.is_empty() && !(p.class.is_some() && is_nic_class(class)) {
            continue;
        }
        if cx.b.nics.len() >= super::model::MAX_DEVICES {
            continue;
        }
        let rdma = rdma.first().map(|o| o.name.clone());
        let name = rdma
            .clone()
            .or_else(|| nets.first().cloned())
            .or_else(|| p.busid.clone())
            .unwrap_or_else(|| format!("nic{}", cx.b.nics.len()));
        cx.b.nics.push(Nic {
            index: 0,
            name,
            netdevs: nets,
            rdma,
            busid: p.busid.clone(),
            pci: Some(p.pci),
            numa: None,
            speed_mbps: None,
            is_virtual: false,
        });
    }
    for (o, loc) in std::mem::take(&mut cx.orphan_osdevs) {
        if o.kind != OsDevKind::Network
            || o.name.is_empty()
            || cx.b.nics.len() >= super::model::MAX_DEVICES
        {
            continue;
        }
        cx.b.nics.push(Nic {
            index: 0,
            name: o.name.clone(),
            netdevs: vec![o.name],
            rdma: None,
            busid: None,
            pci: None,
            numa: single(&loc.nodes),
            speed_mbps: None,
            is_virtual: true,
        });
    }
}

/// Reads an `NVLinkBandwidth` matrix (MB/s) into NVLink counts. Optional
/// data: a matrix that does not add up is skipped with a warning.
fn nvlink_matrix(cx: &mut Ctx, n: Node) -> Result<(), TopoError> {
    let line = cx.line(n);
    let Some(nb) = n
        .attribute("nbobjs")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|v| *v > 0 && *v <= 1024)
    else {
        cx.b.warn(format!(
            "{}:{line}: NVLinkBandwidth without a usable nbobjs: skipped",
            cx.file
        ));
        return Ok(());
    };
    let homogeneous_type = n.attribute("type");
    let mut idx: Vec<Option<String>> = Vec::with_capacity(nb);
    let mut values: Vec<u64> = Vec::new();
    for c in n.children().filter(Node::is_element) {
        match c.tag_name().name() {
            "indexes" => {
                for tok in c.text().unwrap_or("").split_whitespace() {
                    if idx.len() >= nb {
                        break;
                    }
                    // Heterogeneous: "OSDev:802"; homogeneous: "802" with type on the parent.
                    let (ty, gp) = match tok.split_once(':') {
                        Some((t, g)) => (Some(t), g),
                        None => (homogeneous_type, tok),
                    };
                    let gpu = match (ty, gp.parse::<u64>()) {
                        (Some("OSDev") | Some("PCIDev"), Ok(g)) => {
                            Some(cx.gp_to_gpu.get(&g).cloned())
                        }
                        _ => None,
                    };
                    idx.push(gpu.map(|g| g.unwrap_or_default()));
                }
            }
            "u64values" => {
                for tok in c.text().unwrap_or("").split_whitespace() {
                    if values.len() > nb * nb {
                        break;
                    }
                    match tok.parse::<u64>() {
                        Ok(v) => values.push(v),
                        Err(_) => {
                            return Err(cx.invalid(c, "<u64values>", "unsigned integers", tok))
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if idx.len() != nb || values.len() != nb * nb {
        cx.b.warn(format!(
            "{}:{line}: NVLinkBandwidth has {} indexes and {} values for {nb} objects: skipped",
            cx.file,
            idx.len(),
            values.len()
        ));
        return Ok(());
    }
    // idx[i]: None = not a PCI/OS device (ignored), Some("") = a PCI device
    // that is not a GPU (an NVSwitch), Some(busid) = a GPU.
    // hwloc counts 20000 MB/s per NVLink 1.0 link and 25000 MB/s per link
    // of later generations.
    let links = |bw: u64| -> u32 {
        let n = match (bw % 25_000, bw % 20_000) {
            _ if bw == 0 => 0,
            (0, _) => bw / 25_000,
            (_, 0) => bw / 20_000,
            _ => bw.div_ceil(25_000),
        };
        n.min(1024) as u32
    };
    for i in 0..nb {
        let Some(Some(a)) = idx.get(i).map(|x| x.as_ref().filter(|s| !s.is_empty())) else {
            continue;
        };
        let mut to_switch = 0u32;
        for j in 0..nb {
            if i == j {
                continue;
            }
            let bw = values[i * nb + j].max(values[j * nb + i]);
            match &idx[j] {
                Some(b) if !b.is_empty() && i < j => {
                    cx.b.nvlink_direct.push((a.clone(), b.clone(), links(bw)));
                }
                Some(b) if !b.is_empty() => {}
                Some(_) => to_switch = to_switch.saturating_add(links(bw)),
                None => {}
            }
        }
        if to_switch > 0 {
            cx.b.nvlink_switch.push((a.clone(), to_switch));
        }
    }
    Ok(())
}
