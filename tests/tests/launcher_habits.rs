//! An mpirun user's habits on localhost: real command lines pasted from Open MPI and Hydra
//! scripts, hostfiles of both families, `railrun ... | head`, and log colour. Jobs are real
//! railrun runs of real programs (`sh`, `yes`, `rr-testprog`, `rr-collcheck`); a host list of
//! `localhost` and `127.0.0.2` gives two nodes on this machine, and a fake `ssh` (a script
//! that runs the agent here) gives ranks behind an agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use railring_tests::proc::{read_all, wait_timeout, ScratchDir};

const TESTPROG: &str = env!("CARGO_BIN_EXE_rr-testprog");
const COLLCHECK: &str = env!("CARGO_BIN_EXE_rr-collcheck");

fn railrun_bin() -> &'static Path {
    railring_tests::bins::railrun()
}

fn railrun() -> Command {
    let mut c = Command::new(railrun_bin());
    c.env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("RAILRUN_SSH")
        .env_remove("RAILRING_LOG_COLOR")
        .env_remove("NO_COLOR");
    c.stdin(Stdio::null());
    c
}

fn run_limited(mut c: Command, limit: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    let to = read_all(child.stdout.take().unwrap());
    let te = read_all(child.stderr.take().unwrap());
    let Some(status) = wait_timeout(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("did not finish within {limit:?}: {c:?}");
    };
    Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `[rank] KEY=VALUE` lines of `rr-testprog env` → per rank, the value of `key`.
fn per_rank(out: &str, key: &str) -> Vec<(usize, String)> {
    let mut v: Vec<(usize, String)> = out
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix('[')?;
            let (r, kv) = rest.split_once("] ")?;
            let (k, val) = kv.split_once('=')?;
            (k == key).then(|| (r.parse().ok(), val.to_string()))
        })
        .filter_map(|(r, v)| Some((r?, v)))
        .collect();
    v.sort();
    v
}

/// Processes whose command line holds `marker` (and are not zombies).
fn alive_with(marker: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if !cmd.split(|&b| b == 0).any(|a| a == marker.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|x| x.1.trim_start().starts_with('Z'));
        if !zombie && pid != std::process::id() {
            v.push(pid);
        }
    }
    v
}

fn assert_gone(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let v = alive_with(marker);
        if v.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for p in &v {
                // SAFETY: plain kill(2) of processes this test started.
                unsafe { libc::kill(*p as i32, libc::SIGKILL) };
            }
            panic!("processes of the job survived: {v:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fake `ssh` that runs the remote command on this machine (the agent path without root).
fn fake_ssh() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join("railrun-habits-fakessh");
        let script = "#!/bin/sh\n\
            while [ $# -gt 0 ]; do case \"$1\" in -o|-F|-p|-l|-i) shift 2 ;; -*) shift ;; *) break ;; esac; done\n\
            shift\n\
            /bin/sh -c \"$*\"\n\
            exit $?\n";
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    })
}

// ------------------------------------------------------------------------------ pasted lines

/// A line from an Open MPI script runs: `--allow-run-as-root`, `--mca` (the interface list
/// becomes the rails, the rest is named in one warning), `-wdir`, `--merge-stderr-to-stdout`,
/// `--display-map`.
#[test]
fn pasted_open_mpi_line_runs() {
    let dir = ScratchDir::new("rr-habits-wdir");
    let mut c = railrun();
    c.args([
        "--allow-run-as-root",
        "--mca",
        "btl",
        "^openib",
        "--mca",
        "btl_tcp_if_include",
        "lo",
        "-mca",
        "pml",
        "ob1",
        "-np",
        "2",
        "--bind-to",
        "none",
        "--display-map",
        "--merge-stderr-to-stdout",
        "--tag-output",
        "-wdir",
    ]);
    c.arg(dir.path());
    c.args([
        "sh",
        "-c",
        "echo \"cwd=$(pwd)\"; echo \"ifname=$RAILRING_SOCKET_IFNAME\"; echo to-stderr >&2",
    ]);
    let o = run_limited(c, Duration::from_secs(60));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}\n{out}");
    // --display-map: the placement table first, on stdout.
    assert!(out.starts_with("rank"), "{out}");
    assert!(out.contains("2 ranks on 1 node"), "{out}");
    let real = std::fs::canonicalize(dir.path()).unwrap();
    for r in 0..2 {
        assert!(
            out.contains(&format!("[{r}] cwd={}", real.display())),
            "{out}"
        );
        assert!(out.contains(&format!("[{r}] ifname==lo")), "{out}");
        // --merge-stderr-to-stdout
        assert!(out.contains(&format!("[{r}] to-stderr")), "{out}");
    }
    assert!(!err.contains("to-stderr"), "{err}");
    let warned: Vec<&str> = err.lines().filter(|l| l.contains("--mca")).collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(
        warned[0].contains("btl=^openib") && warned[0].contains("pml=ob1"),
        "{err}"
    );
}

