//! Running the benchmarks: the command line of each library's run (`mpirun ... mpiperf` and
//! `railrun ... railperf`, both with the same railperf arguments plus `-J FILE`), one launch per
//! library and round in ABBA order, and the rows each run reports (its JSON file, or the table
//! it printed when the file is on another host).

use super::args::Args;
use super::Lib;
use serde::Deserialize;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// One row of a run's `-J` JSON (perf::Row).
#[derive(Clone, Debug, Deserialize)]
pub struct Row {
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub oop_time_us: f64,
    pub oop_busbw: f64,
    pub oop_wrong: u64,
    pub ip_time_us: f64,
    pub ip_busbw: f64,
    pub ip_wrong: u64,
}

impl Row {
    pub fn key(&self) -> (String, String, i64, usize) {
        (self.dtype.clone(), self.redop.clone(), self.root, self.size)
    }
}

/// Rows from the table a run printed (when its JSON file is on another host).
fn rows_from_table(out: &str) -> Vec<Row> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 13 {
                return None;
            }
            Some(Row {
                size: f[0].parse().ok()?,
                count: f[1].parse().ok()?,
                dtype: f[2].into(),
                redop: f[3].into(),
                root: f[4].parse().ok()?,
                oop_time_us: f[5].parse().ok()?,
                oop_busbw: f[7].parse().ok()?,
                oop_wrong: f[8].parse().ok()?,
                ip_time_us: f[9].parse().ok()?,
                ip_busbw: f[11].parse().ok()?,
                ip_wrong: f[12].parse().ok()?,
            })
        })
        .collect()
}

pub struct Run {
    pub lib: Lib,
    pub round: usize,
    pub rows: Vec<Row>,
    pub secs: f64,
    /// The host's cross-core latency in ns before and after the launch (`settle`).
    pub probes: (Option<f64>, Option<f64>),
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub fn show(cmd: &[String]) -> String {
    cmd.iter().map(|s| quote(s)).collect::<Vec<_>>().join(" ")
}

pub struct Tools {
    pub railrun: String,
    pub railperf: PathBuf,
    pub mpiperf: PathBuf,
}

pub fn find_tools() -> Result<Tools, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate railcompare's own executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    let railperf = dir.join("railperf");
    let mpiperf = dir.join("mpiperf");
    let railrun = dir.join("railrun");
    let railrun = if railrun.is_file() {
        railrun.display().to_string()
    } else {
        "railrun".to_string()
    };
    Ok(Tools {
        railrun,
        railperf,
        mpiperf,
    })
}

pub fn check_tools(t: &Tools) -> Result<(), String> {
    if !t.railperf.is_file() {
        return Err(format!("{} not found (railperf must sit next to railcompare: cargo build --release -p railring-examples)", t.railperf.display()));
    }
    if !t.mpiperf.is_file() {
        return Err(format!(
            "{} not found (mpiperf must sit next to railcompare; it needs MPI: cargo build --release -p railring-examples --features mpi)",
            t.mpiperf.display()
        ));
    }
    Ok(())
}

