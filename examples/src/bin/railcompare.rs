//! railcompare: railring against MPI on the same ranks, the same sizes, the same checks.
//!
//! ```text
//! railcompare -np 4 [--hostfile F | -H host:n,...] [--ssh CMD] [--mpirun-args "..."]
//!             [--railrun-args "..."] [--rounds N] [--svg out.svg] [--json out.json]
//!             -- allreduce -b 8 -e 256M -f 2 -n 20 -w 5
//! ```
//!
//! Everything after `--` is railperf's own command line (nccl-tests flags); both benchmarks
//! get exactly those arguments plus `-J <file>`:
//!
//! * MPI:      `mpirun -np N [--allow-run-as-root] --oversubscribe --mca mpi_yield_when_idle 1
//!   [--hostfile F | -H L] [--mca plm_rsh_agent SSH] MPIRUN-ARGS mpiperf ARGS -J F`
//! * railring: `railrun -np N [--hostfile F | -H L] [--ssh SSH] RAILRUN-ARGS railperf ARGS -J F`
//!
//! `mpiperf`, `railperf` (and `railrun`, else the one on `PATH`) are taken from the directory
//! of railcompare's own executable. `--allow-run-as-root` is added when running as root;
//! `--no-yield` drops the yield setting (it helps MPI when ranks outnumber cores and costs it
//! latency otherwise).
//!
//! **Interleaving**: whole sweeps alternate between the libraries in `--rounds` rounds
//! (default 3) in ABBA order — MPI, railring, railring, MPI, MPI, railring, ... — so slow drift
//! of the machine (other jobs, thermal, page cache) hits both equally and neither always goes
//! first. Per size, each library's row is the run with the **median** time over its rounds (the
//! faster of the middle two for an even count), time and bus bandwidth from that same run;
//! `#wrong` is the sum over rounds. (One launch per sweep, not per size: per-size launches would
//! measure mostly start-up and cold caches.)
//!
//! Output: one table with both libraries side by side and the ratio railring/MPI of the bus
//! bandwidth per size, out-of-place and in-place; `--svg` plots bus bandwidth against size
//! (log scale) for both; `--json` writes the medians, the ratios and every raw run. Results are
//! read from the `-J` JSON rank 0 writes (in /tmp of rank 0's host); when rank 0 ran on another
//! host, from the table it printed instead. Exit status: 0 when both ran with no wrong element,
//! 1 otherwise.

use railring_examples::perf::{self, Options};
use serde::Deserialize;
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const USAGE: &str = "usage: railcompare -np N [options] -- RAILPERF-ARGS...
  -np, -n N              number of ranks (both libraries)
  --hostfile F           hostfile (Open MPI syntax; passed to mpirun and railrun)
  -H, --host LIST        host list, e.g. nodeA:2,nodeB:2 (passed to both)
  --ssh CMD              remote shell: railrun --ssh CMD, mpirun --mca plm_rsh_agent CMD
  --mpirun CMD           the mpirun to use (default: mpirun)
  --mpirun-args \"...\"    more mpirun arguments (shell-style quoting)
  --railrun-args \"...\"   more railrun arguments
  --rounds N             sweeps per library, alternating ABBA (default 3)
  --no-yield             do not pass --mca mpi_yield_when_idle 1 to mpirun
  --svg FILE             bus bandwidth against size, both libraries (SVG)
  --json FILE            medians, ratios and raw runs (JSON)
  -v, --verbose          also print every run's own table
  --dry-run              print the commands, run nothing
  -h, --help
example: railcompare -np 4 --svg ar.svg -- allreduce -b 8 -e 256M -f 2 -n 20 -w 5";

#[derive(Default, Debug)]
struct Args {
    np: usize,
    hostfile: Option<String>,
    hosts: Option<String>,
    ssh: Option<String>,
    mpirun: String,
    mpirun_args: Vec<String>,
    railrun_args: Vec<String>,
    rounds: usize,
    yield_idle: bool,
    svg: Option<String>,
    json: Option<String>,
    verbose: bool,
    dry_run: bool,
    perf: Vec<String>,
}

/// Split a string like a POSIX shell would (quotes and backslashes; no expansion): railrun's
/// own `--ssh` splitter.
fn split_words(s: &str) -> Result<Vec<String>, String> {
    railrun::cli::split_words(s).map_err(|e| e.to_string())
}

