//! `railrun plan`: predict collectives on a fabric with the runtime's own plans.
//!
//! ```text
//! railrun plan --fabric F [--ranks N] [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-d TYPE]
//!              [--collective C] [--algo A|all] [--json] [--svg FILE] [--html FILE] [--size S]
//! ```
//!
//! For every size: each algorithm's predicted time, algbw and busbw (nccl-tests' formulas), the
//! algorithm that is fastest (the runtime's order breaks ties), and the bottleneck. The prices
//! come from [`railring_collectives::fabric`] (the plans of `build_plan`, priced on the fabric's
//! links); this module reads the fabric file ([`fabric_file`]), runs the sizes and prints.
//! [`svg`] and [`html`] draw the results; [`order`] is the fabric-aware node order railrun's
//! placement uses.

pub mod fabric_file;
pub mod html;
pub mod order;
pub mod svg;

use railring_collectives::build::algorithms_for;
use railring_collectives::fabric::{Bottleneck, Ecmp, FabricPlanner, Prediction, Tier};
use railring_collectives::{Algo, CollKind, DataType};
use std::io::Write;
use std::path::PathBuf;

/// Algorithms whose plans are run for every rank (no rotation symmetry) are priced up to this
/// many ranks (the tree, required everywhere, always).
pub const RANK_BY_RANK_MAX: usize = 16_384;

const USAGE: &str = "usage: railrun plan --fabric FILE [options]

  --fabric FILE        the fabric (JSON, docs/fabric.md); default: $RAILRING_FABRIC
  --ranks N            ranks (default: every rank of the fabric), ranks_per_node per node
  -b, --minbytes N     smallest size (default 8; K/M/G suffixes)
  -e, --maxbytes N     largest size (default 4G)
  -f, --stepfactor N   size factor (default 2)
  -i, --stepbytes N    size increment (instead of -f)
  -d, --datatype T     element type (default float)
  --collective C       allreduce (default), reducescatter, allgather, alltoall, broadcast
  --algo A             ring, two_level, tree, recursive_doubling, pairwise, bruck, or all
                       (default)
  --json               print the table as JSON
  --svg FILE           also plot predicted busbw against size, one line per algorithm
  --html FILE          also write a page: the fabric with links coloured by load, the node
                       interconnect, and the two-level all-reduce step by step
  --size S             the size the page's fabric view shows (default: the largest)
  --links              with --json: the flows on every fabric link in each algorithm's busiest
                       round (at the largest size)
  --ecmp MODE          instead of the file's: ideal (flows spread evenly over equal-cost
                       uplinks), worst (all on one), hash or hash:SEED
";

/// Options of `railrun plan`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanArgs {
    pub fabric: Option<PathBuf>,
    pub ranks: Option<usize>,
    pub minbytes: u64,
    pub maxbytes: u64,
    pub factor: Option<u64>,
    pub step: Option<u64>,
    pub dtype: DataType,
    pub kind: CollKind,
    pub algo: Option<Algo>,
    pub json: bool,
    pub svg: Option<PathBuf>,
    pub html: Option<PathBuf>,
    pub html_size: Option<u64>,
    /// `--ecmp`: override the fabric file's ECMP mode.
    pub ecmp: Option<Ecmp>,
    /// `--links`: with `--json`, the flows on every link in each algorithm's busiest round.
    pub links: bool,
}

impl Default for PlanArgs {
    fn default() -> Self {
        PlanArgs {
            fabric: None,
            ranks: None,
            minbytes: 8,
            maxbytes: 4 << 30,
            factor: Some(2),
            step: None,
            dtype: DataType::F32,
            kind: CollKind::AllReduce,
            algo: None,
            json: false,
            svg: None,
            html: None,
            html_size: None,
            ecmp: None,
            links: false,
        }
    }
}

/// `8`, `64K`, `4M`, `2G` (powers of 1024): the runtime's own size grammar.
pub use railring::knobs::parse_size;

fn parse_kind(s: &str) -> Option<CollKind> {
    Some(
        match s.to_ascii_lowercase().replace(['_', '-'], "").as_str() {
            "allreduce" => CollKind::AllReduce,
            "reducescatter" => CollKind::ReduceScatter,
            "allgather" => CollKind::AllGather,
            "alltoall" => CollKind::AllToAll,
            "broadcast" | "bcast" => CollKind::Broadcast,
            _ => return None,
        },
    )
}

