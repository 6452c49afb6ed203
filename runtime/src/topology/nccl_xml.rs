//! Loader for NCCL topology files (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`).
//!
//! ```xml
//! <system version="1">
//!   <cpu numaid="0" affinity="00000000,00ffffff" arch="x86_64" ...>
//!     <pci busid="ffff:ff:01.0" class="0x060400" link_speed="16 GT/s" link_width="16">
//!       <pci busid="0000:10:1c.0" class="0x030200" vendor="0x10de" ...>
//!         <gpu dev="0" sm="80"><nvlink target="0000:11:00.0" count="12" tclass="0x068000"/></gpu>
//!       </pci>
//!       <pci busid="0000:10:1b.0" class="0x020700">
//!         <nic><net name="mlx5_0" speed="200000" port="1"/></nic>
//!       </pci>
//!     </pci>
//!     <nic><net name="eth0" speed="10000"/></nic>   <!-- no PCI device -->
//!   </cpu>
//! </system>
//! ```
//!
//! Every `<pci>` with a bridge class (0x0604xx) is one PCIe switch (NCCL
//! writes one element per switch). Devices without `<gpu>`/`<nic>`
//! children are classified by class code (and vendor, when given). Unknown
//! elements and attributes are ignored; values that are present but cannot
//! be understood are errors naming file and line.
//!
//! A partial dump whose `<pci>` devices carry no `class=` yields no GPU or NIC. Loaded for
//! this machine (`RAILRING_TOPO_FILE`, [`load_merged`]), such a device takes its class and
//! vendor from the live sysfs when the same bus id exists here (a warning says so); a file
//! that still yields no GPU and no NIC says so loudly in its warnings.

use roxmltree::{Document, Node};

use super::model::{
    domain_of, is_gpu_class, is_nic_class, Builder, Gpu, Nic, NumaNode, PciKind, PciNode, Topology,
};
use super::util::{normalize_busid, parse_hex, parse_mask, pcie_link_mbps, read_attr};
use super::{xml_line, TopoError, XmlCtx, MAX_XML_DEPTH};
use std::path::Path;

struct Ctx<'a, 'input> {
    doc: &'a Document<'input>,
    file: &'a str,
    b: Builder,
    /// The live system root whose sysfs fills in missing PCI classes (`None`: another machine).
    live: Option<&'a Path>,
    /// Bus ids of devices left without a class.
    classless: Vec<String>,
    /// Devices whose class came from the live sysfs.
    merged: usize,
}

impl<'a, 'i> XmlCtx<'a, 'i> for Ctx<'a, 'i> {
    fn doc(&self) -> &'a Document<'i> {
        self.doc
    }
    fn file(&self) -> &str {
        self.file
    }
}

pub(crate) fn load(doc: &Document, file: &str) -> Result<Topology, TopoError> {
    load_merged(doc, file, None)
}

/// [`load`] for this machine: devices without a class take it from the sysfs under `live`.
pub(crate) fn load_merged(
    doc: &Document,
    file: &str,
    live: Option<&Path>,
) -> Result<Topology, TopoError> {
    let root = doc.root_element();
    if root.tag_name().name() != "system" {
        return Err(TopoError::UnknownFormat {
            file: file.to_string(),
            line: xml_line(doc, root),
            found: root.tag_name().name().chars().take(40).collect(),
            expected: "<system> (NCCL topology)".into(),
        });
    }
    let mut cx = Ctx {
        doc,
        file,
        b: Builder::new(format!("nccl-xml:{file}")),
        live,
        classless: Vec::new(),
        merged: 0,
    };
    for child in root.children().filter(Node::is_element) {
        match child.tag_name().name() {
            "cpu" => cpu(&mut cx, child)?,
            "pci" => {
                let line = cx.line(child);
                cx.b.warn(format!(
                    "{file}:{line}: <pci> outside any <cpu>: NUMA node unknown"
                ));
                pci(&mut cx, child, None, None, 1)?;
            }
            _ => {}
        }
    }
    if cx.merged > 0 {
        cx.b.warn(format!(
            "{file}: {} PCI device(s) without class=: class and vendor taken from this machine's sysfs (same bus id)",
            cx.merged
        ));
    }
    if cx.b.gpus.is_empty() && cx.b.nics.is_empty() {
        let why = if cx.classless.is_empty() {
            "it lists no <gpu>, no <nic> and no PCI device of a GPU or NIC class".to_string()
        } else {
            format!(
                "{} PCI device(s) carry no class= ({}{}){}",
                cx.classless.len(),
                cx.classless
                    .iter()
                    .take(4)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                if cx.classless.len() > 4 { ", ..." } else { "" },
                if cx.live.is_some() {
                    " and this machine's sysfs has none of those bus ids"
                } else {
                    ""
                }
            )
        };
        cx.b.warn(format!(
            "{file} yields NO GPU AND NO NIC: {why}. Ranks are bound by CPU only and choose no NIC. Fix: a complete dump (NCCL_TOPO_DUMP_FILE writes class=), or unset RAILRING_TOPO_FILE to use this machine's sysfs"
        ));
    }
    Ok(cx.b.finish())
}

