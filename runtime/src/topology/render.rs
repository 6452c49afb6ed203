//! Renderings of a topology and its bindings: an `nvidia-smi topo -m`
//! style matrix, plain-text bindings, JSON, and a hand-written SVG picture (one concern:
//! every rendering; the tests are the last hundred lines).
//! Every text form of a [`Binding`] is written here: [`binding_summary`]
//! (`railrun topo`, the SVG) and [`binding_report`] (`railrun --report-bindings`).

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::binding::Binding;
use super::model::{DeviceId, PciKind, Topology};
use super::paths::PathClass;
use super::util::format_cpulist;

/// Devices of the matrix in order (GPUs, then NICs) with their labels.
pub fn devices(topo: &Topology) -> Vec<(String, DeviceId)> {
    let mut v: Vec<(String, DeviceId)> = topo
        .gpus
        .iter()
        .map(|g| (format!("GPU{}", g.index), DeviceId::Gpu(g.index)))
        .collect();
    v.extend(
        topo.nics
            .iter()
            .map(|n| (format!("NIC{}", n.index), DeviceId::Nic(n.index))),
    );
    v
}

/// The device × device path-class matrix, in [`devices`] order.
pub fn path_matrix(topo: &Topology) -> Vec<Vec<PathClass>> {
    let devs = devices(topo);
    devs.iter()
        .map(|(_, a)| devs.iter().map(|(_, b)| topo.path_class(*a, *b)).collect())
        .collect()
}

const LEGEND: &str = "Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
";

