//! `railrun plan --html`: one self-contained page (inline CSS, SVG and script; nothing fetched)
//! with the predicted busbw plot and three views a user switches between:
//! - **fabric**: spines (and core planes), leaves and nodes, every drawn link coloured by the
//!   flows it carries in the busiest round of the chosen algorithm at the chosen size;
//! - **node**: one node's GPUs (ranks), the in-node link and its NICs, which rail each GPU uses
//!   and which leaf each NIC is wired to;
//! - **two-level all-reduce, step by step**: the runtime's two-level plans (built here with
//!   `build_plan` for the first nodes of the fabric) — reduce-scatter in the node, one ring per
//!   rail, all-gather in the node — one step at a time.
//!
//! The page reads `#fabric`, `#node`, `#anim` (and `#anim&step=K`) from its address, so a test
//! can open each view directly; it marks each rendered view on `<body>` (`data-rendered-*`) and
//! records script errors in `#errors`.

use super::fabric_file::FabricFile;
use super::svg::{esc, COLOURS};
use super::{PlanArgs, Table};
use railring_collectives::build::build_plan;
use railring_collectives::fabric::Wiring;
use railring_collectives::plan::{Layout, Step};
use railring_collectives::{Algo, CollKind};
use serde_json::{json, Value};

/// Nodes and ranks per node the step-by-step view plans for (at most).
const ANIM_NODES: usize = 4;
const ANIM_RANKS: usize = 8;