/// Parses the arguments after `plan`.
pub fn parse_args(args: &[String]) -> Result<Option<PlanArgs>, String> {
    let mut a = PlanArgs::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let size = |v: String| {
            parse_size(&v)
                .ok_or_else(|| format!("{flag} `{v}`: expected a size like 8, 64K, 4M, 2G"))
        };
        match flag {
            "--fabric" => a.fabric = Some(PathBuf::from(value()?)),
            "--ranks" | "-np" | "-n" => {
                let v = value()?;
                a.ranks = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| format!("--ranks `{v}`: expected a whole number >= 1"))?,
                )
            }
            "-b" | "--minbytes" => a.minbytes = size(value()?)?,
            "-e" | "--maxbytes" => a.maxbytes = size(value()?)?,
            "-f" | "--stepfactor" => {
                let v = value()?;
                a.factor = Some(
                    v.parse::<u64>()
                        .ok()
                        .filter(|&f| f >= 2)
                        .ok_or_else(|| format!("-f `{v}`: expected a whole number >= 2"))?,
                );
                a.step = None;
            }
            "-i" | "--stepbytes" => {
                a.step = Some(size(value()?)?.max(1));
                a.factor = None;
            }
            "-d" | "--datatype" => {
                let v = value()?;
                a.dtype = v
                    .parse::<DataType>()
                    .map_err(|_| format!("-d `{v}`: unknown data type"))?;
            }
            "--collective" | "-c" => {
                let v = value()?;
                a.kind = parse_kind(&v).ok_or_else(|| {
                    format!("--collective `{v}`: expected allreduce, reducescatter, allgather, alltoall or broadcast")
                })?;
            }
            "--algo" => {
                let v = value()?;
                a.algo = if v.eq_ignore_ascii_case("all") {
                    None
                } else {
                    Some(Algo::parse(&v).ok_or_else(|| {
                        format!("--algo `{v}`: expected ring, two_level, tree, recursive_doubling, pairwise, bruck or all")
                    })?)
                };
            }
            "--json" => a.json = true,
            "--links" => a.links = true,
            "--svg" => a.svg = Some(PathBuf::from(value()?)),
            "--html" => a.html = Some(PathBuf::from(value()?)),
            "--size" => a.html_size = Some(size(value()?)?),
            "--ecmp" => {
                let v = value()?;
                a.ecmp = Some(match v.to_ascii_lowercase().as_str() {
                    "ideal" => Ecmp::Ideal,
                    "worst" => Ecmp::Worst,
                    "hash" => Ecmp::Hash { seed: 0 },
                    h => match h.strip_prefix("hash:").and_then(|x| x.parse().ok()) {
                        Some(seed) => Ecmp::Hash { seed },
                        None => {
                            return Err(format!(
                                "--ecmp `{v}`: expected ideal, worst, hash or hash:SEED"
                            ))
                        }
                    },
                });
            }
            "-h" | "--help" => return Ok(None),
            _ => return Err(format!("unknown option `{arg}`\n{USAGE}")),
        }
        i += 1;
    }
    if a.minbytes > a.maxbytes {
        return Err(format!(
            "-b {} is larger than -e {}",
            a.minbytes, a.maxbytes
        ));
    }
    Ok(Some(a))
}

impl PlanArgs {
    /// The sizes in bytes, at most 1000 of them.
    pub fn sizes(&self) -> Result<Vec<u64>, String> {
        let mut v = Vec::new();
        let mut s = self.minbytes;
        loop {
            v.push(s);
            if v.len() > 1000 {
                return Err("more than 1000 sizes: use a larger -f or -i".into());
            }
            let next = match (self.factor, self.step) {
                (_, Some(st)) => s.checked_add(st),
                (Some(f), None) => s.max(1).checked_mul(f),
                (None, None) => None,
            };
            match next {
                Some(n) if n <= self.maxbytes && n > s => s = n,
                _ => break,
            }
        }
        Ok(v)
    }
}