/// The matrix as `nvidia-smi topo -m` prints it: GPU/NIC × GPU/NIC path
/// classes, CPU and NUMA affinity columns, the legend and the NIC legend.
pub fn matrix_text(topo: &Topology) -> String {
    let devs = devices(topo);
    let m = path_matrix(topo);
    let mut header: Vec<String> = vec![String::new()];
    header.extend(devs.iter().map(|(l, _)| l.clone()));
    header.push("CPU Affinity".into());
    header.push("NUMA Affinity".into());
    let mut rows: Vec<Vec<String>> = vec![header];
    for (i, (label, dev)) in devs.iter().enumerate() {
        let mut row = vec![label.clone()];
        row.extend(m[i].iter().map(|c| c.to_string()));
        let numa = topo.device_numa(*dev);
        let cpus = topo.local_cpus(*dev);
        row.push(if cpus.is_empty() {
            "N/A".into()
        } else {
            format_cpulist(&cpus)
        });
        row.push(numa.map_or("N/A".into(), |n| n.to_string()));
        rows.push(row);
    }
    let ncol = rows[0].len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    if devs.is_empty() {
        out.push_str("No GPU and no NIC found.\n");
    } else {
        for r in &rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                let pad = widths[c].saturating_sub(cell.chars().count());
                line.push_str(cell);
                if c + 1 < ncol {
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.push('\n');
    out.push_str(LEGEND);
    if !topo.nics.is_empty() {
        out.push_str("\nNIC Legend:\n\n");
        let speeds = topo.nic_speeds();
        for n in &topo.nics {
            let mut extra = Vec::new();
            if let Some(r) = n.rdma.as_deref().filter(|r| *r != n.name) {
                extra.push(format!("RDMA {r}"));
            }
            match &speeds[n.index].assumed {
                None if speeds[n.index].mbps > 0 => {
                    extra.push(format!("{} Mb/s", speeds[n.index].mbps))
                }
                Some(a) => extra.push(format!(
                    "port speed unknown: assumed {} Mb/s, {a}",
                    speeds[n.index].mbps
                )),
                None => {}
            }
            if !n.netdevs.is_empty() && n.netdevs.iter().any(|d| *d != n.name) {
                extra.push(format!("interfaces {}", n.netdevs.join(",")));
            }
            if let Some(b) = &n.busid {
                if *b != n.name {
                    extra.push(b.clone());
                }
            }
            if n.is_virtual {
                extra.push("virtual, host-attached".into());
            }
            let extra = if extra.is_empty() {
                String::new()
            } else {
                format!(" ({})", extra.join(", "))
            };
            let _ = writeln!(out, "  NIC{}: {}{}", n.index, n.name, extra);
        }
    }
    out
}

/// One line per binding plus its reason.
pub fn bindings_text(topo: &Topology, bindings: &[Binding]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Bindings ({} local rank(s)):", bindings.len());
    for b in bindings {
        let _ = writeln!(
            out,
            "  local rank {}: {}",
            b.local_rank,
            binding_summary(topo, b)
        );
        let _ = writeln!(out, "    why: {}", b.reason);
    }
    out
}

/// `GPU0 0000:10:1c.0, NIC0 efa0 (PIX, 100000 Mb/s), CPUs 0-23, NUMA 0`.
pub fn binding_summary(topo: &Topology, b: &Binding) -> String {
    let gpu = match &b.gpu {
        Some(g) => format!("GPU{} {}", g.index, g.busid.as_deref().unwrap_or(""))
            .trim_end()
            .to_string(),
        None => "no GPU".into(),
    };
    let nics = if b.nics.is_empty() {
        "no NIC".to_string()
    } else {
        b.nics
            .iter()
            .map(|n| {
                let dev = if !n.netdev.is_empty() && n.netdev != n.name {
                    format!(" [{}]", n.netdev)
                } else {
                    String::new()
                };
                let speed = n
                    .speed_mbps
                    .map(|s| format!(", {s} Mb/s"))
                    .unwrap_or_default();
                format!(
                    "NIC{} {}{} ({}{})",
                    n.index, n.name, dev, n.path_class, speed
                )
            })
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let cpus = cpus_text(b);
    let numa = b.numa.map_or("NUMA ?".to_string(), |n| format!("NUMA {n}"));
    let _ = topo;
    format!("{gpu}, {nics}, {cpus}, {numa}")
}

/// `railrun --report-bindings`' account of one binding, reason included:
/// `GPU 0 (cuda 0, 0000:10:1c.0) | NIC efa0 (PIX) | CPUs 0-23 (NUMA 0) | <reason>`.
pub fn binding_report(b: &Binding) -> String {
    let gpu = match &b.gpu {
        Some(g) => format!(
            "GPU {} (cuda {}{})",
            g.index,
            g.cuda_ordinal,
            g.busid
                .as_deref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default()
        ),
        None => "no GPU".into(),
    };
    let nics = if b.nics.is_empty() {
        "no NIC".to_string()
    } else {
        b.nics
            .iter()
            .map(|n| format!("{} ({})", n.name, n.path_class))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let cpus = cpus_text(b);
    let numa = b.numa.map(|n| format!(" (NUMA {n})")).unwrap_or_default();
    format!("{gpu} | NIC {nics} | {cpus}{numa} | {}", b.reason)
}

/// `CPUs 0-23,48-71`, or `CPUs unbound` when the binding leaves affinity alone.
fn cpus_text(b: &Binding) -> String {
    if b.cpus.is_empty() {
        "CPUs unbound".to_string()
    } else {
        format!("CPUs {}", format_cpulist(&b.cpus))
    }
}

#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    topology: &'a Topology,
    devices: Vec<String>,
    path_classes: Vec<Vec<PathClass>>,
    bindings: &'a [Binding],
}

/// Devices, path classes and bindings as pretty JSON.
pub fn json_report(topo: &Topology, bindings: &[Binding]) -> String {
    let report = Report {
        topology: topo,
        devices: devices(topo).into_iter().map(|(l, _)| l).collect(),
        path_classes: path_matrix(topo),
        bindings,
    };
    serde_json::to_string_pretty(&report)
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    Pci(usize),
    Dev(DeviceId),
}

const SLOT_W: f64 = 130.0;
const BOX_W: f64 = 118.0;
const BOX_H: f64 = 36.0;
const ROW_H: f64 = 64.0;
const COL_PAD: f64 = 16.0;
const TOP: f64 = 70.0;
const PALETTE: [&str; 8] = [
    "#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324",
];

/// An SVG picture: one frame per NUMA node (grouped by socket), host
/// bridges and PCIe switches as a tree, GPUs and NICs as leaves, and the
/// chosen GPU↔NIC pairs as colored curves with matching outlines.
///
/// Built in steps: the drawn forest (`forest`), its roots grouped into
/// NUMA columns (`numa_columns`), positions (`place_columns`), then the
/// drawing: header, frames, edges, boxes and the bindings with their legend.
pub fn svg(topo: &Topology, bindings: &[Binding]) -> String {
    let forest = forest(topo);
    let cols = numa_columns(topo, &forest.roots);
    let max_depth = forest
        .roots
        .iter()
        .map(|r| depth_of(r, &forest.children, 0))
        .max()
        .unwrap_or(0);
    let placed = place_columns(topo, &forest.children, &cols);
    let title = format!(
        "railring topology: {} ({} GPU, {} NIC)",
        topo.source,
        topo.gpus.len(),
        topo.nics.len()
    );
    let shown: Vec<&Binding> = bindings
        .iter()
        .filter(|b| b.gpu.is_some() || !b.nics.is_empty())
        .collect();
    let longest = shown
        .iter()
        .map(|b| binding_summary(topo, b).chars().count() + 16)
        .max()
        .unwrap_or(0);
    let total_w = placed
        .right
        .max(400.0)
        .max(title.chars().count() as f64 * 8.5 + 2.0 * COL_PAD)
        .max(longest as f64 * 6.2 + 2.0 * COL_PAD);
    let body_h = TOP + 40.0 + (max_depth as f64 + 1.0) * ROW_H + 50.0;
    let total_h = body_h + 30.0 + shown.len() as f64 * 18.0;

    let mut s = String::new();
    draw_header(&mut s, &title, total_w, total_h);
    draw_frames(&mut s, &placed.frames, body_h);
    draw_edges(&mut s, &forest.children, &placed.pos);
    draw_boxes(&mut s, topo, &placed.pos);
    draw_bindings(&mut s, topo, &shown, &placed.pos, body_h);
    s.push_str("</svg>\n");
    s
}

/// Host bridges and PCIe switches are drawn; other PCI nodes (bridges,
/// endpoints) are skipped over.
fn is_drawn(k: PciKind) -> bool {
    matches!(k, PciKind::HostBridge | PciKind::Switch)
}

/// Nearest drawn ancestor of PCI node `i` (excluding `i`).
fn drawn_parent(topo: &Topology, mut i: usize) -> Option<usize> {
    let mut steps = 0;
    while let Some(p) = topo.pci.get(i).and_then(|n| n.parent) {
        if p >= i || steps > topo.pci.len() {
            return None;
        }
        if is_drawn(topo.pci[p].kind) {
            return Some(p);
        }
        i = p;
        steps += 1;
    }
    None
}

/// The drawn forest: drawn PCI nodes above the GPUs and NICs, children
/// sorted left to right.
struct Forest {
    children: BTreeMap<Item, Vec<Item>>,
    roots: Vec<Item>,
}

/// Hangs every GPU and NIC under its nearest drawn PCI ancestor, adding
/// each ancestor chain once.
fn forest(topo: &Topology) -> Forest {
    let mut children: BTreeMap<Item, Vec<Item>> = BTreeMap::new();
    let mut roots: Vec<Item> = Vec::new();
    let endpoints: Vec<(DeviceId, Option<usize>)> = topo
        .gpus
        .iter()
        .map(|g| (DeviceId::Gpu(g.index), g.pci))
        .chain(topo.nics.iter().map(|n| (DeviceId::Nic(n.index), n.pci)))
        .collect();
    for (dev, pci) in &endpoints {
        let parent = pci.and_then(|p| {
            if is_drawn(topo.pci[p].kind) {
                Some(p)
            } else {
                drawn_parent(topo, p)
            }
        });
        attach(topo, Item::Dev(*dev), parent, &mut children, &mut roots);
    }
    for v in children.values_mut() {
        v.sort_by_key(|it| sort_key(topo, it));
    }
    Forest { children, roots }
}

/// Adds `item` under `parent`, then the parent's own chain up to the first
/// node already in the forest (or up to a new root).
fn attach(
    topo: &Topology,
    item: Item,
    parent: Option<usize>,
    children: &mut BTreeMap<Item, Vec<Item>>,
    roots: &mut Vec<Item>,
) {
    let mut cur = item;
    let mut par = parent;
    loop {
        match par {
            Some(p) => {
                let e = children.entry(Item::Pci(p)).or_default();
                let existed = !e.is_empty() || roots.contains(&Item::Pci(p));
                if !e.contains(&cur) {
                    e.push(cur);
                }
                if existed {
                    return;
                }
                cur = Item::Pci(p);
                par = drawn_parent(topo, p);
            }
            None => {
                if !roots.contains(&cur) {
                    roots.push(cur);
                }
                return;
            }
        }
    }
}

/// Left-to-right order: by bus id, virtual NICs last.
fn sort_key(topo: &Topology, it: &Item) -> (bool, String) {
    let busid = match it {
        Item::Pci(p) => topo.pci[*p].busid.clone(),
        Item::Dev(DeviceId::Gpu(g)) => topo.gpus[*g].busid.clone(),
        Item::Dev(DeviceId::Nic(n)) => topo.nics[*n]
            .busid
            .clone()
            .or_else(|| Some(format!("~{}", topo.nics[*n].name))),
        Item::Dev(DeviceId::Numa(_)) => None,
    };
    (busid.is_none(), busid.unwrap_or_default())
}

/// The column key of trees whose NUMA node is unknown (drawn last).
const UNKNOWN_COL: (usize, usize) = (usize::MAX, usize::MAX);

/// The roots grouped into columns keyed (socket, NUMA node), one column per
/// NUMA node even when empty, each sorted left to right.
fn numa_columns(topo: &Topology, roots: &[Item]) -> BTreeMap<(usize, usize), Vec<Item>> {
    let numa_of = |it: &Item| -> Option<usize> {
        match it {
            Item::Pci(p) => topo.pci[*p].numa,
            Item::Dev(d) => topo.device_numa(*d),
        }
    };
    let mut cols: BTreeMap<(usize, usize), Vec<Item>> = BTreeMap::new();
    for n in &topo.numa_nodes {
        cols.insert((n.package.unwrap_or(n.id), n.id), Vec::new());
    }
    for r in roots {
        let key = match numa_of(r).and_then(|n| topo.numa_node(n)) {
            Some(n) => (n.package.unwrap_or(n.id), n.id),
            None => UNKNOWN_COL,
        };
        cols.entry(key).or_default().push(*r);
    }
    for v in cols.values_mut() {
        v.sort_by_key(|it| sort_key(topo, it));
    }
    cols
}

/// Width of a subtree in leaf slots.
fn width(it: &Item, ch: &BTreeMap<Item, Vec<Item>>, depth: usize) -> usize {
    match ch.get(it) {
        Some(c) if depth < 64 => c
            .iter()
            .map(|x| width(x, ch, depth + 1))
            .sum::<usize>()
            .max(1),
        _ => 1,
    }
}

/// Depth of the deepest leaf under `it` (`d` is `it`'s own depth).
fn depth_of(it: &Item, ch: &BTreeMap<Item, Vec<Item>>, d: usize) -> usize {
    match ch.get(it) {
        Some(c) if d < 64 => c.iter().map(|x| depth_of(x, ch, d + 1)).max().unwrap_or(d),
        _ => d,
    }
}

/// Places a subtree from `x0`: leaves get slots, parents are centred over
/// their children. Returns the subtree's width in pixels.
fn place(
    it: &Item,
    ch: &BTreeMap<Item, Vec<Item>>,
    x0: f64,
    depth: usize,
    pos: &mut BTreeMap<Item, (f64, f64)>,
) -> f64 {
    let w = width(it, ch, depth) as f64 * SLOT_W;
    let y = TOP + 40.0 + depth as f64 * ROW_H;
    if let Some(c) = ch.get(it).filter(|_| depth < 64) {
        let mut x = x0;
        for k in c {
            x += place(k, ch, x, depth + 1, pos);
        }
    }
    pos.insert(*it, (x0 + w / 2.0, y));
    w
}

/// Where everything goes: box centres, the NUMA frames (x, width, label)
/// and the right edge of the last frame plus padding.
struct Placed {
    pos: BTreeMap<Item, (f64, f64)>,
    frames: Vec<(f64, f64, String)>,
    right: f64,
}

/// Lays the columns out left to right, each frame wide enough for its trees
/// and its label, the trees centred in it.
fn place_columns(
    topo: &Topology,
    children: &BTreeMap<Item, Vec<Item>>,
    cols: &BTreeMap<(usize, usize), Vec<Item>>,
) -> Placed {
    let mut pos: BTreeMap<Item, (f64, f64)> = BTreeMap::new();
    let mut frames: Vec<(f64, f64, String)> = Vec::new();
    let mut x = COL_PAD;
    for (&(pkg, id), items) in cols {
        let start = x;
        let label = frame_label(topo, pkg, id);
        let label_w = label.chars().count() as f64 * 7.0 + 16.0;
        let items_w = items.iter().map(|it| width(it, children, 0)).sum::<usize>() as f64 * SLOT_W;
        let w = (items_w + COL_PAD).max(SLOT_W + COL_PAD).max(label_w);
        // Centre the trees in the frame.
        let mut cx = start + (w - items_w) / 2.0;
        for it in items {
            cx += place(it, children, cx, 0, &mut pos);
        }
        frames.push((start, w, label));
        x = start + w + COL_PAD;
    }
    Placed {
        pos,
        frames,
        right: x,
    }
}

/// "Socket P · NUMA N · CPUs L" for column (`pkg`, `id`).
fn frame_label(topo: &Topology, pkg: usize, id: usize) -> String {
    if (pkg, id) == UNKNOWN_COL {
        return "NUMA node unknown / host-attached".to_string();
    }
    let node = topo.numa_node(id);
    let cpus = node.map(|n| format_cpulist(&n.cpus)).unwrap_or_default();
    let sock = node
        .and_then(|n| n.package)
        .map(|p| format!("Socket {p} · "))
        .unwrap_or_default();
    format!(
        "{sock}NUMA {id} · CPUs {}",
        if cpus.is_empty() { "?".into() } else { cpus }
    )
}

/// The `<svg>` element, the white background and the title.
fn draw_header(s: &mut String, title: &str, total_w: f64, total_h: f64) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{total_h:.0}" viewBox="0 0 {total_w:.0} {total_h:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{total_w:.0}" height="{total_h:.0}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{COL_PAD}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        esc(title)
    );
}

/// One rounded frame per NUMA column, with its label.
fn draw_frames(s: &mut String, frames: &[(f64, f64, String)], body_h: f64) {
    for (fx, fw, label) in frames {
        let _ = writeln!(
            s,
            r##"<rect x="{fx:.1}" y="{:.1}" width="{fw:.1}" height="{:.1}" rx="8" fill="#f4f4f8" stroke="#888"/>"##,
            TOP - 26.0,
            body_h - TOP
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-weight="bold">{}</text>"#,
            fx + 8.0,
            TOP - 10.0,
            esc(label)
        );
    }
}

/// The tree edges, parent's bottom to child's top.
fn draw_edges(
    s: &mut String,
    children: &BTreeMap<Item, Vec<Item>>,
    pos: &BTreeMap<Item, (f64, f64)>,
) {
    for (p, kids) in children {
        let Some(&(px, py)) = pos.get(p) else {
            continue;
        };
        for k in kids {
            if let Some(&(kx, ky)) = pos.get(k) {
                let _ = writeln!(
                    s,
                    r##"<line x1="{px:.1}" y1="{:.1}" x2="{kx:.1}" y2="{:.1}" stroke="#999" stroke-width="1.5"/>"##,
                    py + BOX_H / 2.0,
                    ky - BOX_H / 2.0
                );
            }
        }
    }
}

/// A box's fill and its two label lines; None for items not drawn as boxes.
fn box_style(topo: &Topology, it: &Item) -> Option<(&'static str, String, String)> {
    Some(match it {
        Item::Pci(p) => {
            let n = &topo.pci[*p];
            let (kind, fill) = match n.kind {
                PciKind::HostBridge => ("Host bridge", "#e0e0e0"),
                _ => ("PCIe switch", "#fff2cc"),
            };
            (fill, kind.to_string(), n.busid.clone().unwrap_or_default())
        }
        Item::Dev(DeviceId::Gpu(g)) => {
            let gpu = &topo.gpus[*g];
            let model = gpu
                .model
                .as_deref()
                .map(|m| format!(" {}", m.chars().take(14).collect::<String>()))
                .unwrap_or_default();
            (
                "#d9ead3",
                format!("GPU{g}{model}"),
                gpu.busid.clone().unwrap_or_default(),
            )
        }
        Item::Dev(DeviceId::Nic(n)) => {
            let nic = &topo.nics[*n];
            let sub = if nic.is_virtual {
                "virtual".to_string()
            } else {
                nic.busid.clone().unwrap_or_default()
            };
            let l1 = if nic.busid.as_deref() == Some(nic.name.as_str()) {
                format!("NIC{n}")
            } else {
                format!("NIC{n} {}", nic.name.chars().take(14).collect::<String>())
            };
            ("#cfe2f3", l1, sub)
        }
        Item::Dev(DeviceId::Numa(_)) => return None,
    })
}

/// Every placed item as a labelled box.
fn draw_boxes(s: &mut String, topo: &Topology, pos: &BTreeMap<Item, (f64, f64)>) {
    for (it, &(cx, cy)) in pos {
        let Some((fill, l1, l2)) = box_style(topo, it) else {
            continue;
        };
        // Keep labels inside the box (about 6.5 px per character).
        let l1: String = l1.chars().take(18).collect();
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="{fill}" stroke="#555"/>"##,
            cx - BOX_W / 2.0,
            cy - BOX_H / 2.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            cy - 3.0,
            esc(&l1)
        );
        let _ = writeln!(
            s,
            r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="9" fill="#444">{}</text>"##,
            cy + 11.0,
            esc(&l2)
        );
    }
}

/// Coloured outlines around chosen boxes; a box chosen by several ranks gets
/// nested outlines (up to four, then they repeat).
#[derive(Default)]
struct Outlines(BTreeMap<Item, usize>);

impl Outlines {
    fn draw(&mut self, s: &mut String, it: Item, (x, y): (f64, f64), color: &str, dash: &str) {
        let k = self.0.entry(it).or_insert(0);
        let off = 2.0 + 4.0 * (*k % 4) as f64;
        *k += 1;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="5" fill="none" stroke="{color}" stroke-width="3"{dash}/>"#,
            x - BOX_W / 2.0 - off,
            y - BOX_H / 2.0 - off,
            BOX_W + 2.0 * off,
            BOX_H + 2.0 * off
        );
    }
}