/// The two-level all-reduce of `count` elements over the first nodes, step by step.
fn animation(ff: &FabricFile, count: usize, ds: usize) -> Result<Value, String> {
    let f = &ff.fabric;
    let k = f.nodes.min(ANIM_NODES);
    let l = f.ranks_per_node.min(ANIM_RANKS);
    let layout = Layout::block(k * l, l);
    let count = count.max(k * l);
    let plans = (0..k * l)
        .map(|r| build_plan(CollKind::AllReduce, Algo::TwoLevel, &layout, r, count, 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let len = plans.iter().map(|p| p.steps.len()).max().unwrap_or(0);
    let mut steps = Vec::new();
    for s in 0..len {
        let mut xfers = Vec::new();
        let mut kind = "ring";
        let mut slices = Vec::new();
        for p in &plans {
            match p.steps.get(s) {
                Some(Step::Exchange {
                    send: Some(x),
                    reduce,
                    ..
                }) => xfers.push(json!({
                    "from": p.rank, "to": x.peer, "chan": x.chan,
                    "offset": x.region.offset * ds, "bytes": x.region.len * ds, "reduce": reduce,
                })),
                Some(Step::NodeReduceScatter { slices: sl, group }) => {
                    kind = "rs";
                    if group.first() == Some(&p.rank) {
                        slices = sl
                            .iter()
                            .map(|r| json!([r.offset * ds, r.len * ds]))
                            .collect();
                    }
                }
                Some(Step::NodeAllGather { slices: sl, group }) => {
                    kind = "ag";
                    if group.first() == Some(&p.rank) {
                        slices = sl
                            .iter()
                            .map(|r| json!([r.offset * ds, r.len * ds]))
                            .collect();
                    }
                }
                _ => {}
            }
        }
        steps.push(json!({"kind": kind, "xfers": xfers, "slices": slices}));
    }
    Ok(json!({
        "nodes": k, "ranks_per_node": l, "nics": f.nics, "bytes": count * ds,
        "steps": steps,
        "note": if k < f.nodes || l < f.ranks_per_node {
            format!("the first {k} of {} nodes, {l} of {} ranks per node", f.nodes, f.ranks_per_node)
        } else { String::new() },
    }))
}

/// The page.
pub fn page(ff: &FabricFile, t: &Table, a: &PlanArgs) -> Result<String, String> {
    let f = &ff.fabric;
    let size = a
        .html_size
        .unwrap_or_else(|| t.rows.last().map_or(8, |r| r.size));
    let ds = t.dtype.size();
    let (count, _) = super::count_of(CollKind::AllReduce, size, ds, t.ranks);
    let drawn = f.nodes.min(256);
    let leaf_of: Vec<Vec<usize>> = (0..drawn)
        .map(|n| (0..f.nics).map(|r| f.leaf_of(n, r)).collect())
        .collect();
    let (wiring, per) = match f.wiring {
        Wiring::RailOptimized { nodes_per_su } => ("rail-optimized", nodes_per_su),
        Wiring::NodeOnLeaf { nodes_per_leaf } => ("node on one leaf", nodes_per_leaf),
    };
    let links: serde_json::Map<String, Value> = t
        .links
        .iter()
        .map(|(al, v)| {
            (
                al.name().to_string(),
                Value::Array(
                    v.iter()
                        .map(|l| json!({"class": l.class.name(), "from": l.a, "to": l.b, "flows": l.flows}))
                        .collect(),
                ),
            )
        })
        .collect();
    let rows: Vec<Value> = t
        .rows
        .iter()
        .map(|r| {
            let algos: serde_json::Map<String, Value> = r
                .preds
                .iter()
                .filter_map(|(al, p)| {
                    p.as_ref().ok().map(|p| {
                        (
                            al.name().to_string(),
                            json!({"time_us": p.time * 1e6, "busbw": t.busbw(r, p),
                                   "bottleneck": p.bottleneck.as_ref().map(super::describe)}),
                        )
                    })
                })
                .collect();
            json!({"size": r.size, "choice": r.choice.map(|c| c.name()), "algos": algos})
        })
        .collect();
    let anim = animation(ff, count, ds)?;
    let data = json!({
        "fabric": {
            "name": f.name, "summary": f.summary(), "description": ff.description,
            "nodes": f.nodes, "ranks_per_node": f.ranks_per_node, "nics": f.nics,
            "leaves": f.leaves(), "spines": f.spines(), "pods": f.pods(),
            "leaves_per_pod": f.core.map_or(f.leaves(), |c| c.leaves_per_pod),
            "core_uplinks": f.core.map_or(0, |c| c.uplinks),
            "wiring": wiring, "per": per,
            "nic_gbit": f.nic.bw * 8.0 / 1e9,
            "up_gbit": f.spine.map_or(0.0, |s| s.link_bw * 8.0 / 1e9),
            "core_gbit": f.core.map_or(0.0, |c| c.link_bw * 8.0 / 1e9),
            "node_gbyte": f.node_link.bw / 1e9,
            "leaf_of": leaf_of,
            "hosts": ff.hosts.as_ref().map(|h| h.iter().take(drawn).cloned().collect::<Vec<_>>()),
            "ecmp": f.ecmp.name(),
        },
        "collective": t.kind.name(), "ranks": t.ranks, "size": size,
        "algos": t.algos.iter().map(|a| a.name()).collect::<Vec<_>>(),
        "colours": COLOURS,
        "rows": rows,
        "links": links,
        "anim": anim,
    });
    // `</` cannot end the script element early inside JSON
    let data = serde_json::to_string(&data)
        .map_err(|e| e.to_string())?
        .replace("</", "<\\/");
    let plot = super::svg::plot(ff, t);
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>railrun plan: {title}</title><style>{CSS}</style></head><body>\n\
         <h1>railrun plan: {title}</h1><p class=\"sum\">{sum}</p>\n\
         <div id=\"errors\"></div>\n<div class=\"plot\">{plot}</div>\n\
         <nav><button data-view=\"fabric\">fabric</button><button data-view=\"node\">node interconnect</button>\
         <button data-view=\"anim\">two-level all-reduce, step by step</button></nav>\n\
         <section id=\"fabric\" class=\"view\"></section><section id=\"node\" class=\"view\"></section>\
         <section id=\"anim\" class=\"view\"></section>\n\
         <script type=\"application/json\" id=\"data\">{data}</script>\n<script>{JS}</script>\n</body></html>\n",
        title = esc(&f.name),
        sum = esc(&f.summary()),
    ))
}

const CSS: &str = "body{font-family:sans-serif;margin:16px;color:#222}h1{font-size:20px;margin:0 0 4px}\
.sum{color:#555;font-size:13px;margin:0 0 8px}nav{margin:8px 0}nav button{font-size:14px;margin-right:6px;\
padding:6px 12px;border:1px solid #888;background:#f4f4f4;border-radius:4px;cursor:pointer}\
nav button.on{background:#1f77b4;color:white}.view{display:none}.view.on{display:block}\
#errors{color:#b00;font-weight:bold}.ctl button{margin-right:6px}.cap{font-size:13px;color:#444;margin:4px 0}\
svg text{font-family:sans-serif}";

