//! The SVG: bus bandwidth against size (log scale), one panel per (type, op, root), MPI and
//! railring, out-of-place and in-place.

use super::stats::Compared;
use super::Lib;
use std::fmt::Write as _;

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn size_label(b: f64) -> String {
    let b = b.round() as u64;
    for (u, s) in [
        (1u64 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ] {
        if b >= u && b & (u - 1) == 0 {
            return format!("{}{s}", b / u);
        }
    }
    format!("{b}")
}

fn nice_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

/// Bus bandwidth against size (log2 x), one panel per (type, op, root) group.
pub fn svg(rows: &[Compared], title: &str) -> String {
    let mut groups: Vec<(String, String, i64)> = Vec::new();
    for r in rows {
        let g = (r.dtype.clone(), r.redop.clone(), r.root);
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let (w, ph) = (920.0, 440.0);
    let (ml, mr, mt, mb) = (80.0, 190.0, 50.0, 60.0);
    let h = ph * groups.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let series: [(&str, &str, &str, bool); 4] = [
        ("MPI out-of-place", "#d62728", "", false),
        ("MPI in-place", "#d62728", "6,4", true),
        ("railring out-of-place", "#1f77b4", "", false),
        ("railring in-place", "#1f77b4", "6,4", true),
    ];
    for (gi, g) in groups.iter().enumerate() {
        let y0 = gi as f64 * ph;
        let gr: Vec<&Compared> = rows
            .iter()
            .filter(|r| (r.dtype.clone(), r.redop.clone(), r.root) == *g)
            .collect();
        let pts = |lib: Lib, ip: bool| -> Vec<(f64, f64)> {
            gr.iter()
                .filter(|r| r.size > 0)
                .filter_map(|r| {
                    let a = match lib {
                        Lib::Mpi => r.mpi.as_ref(),
                        Lib::Railring => r.railring.as_ref(),
                    }?;
                    let v = if ip { a.ip_busbw } else { a.oop_busbw };
                    v.is_finite().then_some((r.size as f64, v))
                })
                .collect()
        };
        let all: Vec<(f64, f64)> = [
            pts(Lib::Mpi, false),
            pts(Lib::Mpi, true),
            pts(Lib::Railring, false),
            pts(Lib::Railring, true),
        ]
        .concat();
        let xmin = all
            .iter()
            .map(|p| p.0)
            .fold(f64::INFINITY, f64::min)
            .max(1.0);
        let xmax = all.iter().map(|p| p.0).fold(0.0, f64::max).max(xmin);
        let (lx0, lx1) = (
            xmin.log2(),
            if xmax > xmin {
                xmax.log2()
            } else {
                xmin.log2() + 1.0
            },
        );
        let ymax_data = all.iter().map(|p| p.1).fold(0.0, f64::max);
        let step = nice_step(if ymax_data > 0.0 { ymax_data } else { 1.0 });
        let ymax = ((ymax_data / step).ceil().max(1.0)) * step;
        let (px0, px1, py0, py1) = (ml, w - mr, y0 + mt, y0 + ph - mb);
        let xp = |x: f64| px0 + (x.log2() - lx0) / (lx1 - lx0) * (px1 - px0);
        let yp = |y: f64| py1 - y / ymax * (py1 - py0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            (px0 + px1) / 2.0,
            y0 + 28.0,
            xml(&format!(
                "{title} — {} {}{}",
                g.0,
                g.1,
                if g.2 >= 0 {
                    format!(" root {}", g.2)
                } else {
                    String::new()
                }
            ))
        );
        // grid and y ticks
        let mut y = 0.0;
        while y <= ymax + step * 0.01 {
            let yy = yp(y);
            let _ = writeln!(
                s,
                r##"<line x1="{px0}" y1="{yy:.1}" x2="{px1}" y2="{yy:.1}" stroke="#e0e0e0"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                px0 - 6.0,
                yy + 4.0,
                if step < 1.0 {
                    format!("{y:.2}")
                } else {
                    format!("{y:.0}")
                }
            );
            y += step;
        }
        // x ticks at powers of two, at most ~12 labels
        let (k0, k1) = (lx0.ceil() as i64, lx1.floor() as i64);
        let every = (((k1 - k0 + 1) as f64) / 12.0).ceil().max(1.0) as i64;
        for k in k0..=k1 {
            let xx = xp(2f64.powi(k as i32));
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{py0}" x2="{xx:.1}" y2="{py1}" stroke="#f0f0f0"/>"##
            );
            if (k1 - k) % every == 0 {
                let _ = writeln!(
                    s,
                    r#"<text x="{xx:.1}" y="{}" text-anchor="middle">{}</text>"#,
                    py1 + 18.0,
                    size_label(2f64.powi(k as i32))
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<rect x="{px0}" y="{py0}" width="{}" height="{}" fill="none" stroke="black"/>"#,
            px1 - px0,
            py1 - py0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">message size (bytes, log scale)</text>"#,
            (px0 + px1) / 2.0,
            py1 + 40.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">bus bandwidth (GB/s)</text>"#,
            px0 - 55.0,
            (py0 + py1) / 2.0,
            px0 - 55.0,
            (py0 + py1) / 2.0
        );
        for (si, (name, color, dash, ip)) in series.iter().enumerate() {
            let lib = if si < 2 { Lib::Mpi } else { Lib::Railring };
            let p = pts(lib, *ip);
            if !p.is_empty() {
                let path: Vec<String> = p
                    .iter()
                    .map(|&(x, y)| format!("{:.1},{:.1}", xp(x), yp(y)))
                    .collect();
                let da = if dash.is_empty() {
                    String::new()
                } else {
                    format!(r#" stroke-dasharray="{dash}""#)
                };
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{da}/>"#,
                    path.join(" ")
                );
                for &(x, y) in &p {
                    let fill = if *ip { "white" } else { color };
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{fill}" stroke="{color}"/>"#,
                        xp(x),
                        yp(y)
                    );
                }
            }
            let ly = py0 + 10.0 + si as f64 * 22.0;
            let lx = px1 + 15.0;
            let da = if dash.is_empty() {
                String::new()
            } else {
                format!(r#" stroke-dasharray="{dash}""#)
            };
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{da}/>"#,
                lx + 30.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}">{}</text>"#,
                lx + 36.0,
                ly + 4.0,
                xml(name)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::stats::Agg;

    #[test]
    fn plot_is_svg() {
        let row = |size, bw: f64| Compared {
            size,
            count: size / 4,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            mpi: Some(Agg {
                oop_time_us: 1.0,
                oop_busbw: bw,
                ip_time_us: 1.0,
                ip_busbw: bw,
                oop_wrong: 0,
                ip_wrong: 0,
                rounds: 1,
            }),
            railring: Some(Agg {
                oop_time_us: 1.0,
                oop_busbw: bw * 2.0,
                ip_time_us: 1.0,
                ip_busbw: bw,
                oop_wrong: 0,
                ip_wrong: 0,
                rounds: 1,
            }),
            ratio_oop_busbw: Some(2.0),
            ratio_ip_busbw: Some(1.0),
        };
        let s = svg(&[row(8, 0.1), row(1 << 20, 3.0)], "allreduce <x>");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4);
        assert!(s.contains("1M") && s.contains("&lt;x&gt;"));
    }
}
