//! railrun on localhost: real multi-process jobs of `rr-testprog`.
//!
//! The railrun binary is built on first use with `cargo build -p railrun` into the same target
//! directory as this test (set `RAILRUN_BIN` to use another binary).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use railring_tests::proc::{read_all, wait_timeout};

const TESTPROG: &str = env!("CARGO_BIN_EXE_rr-testprog");

/// The railrun binary under test (built once; `RAILRUN_BIN` overrides).
fn railrun_bin() -> &'static Path {
    railring_tests::bins::railrun()
}

fn railrun() -> Command {
    let mut c = Command::new(railrun_bin());
    // Keep host sources out of the test's way (a CI runner inside Slurm, say).
    c.env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("RAILRUN_SSH");
    c.stdin(Stdio::null());
    c
}

/// A unique marker argument: processes of a test's job carry it on their command line.
fn marker(test: &str) -> String {
    format!("rrmark-{test}-{}", std::process::id())
}

/// Live processes (not zombies) whose command line contains `marker`.
fn procs_with(marker: &str) -> Vec<(u32, String)> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_testprog = argv.first().is_some_and(|a| a.ends_with("rr-testprog"));
        let cmd = argv.join(" ");
        if is_testprog && argv.iter().any(|a| a == marker) {
            let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = state
                .rsplit_once(')')
                .map(|x| x.1.trim_start().starts_with('Z'))
                .unwrap_or(false);
            if !zombie {
                v.push((pid, cmd));
            }
        }
    }
    v
}

fn assert_no_survivors(marker: &str) {
    // railrun has exited: everything must already be gone (allow a moment for the kernel).
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let v = procs_with(marker);
        if v.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for (p, _) in &v {
                unsafe { libc::kill(*p as i32, libc::SIGKILL) };
            }
            panic!("processes of the job survived railrun: {v:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run with a hard limit; returns (output, wall time).
fn run_limited(mut c: Command, limit: Duration) -> (Output, Duration) {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = c.spawn().expect("spawn railrun");
    let to = read_all(child.stdout.take().unwrap());
    let te = read_all(child.stderr.take().unwrap());
    let st = match wait_timeout(&mut child, limit) {
        Some(st) => st,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("railrun did not finish within {limit:?}: {c:?}");
        }
    };
    let wall = t0.elapsed();
    let stdout = to.join().unwrap();
    let stderr = te.join().unwrap();
    (
        Output {
            status: st,
            stdout,
            stderr,
        },
        wall,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `[rank] KEY=VALUE` lines → rank → key → value.
fn tagged_env(out: &str) -> BTreeMap<usize, HashMap<String, String>> {
    let mut m: BTreeMap<usize, HashMap<String, String>> = BTreeMap::new();
    for line in out.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            panic!("untagged line {line:?}")
        };
        let (r, kv) = rest.split_once("] ").expect("tag");
        let (k, v) = kv.split_once('=').expect("KEY=VALUE");
        m.entry(r.parse().unwrap())
            .or_default()
            .insert(k.to_string(), v.to_string());
    }
    m
}

#[test]
fn env_per_rank() {
    let mut c = railrun();
    c.args([
        "-np",
        "4",
        "--tag-output",
        "--bind-to",
        "core",
        "-x",
        "RRTEST_FWD",
        "-x",
        "RRTEST_SET=new=1",
    ])
    .arg("-x")
    .arg("RRTEST_OVR=over")
    .env("RRTEST_FWD", "forwarded")
    .env("RRTEST_OVR", "original")
    // Found next to railrun (not on $PATH): both live in target/<profile>.
    .arg(if railrun_bin().parent() == Path::new(TESTPROG).parent() {
        "rr-testprog"
    } else {
        TESTPROG
    })
    .arg("env");
    let (o, _) = run_limited(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let m = tagged_env(&text(&o.stdout));
    assert_eq!(m.len(), 4, "{m:?}");
    let mut ports = Vec::new();
    let mut ids = Vec::new();
    for (r, e) in &m {
        let g = |k: &str| {
            e.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("rank {r}: {k} missing: {e:?}"))
        };
        let rs = r.to_string();
        for k in [
            "RAILRING_RANK",
            "RANK",
            "OMPI_COMM_WORLD_RANK",
            "RAILRING_LOCAL_RANK",
            "LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ] {
            assert_eq!(g(k), rs, "rank {r}: {k}");
        }
        for k in [
            "RAILRING_WORLD_SIZE",
            "WORLD_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "RAILRING_LOCAL_SIZE",
            "LOCAL_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ] {
            assert_eq!(g(k), "4", "rank {r}: {k}");
        }
        assert_eq!(g("RAILRING_NODE_RANK"), "0");
        assert_eq!(g("RAILRING_NNODES"), "1");
        assert_eq!(g("MASTER_ADDR"), "127.0.0.1");
        assert_eq!(g("RAILRING_BIND_TO"), "core");
        assert!(
            g("RAILRING_STORE_ADDR").starts_with("127.0.0.1:"),
            "{}",
            g("RAILRING_STORE_ADDR")
        );
        assert_eq!(g("RAILRING_JOB_SECRET").len(), 64);
        let id = g("RAILRING_JOB_ID");
        assert!(
            !id.is_empty()
                && id.len() <= 16
                && id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "{id}"
        );
        assert_eq!(g("RRTEST_FWD"), "forwarded");
        assert_eq!(g("RRTEST_SET"), "new=1");
        assert_eq!(g("RRTEST_OVR"), "over");
        ports.push(g("MASTER_PORT"));
        ids.push(id);
    }
    ports.dedup();
    ids.dedup();
    assert_eq!(ports.len(), 1, "one MASTER_PORT per job");
    assert!(ports[0].parse::<u16>().unwrap() > 0);
    assert_eq!(ids.len(), 1, "one job id per job");
    // Another job gets another id.
    let (o2, _) = run_limited(
        {
            let mut c = railrun();
            c.args(["-np", "1", "--tag-output", TESTPROG, "env"]);
            c
        },
        Duration::from_secs(60),
    );
    let m2 = tagged_env(&text(&o2.stdout));
    assert_ne!(m2[&0]["RAILRING_JOB_ID"], ids[0]);
}

#[test]
fn exit_code_and_first_failure_kills_the_rest() {
    let mk = marker("exitcode");
    let mut c = railrun();
    c.args(["-np", "4", TESTPROG, "exit-rank", "2", "3", &mk]);
    let (o, wall) = run_limited(c, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("railrun: rank 2 on host localhost exited with code 3"),
        "{err}"
    );
    // The other ranks sleep 60 s: they must have been killed promptly.
    assert!(wall < Duration::from_secs(20), "took {wall:?}");
    assert_no_survivors(&mk);
}

#[test]
fn rank_killed_by_signal() {
    let mut c = railrun();
    c.args(["-np", "2", TESTPROG, "kill-self", "9"]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(137), "{err}");
    assert!(
        err.contains("on host localhost killed by signal 9 (SIGKILL)"),
        "{err}"
    );

    let mut c = railrun();
    c.args(["-np", "1", TESTPROG, "kill-self", "11"]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(139), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("rank 0 on host localhost killed by signal 11 (SIGSEGV)"));
}

#[test]
fn all_ranks_ok_is_exit_0() {
    let mut c = railrun();
    c.args(["-np", "3", TESTPROG, "exit", "0"]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));
}