fn parse_args(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        mpirun: "mpirun".into(),
        rounds: 3,
        yield_idle: true,
        ..Default::default()
    };
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut val = |name: &str| -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            i += 1;
            argv.get(i)
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--" => {
                a.perf = argv[i + 1..].to_vec();
                break;
            }
            "-np" | "-n" | "--np" | "-c" => {
                let v = val(&flag)?;
                a.np = v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0 && n < (1 << 20))
                    .ok_or(format!("{flag}: '{v}' is not a rank count"))?;
            }
            "--hostfile" | "--machinefile" => a.hostfile = Some(val(&flag)?),
            "-H" | "--host" | "--hosts" => a.hosts = Some(val(&flag)?),
            "--ssh" | "--rsh" => a.ssh = Some(val(&flag)?),
            "--mpirun" => a.mpirun = val(&flag)?,
            "--mpirun-args" => a.mpirun_args.extend(split_words(&val(&flag)?)?),
            "--railrun-args" => a.railrun_args.extend(split_words(&val(&flag)?)?),
            "--rounds" => {
                let v = val(&flag)?;
                a.rounds = v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| (1..=100).contains(&n))
                    .ok_or(format!("--rounds: '{v}' is not a number from 1 to 100"))?;
            }
            "--no-yield" => a.yield_idle = false,
            "--svg" => a.svg = Some(val(&flag)?),
            "--json" => a.json = Some(val(&flag)?),
            "-v" | "--verbose" => a.verbose = true,
            "--dry-run" => a.dry_run = true,
            "-h" | "--help" => return Err(String::new()),
            f if !f.starts_with('-') => {
                // the benchmark's arguments without a `--`
                a.perf = argv[i..].to_vec();
                break;
            }
            f => {
                return Err(format!(
                    "unknown option '{f}' (benchmark arguments go after --)"
                ))
            }
        }
        i += 1;
    }
    if a.np == 0 {
        return Err("-np N is required".into());
    }
    if a.hostfile.is_some() && a.hosts.is_some() {
        return Err("give --hostfile or -H, not both".into());
    }
    if a.perf.is_empty() {
        return Err(
            "no benchmark arguments: add -- allreduce -b 8 -e 256M -f 2 (railperf's flags)".into(),
        );
    }
    Ok(a)
}

/// One row of a run's `-J` JSON (perf::Row).
#[derive(Clone, Debug, Deserialize)]
struct Row {
    size: usize,
    count: usize,
    #[serde(rename = "type")]
    dtype: String,
    redop: String,
    root: i64,
    oop_time_us: f64,
    oop_busbw: f64,
    oop_wrong: u64,
    ip_time_us: f64,
    ip_busbw: f64,
    ip_wrong: u64,
}

impl Row {
    fn key(&self) -> (String, String, i64, usize) {
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lib {
    Mpi,
    Railring,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Mpi => "mpi",
            Lib::Railring => "railring",
        }
    }
}

struct Run {
    lib: Lib,
    round: usize,
    rows: Vec<Row>,
    secs: f64,
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

fn show(cmd: &[String]) -> String {
    cmd.iter().map(|s| quote(s)).collect::<Vec<_>>().join(" ")
}

struct Tools {
    railrun: String,
    railperf: PathBuf,
    mpiperf: PathBuf,
}

fn find_tools() -> Result<Tools, String> {
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

fn check_tools(t: &Tools) -> Result<(), String> {
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

fn command(lib: Lib, a: &Args, t: &Tools, json: &str) -> Vec<String> {
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

fn run_one(lib: Lib, round: usize, a: &Args, t: &Tools) -> Result<Run, String> {
    let json = format!(
        "/tmp/railcompare-{}-{}-{round}.json",
        std::process::id(),
        lib.name()
    );
    let _ = std::fs::remove_file(&json);
    let cmd = command(lib, a, t, &json);
    let t0 = Instant::now();
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cmd[0]))?;
    let secs = t0.elapsed().as_secs_f64();
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
    })
}