/// nccl-tests' bus bandwidth factor.
pub fn bus_factor(kind: CollKind, n: usize) -> f64 {
    let n = n as f64;
    match kind {
        CollKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollKind::ReduceScatter | CollKind::AllGather | CollKind::AllToAll => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// (element count per call as the library sees it, bytes the size stands for), as railperf
/// counts them.
pub fn count_of(kind: CollKind, size: u64, ds: usize, n: usize) -> (usize, u64) {
    let total = size as usize / ds;
    match kind {
        CollKind::ReduceScatter | CollKind::AllGather | CollKind::AllToAll => {
            let per = total / n;
            (per, (per * n * ds) as u64)
        }
        _ => (total, (total * ds) as u64),
    }
}

/// Flows on one link in a round: its class, what it joins (see `Routes::ends`), and the flows.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkLoad {
    pub class: railring_collectives::fabric::LinkClass,
    pub a: usize,
    pub b: Option<usize>,
    pub flows: u32,
}

/// One row: a size and every algorithm's prediction.
#[derive(Clone, Debug)]
pub struct Row {
    pub size: u64,
    pub count: usize,
    pub preds: Vec<(Algo, Result<Prediction, String>)>,
    /// The fastest algorithm (ties: the runtime's order of preference).
    pub choice: Option<Algo>,
}

/// The whole table.
#[derive(Clone, Debug)]
pub struct Table {
    /// Per algorithm (with `--links` or `--html`): the busiest round's flows per link, at the
    /// largest size, as (class, from, to, flows).
    pub links: Vec<(Algo, Vec<LinkLoad>)>,
    pub kind: CollKind,
    pub dtype: DataType,
    pub ranks: usize,
    pub algos: Vec<Algo>,
    pub rows: Vec<Row>,
}

impl Table {
    pub fn busbw(&self, row: &Row, p: &Prediction) -> f64 {
        if p.time > 0.0 {
            row.size as f64 / p.time / 1e9 * bus_factor(self.kind, self.ranks)
        } else {
            0.0
        }
    }
}

/// Computes the table for `args` on a read fabric file. Each algorithm is priced by a planner of
/// its own, the algorithms on as many threads as there are CPUs.
pub fn compute(ff: &fabric_file::FabricFile, args: &PlanArgs) -> Result<Table, String> {
    let f = &ff.fabric;
    let ranks = args.ranks.unwrap_or(f.ranks());
    FabricPlanner::new(f, ranks, true).map_err(|e| e.to_string())?;
    let algos: Vec<Algo> = match args.algo {
        Some(a) => vec![a],
        None => algorithms_for(args.kind).to_vec(),
    };
    let ds = args.dtype.size();
    let sizes = args.sizes()?;
    let counts: Vec<(usize, u64)> = sizes
        .iter()
        .map(|&s| count_of(args.kind, s, ds, ranks))
        .collect();
    let kind = args.kind;
    let price = |algo: Algo| -> Vec<Result<Prediction, String>> {
        let rank_by_rank = matches!(
            (kind, algo),
            (_, Algo::RecursiveDoubling) | (CollKind::Broadcast, Algo::Ring)
        );
        if rank_by_rank && ranks > RANK_BY_RANK_MAX {
            let e = format!(
                "not priced above {RANK_BY_RANK_MAX} ranks: {algo} has no rank symmetry and is run rank by rank"
            );
            return counts.iter().map(|_| Err(e.clone())).collect();
        }
        match FabricPlanner::new(f, ranks, true) {
            Ok(mut p) => counts
                .iter()
                .map(|&(count, _)| p.predict(kind, algo, count, ds, 0))
                .collect(),
            Err(e) => counts.iter().map(|_| Err(e.to_string())).collect(),
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, algos.len().max(1));
    let mut per_algo: Vec<Vec<Result<Prediction, String>>> = vec![Vec::new(); algos.len()];
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(&mut per_algo);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&algo) = algos.get(i) else { break };
                let v = price(algo);
                out.lock().unwrap_or_else(|e| e.into_inner())[i] = v;
            });
        }
    });
    let mut rows = Vec::new();
    for (k, &(count, bytes)) in counts.iter().enumerate() {
        let preds: Vec<(Algo, Result<Prediction, String>)> = algos
            .iter()
            .zip(&per_algo)
            .map(|(&a, v)| (a, v[k].clone()))
            .collect();
        let choice = preds
            .iter()
            .filter_map(|(a, p)| p.as_ref().ok().map(|p| (*a, p.time)))
            .fold(None, |best: Option<(Algo, f64)>, (a, t)| match best {
                Some((_, bt)) if bt <= t => best,
                _ => Some((a, t)),
            })
            .map(|b| b.0);
        rows.push(Row {
            size: bytes,
            count,
            preds,
            choice,
        });
    }
    let mut links = Vec::new();
    if args.links || args.html.is_some() {
        let size = args.html_size.unwrap_or(*sizes.last().unwrap_or(&8));
        let (count, _) = count_of(args.kind, size, ds, ranks);
        for &algo in &algos {
            let Ok(mut p) = FabricPlanner::new(f, ranks, true) else {
                continue;
            };
            if ranks > RANK_BY_RANK_MAX && matches!(algo, Algo::RecursiveDoubling) {
                continue;
            }
            if let Ok(v) = p.link_loads(args.kind, algo, count.max(1), 0) {
                let r = p.routes();
                links.push((
                    algo,
                    v.into_iter()
                        .map(|(l, flows)| {
                            let (class, a, b) = r.ends(l);
                            LinkLoad { class, a, b, flows }
                        })
                        .collect(),
                ));
            }
        }
    }
    Ok(Table {
        links,
        kind: args.kind,
        dtype: args.dtype,
        ranks,
        algos,
        rows,
    })
}