pub fn command(lib: Lib, a: &Args, t: &Tools, json: &str) -> Vec<String> {
    let mut c: Vec<String> = Vec::new();
    match lib {
        Lib::Mpi => {
            c.push(a.mpirun.clone());
            c.extend(["-np".into(), a.np.to_string()]);
            if is_root() {
                c.push("--allow-run-as-root".into());
            }
            c.push("--oversubscribe".into());
            if a.yield_idle {
                c.extend(["--mca", "mpi_yield_when_idle", "1"].map(String::from));
            }
            if let Some(h) = &a.hostfile {
                c.extend(["--hostfile".into(), h.clone()]);
            }
            if let Some(h) = &a.hosts {
                c.extend(["-H".into(), h.clone()]);
            }
            if let Some(s) = &a.ssh {
                c.extend(["--mca".into(), "plm_rsh_agent".into(), s.clone()]);
            }
            c.extend(a.mpirun_args.iter().cloned());
            c.push(t.mpiperf.display().to_string());
        }
        Lib::Railring => {
            c.push(t.railrun.clone());
            c.extend(["-np".into(), a.np.to_string()]);
            if let Some(h) = &a.hostfile {
                c.extend(["--hostfile".into(), h.clone()]);
            }
            if let Some(h) = &a.hosts {
                c.extend(["-H".into(), h.clone()]);
            }
            if let Some(s) = &a.ssh {
                c.extend(["--ssh".into(), s.clone()]);
            }
            c.extend(a.railrun_args.iter().cloned());
            c.push(t.railperf.display().to_string());
        }
    }
    c.extend(a.perf.iter().cloned());
    c.extend(["-J".into(), json.into()]);
    c
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A fresh `TMPDIR` for one mpirun (removed after the run): Open MPI puts its session
/// directory (`ompi.<host>.<uid>`) there, and two mpiruns starting at once under the same one
/// race on it ("File exists"). Only the local mpirun and its local ranks see it; daemons on
/// other hosts keep their own.
fn session_dir(round: usize) -> Result<PathBuf, String> {
    let d = std::env::temp_dir().join(format!(
        "railcompare-{}-mpi-{round}.tmp",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    Ok(d)
}

pub fn run_one(lib: Lib, round: usize, a: &Args, t: &Tools) -> Result<Run, String> {
    let json = format!(
        "/tmp/railcompare-{}-{}-{round}.json",
        std::process::id(),
        lib.name()
    );
    let _ = std::fs::remove_file(&json);
    let cmd = command(lib, a, t, &json);
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]).stdin(Stdio::null());
    let session = match lib {
        Lib::Mpi => Some(session_dir(round)?),
        Lib::Railring => None,
    };
    if let Some(d) = &session {
        c.env("TMPDIR", d);
    }
    let t0 = Instant::now();
    let out = c.output();
    let secs = t0.elapsed().as_secs_f64();
    if let Some(d) = &session {
        let _ = std::fs::remove_dir_all(d);
    }
    let out = out.map_err(|e| format!("cannot run {}: {e}", cmd[0]))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if a.verbose {
        print!("{stdout}");
    }
    let rows = match std::fs::read(&json) {
        Ok(b) => {
            let _ = std::fs::remove_file(&json);
            serde_json::from_slice::<Vec<Row>>(&b)
                .map_err(|e| format!("{}: {json}: {e}", lib.name()))?
        }
        Err(_) => rows_from_table(&stdout),
    };
    if !out.status.success() && rows.is_empty() {
        return Err(format!(
            "the {} run failed ({}):\n  {}\n--- its output (last lines) ---\n{}\n{}",
            lib.name(),
            out.status,
            show(&cmd),
            tail(&stdout, 15),
            tail(&stderr, 25)
        ));
    }
    if rows.is_empty() {
        return Err(format!(
            "the {} run printed no result rows:\n  {}\n{}\n{}",
            lib.name(),
            show(&cmd),
            tail(&stdout, 15),
            tail(&stderr, 15)
        ));
    }
    if !out.status.success() {
        // wrong elements end a run with status 1 after its table: keep the rows, report below
        eprintln!(
            "# railcompare: the {} run exited with {} ({})",
            lib.name(),
            out.status,
            tail(&stderr, 3).replace('\n', " | ")
        );
    }
    Ok(Run {
        lib,
        round,
        rows,
        secs,
        probes: (None, None),
    })
}

/// ABBA order: round r runs MPI first when r is even.
pub fn order(rounds: usize) -> Vec<(Lib, usize)> {
    let mut v = Vec::new();
    for r in 0..rounds {
        if r % 2 == 0 {
            v.extend([(Lib::Mpi, r), (Lib::Railring, r)]);
        } else {
            v.extend([(Lib::Railring, r), (Lib::Mpi, r)]);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_parse_back() {
        let line = "        1024           256     float     sum      -1    10.00    0.10    0.15      0    11.00    0.09    0.14      0";
        let r = rows_from_table(line);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].size, r[0].count, r[0].oop_busbw, r[0].ip_wrong),
            (1024, 256, 0.15, 0)
        );
    }

    #[test]
    fn abba_order() {
        let o: Vec<&str> = order(3).iter().map(|(l, _)| l.name()).collect();
        assert_eq!(o, ["mpi", "railring", "railring", "mpi", "mpi", "railring"]);
    }
}