/// ABBA order: round r runs MPI first when r is even.
fn order(rounds: usize) -> Vec<(Lib, usize)> {
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

/// Medians over rounds of one library at one row key.
#[derive(Clone, Debug, serde::Serialize)]
struct Agg {
    oop_time_us: f64,
    oop_busbw: f64,
    ip_time_us: f64,
    ip_busbw: f64,
    oop_wrong: u64,
    ip_wrong: u64,
    rounds: usize,
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
struct Compared {
    size: usize,
    count: usize,
    #[serde(rename = "type")]
    dtype: String,
    redop: String,
    root: i64,
    mpi: Option<Agg>,
    railring: Option<Agg>,
    ratio_oop_busbw: Option<f64>,
    ratio_ip_busbw: Option<f64>,
}

fn ratio(rr: f64, mpi: f64) -> Option<f64> {
    (mpi > 0.0 && rr.is_finite()).then(|| rr / mpi)
}

fn compare(runs: &[Run]) -> Vec<Compared> {
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

fn f_opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

fn table(rows: &[Compared]) -> String {
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
fn svg(rows: &[Compared], title: &str) -> String {
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

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("railcompare: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    std::process::exit(match run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("railcompare: {e}");
            1
        }
    });
}

fn run(mut a: Args) -> Result<i32, String> {
    // Validate the benchmark's arguments here, once, with railperf's own parser.
    a.perf.retain(|x| x != "--vs-mpi");
    let o = Options::parse(&a.perf)
        .map_err(|e| format!("benchmark arguments: {e}\n\n{}", perf::USAGE))?;
    if o.help {
        return Err(format!("benchmark arguments: -h\n\n{}", perf::USAGE));
    }
    if o.json.is_some() {
        return Err("benchmark arguments: leave -J out (railcompare adds its own); use railcompare --json FILE".into());
    }
    if !o.rest.is_empty() {
        return Err(format!(
            "benchmark arguments: unknown option(s) {}",
            o.rest.join(" ")
        ));
    }
    let tools = find_tools()?;
    let title = format!("{} over {} ranks", o.coll.name(), a.np);
    println!(
        "# railcompare: {title}; {} round(s) per library in ABBA order, median per size",
        a.rounds
    );
    println!(
        "# mpi:      {}",
        show(&command(Lib::Mpi, &a, &tools, "FILE"))
    );
    println!(
        "# railring: {}",
        show(&command(Lib::Railring, &a, &tools, "FILE"))
    );
    if a.dry_run {
        return Ok(0);
    }
    check_tools(&tools)?;
    let mut runs = Vec::new();
    for (lib, round) in order(a.rounds) {
        let r = run_one(lib, round, &a, &tools)?;
        let wrong: u64 = r.rows.iter().map(|x| x.oop_wrong + x.ip_wrong).sum();
        println!(
            "# round {} {:<8} {} rows, {} wrong, {:.1} s",
            round + 1,
            lib.name(),
            r.rows.len(),
            wrong,
            r.secs
        );
        runs.push(r);
    }
    let rows = compare(&runs);
    println!("#");
    print!("{}", table(&rows));
    let wrong = |lib: Lib| -> u64 {
        runs.iter()
            .filter(|r| r.lib == lib)
            .flat_map(|r| &r.rows)
            .map(|x| x.oop_wrong + x.ip_wrong)
            .sum()
    };
    let (wm, wr) = (wrong(Lib::Mpi), wrong(Lib::Railring));
    let ok = |w: u64| if w == 0 { "OK" } else { "FAILED" };
    println!(
        "# Out of bounds values : mpi {wm} {}, railring {wr} {}",
        ok(wm),
        ok(wr)
    );
    let avg = |f: &dyn Fn(&Compared) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(f)
            .filter(|x| x.is_finite())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let bus = |lib: Lib| {
        avg(&|r: &Compared| {
            let a = match lib {
                Lib::Mpi => r.mpi.as_ref(),
                Lib::Railring => r.railring.as_ref(),
            }?;
            Some((a.oop_busbw + a.ip_busbw) / 2.0)
        })
    };
    let geo = |f: &dyn Fn(&Compared) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(f)
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
    };
    println!(
        "# Avg bus bandwidth    : mpi {}, railring {}; geometric mean of ratios railring/mpi: out-of-place {}, in-place {}",
        f_opt(bus(Lib::Mpi), 4),
        f_opt(bus(Lib::Railring), 4),
        f_opt(geo(&|r| r.ratio_oop_busbw), 3),
        f_opt(geo(&|r| r.ratio_ip_busbw), 3)
    );
    if let Some(p) = &a.svg {
        std::fs::write(p, svg(&rows, &title)).map_err(|e| format!("writing {p}: {e}"))?;
        println!("# plot: {p}");
    }
    if let Some(p) = &a.json {
        let raw: Vec<serde_json::Value> = runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "library": r.lib.name(),
                    "round": r.round,
                    "seconds": r.secs,
                    "rows": r.rows.iter().map(|x| serde_json::json!({
                        "size": x.size, "count": x.count, "type": x.dtype, "redop": x.redop, "root": x.root,
                        "oop_time_us": x.oop_time_us, "oop_busbw": x.oop_busbw, "oop_wrong": x.oop_wrong,
                        "ip_time_us": x.ip_time_us, "ip_busbw": x.ip_busbw, "ip_wrong": x.ip_wrong,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "collective": o.coll.name(),
            "nranks": a.np,
            "rounds": a.rounds,
            "order": order(a.rounds).iter().map(|(l, _)| l.name()).collect::<Vec<_>>(),
            "statistic": "median over rounds",
            "commands": {
                "mpi": show(&command(Lib::Mpi, &a, &tools, "FILE")),
                "railring": show(&command(Lib::Railring, &a, &tools, "FILE")),
            },
            "rows": rows,
            "runs": raw,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(p, text + "\n").map_err(|e| format!("writing {p}: {e}"))?;
        println!("# json: {p}");
    }
    Ok(if wm == 0 && wr == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        assert_eq!(
            split_words(r#"--mca btl "self,tcp" -x 'A=b c' d\ e"#).unwrap(),
            vec!["--mca", "btl", "self,tcp", "-x", "A=b c", "d e"]
        );
        assert!(split_words("'open").is_err());
    }

    #[test]
    fn args_and_order() {
        let v: Vec<String> = [
            "-np",
            "4",
            "--rounds",
            "3",
            "--ssh",
            "ssh -F c",
            "--",
            "allreduce",
            "-b",
            "8",
        ]
        .map(String::from)
        .to_vec();
        let a = parse_args(&v).unwrap();
        assert_eq!(a.np, 4);
        assert_eq!(a.rounds, 3);
        assert_eq!(a.perf, vec!["allreduce", "-b", "8"]);
        let o: Vec<&str> = order(3).iter().map(|(l, _)| l.name()).collect();
        assert_eq!(o, ["mpi", "railring", "railring", "mpi", "mpi", "railring"]);
        assert!(parse_args(&["--".to_string(), "allreduce".into()]).is_err());
    }

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
