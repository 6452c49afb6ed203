//! `railrun doctor`: a health sweep of the nodes a job would run on — the same host sources as
//! railrun (hostfile, `-H`, a Slurm allocation) and the same way in (SSH agents or srun).
//!
//! It starts `--ppn` ranks per node of railrun itself in probe mode (`probe.rs`): per node the
//! inventory (CPUs, NUMA, GPUs, every interface's state, speed, MTU and addresses), memory
//! bandwidth and the in-node all-reduce bus bandwidth; per rail a bounded pairwise sweep of
//! bandwidth and latency (`sweep.rs`: a shifted ring, `min(n - 1, --max-rounds)` rounds per
//! rail, every node sending and receiving in each). The launcher reads the report from rank 0's
//! output, names what is wrong (`analyze.rs`), prints the table and writes the JSON and SVG
//! (`render.rs`). Exit code 0 when nothing is named, 1 when something is, 2 for a bad command
//! line, 4 when the sweep itself could not run.

mod analyze;
pub mod probe;
mod render;
pub mod report;
mod sweep;

pub use analyze::analyze;

use crate::cli::{self, Command, EnvSpec};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub const USAGE: &str = "usage: railrun doctor [railrun host options] [doctor options]

Checks the nodes of a hostfile, -H list or Slurm allocation: inventory, rail interfaces (state,
speed, MTU, subnet), memory and in-node all-reduce bandwidth, and pairwise bandwidth and latency
between nodes on every rail. Names what is more than 20 % below its median, down, mismatched or
unreachable, and exits 1 when it names anything (0: healthy).

host options (as railrun): --hostfile F | -H hosts | (Slurm allocation), --ssh CMD,
  --launch-agent PATH, --connect-timeout S, --timeout S, -x VAR[=VAL], -v
doctor options:
  --ifname LIST      rail interfaces (RAILRING_SOCKET_IFNAME grammar; default: that variable,
                     else every interface but loopback and virtual ones)
  --ppn N            ranks per node for the in-node all-reduce (default 2)
  --duration S       seconds of bulk transfer per pair test (default 0.4)
  --max-rounds N     rounds per rail (default 16): node i sends to i+s for up to N shifts s
  --json FILE        write the report as JSON
  --svg FILE         draw a node x node bandwidth heat map per rail
";

/// Exit code when the sweep itself could not run.
pub const EXIT_SWEEP: i32 = 4;

#[derive(Debug, Default, PartialEq)]
struct Args {
    json: Option<PathBuf>,
    svg: Option<PathBuf>,
    ifname: Option<String>,
    ppn: usize,
    duration: f64,
    max_rounds: usize,
    help: bool,
    /// Everything else: railrun's own options.
    rest: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        ppn: 2,
        duration: 0.4,
        max_rounds: 16,
        ..Default::default()
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| format!("{name} needs a value"))
                }
            }
        };
        match flag.as_str() {
            "--json" => a.json = Some(PathBuf::from(value("--json")?)),
            "--svg" => a.svg = Some(PathBuf::from(value("--svg")?)),
            "--ifname" => a.ifname = Some(value("--ifname")?),
            "--ppn" => {
                a.ppn = value("--ppn")?
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or("--ppn: a number from 1 to 64")?
            }
            "--duration" => {
                a.duration = value("--duration")?
                    .parse()
                    .ok()
                    .filter(|s: &f64| (0.01..=60.0).contains(s))
                    .ok_or("--duration: seconds from 0.01 to 60")?
            }
            "--max-rounds" => {
                a.max_rounds = value("--max-rounds")?
                    .parse()
                    .ok()
                    .filter(|n| (1..=100_000).contains(n))
                    .ok_or("--max-rounds: a number from 1")?
            }
            "-h" | "--help" => a.help = true,
            "-np" | "--np" | "-n" | "--ppn-per" | "--dry-run" => {
                return Err(format!(
                    "{flag}: railrun doctor starts --ppn ranks on every node itself"
                ))
            }
            _ => {
                a.rest.push(arg.clone());
                // a railrun option's separate value goes with it
                if inline.is_none()
                    && arg.starts_with('-')
                    && takes_value(arg.trim_start_matches('-'))
                {
                    i += 1;
                    if let Some(v) = args.get(i) {
                        a.rest.push(v.clone());
                    }
                }
            }
        }
        i += 1;
    }
    Ok(a)
}

/// railrun options that take a value (see `cli::parse`).
fn takes_value(name: &str) -> bool {
    matches!(
        name,
        "hostfile"
            | "machinefile"
            | "f"
            | "default-hostfile"
            | "H"
            | "host"
            | "hosts"
            | "map-by"
            | "x"
            | "output-dir"
            | "ssh"
            | "launch-ssh"
            | "launch-agent"
            | "connect-timeout"
            | "timeout"
            | "bind-to"
    )
}

/// `railrun doctor ...` (the arguments after `doctor`): the exit code.
pub fn run(args: &[String]) -> i32 {
    if args.first().map(String::as_str) == Some("--probe") {
        return probe::run(&args[1..]);
    }
    let a = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("railrun doctor: {e}\n\n{USAGE}");
            return 2;
        }
    };
    if a.help {
        print!("{USAGE}");
        return 0;
    }
    match doctor(&a) {
        Ok(code) => code,
        Err((code, e)) => {
            eprintln!("railrun doctor: {e}");
            code
        }
    }
}