/// Chosen pairs: a curve per GPU↔NIC pair (dashed for extra rails) and
/// outlines in the same colour, and below the frames the legend, one line
/// per local rank in its colour.
fn draw_bindings(
    s: &mut String,
    topo: &Topology,
    shown: &[&Binding],
    pos: &BTreeMap<Item, (f64, f64)>,
    body_h: f64,
) {
    let mut outlines = Outlines::default();
    let mut ly = body_h + 10.0;
    let _ = writeln!(
        s,
        r#"<text x="{COL_PAD}" y="{ly:.1}" font-weight="bold">Bindings</text>"#
    );
    for (k, b) in shown.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let gpos = b
            .gpu
            .as_ref()
            .and_then(|g| pos.get(&Item::Dev(DeviceId::Gpu(g.index))).copied());
        for (j, n) in b.nics.iter().enumerate() {
            let nic_item = Item::Dev(DeviceId::Nic(n.index));
            let Some(npos) = pos.get(&nic_item).copied() else {
                continue;
            };
            let dash = if j == 0 {
                ""
            } else {
                r#" stroke-dasharray="5,3""#
            };
            if let Some((gx, gy)) = gpos {
                let (x1, y1, x2, y2) = (gx, gy + BOX_H / 2.0, npos.0, npos.1 + BOX_H / 2.0);
                let bulge = 28.0 + 6.0 * (k % 4) as f64;
                let _ = writeln!(
                    s,
                    r#"<path d="M {x1:.1} {y1:.1} C {x1:.1} {:.1}, {x2:.1} {:.1}, {x2:.1} {y2:.1}" fill="none" stroke="{color}" stroke-width="3" opacity="0.85"{dash}/>"#,
                    y1.max(y2) + bulge,
                    y1.max(y2) + bulge
                );
            }
            outlines.draw(s, nic_item, npos, color, dash);
        }
        if let (Some(p), Some(g)) = (gpos, &b.gpu) {
            outlines.draw(s, Item::Dev(DeviceId::Gpu(g.index)), p, color, "");
        }
        ly += 18.0;
        let _ = writeln!(
            s,
            r#"<text x="{COL_PAD}" y="{ly:.1}" fill="{color}">local rank {}: {}</text>"#,
            b.local_rank,
            esc(&binding_summary(topo, b))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{GpuRef, NicRef};

    fn binding(gpu: bool, nics: usize, cpus: Vec<usize>, numa: Option<usize>) -> Binding {
        Binding {
            local_rank: 1,
            gpu: gpu.then(|| GpuRef {
                index: 3,
                cuda_ordinal: 1,
                busid: Some("0000:20:1d.0".into()),
            }),
            nics: (0..nics)
                .map(|i| NicRef {
                    index: i,
                    name: format!("mlx5_{i}"),
                    netdev: if i == 0 {
                        "ib0".into()
                    } else {
                        format!("mlx5_{i}")
                    },
                    path_class: if i == 0 {
                        PathClass::Pix
                    } else {
                        PathClass::Phb
                    },
                    speed_mbps: (i == 0).then_some(100_000),
                })
                .collect(),
            cpus,
            numa,
            reason: "because".into(),
        }
    }

    fn empty_topology() -> Topology {
        Topology {
            source: "test".into(),
            numa_nodes: Vec::new(),
            pci: Vec::new(),
            gpus: Vec::new(),
            nics: Vec::new(),
            cores: Vec::new(),
            nvlinks: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn summary_for_railrun_topo() {
        let t = empty_topology();
        assert_eq!(
            binding_summary(&t, &binding(true, 2, vec![0, 1, 2, 5], Some(0))),
            "GPU3 0000:20:1d.0, NIC0 mlx5_0 [ib0] (PIX, 100000 Mb/s) + NIC1 mlx5_1 (PHB), CPUs 0-2,5, NUMA 0"
        );
        assert_eq!(
            binding_summary(&t, &binding(false, 0, vec![], None)),
            "no GPU, no NIC, CPUs unbound, NUMA ?"
        );
    }

    #[test]
    fn report_for_railrun_report_bindings() {
        assert_eq!(
            binding_report(&binding(true, 2, vec![0, 1, 2, 5], Some(0))),
            "GPU 3 (cuda 1, 0000:20:1d.0) | NIC mlx5_0 (PIX), mlx5_1 (PHB) | CPUs 0-2,5 (NUMA 0) | because"
        );
        let mut b = binding(true, 1, vec![4], Some(1));
        b.gpu.as_mut().unwrap().busid = None;
        assert_eq!(
            binding_report(&b),
            "GPU 3 (cuda 1) | NIC mlx5_0 (PIX) | CPUs 4 (NUMA 1) | because"
        );
        assert_eq!(
            binding_report(&binding(false, 0, vec![], None)),
            "no GPU | NIC no NIC | CPUs unbound | because"
        );
    }
}