/// The class and vendor of PCI device `busid` in the sysfs under `live`.
fn live_class(live: &Path, busid: &str) -> Option<(u32, Option<u16>)> {
    if busid.contains(['/', '\\']) || busid.starts_with('.') {
        return None;
    }
    let dir = live.join("sys/bus/pci/devices").join(busid);
    let class = read_attr(&dir.join("class")).and_then(|t| parse_hex(&t))?;
    let vendor = read_attr(&dir.join("vendor")).and_then(|t| parse_hex(&t));
    Some((
        (class & 0xff_ffff) as u32,
        vendor.filter(|v| *v <= 0xffff).map(|v| v as u16),
    ))
}

fn cpu(cx: &mut Ctx, n: Node) -> Result<(), TopoError> {
    let id = match n.attribute("numaid") {
        Some(v) => {
            let id: usize = v
                .trim()
                .parse()
                .map_err(|_| cx.invalid(n, "<cpu numaid>", "a NUMA node number", v))?;
            if id >= super::model::MAX_NUMA_NODES {
                return Err(cx.invalid(n, "<cpu numaid>", "a NUMA node number below 4096", v));
            }
            id
        }
        None => {
            let id = cx.b.numa.iter().map(|x| x.id + 1).max().unwrap_or(0);
            let line = cx.line(n);
            cx.b.warn(format!(
                "{}:{line}: <cpu> without numaid: numbered {id}",
                cx.file
            ));
            id
        }
    };
    let cpus = match n.attribute("affinity") {
        Some(v) => parse_mask(v).map_err(|e| {
            cx.invalid(
                n,
                "<cpu affinity>",
                &format!("a CPU mask like 00000000,00ffffff ({e})"),
                v,
            )
        })?,
        None => {
            let line = cx.line(n);
            cx.b.warn(format!(
                "{}:{line}: <cpu numaid=\"{id}\"> without affinity: CPUs unknown",
                cx.file
            ));
            Vec::new()
        }
    };
    if !cx.b.charge_cpus(cpus.len()) {
        return Err(cx.limit(n, "too many CPUs listed"));
    }
    if let Some(existing) = cx.b.numa.iter_mut().find(|x| x.id == id) {
        existing.cpus.extend(cpus);
        existing.cpus.sort_unstable();
        existing.cpus.dedup();
    } else {
        if cx.b.numa.len() >= super::model::MAX_NUMA_NODES {
            return Err(cx.limit(n, "too many <cpu> elements"));
        }
        cx.b.numa.push(NumaNode {
            id,
            package: None,
            cpus,
        });
    }
    for child in n.children().filter(Node::is_element) {
        match child.tag_name().name() {
            "pci" => pci(cx, child, None, Some(id), 2)?,
            "nic" => nic(cx, child, None, None, Some(id))?,
            _ => {}
        }
    }
    Ok(())
}

fn hex_attr(
    cx: &Ctx,
    n: Node,
    attr: &str,
    max: u64,
    expected: &str,
) -> Result<Option<u64>, TopoError> {
    match n.attribute(attr) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => match parse_hex(v) {
            Some(x) if x <= max => Ok(Some(x)),
            _ => Err(cx.invalid(n, &format!("<{} {attr}>", n.tag_name().name()), expected, v)),
        },
    }
}