fn doctor(a: &Args) -> Result<i32, (i32, String)> {
    let t0 = Instant::now();
    // railrun's own parser for the host options; the program is railrun in probe mode
    let mut argv = a.rest.clone();
    argv.extend(["--".to_string(), "railrun".to_string()]);
    let mut o = match cli::parse(&argv) {
        Ok(Command::Run(o)) => *o,
        Ok(_) => return Err((2, format!("unexpected arguments {:?}", a.rest))),
        Err(e) => return Err((2, e.to_string())),
    };
    let env = |k: &str| std::env::var(k).ok();
    let src = crate::host_source::resolve_hosts(o.hostfile.as_deref(), o.hosts.as_deref(), &env)
        .map_err(|e| (crate::job::EXIT_CONFIG, e.to_string()))?;
    let nodes = src.hosts.len().max(1);
    // the rail filter: --ifname, else the one the user passes to jobs; the probes' own
    // communicator stays on loopback (only the store and the tested sockets cross nodes)
    let mut ifname = a.ifname.clone();
    o.env.retain(|e| {
        if e.name == railring::vars::SOCKET_IFNAME {
            if ifname.is_none() {
                ifname = e.value.clone().or_else(|| env(&e.name));
            }
            false
        } else {
            true
        }
    });
    let ifname = ifname.or_else(|| env(railring::vars::SOCKET_IFNAME));
    o.env.push(EnvSpec {
        name: railring::vars::SOCKET_IFNAME.into(),
        value: Some("=lo".into()),
    });
    let popts = probe::ProbeOpts {
        duration: Duration::from_secs_f64(a.duration),
        max_rounds: a.max_rounds,
        ifname,
    };
    let exe = match &o.launch_agent {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.to_str().map(String::from))
            .ok_or((
                EXIT_SWEEP,
                "cannot find railrun's own path (use --launch-agent)".to_string(),
            ))?,
    };
    o.program = exe;
    o.args = vec!["doctor".into(), "--probe".into()];
    o.args.extend(popts.to_args());
    o.np = Some(nodes * a.ppn);
    o.ppn = Some(a.ppn);
    o.oversubscribe = true;
    // A new private directory (mkdtemp-style: random name, mode 0700) that no other user can
    // have prepared or linked; the probes' output files are written only inside it.
    let out =
        railring::private_fs::temp_dir(&std::env::temp_dir(), "railrun-doctor-").map_err(|e| {
            (
                EXIT_SWEEP,
                format!("cannot make a directory for the probes' output: {e}"),
            )
        })?;
    o.output_dir = Some(out.clone());
    let code = crate::job::run(&o);
    let rank0 = std::fs::read_to_string(out.join("rank.0.out")).unwrap_or_default();
    let js: String = rank0
        .lines()
        .filter_map(|l| l.strip_prefix(probe::LINE))
        .collect();
    let parsed: Option<report::Report> = serde_json::from_str(&js).ok();
    let Some(mut r) = parsed.filter(|_| code == 0) else {
        let mut why = format!("the sweep did not complete (railrun exit code {code})");
        for k in 0..nodes * a.ppn {
            let t = std::fs::read_to_string(out.join(format!("rank.{k}.out"))).unwrap_or_default();
            let t: Vec<&str> = t.lines().filter(|l| !l.starts_with(probe::LINE)).collect();
            if !t.is_empty() {
                why.push_str(&format!("\nrank {k}:\n  {}", t.join("\n  ")));
            }
        }
        let _ = std::fs::remove_dir_all(&out);
        return Err((EXIT_SWEEP, why));
    };
    let _ = std::fs::remove_dir_all(&out);
    let (findings, notes) = analyze(&r);
    r.findings = findings;
    r.notes = notes;
    r.run_s = t0.elapsed().as_secs_f64();
    print!("{}", render::table(&r));
    if let Some(p) = &a.json {
        let js = serde_json::to_string_pretty(&r).map_err(|e| (EXIT_SWEEP, e.to_string()))?;
        std::fs::write(p, js + "\n")
            .map_err(|e| (EXIT_SWEEP, format!("--json {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, render::svg(&r))
            .map_err(|e| (EXIT_SWEEP, format!("--svg {}: {e}", p.display())))?;
    }
    Ok(if r.findings.is_empty() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn doctor_options_are_taken_and_railrun_s_are_passed_on() {
        let a = parse(&s(&[
            "--hostfile",
            "hf",
            "--json",
            "r.json",
            "-x",
            "A=1",
            "--ppn=3",
            "--ifname",
            "rail",
            "--ssh",
            "ssh -F c",
        ]))
        .unwrap();
        assert_eq!(a.json, Some(PathBuf::from("r.json")));
        assert_eq!(a.ppn, 3);
        assert_eq!(a.ifname.as_deref(), Some("rail"));
        assert_eq!(
            a.rest,
            s(&["--hostfile", "hf", "-x", "A=1", "--ssh", "ssh -F c"])
        );
        assert!(parse(&s(&["-np", "4"])).is_err());
        assert!(parse(&s(&["--ppn", "0"])).is_err());
        assert!(parse(&s(&["--duration", "x"])).is_err());
        assert!(parse(&s(&["--json"])).is_err());
    }
}
