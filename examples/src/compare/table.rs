//! The side-by-side table: both libraries' time and bus bandwidth per size, out-of-place and
//! in-place, the ratio railring/MPI and the wrong-element counts.

use super::stats::{Agg, Compared};
use std::fmt::Write as _;

fn f_time(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 1e4 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn f_opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

pub fn table(rows: &[Compared]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#{:>49}{:^40}   {:^40}", "", "out-of-place", "in-place");
    let _ = writeln!(
        s,
        "#{:>11} {:>12} {:>8} {:>6} {:>5} | {:>8} {:>7} {:>8} {:>7} {:>6} | {:>8} {:>7} {:>8} {:>7} {:>6} | {:>6} {:>6}",
        "size", "count", "type", "redop", "root", "mpi", "mpi", "railring", "rr", "ratio", "mpi", "mpi", "railring", "rr", "ratio", "#wrong", "#wrong"
    );
    let _ = writeln!(
        s,
        "#{:>11} {:>12} {:>8} {:>6} {:>5} | {:>8} {:>7} {:>8} {:>7} {:>6} | {:>8} {:>7} {:>8} {:>7} {:>6} | {:>6} {:>6}",
        "(B)", "(elements)", "", "", "", "time(us)", "busbw", "time(us)", "busbw", "rr/mpi", "time(us)", "busbw", "time(us)", "busbw", "rr/mpi", "mpi", "rr"
    );
    for r in rows {
        let m = r.mpi.as_ref();
        let x = r.railring.as_ref();
        let w = |a: Option<&Agg>| {
            a.map(|a| (a.oop_wrong + a.ip_wrong).to_string())
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(
            s,
            " {:>11} {:>12} {:>8} {:>6} {:>5} | {:>8} {:>7} {:>8} {:>7} {:>6} | {:>8} {:>7} {:>8} {:>7} {:>6} | {:>6} {:>6}",
            r.size,
            r.count,
            r.dtype,
            r.redop,
            r.root,
            m.map(|a| f_time(a.oop_time_us)).unwrap_or_else(|| "-".into()),
            f_opt(m.map(|a| a.oop_busbw), 2),
            x.map(|a| f_time(a.oop_time_us)).unwrap_or_else(|| "-".into()),
            f_opt(x.map(|a| a.oop_busbw), 2),
            f_opt(r.ratio_oop_busbw, 2),
            m.map(|a| f_time(a.ip_time_us)).unwrap_or_else(|| "-".into()),
            f_opt(m.map(|a| a.ip_busbw), 2),
            x.map(|a| f_time(a.ip_time_us)).unwrap_or_else(|| "-".into()),
            f_opt(x.map(|a| a.ip_busbw), 2),
            f_opt(r.ratio_ip_busbw, 2),
            w(m),
            w(x),
        );
    }
    s
}