/// "leaf -> spine, 2 flows/link (ECMP: 3 uplinks above an even spread, max 2 vs 1)".
pub fn describe(b: &Bottleneck) -> String {
    let mut s = match b.tier {
        Tier::NodeStep => "in-node steps".to_string(),
        Tier::InNode => "in-node link".to_string(),
        Tier::Link(c) => format!(
            "{}, {} flow{}/link",
            c.name(),
            b.flows,
            if b.flows == 1 { "" } else { "s" }
        ),
    };
    if b.latency_bound {
        s.push_str(", latency-bound");
    }
    if b.ecmp_overloaded > 0 {
        s.push_str(&format!(
            " (ECMP: {} uplink{} above an even spread, {} flows where {} would do)",
            b.ecmp_overloaded,
            if b.ecmp_overloaded == 1 { "" } else { "s" },
            b.ecmp_max,
            b.ecmp_even
        ));
    }
    s
}

#[allow(dead_code)]
fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < 4 && v.fract() == 0.0 && (v / 1024.0).fract() == 0.0 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v} {}", U[i])
}

/// The table as text.
pub fn render_text(ff: &fabric_file::FabricFile, t: &Table) -> String {
    let f = &ff.fabric;
    let mut out = format!("# railrun plan: {}\n", f.summary());
    out.push_str(&format!(
        "# {} of {}, {} ranks on {} nodes; time in us, algbw and busbw in GB/s (nccl-tests' formulas)\n",
        t.kind,
        t.dtype.name(),
        t.ranks,
        t.ranks.div_ceil(f.ranks_per_node)
    ));
    let mut head = format!("#{:>11} {:>12}", "size", "count");
    for a in &t.algos {
        head.push_str(&format!(" {:>30}", format!("{a}: time algbw busbw")));
    }
    head.push_str("  choice: bottleneck");
    out.push_str(&head);
    out.push('\n');
    let mut notes: Vec<String> = Vec::new();
    for r in &t.rows {
        let mut line = format!("{:>12} {:>12}", r.size, r.count);
        for (a, p) in &r.preds {
            match p {
                Ok(p) => {
                    let alg = if p.time > 0.0 {
                        r.size as f64 / p.time / 1e9
                    } else {
                        0.0
                    };
                    line.push_str(&format!(
                        " {:>30}",
                        format!("{:.2} {:.3} {:.3}", p.time * 1e6, alg, t.busbw(r, p))
                    ));
                }
                Err(e) => {
                    line.push_str(&format!(" {:>30}", "n/a"));
                    let note = format!("# {a}: {e}");
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
            }
        }
        match r.choice {
            Some(c) => {
                let b = r
                    .preds
                    .iter()
                    .find(|(a, _)| *a == c)
                    .and_then(|(_, p)| p.as_ref().ok())
                    .and_then(|p| p.bottleneck.as_ref())
                    .map(describe)
                    .unwrap_or_else(|| "-".into());
                line.push_str(&format!("  {c}: {b}"));
            }
            None => line.push_str("  -"),
        }
        out.push_str(&line);
        out.push('\n');
    }
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// The table as JSON.
pub fn render_json(ff: &fabric_file::FabricFile, t: &Table) -> String {
    use serde_json::{json, Map, Value};
    let f = &ff.fabric;
    let rows: Vec<Value> = t
        .rows
        .iter()
        .map(|r| {
            let mut algos = Map::new();
            for (a, p) in &r.preds {
                algos.insert(
                    a.name().into(),
                    match p {
                        Ok(p) => json!({
                            "time_us": p.time * 1e6,
                            "algbw_gbs": if p.time > 0.0 { r.size as f64 / p.time / 1e9 } else { 0.0 },
                            "busbw_gbs": t.busbw(r, p),
                            "rounds": p.rounds,
                            "transfer_bytes": p.transfer,
                            "ranks_simulated": p.rho,
                            "bottleneck": p.bottleneck.as_ref().map(|b| json!({
                                "tier": b.tier.name(),
                                "flows_per_link": b.flows,
                                "ecmp_width": b.ecmp_width,
                                "ecmp_overloaded_uplinks": b.ecmp_overloaded,
                                "ecmp_max_flows": b.ecmp_max,
                                "ecmp_even_flows": b.ecmp_even,
                                "latency_bound": b.latency_bound,
                                "share_of_time": b.share,
                                "text": describe(b),
                            })),
                        }),
                        Err(e) => json!({ "error": e }),
                    },
                );
            }
            json!({
                "size": r.size,
                "count": r.count,
                "choice": r.choice.map(|a| a.name()),
                "algos": algos,
            })
        })
        .collect();
    let links: Map<String, Value> = t
        .links
        .iter()
        .map(|(a, v)| {
            (
                a.name().to_string(),
                Value::Array(
                    v.iter()
                        .map(|l| json!({"class": l.class.name(), "from": l.a, "to": l.b, "flows": l.flows}))
                        .collect(),
                ),
            )
        })
        .collect();
    let v = json!({
        "busiest_round_links": links,
        "fabric": {
            "name": f.name,
            "summary": f.summary(),
            "nodes": f.nodes,
            "ranks_per_node": f.ranks_per_node,
            "nics_per_node": f.nics,
            "leaves": f.leaves(),
            "pods": f.pods(),
            "leaf_oversubscription": f.leaf_oversubscription(),
            "spine_oversubscription": f.spine_oversubscription(),
            "ecmp": f.ecmp.name(),
        },
        "collective": t.kind.name(),
        "dtype": t.dtype.name(),
        "ranks": t.ranks,
        "rows": rows,
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

/// `railrun plan ...`: the exit code.
pub fn run(args: &[String]) -> i32 {
    let a = match parse_args(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("railrun plan: {e}");
            return 2;
        }
    };
    match plan(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("railrun plan: {e}");
            1
        }
    }
}

fn plan(mut a: PlanArgs) -> Result<(), String> {
    if a.fabric.is_none() {
        a.fabric = std::env::var_os("RAILRING_FABRIC")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
    }
    let path = a
        .fabric
        .clone()
        .ok_or_else(|| format!("no fabric: give --fabric FILE (or RAILRING_FABRIC)\n{USAGE}"))?;
    let mut ff = fabric_file::load(&path)?;
    if let Some(e) = a.ecmp {
        ff.fabric.ecmp = e;
    }
    let t = compute(&ff, &a)?;
    let text = if a.json {
        render_json(&ff, &t)
    } else {
        render_text(&ff, &t)
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| format!("stdout: {e}"))?;
    if let Some(p) = &a.svg {
        std::fs::write(p, svg::plot(&ff, &t)).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &a.html {
        let page = html::page(&ff, &t, &a)?;
        std::fs::write(p, page).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Option<PlanArgs>, String> {
        parse_args(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn options() {
        let a = args(
            "--fabric f.json --ranks 64 -b 1K -e 4M -f 4 --collective allgather --algo ring --json",
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.ranks, Some(64));
        assert_eq!(
            a.sizes().unwrap(),
            vec![1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20]
        );
        assert_eq!(a.kind, CollKind::AllGather);
        assert_eq!(a.algo, Some(Algo::Ring));
        assert!(a.json);
        assert_eq!(PlanArgs::default().sizes().unwrap().len(), 30);
        for bad in [
            "--ranks 0",
            "-b x",
            "-f 1",
            "--collective reduce",
            "--algo fast",
            "--frob",
            "-b 4M -e 1K",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
        assert_eq!(args("--help").unwrap(), None);
        assert_eq!(
            count_of(CollKind::AllGather, 1 << 20, 4, 4),
            (65536, 1 << 20)
        );
    }
}