const JS: &str = r##"
"use strict";
window.onerror = function (m, s, l) {
  var e = document.getElementById("errors");
  e.textContent += "script error: " + m + " (line " + l + ")\n";
  document.body.setAttribute("data-errors", "1");
};
var D = JSON.parse(document.getElementById("data").textContent);
var NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, parent, text) {
  var e = document.createElementNS(NS, tag);
  for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function svg(parent, w, h) {
  var s = el("svg", {width: w, height: h, viewBox: "0 0 " + w + " " + h}, null);
  parent.appendChild(s);
  return s;
}
function heat(x) { // 0..1 -> green..yellow..red
  if (x <= 0) return "#cfcfcf";
  var r = x < 0.5 ? Math.round(510 * x) : 255, g = x < 0.5 ? 200 : Math.round(200 * (1 - x) * 2);
  return "rgb(" + r + "," + g + ",40)";
}
function human(b) {
  var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; i++; }
  return (Math.round(b * 10) / 10) + " " + u[i];
}
var F = D.fabric;

// ---- fabric view
var fabricAlgo = null;
function renderFabric() {
  var sec = document.getElementById("fabric");
  sec.innerHTML = "";
  var algos = Object.keys(D.links);
  if (fabricAlgo === null) {
    var last = D.rows[D.rows.length - 1];
    fabricAlgo = (last && last.choice && D.links[last.choice]) ? last.choice : algos[0];
  }
  var ctl = document.createElement("div");
  ctl.className = "ctl";
  algos.forEach(function (a) {
    var b = document.createElement("button");
    b.textContent = a;
    b.className = "algo" + (a === fabricAlgo ? " on" : "");
    b.onclick = function () { fabricAlgo = a; renderFabric(); };
    ctl.appendChild(b);
  });
  sec.appendChild(ctl);
  var loads = {}, max = 0;
  (D.links[fabricAlgo] || []).forEach(function (l) {
    var key = l["class"] + ":" + l.from + ":" + (l.to === null ? "*" : l.to);
    loads[key] = l.flows;
    if (l.flows > max) max = l.flows;
  });
  function flows(cls, a, b) {
    var v = loads[cls + ":" + a + ":" + b];
    if (v === undefined) v = loads[cls + ":" + a + ":*"];
    return v || 0;
  }
  var pods = Math.min(F.pods, 4), lpp = Math.min(F.leaves_per_pod, F.leaves);
  var lshow = Math.min(lpp, 8), sshow = Math.min(F.spines, 8);
  var w = Math.max(900, pods * (lshow * 70 + 40)), h = F.pods > 1 ? 470 : 390;
  var s = svg(sec, w, h);
  s.setAttribute("id", "fabric-svg");
  var podW = w / pods, yCore = 30, ySpine = F.pods > 1 ? 130 : 40, yLeaf = ySpine + 150, yNode = yLeaf + 120;
  var drawnLinks = 0;
  function link(x1, y1, x2, y2, f, title) {
    var ln = el("line", {x1: x1, y1: y1, x2: x2, y2: y2, stroke: heat(max ? f / max : 0),
      "stroke-width": f ? 3 : 1.5, "class": "link", "data-flows": f}, s);
    el("title", {}, ln, title + ": " + f + " flow" + (f === 1 ? "" : "s"));
    drawnLinks++;
  }
  var coreX = [];
  if (F.pods > 1) {
    for (var j = 0; j < sshow; j++) {
      var x = 40 + j * (w - 80) / Math.max(1, sshow - 1);
      coreX.push(x);
    }
  }
  for (var p = 0; p < pods; p++) {
    var x0 = p * podW;
    var spineX = [];
    for (var j = 0; j < sshow; j++) spineX.push(x0 + 30 + (j + 0.5) * (podW - 60) / sshow);
    var leafX = [];
    for (var i = 0; i < lshow; i++) leafX.push(x0 + 30 + (i + 0.5) * (podW - 60) / lshow);
    for (var i = 0; i < lshow; i++) {
      var leaf = p * F.leaves_per_pod + i;
      if (leaf >= F.leaves) break;
      for (var j = 0; j < sshow; j++) {
        var f = Math.max(flows("leaf -> spine", leaf, j), flows("spine -> leaf", leaf, j));
        link(leafX[i], yLeaf, spineX[j], ySpine + 16, f, "leaf " + leaf + " - spine " + j);
      }
      // nodes under this leaf (first 4)
      var under = [];
      for (var n = 0; n < F.leaf_of.length && under.length < 4; n++)
        for (var r = 0; r < F.nics; r++) if (F.leaf_of[n][r] === leaf) { under.push([n, r]); break; }
      under.forEach(function (nr, k) {
        var nx = leafX[i] - 24 + k * 16;
        var f2 = Math.max(flows("NIC -> leaf", nr[0], nr[1]), flows("leaf -> NIC", nr[0], nr[1]));
        link(nx, yNode, leafX[i], yLeaf + 16, f2, (F.hosts ? F.hosts[nr[0]] : "node " + nr[0]) + " NIC " + nr[1]);
        el("rect", {x: nx - 5, y: yNode, width: 10, height: 14, fill: "#555", "class": "nodebox"}, s);
      });
      el("rect", {x: leafX[i] - 22, y: yLeaf, width: 44, height: 18, rx: 3, fill: "#2c7fb8", "class": "leaf"}, s);
      el("text", {x: leafX[i], y: yLeaf + 13, "text-anchor": "middle", fill: "white", "font-size": 10}, s, "leaf " + leaf);
    }
    for (var j = 0; j < sshow; j++) {
      if (F.pods > 1) {
        var fc = Math.max(flows("spine -> core", p, j * F.core_uplinks), flows("core -> spine", p, j * F.core_uplinks),
                          flows("spine -> core", p, "*"));
        link(spineX[j], ySpine, coreX[j], yCore + 16, fc, "pod " + p + " spine " + j + " - core plane " + j);
      }
      el("rect", {x: spineX[j] - 22, y: ySpine, width: 44, height: 18, rx: 3, fill: "#41ab5d", "class": "spine"}, s);
      el("text", {x: spineX[j], y: ySpine + 13, "text-anchor": "middle", fill: "white", "font-size": 10}, s, "spine " + j);
    }
    if (F.pods > 1) el("text", {x: x0 + podW / 2, y: h - 8, "text-anchor": "middle", "font-size": 12}, s, "pod " + p);
  }
  coreX.forEach(function (x, j) {
    el("rect", {x: x - 24, y: yCore, width: 48, height: 18, rx: 3, fill: "#8c6bb1", "class": "core"}, s);
    el("text", {x: x, y: yCore + 13, "text-anchor": "middle", fill: "white", "font-size": 10}, s, "core " + j);
  });
  var cap = document.createElement("p");
  cap.className = "cap";
  var hidden = [];
  if (F.pods > pods) hidden.push((F.pods - pods) + " pods");
  if (lpp > lshow) hidden.push((lpp - lshow) + " leaves per pod");
  if (F.spines > sshow) hidden.push((F.spines - sshow) + " spines per pod");
  cap.textContent = "Links coloured by flows in the busiest round of " + fabricAlgo + " (" + D.collective +
    " of " + human(D.size) + " on " + D.ranks + " ranks); grey: idle; red: " + max + " flows. ECMP: " + F.ecmp +
    ". Wiring: " + F.wiring + ", " + F.per + (F.wiring === "rail-optimized" ? " nodes per unit" : " nodes per leaf") +
    (hidden.length ? ". Not drawn: " + hidden.join(", ") : "") + ".";
  sec.appendChild(cap);
  document.body.setAttribute("data-rendered-fabric", drawnLinks);
}

