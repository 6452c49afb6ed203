//! `emucluster`: bring an emulated railring cluster up/down by hand.
//!
//! ```text
//! emucluster up   --hosts 2 --rails 2 [--rate 1gbit] [--tcp-cc NAME] --state DIR
//! emucluster up   --fabric FILE [--tcp-cc NAME] --state DIR (leaves and spines: docs/fabric.md)
//! emucluster exec --state DIR HOST [-- cmd args...]    (no cmd: interactive shell)
//! emucluster info --state DIR
//! emucluster down --state DIR
//! emucluster gc                                        (clusters whose owner died)
//! ```
//! Same code as the test library (`railring_tests::cluster`).

use std::path::PathBuf;
use std::process::ExitCode;

use railring_tests::cluster::{gc_stale, Cluster, ClusterSpec, UpOptions};

const USAGE: &str = "usage:
  emucluster up   --hosts N --rails R [--rate RATE] [--tcp-cc NAME] --state DIR
  emucluster up   --fabric FILE [--tcp-cc NAME] --state DIR   (hosts under leaf/spine switches)
    --tcp-cc: the hosts' TCP congestion control (default cubic; `inherit` keeps this machine's)
  emucluster exec --state DIR HOST [-- CMD ARGS...]
  emucluster info --state DIR
  emucluster down --state DIR
  emucluster gc";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("emucluster: {e}");
            ExitCode::from(2)
        }
    }
}

struct Opts {
    hosts: usize,
    rails: usize,
    rate: Option<String>,
    tcp_cc: Option<String>,
    fabric: Option<PathBuf>,
    state: Option<PathBuf>,
    positional: Vec<String>,
    rest: Vec<String>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        hosts: 2,
        rails: 2,
        rate: None,
        tcp_cc: None,
        fabric: None,
        state: None,
        positional: Vec::new(),
        rest: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let mut val = |name: &str| -> Result<String, String> {
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a {
            "--hosts" => o.hosts = val(a)?.parse().map_err(|e| format!("--hosts: {e}"))?,
            "--rails" => o.rails = val(a)?.parse().map_err(|e| format!("--rails: {e}"))?,
            "--rate" => o.rate = Some(val(a)?),
            "--tcp-cc" => o.tcp_cc = Some(val(a)?),
            "--fabric" => o.fabric = Some(PathBuf::from(val(a)?)),
            "--state" => o.state = Some(PathBuf::from(val(a)?)),
            "--" => {
                o.rest = args[i + 1..].to_vec();
                break;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{USAGE}")),
            s => o.positional.push(s.to_string()),
        }
        i += 1;
    }
    Ok(o)
}

fn run(args: Vec<String>) -> Result<ExitCode, String> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err(USAGE.to_string());
    };
    let o = parse(rest)?;
    let state = || {
        o.state
            .clone()
            .ok_or_else(|| format!("--state DIR is required\n{USAGE}"))
    };
    match cmd.as_str() {
        "up" => {
            let dir = state()?;
            Cluster::available()?;
            let t = std::time::Instant::now();
            let opts = UpOptions {
                dir: Some(dir),
                detached: true,
                tcp_cc: o.tcp_cc.clone(),
            };
            let c = match &o.fabric {
                Some(f) => {
                    let ff = railrun::plan::fabric_file::load(f)?;
                    if let Some(h) = &ff.hosts {
                        let want: Vec<String> = (1..=h.len()).map(|k| format!("n{k}")).collect();
                        if *h != want {
                            return Err(format!(
                                "{}: emulated hosts are named n1..n{}; the file names {}",
                                f.display(),
                                h.len(),
                                h.iter().take(4).cloned().collect::<Vec<_>>().join(",")
                            ));
                        }
                    }
                    Cluster::up_fabric(&ff.fabric, opts)?
                }
                None => Cluster::up_with(
                    ClusterSpec {
                        hosts: o.hosts,
                        rails: o.rails,
                        rail_rate: o.rate.clone(),
                    },
                    opts,
                )?,
            };
            let me = std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or("emucluster".into());
            let d = c.dir().display().to_string();
            let mut say = format!("{}{}", c.describe(), c.describe_fabric());
            say += &format!("up in {:.2}s. Enter a host:\n", t.elapsed().as_secs_f64());
            say +=
                &format!("  {me} exec --state {d} n1                 # interactive shell on n1\n");
            say += &format!(
                "  {me} exec --state {d} head -- {} n1 hostname\n",
                c.ssh_command()
            );
            say += &format!(
                "  nsenter -t {} -n -u -m bash            # same as exec head\n",
                c.holder_pid("head")
            );
            say += &format!(
                "ssh config: {}   hostfile: {}\n",
                c.ssh_config().display(),
                c.hostfile(1)?.display()
            );
            say += &format!("tear down:  {me} down --state {d}\n");
            // the cluster is up: hand it over before telling, so a closed stdout (`| head -1`)
            // cannot take it down with it
            c.detach()?;
            let _ = std::io::Write::write_all(&mut std::io::stdout(), say.as_bytes());
            Ok(ExitCode::SUCCESS)
        }
        "exec" => {
            let c = Cluster::attach(&state()?)?;
            let host = o
                .positional
                .first()
                .ok_or_else(|| format!("exec needs a HOST\n{USAGE}"))?;
            let argv: Vec<String> = if o.rest.is_empty() {
                vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/bash".into())]
            } else {
                o.rest.clone()
            };
            if !c.host_names().contains(host) && host != "head" {
                return Err(format!(
                    "unknown host {host:?} (have head, {})",
                    c.host_names().join(", ")
                ));
            }
            let st = c
                .exec_os(host, &argv)
                .status()
                .map_err(|e| format!("nsenter: {e}"))?;
            Ok(ExitCode::from(st.code().unwrap_or(128) as u8))
        }
        "info" => {
            let c = Cluster::attach(&state()?)?;
            print!("{}{}", c.describe(), c.describe_fabric());
            println!("ssh command: {}", c.ssh_command());
            Ok(ExitCode::SUCCESS)
        }
        "down" => {
            let dir = state()?;
            let t = std::time::Instant::now();
            if !dir.join("state").exists() && !dir.exists() {
                println!("no cluster at {} (already down)", dir.display());
                return Ok(ExitCode::SUCCESS);
            }
            Cluster::attach(&dir)?.down()?;
            println!("down in {:.2}s", t.elapsed().as_secs_f64());
            Ok(ExitCode::SUCCESS)
        }
        "gc" => {
            let removed = gc_stale()?;
            println!("removed {} stale cluster(s): {removed:?}", removed.len());
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(USAGE.to_string()),
    }
}