/// A line from a Hydra script: `-f` with a hostfile of bare names (one rank per host per
/// pass), `-genv`, `-envlist`, `-wdir` — on two "nodes" of this machine.
#[test]
fn pasted_hydra_line_runs() {
    let dir = ScratchDir::new("rr-habits-hydra");
    let hf = dir.path().join("hosts");
    std::fs::write(&hf, "localhost\n127.0.0.2\n").unwrap();
    let mut c = railrun();
    c.env("RRTEST_LISTED", "yes").args(["-f"]).arg(&hf).args([
        "-n",
        "4",
        "-genv",
        "RRTEST_G",
        "g 1",
        "-envlist",
        "RRTEST_LISTED",
        "--tag-output",
        TESTPROG,
        "env",
    ]);
    let o = run_limited(c, Duration::from_secs(60));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    let nodes = per_rank(&out, "RAILRING_NODE_RANK");
    assert_eq!(
        nodes,
        [(0, "0"), (1, "1"), (2, "0"), (3, "1")].map(|(r, n)| (r, n.to_string())),
        "{out}"
    );
    let local: Vec<String> = per_rank(&out, "RAILRING_LOCAL_RANK")
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert_eq!(local, ["0", "0", "1", "1"]);
}

/// Placement options a real job honours: `-N`, `--map-by seq`, `--rank-by node`, `--nolocal`,
/// and a second `--hostfile` is a usage error (exit 2) naming both.
#[test]
fn placement_options_in_real_jobs() {
    let dir = ScratchDir::new("rr-habits-place");
    let nodes_of = |args: &[&str]| -> Vec<String> {
        let mut c = railrun();
        c.args(args).args(["--tag-output", TESTPROG, "env"]);
        let o = run_limited(c, Duration::from_secs(60));
        let out = text(&o.stdout);
        assert!(o.status.success(), "{args:?}: {}\n{out}", text(&o.stderr));
        per_rank(&out, "RAILRING_NODE_RANK")
            .into_iter()
            .map(|x| x.1)
            .collect()
    };
    // -N 1: one per host (Open MPI's npernode), np from the hosts.
    assert_eq!(
        nodes_of(&["-H", "localhost:2,127.0.0.2:2", "-N", "1"]),
        ["0", "1"]
    );
    // --rank-by node deals the by-slot counts round-robin.
    assert_eq!(
        nodes_of(&["-H", "localhost:2,127.0.0.2:2", "--rank-by", "node"]),
        ["0", "1", "0", "1"]
    );
    // --map-by seq: rank i on line i.
    let hf = dir.path().join("seq");
    std::fs::write(&hf, "127.0.0.2\nlocalhost slots=4\n127.0.0.2\n").unwrap();
    let hfs = hf.to_str().unwrap();
    assert_eq!(
        nodes_of(&["--hostfile", hfs, "--map-by", "seq"]),
        ["0", "1", "0"]
    );

    // --nolocal with only this machine: a clear error, exit 1.
    let mut c = railrun();
    c.args(["--nolocal", "-H", "localhost:2", "true"]);
    let o = run_limited(c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("--nolocal"), "{}", text(&o.stderr));
    // Two hostfiles: exit 2 naming both.
    let mut c = railrun();
    c.args(["--hostfile", hfs, "-machinefile", "other", "true"]);
    let o = run_limited(c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert!(e.contains(hfs) && e.contains("`other`"), "{e}");
}

/// The binding modes pasted lines ask for are computed for this machine's ranks and
/// reported: `--map-by core` binds each rank to its own core; `--bind-to hwthread` to one
/// hardware thread; `--bind-to socket` to the whole socket.
#[test]
fn pasted_binding_modes_are_reported() {
    let cpus: Vec<usize> = railring::topology::process_allowed_cpus().unwrap();
    let lines = |args: &[&str]| -> Vec<String> {
        let mut c = railrun();
        c.args(args)
            .args(["--report-bindings", "--dry-run", "true"]);
        let o = run_limited(c, Duration::from_secs(30));
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        text(&o.stdout)
            .lines()
            .filter(|l| l.contains("(local rank"))
            .map(String::from)
            .collect()
    };
    let n = cpus.len().min(2);
    let np = n.to_string();
    let l = lines(&["-np", &np, "--map-by", "core"]);
    assert_eq!(l.len(), n);
    for (r, line) in l.iter().enumerate() {
        assert!(
            line.contains(&format!("CPUs {}", cpus[r])) && line.contains("bind-to core"),
            "{line}"
        );
    }
    let l = lines(&["-np", &np, "--bind-to", "hwthread"]);
    for line in &l {
        assert!(line.contains("bind-to hwthread"), "{line}");
    }
    let l = lines(&["-np", "1", "--bind-to", "socket"]);
    assert!(l[0].contains("bind-to socket"), "{}", l[0]);

    // ... and every program gets it before exec: a shell reads its own affinity.
    let mut c = railrun();
    c.args(["-np", &np, "--map-by", "core", "--tag-output", "sh", "-c"])
        .arg("grep Cpus_allowed_list /proc/self/status");
    let o = run_limited(c, Duration::from_secs(60));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    for (r, cpu) in cpus.iter().take(n).enumerate() {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("[{r}] Cpus_allowed_list:"))
                    && l.split_whitespace().last() == Some(cpu.to_string().as_str())),
            "rank {r} should be bound to CPU {cpu}: {out}"
        );
    }
}