#[test]
fn sigterm_ignored_gets_sigkill_after_grace() {
    let mk = marker("ignoreterm");
    let mut c = railrun();
    c.env("RAILRUN_KILL_GRACE", "0.5").args([
        "-np",
        "2",
        "--timeout",
        "1",
        TESTPROG,
        "ignore-term",
        "60",
        &mk,
    ]);
    let (o, wall) = run_limited(c, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(124), "{err}");
    assert!(err.contains("SIGKILL"), "{err}");
    assert!(wall < Duration::from_secs(15), "took {wall:?}");
    assert_no_survivors(&mk);
}

#[test]
fn timeout_kills_the_job() {
    let mk = marker("timeout");
    let mut c = railrun();
    c.args(["-np", "2", "--timeout", "1.5", TESTPROG, "sleep", "60", &mk]);
    let (o, wall) = run_limited(c, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(124), "{err}");
    assert!(err.contains("--timeout"), "{err}");
    assert!(
        wall >= Duration::from_millis(1400) && wall < Duration::from_secs(15),
        "took {wall:?}"
    );
    assert_no_survivors(&mk);
}

#[test]
fn stdin_goes_to_rank_0_only() {
    let mut c = railrun();
    c.args(["-np", "3", "--tag-output", TESTPROG, "echo-stdin"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut si = child.stdin.take().unwrap();
    let w = std::thread::spawn(move || {
        si.write_all(b"hello\nworld\npartial").unwrap();
    });
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t = std::thread::spawn(move || {
        let mut b = String::new();
        let _ = se.read_to_string(&mut b);
        b
    });
    let mut out = String::new();
    so.read_to_string(&mut out).unwrap();
    w.join().unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(30)).expect("railrun hung");
    assert!(st.success(), "{}", t.join().unwrap());
    assert_eq!(out, "[0] hello\n[0] world\n[0] partial\n");
}

#[test]
fn tagged_lines_stay_whole_under_concurrency() {
    let n = 2000;
    let mut c = railrun();
    c.args([
        "-np",
        "4",
        "--tag-output",
        TESTPROG,
        "lines",
        &n.to_string(),
    ]);
    let (o, _) = run_limited(c, Duration::from_secs(120));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut counts: HashMap<(usize, &str), usize> = HashMap::new();
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    for (stream, body) in [("out", &out), ("err", &err)] {
        // railrun's own notes (e.g. the OMP_NUM_THREADS it sets for ranks bound to one core
        // each where 4 ranks outnumber the CPUs) are not rank output
        for line in body
            .lines()
            .filter(|l| !(stream == "err" && l.starts_with("railrun: ")))
        {
            // [r] BEGIN rank=r i=I stream=S <300 letters> END
            let (tag, rest) = line
                .split_once("] ")
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let r: usize = tag.strip_prefix('[').unwrap().parse().unwrap();
            let f: Vec<&str> = rest.split(' ').collect();
            assert_eq!(f.len(), 6, "split or merged line: {line:?}");
            assert_eq!(f[0], "BEGIN", "{line:?}");
            assert_eq!(f[1], format!("rank={r}"), "{line:?}");
            assert_eq!(f[3], format!("stream={stream}"), "{line:?}");
            let payload: String = (0..300)
                .map(|i| (b'a' + ((i + r) % 26) as u8) as char)
                .collect();
            assert_eq!(f[4], payload, "{line:?}");
            assert_eq!(f[5], "END", "{line:?}");
            *counts.entry((r, stream)).or_default() += 1;
        }
    }
    for r in 0..4 {
        assert_eq!(
            counts.get(&(r, "out")),
            Some(&(n / 2)),
            "rank {r} stdout lines"
        );
        assert_eq!(
            counts.get(&(r, "err")),
            Some(&(n / 2)),
            "rank {r} stderr lines"
        );
    }
}

#[test]
fn output_dir_gets_one_file_per_rank() {
    let dir = std::env::temp_dir().join(format!("railrun-outdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut c = railrun();
    c.arg("-np")
        .arg("2")
        .arg("--output-dir")
        .arg(&dir)
        .args([TESTPROG, "lines", "10"]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        o.stdout.is_empty(),
        "output went to the terminal: {}",
        text(&o.stdout)
    );
    for r in 0..2 {
        let f = std::fs::read_to_string(dir.join(format!("rank.{r}.out"))).unwrap();
        let lines: Vec<&str> = f.lines().collect();
        assert_eq!(lines.len(), 10, "{f}");
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with(&format!("BEGIN rank={r} ")) && l.ends_with(" END")),
            "{f}"
        );
        assert_eq!(lines.iter().filter(|l| l.contains("stream=err")).count(), 5);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_program_is_a_clear_error() {
    let mut c = railrun();
    c.args(["-np", "2", "rr-no-such-program-xyz"]);
    let (o, _) = run_limited(c, Duration::from_secs(30));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(
        err.contains("rr-no-such-program-xyz") && err.contains("not found"),
        "{err}"
    );

    let mut c = railrun();
    c.args(["-np", "2", "/nonexistent/dir/prog"]);
    let (o, _) = run_limited(c, Duration::from_secs(30));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(
        err.contains("rank 0 on host localhost: cannot start /nonexistent/dir/prog"),
        "{err}"
    );
    assert!(err.contains("No such file or directory"), "{err}");
}

#[test]
fn dry_run_table_and_json() {
    let mut c = railrun();
    c.args([
        "-np",
        "4",
        "-H",
        "nodea:2,nodeb:2",
        "--dry-run",
        "./not-started",
    ]);
    let (o, _) = run_limited(c, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(1)
        .take(4)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(out.lines().next().unwrap().starts_with("rank"), "{out}");
    assert_eq!(rows[0][..2], ["0", "nodea"], "{out}");
    assert_eq!(rows[1][..2], ["1", "nodea"], "{out}");
    assert_eq!(rows[2][..2], ["2", "nodeb"], "{out}");
    assert_eq!(rows[3][..2], ["3", "nodeb"], "{out}");

    let mut c = railrun();
    c.args([
        "-np",
        "4",
        "-H",
        "nodea:2,nodeb:2",
        "--map-by",
        "node",
        "--dry-run=json",
        "./not-started",
    ]);
    let (o, _) = run_limited(c, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 4);
    let hosts: Vec<&str> = a.iter().map(|r| r["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["nodea", "nodeb", "nodea", "nodeb"]);
    assert_eq!(a[2]["local_rank"], 1);
    assert_eq!(a[1]["node_rank"], 1);
}

#[test]
fn bad_hostfile_names_file_and_line() {
    let hf = std::env::temp_dir().join(format!("railrun-badhf-{}", std::process::id()));
    std::fs::write(&hf, "nodea slots=2\nnodeb slots=two\n").unwrap();
    let mut c = railrun();
    c.arg("--hostfile")
        .arg(&hf)
        .args(["-np", "2", TESTPROG, "exit", "0"]);
    let (o, _) = run_limited(c, Duration::from_secs(30));
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains(&format!("{}:2:", hf.display())), "{err}");
    let _ = std::fs::remove_file(hf);
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["--no-such-option", "x"][..],
        &["-np"],
        &["-np", "zero", "x"],
        &[],
    ] {
        let mut c = railrun();
        c.args(args);
        let (o, _) = run_limited(c, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).starts_with("railrun: "),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
    let (o, _) = run_limited(
        {
            let mut c = railrun();
            c.arg("--help");
            c
        },
        Duration::from_secs(30),
    );
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("--connect-timeout"));
}

#[test]
fn ctrl_c_stops_everything_with_130() {
    let mk = marker("ctrlc");
    let mut c = railrun();
    c.args(["-np", "3", TESTPROG, "sleep", "60", &mk])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while procs_with(&mk).len() < 3 {
        assert!(Instant::now() < deadline, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = wait_timeout(&mut child, Duration::from_secs(20))
        .expect("railrun did not stop after SIGINT");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(st.code(), Some(130), "{err}");
    assert!(err.contains("SIGINT"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_no_survivors(&mk);
}

#[test]
fn sigterm_to_railrun_exits_143() {
    let mk = marker("sigterm");
    let mut c = railrun();
    c.args(["-np", "2", TESTPROG, "sleep", "60", &mk])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while procs_with(&mk).len() < 2 {
        assert!(Instant::now() < deadline, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_timeout(&mut child, Duration::from_secs(20))
        .expect("railrun did not stop after SIGTERM");
    assert_eq!(st.code(), Some(143));
    assert_no_survivors(&mk);
}

#[test]
fn railrun_killed_hard_takes_its_ranks_along() {
    // SIGKILL to railrun: PDEATHSIG ends the ranks.
    let mk = marker("sigkill");
    let mut c = railrun();
    c.args(["-np", "2", TESTPROG, "sleep", "60", &mk])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while procs_with(&mk).len() < 2 {
        assert!(Instant::now() < deadline, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_survivors(&mk);
}

#[test]
fn leftover_descendants_are_killed() {
    let mk = marker("orphan");
    let mut c = railrun();
    c.args(["-np", "2", TESTPROG, "orphan", "60", &mk]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).matches("ORPHAN=").count(), 2);
    assert_no_survivors(&mk);
}

#[test]
fn store_across_4_ranks() {
    let mut c = railrun();
    c.args(["-np", "4", TESTPROG, "store"]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    let mut adds = Vec::new();
    for r in 0..4 {
        for k in 0..4 {
            assert!(
                out.contains(&format!("STORE rank={r} rank/{k}=hello from rank {k} on ")),
                "{out}"
            );
        }
        assert!(out.contains(&format!("STORE rank={r} count=4")), "{out}");
        let add = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STORE rank={r} add=")))
            .unwrap_or_else(|| panic!("{out}"));
        adds.push(add.parse::<u32>().unwrap());
    }
    adds.sort();
    assert_eq!(adds, [1, 2, 3, 4]);
}

// ------------------------------------------------------------------------------------------
// The agent path without root: a fake `ssh` that runs the remote command locally, so hosts
// `fakea`, `fakeb` get one `railrun --agent` each, talking over the "ssh" pipes.

fn fake_ssh() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join("railrun-fakessh");
        let script = r#"#!/bin/sh
# fake ssh: drop options, take the host, run the remote command here
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-F|-p|-l|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
case "$host" in
  hang*) exec sleep 600 ;;
  refuse*) echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;
esac
export RRTEST_NODE="$host"
# Not exec: like real ssh, this process stays between railrun and the agent, so killing it
# leaves the agent with nothing but its closed stdin.
/bin/sh -c "$*"
exit $?
"#;
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    })
}

fn railrun_fake_ssh() -> Command {
    let mut c = railrun();
    c.arg("--ssh").arg(fake_ssh());
    c
}

#[test]
fn agents_over_fake_ssh_env_and_store() {
    let mut c = railrun_fake_ssh();
    c.args([
        "-H",
        "fakea:2,fakeb:2",
        "-np",
        "4",
        "--tag-output",
        "-x",
        "RRTEST_X=1",
        TESTPROG,
        "env",
    ]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let m = tagged_env(&text(&o.stdout));
    assert_eq!(m.len(), 4);
    for (r, e) in &m {
        let node = if *r < 2 { "fakea" } else { "fakeb" };
        assert_eq!(e["RRTEST_NODE"], node, "rank {r}");
        assert_eq!(e["RAILRING_NODE_RANK"], if *r < 2 { "0" } else { "1" });
        assert_eq!(e["RAILRING_LOCAL_RANK"], (r % 2).to_string());
        assert_eq!(e["RAILRING_NNODES"], "2");
        assert_eq!(e["MASTER_ADDR"], "fakea");
        assert_eq!(e["MASTER_PORT"], m[&0]["MASTER_PORT"]);
        assert_eq!(e["RRTEST_X"], "1");
        assert_eq!(e["RAILRING_JOB_SECRET"], m[&0]["RAILRING_JOB_SECRET"]);
    }
    // One relay per node.
    assert_eq!(m[&0]["RAILRING_STORE_ADDR"], m[&1]["RAILRING_STORE_ADDR"]);
    assert_ne!(m[&0]["RAILRING_STORE_ADDR"], m[&2]["RAILRING_STORE_ADDR"]);

    let mut c = railrun_fake_ssh();
    c.args(["-H", "fakea:2,fakeb:2", "-np", "4", TESTPROG, "store"]);
    let (o, _) = run_limited(c, Duration::from_secs(60));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    for r in 0..4 {
        assert!(out.contains(&format!("STORE rank={r} count=4")), "{out}");
        for k in 0..4 {
            assert!(
                out.contains(&format!("STORE rank={r} rank/{k}=hello from rank {k} on ")),
                "{out}"
            );
        }
    }
}

#[test]
fn agents_over_fake_ssh_failure_and_stdin() {
    let mk = marker("fakefail");
    let mut c = railrun_fake_ssh();
    c.args([
        "-H",
        "fakea:2,fakeb:2",
        "-np",
        "4",
        TESTPROG,
        "exit-rank",
        "3",
        "5",
        &mk,
    ]);
    let (o, wall) = run_limited(c, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains("railrun: rank 3 on host fakeb exited with code 5"),
        "{err}"
    );
    assert!(wall < Duration::from_secs(20), "took {wall:?}");
    assert_no_survivors(&mk);

    let mut c = railrun_fake_ssh();
    c.args([
        "-H",
        "fakea,fakeb",
        "-np",
        "2",
        "--tag-output",
        TESTPROG,
        "echo-stdin",
    ]);
    c.stdin(Stdio::piped());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"remote\n").unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(30)).expect("hung");
    assert!(st.success());
    assert_eq!(out, "[0] remote\n");
}

#[test]
fn agents_over_fake_ssh_unreachable_hosts() {
    let mut c = railrun_fake_ssh();
    c.args(["-H", "fakea,refuse1", "-np", "2", TESTPROG, "exit", "0"]);
    let (o, _) = run_limited(c, Duration::from_secs(30));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(
        err.contains("host refuse1") && err.contains("Connection refused"),
        "{err}"
    );

    let mut c = railrun_fake_ssh();
    c.args([
        "-H",
        "fakea,hang1",
        "--connect-timeout",
        "1",
        "-np",
        "2",
        TESTPROG,
        "exit",
        "0",
    ]);
    let (o, wall) = run_limited(c, Duration::from_secs(30));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(
        err.contains("host hang1") && err.contains("--connect-timeout"),
        "{err}"
    );
    assert!(wall < Duration::from_secs(6), "took {wall:?}");
}

#[test]
fn agent_kills_its_ranks_when_the_launcher_dies() {
    let mk = marker("lostlauncher");
    let mut c = railrun_fake_ssh();
    c.env("RAILRUN_KILL_GRACE", "0.5");
    c.args(["-H", "fakea:2", "-np", "2", TESTPROG, "sleep", "60", &mk])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while procs_with(&mk).len() < 2 {
        assert!(Instant::now() < deadline, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL railrun: its "ssh" dies (PDEATHSIG); the agent, a child of "ssh", lives on but
    // sees its stdin close, and kills its ranks.
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !procs_with(&mk).is_empty() {
        assert!(
            Instant::now() < deadline,
            "ranks survived the launcher: {:?}",
            procs_with(&mk)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
