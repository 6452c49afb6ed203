//! `railrun doctor`'s outputs: the text table (nodes, rail interfaces, pairwise bandwidth and
//! latency per rail, findings) and the SVG (a node × node bandwidth heat map per rail).

use super::report::{fmt_bps, Report};
use std::fmt::Write as _;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// A tested pair: (bits per second, latency in µs), either missing when the test failed.
type Cell = Option<(Option<f64>, Option<f64>)>;

/// The matrix of one rail: `m[from][to]`.
fn matrix(r: &Report, rail: &str) -> Vec<Vec<Cell>> {
    let n = r.nodes.len();
    let mut m = vec![vec![None; n]; n];
    for p in r.pairs.iter().filter(|p| p.rail == rail) {
        if p.from < n && p.to < n {
            m[p.from][p.to] = Some((p.bps, p.lat_us));
        }
    }
    m
}

/// The text report.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "railrun doctor: {} nodes, {} rails ({}), {} ranks per node; sweep of {} rounds x {} rails ({:.1} s per test) took {:.1} s; total {:.1} s",
        r.nodes.len(),
        r.rails.len(),
        r.rails.join(", "),
        r.ppn,
        r.shifts.len(),
        r.rails.len(),
        r.duration_s,
        r.sweep_s,
        r.run_s
    );
    let _ = writeln!(s, "\nnodes");
    let _ = writeln!(
        s,
        "  {:<12} {:>4} {:>4} {:>4} {:>9} {:>13}  rail interfaces (state speed MTU address)",
        "host", "cpus", "numa", "gpus", "mem GB/s", "in-node GB/s"
    );
    for n in &r.nodes {
        let rails: Vec<String> = r
            .rails
            .iter()
            .map(|name| match n.nics.iter().find(|x| &x.name == name) {
                Some(x) => format!(
                    "{name} {} {} {} {}",
                    x.state,
                    x.speed_mbps
                        .filter(|v| *v > 0)
                        .map(|v| format!("{v}Mb/s"))
                        .unwrap_or_else(|| "?".into()),
                    x.mtu.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                    x.addrs.first().cloned().unwrap_or_else(|| "-".into())
                ),
                None => format!("{name} missing"),
            })
            .collect();
        let _ = writeln!(
            s,
            "  {:<12} {:>4} {:>4} {:>4} {:>9} {:>13}  {}",
            n.host,
            n.cpus,
            n.numa_nodes,
            n.gpus.len(),
            opt(n.mem_gbs, 1),
            opt(n.allreduce_gbs, 2),
            rails.join("; ")
        );
    }
    for rail in &r.rails {
        let m = matrix(r, rail);
        for (title, bw) in [("bandwidth, Mbit/s", true), ("latency, us", false)] {
            let _ = writeln!(s, "\n{rail}: {title} (row sends to column)");
            let _ = write!(s, "  {:<12}", "");
            for n in &r.nodes {
                let _ = write!(s, " {:>9}", n.host);
            }
            s.push('\n');
            for (i, row) in m.iter().enumerate() {
                let _ = write!(s, "  {:<12}", r.nodes[i].host);
                for cell in row {
                    let v = match cell {
                        None => "-".to_string(),
                        Some((b, l)) => {
                            let x = if bw { b.map(|b| b / 1e6) } else { *l };
                            x.map(|x| format!("{x:.0}"))
                                .unwrap_or_else(|| "fail".into())
                        }
                    };
                    let _ = write!(s, " {v:>9}");
                }
                s.push('\n');
            }
        }
    }
    for n in &r.notes {
        let _ = writeln!(s, "\nnote: {n}");
    }
    if r.findings.is_empty() {
        let _ = writeln!(s, "\nfindings: none");
    } else {
        let _ = writeln!(s, "\nfindings ({}):", r.findings.len());
        for f in &r.findings {
            let _ = writeln!(s, "  {}", f.line());
        }
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Red (slow) through yellow to green (the rail's fastest pair).
fn color(frac: f64) -> String {
    let f = frac.clamp(0.0, 1.0);
    let (r, g) = if f < 0.5 {
        (220.0, 60.0 + 330.0 * f)
    } else {
        (220.0 - 360.0 * (f - 0.5), 225.0)
    };
    format!("rgb({:.0},{:.0},70)", r.max(40.0), g.min(225.0))
}

/// One heat map per rail, side by side, and the findings under them.
pub fn svg(r: &Report) -> String {
    let n = r.nodes.len().max(1);
    let cell = if n > 32 { 12.0 } else { 44.0 };
    let label = 70.0;
    let size = label + cell * n as f64;
    let w = 20.0 + (size + 30.0) * r.rails.len().max(1) as f64;
    let lines = r.findings.len() + 2;
    let h = 100.0 + cell * n as f64 + 18.0 * lines as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14">railrun doctor: pairwise bandwidth per rail (row sends to column); {} nodes</text>"#,
        r.nodes.len()
    );
    for (k, rail) in r.rails.iter().enumerate() {
        let x0 = 10.0 + k as f64 * (size + 30.0);
        let y0 = 50.0;
        let m = matrix(r, rail);
        let max = m
            .iter()
            .flatten()
            .filter_map(|c| c.and_then(|c| c.0))
            .fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            r#"<text x="{:.0}" y="38" font-size="13">{} (max {})</text>"#,
            x0 + label,
            esc(rail),
            fmt_bps(max)
        );
        for (i, nd) in r.nodes.iter().enumerate() {
            if n <= 32 {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.0}" y="{:.0}" text-anchor="end">{}</text>"#,
                    x0 + label - 4.0,
                    y0 + cell * (i as f64 + 0.6),
                    esc(&nd.host)
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.0}" y="{:.0}" text-anchor="middle">{}</text>"#,
                    x0 + label + cell * (i as f64 + 0.5),
                    y0 - 2.0 + cell * n as f64 + 14.0,
                    esc(&nd.host)
                );
            }
            for (j, c) in m[i].iter().enumerate() {
                let (fill, text) = match c {
                    None if i == j => ("#eeeeee".to_string(), String::new()),
                    None => ("#ffffff".to_string(), String::new()),
                    Some((None, _)) => ("#555555".to_string(), "fail".to_string()),
                    Some((Some(b), _)) => (
                        color(if max > 0.0 { b / max } else { 0.0 }),
                        format!("{:.0}", b / 1e6),
                    ),
                };
                let (cx, cy) = (x0 + label + cell * j as f64, y0 + cell * i as f64);
                let _ = writeln!(
                    s,
                    r##"<rect x="{cx:.0}" y="{cy:.0}" width="{cell:.0}" height="{cell:.0}" fill="{fill}" stroke="#ffffff"><title>{} -&gt; {} on {}: {}</title></rect>"##,
                    esc(&r.nodes[i].host),
                    esc(&r.nodes.get(j).map(|x| x.host.clone()).unwrap_or_default()),
                    esc(rail),
                    esc(&text)
                );
                if n <= 32 && !text.is_empty() {
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.0}" y="{:.0}" text-anchor="middle" font-size="9">{}</text>"#,
                        cx + cell / 2.0,
                        cy + cell / 2.0 + 3.0,
                        esc(&text)
                    );
                }
            }
        }
    }
    let mut y = 90.0 + cell * n as f64;
    let head = if r.findings.is_empty() {
        "findings: none".to_string()
    } else {
        format!("findings ({}):", r.findings.len())
    };
    let _ = writeln!(s, r#"<text x="10" y="{y:.0}" font-size="12">{head}</text>"#);
    for f in &r.findings {
        y += 18.0;
        let _ = writeln!(
            s,
            r##"<text x="20" y="{y:.0}" fill="#b00020">{}</text>"##,
            esc(&f.line())
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::super::report::{Finding, NodeReport, Pair};
    use super::*;

    #[test]
    fn table_and_svg_show_every_pair_and_finding() {
        let mut r = Report {
            nodes: (0..3)
                .map(|i| NodeReport {
                    node: i,
                    host: format!("n{}", i + 1),
                    ..Default::default()
                })
                .collect(),
            rails: vec!["rail0".into()],
            ..Default::default()
        };
        r.pairs.push(Pair {
            rail: "rail0".into(),
            from: 0,
            to: 1,
            bps: Some(2e8),
            lat_us: Some(35.0),
            error: None,
        });
        r.pairs.push(Pair {
            rail: "rail0".into(),
            from: 1,
            to: 2,
            bps: None,
            lat_us: None,
            error: Some("connect: timed out".into()),
        });
        r.findings.push(Finding {
            kind: "down".into(),
            host: "n3".into(),
            interface: Some("rail0".into()),
            expected: "operstate up".into(),
            measured: "operstate down".into(),
            check: "the cable <&>".into(),
        });
        let t = table(&r);
        assert!(
            t.contains("200") && t.contains("fail") && t.contains("n3 rail0: down"),
            "{t}"
        );
        let s = svg(&r);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches("<rect").count(), 9);
        assert!(s.contains("the cable &lt;&amp;&gt;"));
    }
}