// ------------------------------------------------------------------------------ | head

/// `railrun -np 2 yes | head -2` ends within about a second, with status 141 (SIGPIPE), and
/// leaves no `yes` behind; the same with ranks behind an agent (fake ssh).
#[test]
fn a_closed_pipe_ends_the_job() {
    for remote in [false, true] {
        let marker = format!("rrhabits-pipe-{}-{remote}", std::process::id());
        let rr = railrun_bin().display().to_string();
        let hosts = if remote {
            format!("--ssh {} -H fakea:2", fake_ssh().display())
        } else {
            String::new()
        };
        let script = format!(
            "{rr} {hosts} -np 2 yes {marker} | head -2; echo \"status=${{PIPESTATUS[0]}}\""
        );
        let mut c = Command::new("bash");
        c.args(["-c", &script])
            .env_remove("RAILRUN_SSH")
            .stdin(Stdio::null());
        let t0 = Instant::now();
        let o = run_limited(c, Duration::from_secs(30));
        let wall = t0.elapsed();
        let out = text(&o.stdout);
        assert_eq!(
            out.lines().take(2).collect::<Vec<_>>(),
            [marker.as_str(), marker.as_str()],
            "remote={remote}: {out}"
        );
        assert!(
            out.contains("status=141"),
            "remote={remote}: {out}\n{}",
            text(&o.stderr)
        );
        // About a second: SIGTERM ends `yes` at once (the 3 s SIGKILL grace is not needed).
        assert!(
            wall < Duration::from_secs(if remote { 6 } else { 3 }),
            "remote={remote}: took {wall:?}"
        );
        assert_gone(&marker);
    }
}

// ------------------------------------------------------------------------------ colour

fn has_esc(b: &[u8]) -> bool {
    b.contains(&0x1b)
}

/// Log lines captured into a pipe or a file carry no ESC byte; `RAILRING_LOG_COLOR=always`
/// forces colour (so the check above can fail); on a terminal, colour unless `NO_COLOR`.
#[test]
fn log_lines_are_plain_off_a_terminal() {
    // A pipe.
    let mut c = railrun();
    c.env("RAILRING_DEBUG", "INFO")
        .args(["-np", "2", COLLCHECK, "allreduce", "64"]);
    let o = run_limited(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("INFO"), "{}", text(&o.stderr));
    assert!(!has_esc(&o.stderr), "{}", text(&o.stderr));
    // A file (2> file) and --output-dir.
    let dir = ScratchDir::new("rr-habits-colour");
    let log = dir.path().join("err.log");
    let mut c = railrun();
    c.env("RAILRING_DEBUG", "INFO")
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null())
        .args(["-np", "2", "--output-dir"])
        .arg(dir.path().join("out"))
        .args([COLLCHECK, "allreduce", "64"]);
    let st = c.status().unwrap();
    assert!(st.success());
    let rank0 = std::fs::read(dir.path().join("out/rank.0.out")).unwrap();
    assert!(text(&rank0).contains("INFO"), "{}", text(&rank0));
    assert!(!has_esc(&rank0) && !has_esc(&std::fs::read(&log).unwrap()));
    // Forced on.
    let mut c = railrun();
    c.env("RAILRING_DEBUG", "INFO")
        .env("RAILRING_LOG_COLOR", "always")
        .args(["-np", "1", COLLCHECK, "allreduce", "8"]);
    let o = run_limited(c, Duration::from_secs(60));
    assert!(has_esc(&o.stderr), "{}", text(&o.stderr));

    // A terminal (util-linux `script` gives railrun a pseudo-terminal): colour, unless
    // NO_COLOR is set.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIPPED: the terminal half (util-linux `script` is not installed)");
        return;
    }
    for (no_color, want) in [(None, true), (Some("1"), false)] {
        let cmd = format!("{} -np 1 {COLLCHECK} allreduce 8", railrun_bin().display());
        let mut c = Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"])
            .env("RAILRING_DEBUG", "INFO")
            .env_remove("RAILRING_LOG_COLOR")
            .env_remove("NO_COLOR")
            .env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURM_NODELIST")
            .stdin(Stdio::null());
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        let o = run_limited(c, Duration::from_secs(60));
        let all = [o.stdout.clone(), o.stderr.clone()].concat();
        assert!(text(&all).contains("INFO"), "{}", text(&all));
        assert_eq!(
            has_esc(&all),
            want,
            "NO_COLOR={no_color:?}: {:?}",
            text(&all)
        );
    }
}