fn pci(
    cx: &mut Ctx,
    n: Node,
    parent: Option<usize>,
    numa: Option<usize>,
    depth: usize,
) -> Result<(), TopoError> {
    if depth > MAX_XML_DEPTH {
        return Err(cx.limit(n, "elements nested too deeply"));
    }
    let busid = match n.attribute("busid") {
        Some(v) => Some(
            normalize_busid(v)
                .ok_or_else(|| cx.invalid(n, "<pci busid>", "a PCI bus id dddd:bb:dd.f", v))?,
        ),
        None => None,
    };
    let mut class =
        hex_attr(cx, n, "class", 0xff_ffff, "a PCI class code like 0x030200")?.map(|c| c as u32);
    let mut vendor = hex_attr(
        cx,
        n,
        "vendor",
        0xffff,
        "a 16-bit PCI vendor id like 0x10de",
    )?
    .map(|v| v as u16);
    let has_child = n
        .children()
        .any(|c| c.has_tag_name("gpu") || c.has_tag_name("nic") || c.has_tag_name("pci"));
    if class.is_none() && !has_child {
        if let Some(b) = busid.as_deref() {
            match cx.live.and_then(|l| live_class(l, b)) {
                Some((c, v)) => {
                    class = Some(c);
                    vendor = vendor.or(v);
                    cx.merged += 1;
                }
                None => {
                    if cx.classless.len() < 4096 {
                        cx.classless.push(b.to_string());
                    }
                }
            }
        }
    }
    let device = hex_attr(cx, n, "device", 0xffff, "a 16-bit PCI device id")?.map(|v| v as u16);
    let link_mbps = match (n.attribute("link_speed"), n.attribute("link_width")) {
        (Some(s), Some(w)) => pcie_link_mbps(s, w),
        _ => None,
    };
    let is_bridge = class.is_some_and(|c| c >> 8 == 0x0604);
    let parent = match parent {
        Some(p) => Some(p),
        None => Some(
            cx.b.synth_host_bridge(numa, &domain_of(busid.as_deref()))
                .ok_or_else(|| cx.limit(n, "too many PCI devices"))?,
        ),
    };
    let idx =
        cx.b.add_pci(PciNode {
            busid: busid.clone(),
            kind: if is_bridge {
                PciKind::Switch
            } else {
                PciKind::Device
            },
            class,
            vendor,
            device,
            parent,
            numa,
            link_mbps,
        })
        .ok_or_else(|| cx.limit(n, "too many PCI devices"))?;

    let mut has_gpu = false;
    let mut has_nic = false;
    for child in n.children().filter(Node::is_element) {
        match child.tag_name().name() {
            "pci" => pci(cx, child, Some(idx), numa, depth + 1)?,
            "gpu" => {
                has_gpu = true;
                gpu(cx, child, idx, busid.as_deref(), numa)?;
            }
            "nic" => {
                has_nic = true;
                nic(cx, child, Some(idx), busid.as_deref(), numa)?;
            }
            _ => {}
        }
    }
    if !is_bridge && !has_gpu && class.is_some_and(|c| is_gpu_class(c, vendor)) {
        gpu(cx, n, idx, busid.as_deref(), numa)?;
    }
    if !is_bridge && !has_nic && !has_gpu && class.is_some_and(is_nic_class) {
        add_nic(cx, n, Some(idx), busid.as_deref(), numa, None, None)?;
    }
    Ok(())
}

fn gpu(
    cx: &mut Ctx,
    n: Node,
    pci: usize,
    busid: Option<&str>,
    numa: Option<usize>,
) -> Result<(), TopoError> {
    if cx.b.gpus.len() >= super::model::MAX_DEVICES {
        return Err(cx.limit(n, "too many GPUs"));
    }
    cx.b.gpus.push(Gpu {
        index: 0,
        busid: busid.map(str::to_string),
        pci: Some(pci),
        numa,
        model: None,
        uuid: None,
    });
    if n.tag_name().name() != "gpu" {
        return Ok(());
    }
    for link in n.children().filter(|c| c.has_tag_name("nvlink")) {
        let count: u32 = match link.attribute("count") {
            Some(v) => match v.trim().parse::<u32>() {
                Ok(c) if c <= 1024 => c,
                _ => return Err(cx.invalid(link, "<nvlink count>", "a link count (0-1024)", v)),
            },
            None => 1,
        };
        let tclass = hex_attr(
            cx,
            link,
            "tclass",
            0xff_ffff,
            "a PCI class code like 0x068000",
        )?;
        let Some(me) = busid else { continue };
        match tclass.map(|c| c >> 8) {
            Some(0x0680) => cx.b.nvlink_switch.push((me.to_string(), count)),
            Some(0x0300) | Some(0x0302) | None => {
                let Some(t) = link.attribute("target") else {
                    continue;
                };
                let t = normalize_busid(t).ok_or_else(|| {
                    cx.invalid(link, "<nvlink target>", "a PCI bus id dddd:bb:dd.f", t)
                })?;
                cx.b.nvlink_direct.push((me.to_string(), t, count));
            }
            Some(_) => {} // NVLink to a CPU: not a GPU path
        }
    }
    Ok(())
}

