//! railcompare's command line: its own options, then railperf's after `--`.

pub const USAGE: &str = "usage: railcompare -np N [options] -- RAILPERF-ARGS...
  -np, -n N              number of ranks (both libraries)
  --hostfile F           hostfile (Open MPI syntax; passed to mpirun and railrun)
  -H, --host LIST        host list, e.g. nodeA:2,nodeB:2 (passed to both)
  --ssh CMD              remote shell: railrun --ssh CMD, mpirun --mca plm_rsh_agent CMD
  --mpirun CMD           the mpirun to use (default: mpirun)
  --mpirun-args \"...\"    more mpirun arguments (shell-style quoting)
  --railrun-args \"...\"   more railrun arguments
  --rounds N             sweeps per library, alternating ABBA (default 3)
  --settle SECS          while the host's cross-core latency is more than twice the fastest
                         probe seen, wait up to SECS before a launch (default 120), and run
                         a launch again when the probe after it was slow
  --quiet-ns NS          the host's usual cross-core latency, as the fastest probe to start
                         from (e.g. the least of several railcompare --probe)
  --no-settle            no latency probes: launch at once, keep every run
  --probe                print the host's cross-core latency (ns) and exit
  --no-yield             do not pass --mca mpi_yield_when_idle 1 to mpirun
  --svg FILE             bus bandwidth against size, both libraries (SVG)
  --json FILE            medians, ratios and raw runs (JSON)
  -v, --verbose          also print every run's own table
  --dry-run              print the commands, run nothing
  -h, --help
example: railcompare -np 4 --svg ar.svg -- allreduce -b 8 -e 256M -f 2 -n 20 -w 5";

#[derive(Default, Debug)]
pub struct Args {
    pub np: usize,
    pub hostfile: Option<String>,
    pub hosts: Option<String>,
    pub ssh: Option<String>,
    pub mpirun: String,
    pub mpirun_args: Vec<String>,
    pub railrun_args: Vec<String>,
    pub rounds: usize,
    pub yield_idle: bool,
    pub svg: Option<String>,
    pub json: Option<String>,
    pub verbose: bool,
    pub dry_run: bool,
    /// Most seconds to wait for a quiet host before a launch; None: no probes.
    pub settle: Option<u64>,
    pub probe: bool,
    /// A known quiet probe (ns) the baseline starts from.
    pub quiet_ns: Option<f64>,
    pub perf: Vec<String>,
}

/// Split a string like a POSIX shell would (quotes and backslashes; no expansion): railrun's
/// own `--ssh` splitter.
fn split_words(s: &str) -> Result<Vec<String>, String> {
    railrun::cli::split_words(s).map_err(|e| e.to_string())
}

/// `v` as a number that `ok` accepts, else an error naming `flag` and `what` it should be.
fn number<T: std::str::FromStr>(
    flag: &str,
    v: &str,
    ok: impl Fn(&T) -> bool,
    what: &str,
) -> Result<T, String> {
    v.trim()
        .parse::<T>()
        .ok()
        .filter(ok)
        .ok_or(format!("{flag}: '{v}' is not {what}"))
}

pub fn parse_args(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        mpirun: "mpirun".into(),
        rounds: 3,
        yield_idle: true,
        settle: Some(120),
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
                a.np = number(
                    &flag,
                    &val(&flag)?,
                    |&n: &usize| n > 0 && n < (1 << 20),
                    "a rank count",
                )?;
            }
            "--hostfile" | "--machinefile" => a.hostfile = Some(val(&flag)?),
            "-H" | "--host" | "--hosts" => a.hosts = Some(val(&flag)?),
            "--ssh" | "--rsh" => a.ssh = Some(val(&flag)?),
            "--mpirun" => a.mpirun = val(&flag)?,
            "--mpirun-args" => a.mpirun_args.extend(split_words(&val(&flag)?)?),
            "--railrun-args" => a.railrun_args.extend(split_words(&val(&flag)?)?),
            "--rounds" => {
                let ok = |n: &usize| (1..=100).contains(n);
                a.rounds = number(&flag, &val(&flag)?, ok, "a number from 1 to 100")?;
            }
            "--settle" => {
                let ok = |&n: &u64| n <= 86_400;
                a.settle = Some(number(
                    &flag,
                    &val(&flag)?,
                    ok,
                    "a number of seconds (0 to 86400)",
                )?);
            }
            "--no-settle" => a.settle = None,
            "--quiet-ns" => {
                let ok = |n: &f64| n.is_finite() && *n > 0.0;
                a.quiet_ns = Some(number(&flag, &val(&flag)?, ok, "a latency in ns")?);
            }
            "--probe" => a.probe = true,
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
    if a.probe {
        return Ok(a);
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
    fn args() {
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
        assert!(parse_args(&["--".to_string(), "allreduce".into()]).is_err());
        assert_eq!(a.settle, Some(120), "the guard is on by default");
    }

    #[test]
    fn settle_options() {
        let p = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let a = p(&[
            "-np",
            "2",
            "--settle",
            "30",
            "--quiet-ns",
            "65",
            "--",
            "reduce",
        ])
        .unwrap();
        assert_eq!((a.settle, a.quiet_ns), (Some(30), Some(65.0)));
        assert_eq!(
            p(&["-np", "2", "--no-settle", "reduce"]).unwrap().settle,
            None
        );
        assert!(p(&["--probe"]).unwrap().probe, "--probe needs no -np");
        for bad in [
            ["--settle", "x"],
            ["--settle", "-1"],
            ["--quiet-ns", "0"],
            ["--quiet-ns", "nan"],
        ] {
            let e = p(&["-np", "2", bad[0], bad[1], "reduce"]).unwrap_err();
            assert!(e.starts_with(bad[0]), "{e}");
        }
    }
}
