//! Per size, each library's run with the median time over its rounds, and the ratios
//! railring/MPI of the bus bandwidth.

use super::runs::{Row, Run};
use super::Lib;

/// Medians over rounds of one library at one row key.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Agg {
    pub oop_time_us: f64,
    pub oop_busbw: f64,
    pub ip_time_us: f64,
    pub ip_busbw: f64,
    pub oop_wrong: u64,
    pub ip_wrong: u64,
    pub rounds: usize,
}

fn aggregate(rows: &[&Row]) -> Option<Agg> {
    if rows.is_empty() {
        return None;
    }
    // The run with the (lower) median time; its bandwidth comes from the same run, so time and
    // bandwidth always agree.
    let pick = |key: fn(&Row) -> f64| -> &Row {
        let mut v: Vec<&Row> = rows.to_vec();
        v.sort_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        v[(v.len() - 1) / 2]
    };
    let o = pick(|r| r.oop_time_us);
    let i = pick(|r| r.ip_time_us);
    Some(Agg {
        oop_time_us: o.oop_time_us,
        oop_busbw: o.oop_busbw,
        ip_time_us: i.ip_time_us,
        ip_busbw: i.ip_busbw,
        oop_wrong: rows.iter().map(|r| r.oop_wrong).sum(),
        ip_wrong: rows.iter().map(|r| r.ip_wrong).sum(),
        rounds: rows.len(),
    })
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Compared {
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub mpi: Option<Agg>,
    pub railring: Option<Agg>,
    pub ratio_oop_busbw: Option<f64>,
    pub ratio_ip_busbw: Option<f64>,
}

fn ratio(rr: f64, mpi: f64) -> Option<f64> {
    (mpi > 0.0 && rr.is_finite()).then(|| rr / mpi)
}

pub fn compare(runs: &[Run]) -> Vec<Compared> {
    // keys in first-seen order
    let mut keys: Vec<((String, String, i64, usize), usize)> = Vec::new();
    for r in runs {
        for row in &r.rows {
            if !keys.iter().any(|(k, _)| *k == row.key()) {
                keys.push((row.key(), row.count));
            }
        }
    }
    keys.into_iter()
        .map(|(k, count)| {
            let of = |lib: Lib| -> Vec<&Row> {
                runs.iter()
                    .filter(|r| r.lib == lib)
                    .flat_map(|r| r.rows.iter().filter(|x| x.key() == k))
                    .collect()
            };
            let mpi = aggregate(&of(Lib::Mpi));
            let railring = aggregate(&of(Lib::Railring));
            let (ratio_oop_busbw, ratio_ip_busbw) = match (&mpi, &railring) {
                (Some(m), Some(r)) => (
                    ratio(r.oop_busbw, m.oop_busbw),
                    ratio(r.ip_busbw, m.ip_busbw),
                ),
                _ => (None, None),
            };
            Compared {
                size: k.3,
                count,
                dtype: k.0,
                redop: k.1,
                root: k.2,
                mpi,
                railring,
                ratio_oop_busbw,
                ratio_ip_busbw,
            }
        })
        .collect()
}