// ------------------------------------------------------------------------------ tools

fn railperf_bin() -> &'static Path {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| railring_tests::bins::workspace_bin("railring-examples", "railperf"))
}

/// `railperf` and `railrun topo` refuse options they do not know, exit 2, naming the option
/// (before, `railperf --iters-typo 3` ran the default benchmark).
#[test]
fn unknown_options_of_the_tools_exit_2() {
    for args in [
        &["allreduce", "--iters-typo", "3"][..],
        &["--frob"],
        &["-q"],
    ] {
        let o = run_limited(
            {
                let mut c = Command::new(railperf_bin());
                c.args(args).stdin(Stdio::null());
                c
            },
            Duration::from_secs(30),
        );
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        let bad = args
            .iter()
            .find(|a| a.starts_with('-') && **a != "allreduce")
            .unwrap();
        assert!(e.contains(bad), "{args:?}: {e}");
    }
    for args in [
        &["topo", "--frob"][..],
        &["topo", "--json=1"],
        &["topo", "stray"],
    ] {
        let mut c = railrun();
        c.args(args);
        let o = run_limited(c, Duration::from_secs(30));
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(
            e.contains(args[1].split('=').next().unwrap()),
            "{args:?}: {e}"
        );
    }
}

/// `railperf --csv F` writes one row per measurement (out of place and in place for every
/// size), in both modes; the non-blocking default says what it does, and its results are
/// checked element by element like the blocking ones (#wrong 0).
#[test]
fn railperf_csv_and_both_call_modes() {
    let dir = ScratchDir::new("rr-habits-csv");
    for (z, calls) in [("0", "non-blocking"), ("1", "blocking")] {
        let csv = dir.path().join(format!("z{z}.csv"));
        let mut c = railrun();
        c.args(["-np", "2"])
            .arg(railperf_bin())
            .args([
                "allreduce",
                "-b",
                "8",
                "-e",
                "4K",
                "-f",
                "8",
                "-n",
                "5",
                "-w",
                "1",
                "-z",
                z,
            ])
            .arg("--csv")
            .arg(&csv);
        let o = run_limited(c, Duration::from_secs(120));
        let out = text(&o.stdout);
        assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
        let label = if z == "0" {
            "(non-blocking calls: every iteration started with *_start"
        } else {
            "(blocking calls)"
        };
        assert!(out.contains(label), "{out}");
        let t = std::fs::read_to_string(&csv).unwrap();
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(
            rows[0],
            "collective,library,nranks,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,calls"
        );
        // sizes 8, 64, 512, 4096: two measurements each
        assert_eq!(rows.len(), 1 + 4 * 2, "{t}");
        for (i, r) in rows[1..].iter().enumerate() {
            let f: Vec<&str> = r.split(',').collect();
            assert_eq!(f.len(), 14, "{r}");
            assert_eq!(&f[..3], ["allreduce", "railring", "2"], "{r}");
            assert_eq!(f[3], [8, 64, 512, 4096][i / 2].to_string(), "{r}");
            assert_eq!(
                f[8],
                if i % 2 == 0 {
                    "out-of-place"
                } else {
                    "in-place"
                }
            );
            assert!(f[9].parse::<f64>().unwrap() > 0.0, "{r}");
            assert_eq!(f[12], "0", "wrong elements: {r}");
            assert_eq!(f[13], calls, "{r}");
        }
    }
}