// ---- node view
function renderNode() {
  var sec = document.getElementById("node");
  sec.innerHTML = "";
  var L = Math.min(F.ranks_per_node, 16), R = Math.min(F.nics, 16);
  var w = Math.max(700, Math.max(L, R) * 80 + 80), h = 360;
  var s = svg(sec, w, h);
  s.setAttribute("id", "node-svg");
  el("rect", {x: 10, y: 10, width: w - 20, height: 250, fill: "#f7f7f7", stroke: "#999", rx: 8}, s);
  el("text", {x: 20, y: 30, "font-size": 13}, s, (F.hosts ? F.hosts[0] : "node 0") + ": " + F.ranks_per_node +
    " ranks (GPUs), in-node link " + F.node_gbyte + " GB/s per direction");
  var gx = function (i) { return 40 + (i + 0.5) * (w - 80) / L; };
  var nx = function (r) { return 40 + (r + 0.5) * (w - 80) / R; };
  el("rect", {x: 40, y: 110, width: w - 80, height: 22, fill: "#76b041", rx: 4, "class": "switch"}, s);
  el("text", {x: w / 2, y: 126, "text-anchor": "middle", fill: "white", "font-size": 12}, s, "in-node fabric (NVLink/NVSwitch or shared memory)");
  for (var i = 0; i < L; i++) {
    el("line", {x1: gx(i), y1: 80, x2: gx(i), y2: 110, stroke: "#76b041", "stroke-width": 3}, s);
    var r = i % F.nics;
    if (r < R) el("line", {x1: gx(i), y1: 70, x2: nx(r), y2: 200, stroke: D.colours[r % D.colours.length],
      "stroke-width": 1.5, "stroke-dasharray": "4 3", "class": "rail"}, s);
    el("rect", {x: gx(i) - 26, y: 45, width: 52, height: 34, fill: "#333", rx: 4, "class": "gpu"}, s);
    el("text", {x: gx(i), y: 67, "text-anchor": "middle", fill: "white", "font-size": 11}, s, "rank " + i);
  }
  for (var r = 0; r < R; r++) {
    el("rect", {x: nx(r) - 30, y: 200, width: 60, height: 30, fill: D.colours[r % D.colours.length], rx: 4, "class": "nic"}, s);
    el("text", {x: nx(r), y: 213, "text-anchor": "middle", fill: "white", "font-size": 10}, s, "NIC " + r);
    el("text", {x: nx(r), y: 226, "text-anchor": "middle", fill: "white", "font-size": 9}, s, F.nic_gbit + " Gb/s");
    el("line", {x1: nx(r), y1: 230, x2: nx(r), y2: 300, stroke: "#555"}, s);
    el("text", {x: nx(r), y: 318, "text-anchor": "middle", "font-size": 11}, s, "leaf " + F.leaf_of[0][r]);
  }
  var cap = document.createElement("p");
  cap.className = "cap";
  cap.textContent = "Rank i uses rail i mod " + F.nics + " (dashed); " + F.wiring + " wiring: NIC r of this node is on leaf " +
    F.leaf_of[0].join(", ") + (F.ranks_per_node > L || F.nics > R ? " (first 16 drawn)" : "") +
    ". Leaf uplinks: " + F.spines + " x " + (Math.round(F.up_gbit * 100) / 100) + " Gb/s.";
  sec.appendChild(cap);
  document.body.setAttribute("data-rendered-node", document.querySelectorAll("#node .gpu").length);
}

