//! `railrun plan --svg`: predicted busbw against size, one line per algorithm, the sizes on a
//! log scale — a standalone SVG file.

use super::fabric_file::FabricFile;
use super::Table;

/// Colours of the algorithms' lines (also the HTML page's).
pub const COLOURS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn size_label(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The plot.
pub fn plot(ff: &FabricFile, t: &Table) -> String {
    let (w, h) = (860.0, 520.0);
    let (l, r, top, bot) = (70.0, 190.0, 60.0, 60.0);
    let (pw, ph) = (w - l - r, h - top - bot);
    let sizes: Vec<u64> = t.rows.iter().map(|r| r.size.max(1)).collect();
    let (x0, x1) = (
        (*sizes.first().unwrap_or(&1) as f64).log2(),
        (*sizes.last().unwrap_or(&2) as f64).log2(),
    );
    let xspan = (x1 - x0).max(1.0);
    let mut ymax: f64 = 0.0;
    for row in &t.rows {
        for (_, p) in &row.preds {
            if let Ok(p) = p {
                ymax = ymax.max(t.busbw(row, p));
            }
        }
    }
    let ymax = if ymax > 0.0 { nice(ymax) } else { 1.0 };
    let x = |s: u64| l + ((s.max(1) as f64).log2() - x0) / xspan * pw;
    let y = |v: f64| top + ph - v / ymax * ph;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n"
    );
    out.push_str(&format!(
        "<text x=\"{l}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Predicted busbw: {} of {}, {} ranks</text>\n<text x=\"{l}\" y=\"40\" fill=\"#555\">{}</text>\n",
        t.kind,
        esc(t.dtype.name()),
        t.ranks,
        esc(&ff.fabric.summary().chars().take(130).collect::<String>())
    ));
    // grid and axes
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let yy = y(v);
        out.push_str(&format!(
            "<line x1=\"{l}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            l + pw,
            l - 6.0,
            yy + 4.0,
            trim(v)
        ));
    }
    let step = (sizes.len() / 10).max(1);
    for (i, &s) in sizes.iter().enumerate() {
        if i % step == 0 || i + 1 == sizes.len() {
            out.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
                x(s),
                top + ph + 18.0,
                size_label(s)
            ));
        }
    }
    out.push_str(&format!(
        "<rect x=\"{l}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#333\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">size (bytes)</text>\n<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\">busbw (GB/s)</text>\n",
        l + pw / 2.0,
        h - 18.0,
        top + ph / 2.0
    ));
    for (k, algo) in t.algos.iter().enumerate() {
        let c = COLOURS[k % COLOURS.len()];
        let pts: Vec<String> = t
            .rows
            .iter()
            .filter_map(|row| {
                row.preds
                    .iter()
                    .find(|(a, _)| a == algo)
                    .and_then(|(_, p)| p.as_ref().ok())
                    .map(|p| format!("{:.1},{:.1}", x(row.size), y(t.busbw(row, p))))
            })
            .collect();
        if !pts.is_empty() {
            out.push_str(&format!(
                "<polyline class=\"algo\" data-algo=\"{algo}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\n",
                pts.join(" ")
            ));
        }
        let ly = top + 20.0 + 22.0 * k as f64;
        out.push_str(&format!(
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{c}\" stroke-width=\"3\"/><text x=\"{:.1}\" y=\"{:.1}\">{algo}{}</text>\n",
            l + pw + 15.0,
            l + pw + 40.0,
            l + pw + 46.0,
            ly + 4.0,
            if pts.is_empty() { " (n/a)" } else { "" }
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