fn nic(
    cx: &mut Ctx,
    n: Node,
    pci: Option<usize>,
    busid: Option<&str>,
    numa: Option<usize>,
) -> Result<(), TopoError> {
    let mut any = false;
    for net in n.children().filter(|c| c.has_tag_name("net")) {
        any = true;
        let speed = match net.attribute("speed") {
            Some(v) if !v.trim().is_empty() => Some(
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|s| *s < 1 << 40)
                    .ok_or_else(|| cx.invalid(net, "<net speed>", "a speed in Mbit/s", v))?,
            ),
            _ => None,
        };
        let name = net
            .attribute("name")
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let rdma = name.is_some_and(|n| is_rdma_net(n, net));
        add_nic(cx, net, pci, busid, numa, name, speed)?;
        if let (Some(n), Some(nic)) = (name, cx.b.nics.last_mut()) {
            // An RDMA device's name is no interface name: the TCP transport must never get
            // `mlx5_7`. Its interfaces come from the live sysfs when the device is here.
            if rdma {
                nic.rdma = Some(n.chars().take(64).collect());
            } else {
                nic.netdevs = vec![n.chars().take(64).collect()];
            }
        }
    }
    if !any {
        add_nic(cx, n, pci, busid, numa, None, None)?;
    }
    Ok(())
}

/// Whether an NCCL `<net name>` is an RDMA device rather than a network interface: a known
/// RDMA driver's naming (`mlx5_0`, `bnxt_re0`, `irdma1`, `efa_0`, `rdmap16s27`, `hfi1_0`,
/// `rxe0`, ...), or what NCCL's IB transport writes for a port (`port` 1 or more with a real
/// port GUID; its socket transport writes `port="0"` and the interface index as GUID).
fn is_rdma_net(name: &str, net: Node) -> bool {
    const DRIVERS: [&str; 20] = [
        "mlx4_",
        "mlx5_",
        "bnxt_re",
        "irdma",
        "i40iw",
        "efa_",
        "rdmap",
        "hfi1_",
        "qib",
        "rxe",
        "siw",
        "erdma",
        "ionic_",
        "hns_",
        "qedr",
        "ocrdma",
        "cxgb4_",
        "vmw_pvrdma",
        "usnic_",
        "mana_",
    ];
    if DRIVERS.iter().any(|d| name.starts_with(d)) {
        return true;
    }
    let port = net
        .attribute("port")
        .and_then(|p| p.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let guid = net.attribute("guid").and_then(parse_hex).unwrap_or(0);
    port >= 1 && guid > 0xffff
}

fn add_nic(
    cx: &mut Ctx,
    n: Node,
    pci: Option<usize>,
    busid: Option<&str>,
    numa: Option<usize>,
    name: Option<&str>,
    speed: Option<u64>,
) -> Result<(), TopoError> {
    if cx.b.nics.len() >= super::model::MAX_DEVICES {
        return Err(cx.limit(n, "too many NICs"));
    }
    let name = match name.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => s.chars().take(64).collect(),
        None => match busid {
            Some(b) => b.to_string(),
            None => format!("nic{}", cx.b.nics.len()),
        },
    };
    cx.b.nics.push(Nic {
        index: 0,
        name,
        netdevs: Vec::new(),
        rdma: None,
        busid: busid.map(str::to_string),
        pci,
        numa,
        speed_mbps: speed,
        is_virtual: pci.is_none(),
    });
    Ok(())
}