// ---- step-by-step view
var A = D.anim, step = 0, timer = null;
function renderAnim() {
  var sec = document.getElementById("anim");
  sec.innerHTML = "";
  var ctl = document.createElement("div");
  ctl.className = "ctl";
  [["prev", function () { step = Math.max(0, step - 1); renderAnim(); }],
   ["play", function () { if (timer) { clearInterval(timer); timer = null; } else timer = setInterval(function () { step = (step + 1) % A.steps.length; renderAnim(); }, 900); }],
   ["next", function () { step = Math.min(A.steps.length - 1, step + 1); renderAnim(); }]].forEach(function (b) {
    var e = document.createElement("button");
    e.textContent = b[0]; e.id = "anim-" + b[0]; e.onclick = b[1];
    ctl.appendChild(e);
  });
  sec.appendChild(ctl);
  var K = A.nodes, L = A.ranks_per_node;
  var w = Math.max(800, K * (L * 34 + 30) + 40), h = 300;
  var s = svg(sec, w, h);
  s.setAttribute("id", "anim-svg");
  var defs = el("defs", {}, s);
  var mk = el("marker", {id: "arr", markerWidth: 8, markerHeight: 8, refX: 7, refY: 4, orient: "auto"}, defs);
  el("path", {d: "M0,0 L8,4 L0,8 z", fill: "#444"}, mk);
  var nodeW = (w - 40) / K;
  var pos = function (r) { var k = Math.floor(r / L), i = r % L; return [20 + k * nodeW + 20 + (i + 0.5) * (nodeW - 40) / L, 150]; };
  var st = A.steps[step] || {kind: "none", xfers: [], slices: []};
  for (var k = 0; k < K; k++) {
    el("rect", {x: 20 + k * nodeW + 6, y: 90, width: nodeW - 12, height: 120, rx: 8,
      fill: st.kind === "ring" ? "#f4f4f4" : "#e5f1d9", stroke: "#999", "class": "animnode"}, s);
    el("text", {x: 20 + k * nodeW + 14, y: 106, "font-size": 11}, s, "node " + k);
  }
  for (var r = 0; r < K * L; r++) {
    var p = pos(r), c = D.colours[(r % L) % D.colours.length];
    el("circle", {cx: p[0], cy: p[1], r: 14, fill: c, "class": "rank"}, s);
    el("text", {x: p[0], y: p[1] + 4, "text-anchor": "middle", fill: "white", "font-size": 10}, s, "" + r);
  }
  var arrows = 0;
  st.xfers.forEach(function (x, n) {
    var a = pos(x.from), b = pos(x.to), c = D.colours[x.chan % D.colours.length];
    var lift = 40 + 12 * (x.chan % 4);
    var path = "M" + a[0] + "," + (a[1] - 14) + " C" + a[0] + "," + (a[1] - lift - 30) + " " + b[0] + "," + (b[1] - lift - 30) + " " + b[0] + "," + (b[1] - 16);
    if (x.to < x.from) path = "M" + a[0] + "," + (a[1] + 14) + " C" + a[0] + "," + (a[1] + lift + 30) + " " + b[0] + "," + (b[1] + lift + 30) + " " + b[0] + "," + (b[1] + 16);
    el("path", {d: path, fill: "none", stroke: c, "stroke-width": 2, "marker-end": "url(#arr)", "class": "xfer"}, s);
    arrows++;
  });
  var txt;
  if (st.kind === "rs") txt = "reduce-scatter inside each node: local rank i ends with slice i (" +
    st.slices.map(function (x) { return human(x[1]); }).join(", ") + ") reduced over its node";
  else if (st.kind === "ag") txt = "all-gather inside each node: every rank gets every slice";
  else {
    var red = st.xfers.length && st.xfers[0].reduce;
    txt = "ring step on each rail: local rank i sends to local rank i of the next node (channel i) " +
      (red ? "and the receiver reduces (reduce-scatter phase)" : "(all-gather phase)") + "; chunks of " +
      human(st.xfers.length ? st.xfers[0].bytes : 0);
  }
  el("text", {x: 20, y: 30, "font-size": 14, "font-weight": "bold"}, s, "step " + (step + 1) + " of " + A.steps.length);
  el("text", {x: 20, y: 50, "font-size": 12}, s, txt);
  var cap = document.createElement("p");
  cap.className = "cap";
  cap.textContent = "The runtime's two-level all-reduce plans for " + human(A.bytes) + " over " + K + " nodes x " + L +
    " ranks" + (A.note ? " (" + A.note + ")" : "") + ". Colours: local rank = channel = rail.";
  sec.appendChild(cap);
  document.body.setAttribute("data-rendered-anim", (step + 1) + "/" + A.steps.length + ":" + arrows);
}

var views = {fabric: renderFabric, node: renderNode, anim: renderAnim};
function show(v) {
  ["fabric", "node", "anim"].forEach(function (x) {
    document.getElementById(x).className = "view" + (x === v ? " on" : "");
  });
  Array.prototype.forEach.call(document.querySelectorAll("nav button"), function (b) {
    b.className = b.getAttribute("data-view") === v ? "on" : "";
  });
  views[v]();
  document.body.setAttribute("data-view", v);
}
Array.prototype.forEach.call(document.querySelectorAll("nav button"), function (b) {
  b.onclick = function () { show(b.getAttribute("data-view")); };
});
var h = (location.hash || "#fabric").slice(1).split("&"), v = views[h[0]] ? h[0] : "fabric";
h.forEach(function (kv) { var m = /^step=(\d+)$/.exec(kv); if (m) step = Math.min(A.steps.length - 1, parseInt(m[1], 10)); });
show(v);
"##;
