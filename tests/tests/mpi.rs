//! MPI bootstrap and the MPI comparison (cargo feature `mpi`; needs Open MPI's `mpirun`):
//!
//! * `rr-mpiprog` under Debian's `mpirun` on localhost, 2 and 4 ranks: `Communicator::init()`
//!   detecting mpirun, and `Communicator::from_mpi(&world)`; every element of every all-reduce
//!   is checked on every rank.
//! * The same across the emulated cluster's hosts (root; otherwise `SKIPPED`): mpirun on `head`
//!   with a hostfile of n1, n2 and the cluster's ssh; railring's data plane on the rails.
//! * `railcompare` smoke tests (localhost, and across the cluster): both tables, zero wrong,
//!   the SVG written. Nothing here asserts a speed.
//!
//! `cargo test -p railring-tests --features mpi --test mpi`
#![cfg(feature = "mpi")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use railring_tests::bins;
use railring_tests::cluster::{Cluster, ClusterSpec};
use railring_tests::proc::{collect, wait_timeout, ScratchDir};

const MPIPROG: &str = env!("CARGO_BIN_EXE_rr-mpiprog");

fn is_root() -> bool {
    // SAFETY: no arguments, no side effects.
    unsafe { libc::geteuid() == 0 }
}

/// mpirun with the flags every run here needs (root, 2 shared cores) and its own session
/// directory base `tmp` (a fresh [`ScratchDir`] per run): Open MPI creates
/// `<base>/ompi.<host>.<uid>`, and two mpiruns starting at once under the same base race on it
/// ("File exists"). Given as an MCA parameter, it also reaches the daemons mpirun starts on the
/// emulated cluster's hosts (which share this machine's /tmp).
fn mpirun_argv(np: usize, tmp: &ScratchDir) -> Vec<String> {
    let mut v: Vec<String> = vec!["mpirun".into(), "-np".into(), np.to_string()];
    if is_root() {
        v.push("--allow-run-as-root".into());
    }
    v.extend(["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"].map(String::from));
    v.extend([
        "--mca".into(),
        "orte_tmpdir_base".into(),
        tmp.path().display().to_string(),
    ]);
    v
}

/// A command with none of the launcher variables this test process may have inherited.
fn clean(mut c: Command) -> Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("RAILRING_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMI")
            || k.starts_with("RAILRUN_")
        {
            c.env_remove(&k);
        }
    }
    c.stdin(Stdio::null());
    c
}

/// Run `cmd`; past `limit`, SIGTERM (mpirun then ends its ranks), SIGKILL 5 s later, and fail.
fn run_limited(mut cmd: Command, limit: Duration, what: &str) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let (to, te) = collect(&mut child);
    let Some(status) = wait_timeout(&mut child, limit) else {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = wait_timeout(&mut child, Duration::from_secs(5));
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{what}: did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
            to.join().unwrap(),
            te.join().unwrap()
        );
    };
    Output {
        status,
        stdout: to.join().unwrap().into_bytes(),
        stderr: te.join().unwrap().into_bytes(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every rank printed its OK line; returns rank → (nodes, host).
fn assert_all_ok(o: &Output, np: usize, mode: &str) -> Vec<(usize, String)> {
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert!(
        o.status.success(),
        "mode {mode}, {np} ranks: mpirun failed ({})\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    (0..np)
        .map(|r| {
            let p = format!("OK rank {r} of {np} mode {mode} nodes ");
            let rest = out
                .lines()
                .find_map(|l| l.strip_prefix(&p))
                .unwrap_or_else(|| {
                    panic!(
                        "rank {r} did not report OK (mode {mode})\nstdout:\n{out}\nstderr:\n{err}"
                    )
                });
            let mut f = rest.split_whitespace();
            let nodes: usize = f.next().and_then(|x| x.parse().ok()).expect("nodes");
            assert_eq!(f.next(), Some("host"), "{rest}");
            (nodes, f.next().unwrap_or("").to_string())
        })
        .collect()
}

fn local_mpirun(np: usize, mode: &str) {
    let tmp = ScratchDir::new("rr-mpirun");
    let mut argv = mpirun_argv(np, &tmp);
    argv.extend([MPIPROG.to_string(), mode.to_string()]);
    let mut c = clean(Command::new(&argv[0]));
    c.args(&argv[1..]);
    let o = run_limited(
        c,
        Duration::from_secs(120),
        &format!("mpirun -np {np} rr-mpiprog {mode}"),
    );
    for (nodes, _) in assert_all_ok(&o, np, mode) {
        assert_eq!(nodes, 1, "one machine is one node");
    }
}

#[test]
fn init_detects_mpirun_2_ranks() {
    local_mpirun(2, "init");
}

#[test]
fn init_detects_mpirun_4_ranks() {
    local_mpirun(4, "init");
}

#[test]
fn from_mpi_2_ranks() {
    local_mpirun(2, "from-mpi");
}

#[test]
fn from_mpi_4_ranks() {
    local_mpirun(4, "from-mpi");
}

/// MPMD: `np_bad` ranks run with `bad_env`, the others without. The job must end (mpirun
/// aborts it when a rank exits non-zero) with the failing rank's own error, not hang.
fn one_rank_fails(np_good: usize, bad_env: &str, want: &str) {
    let tmp = ScratchDir::new("rr-mpirun");
    let mut argv = mpirun_argv(np_good, &tmp);
    argv.extend([
        MPIPROG.to_string(),
        "init".into(),
        ":".into(),
        "-np".into(),
        "1".into(),
        "env".into(),
        bad_env.into(),
        MPIPROG.into(),
        "init".into(),
    ]);
    let mut c = clean(Command::new(&argv[0]));
    c.args(&argv[1..]);
    let o = run_limited(
        c,
        Duration::from_secs(120),
        &format!("mpirun with one rank given {bad_env}"),
    );
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{all}");
    let bad = np_good; // the last rank
    assert!(
        all.contains(&format!("FAIL rank {bad}: Communicator::init:")) && all.contains(want),
        "{all}"
    );
}

#[test]
fn a_rank_failing_before_mpi_init_ends_the_job() {
    one_rank_fails(2, "RAILRING_TIMEOUT=bad", "RAILRING_TIMEOUT=\"bad\"");
}

#[test]
fn a_rank_failing_during_the_bootstrap_ends_the_job() {
    // after the MPI broadcast, while the others wait for it in the store
    one_rank_fails(
        2,
        "RAILRING_SOCKET_IFNAME==rr-no-such-if",
        "matches no IPv4 interface",
    );
}

/// Alone (no mpirun), a program built with the `mpi` feature is a world of one and never
/// touches MPI.
#[test]
fn alone_without_mpirun_is_not_mpi() {
    let mut c = clean(Command::new(MPIPROG));
    c.arg("init");
    let o = run_limited(c, Duration::from_secs(30), "rr-mpiprog init alone");
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("world of 1: mpirun was not detected"),
        "{}",
        text(&o.stderr)
    );
}

/// railperf, mpiperf, railcompare and railrun, built once into this test's target directory.
fn tools() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        bins::cargo_build(&[
            "-p",
            "railring-examples",
            "-p",
            "railrun",
            "--features",
            "railring-examples/mpi",
            "--bins",
        ])
    })
}

/// Output of railcompare: both libraries' columns for every size, zero wrong; the SVG and JSON.
fn assert_compare_ok(o: &Output, sizes: &[usize], svg: &Path, json: &Path) {
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert!(
        o.status.success(),
        "railcompare failed ({})\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    assert!(
        out.contains("# Out of bounds values : mpi 0 OK, railring 0 OK"),
        "{out}\n{err}"
    );
    for s in sizes {
        let row = out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.split_whitespace().next() == Some(&s.to_string()))
            .unwrap_or_else(|| panic!("no row for {s} B\n{out}"));
        // size count type redop root | mpi t bw rr t bw ratio | mpi t bw rr t bw ratio | w w
        let f: Vec<&str> = row.split_whitespace().filter(|x| *x != "|").collect();
        assert_eq!(f.len(), 17, "{row}");
        assert!(
            f[5..15].iter().all(|x| *x != "-"),
            "a library is missing at {s} B: {row}"
        );
        assert_eq!((f[15], f[16]), ("0", "0"), "wrong elements at {s} B: {row}");
    }
    let svg_text = std::fs::read_to_string(svg).expect("the SVG was written");
    assert!(svg_text.starts_with("<svg") && svg_text.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg_text.matches("<polyline").count(),
        4,
        "MPI and railring, out-of-place and in-place"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json).expect("the JSON was written")).expect("JSON");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), sizes.len());
    for r in rows {
        assert!(
            r["mpi"]["oop_busbw"].is_number() && r["railring"]["ip_busbw"].is_number(),
            "{r}"
        );
        assert!(
            r["ratio_oop_busbw"].is_number() || r["mpi"]["oop_busbw"] == 0.0,
            "{r}"
        );
    }
}

#[test]
fn railcompare_smoke_2_ranks() {
    let dir = tools();
    let tmp = std::env::temp_dir().join(format!("rr-mpi-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (svg, json) = (tmp.join("ar.svg"), tmp.join("ar.json"));
    let mut c = clean(Command::new(dir.join("railcompare")));
    c.args(["-np", "2", "--svg"])
        .arg(&svg)
        .arg("--json")
        .arg(&json);
    c.args([
        "--",
        "allreduce",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "2",
        "-n",
        "2",
        "-w",
        "1",
    ]);
    let o = run_limited(c, Duration::from_secs(300), "railcompare -np 2");
    let sizes: Vec<usize> = (3..=16).map(|k| 1usize << k).collect();
    assert_compare_ok(&o, &sizes, &svg, &json);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `railperf --vs-mpi` under railrun points to railcompare (and fails: it is not a benchmark).
#[test]
fn railperf_vs_mpi_points_to_railcompare() {
    let dir = tools();
    let mut c = clean(Command::new(dir.join("railrun")));
    c.args(["-np", "2"]).arg(dir.join("railperf")).args([
        "allreduce",
        "-b",
        "8",
        "-e",
        "1K",
        "--vs-mpi",
    ]);
    let o = run_limited(c, Duration::from_secs(60), "railrun railperf --vs-mpi");
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("railcompare -np 2") && err.contains("-- allreduce -b 8 -e 1K"),
        "{err}"
    );
}

/// mpiperf is an Open MPI program: railrun refuses it before the start, and under another
/// MPI's launcher (MPICH's mpiexec) it compares MPI_COMM_WORLD with the size the launcher
/// announced instead of running N worlds of one.
#[test]
fn mpiperf_checks_the_world_it_was_given() {
    let dir = tools();
    let args = ["allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"];
    let mut c = clean(Command::new(dir.join("railrun")));
    c.args(["-np", "2"]).arg(dir.join("mpiperf")).args(args);
    let o = run_limited(c, Duration::from_secs(60), "railrun -np 2 mpiperf");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is an Open MPI program (it links libmpi.so.40)")
            && err.contains("mpirun -np 2"),
        "{err}"
    );
    let Some(mpiexec) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("mpiexec.mpich"))
            .find(|f| f.is_file())
    }) else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: mpiperf_checks_the_world_it_was_given: mpiexec.mpich not found (MPICH part)"
        );
        return;
    };
    let mut c = clean(Command::new(mpiexec));
    c.args(["-n", "2"]).arg(dir.join("mpiperf")).args(args);
    let o = run_limited(c, Duration::from_secs(60), "mpiexec.mpich -n 2 mpiperf");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(
        err.contains("MPI_COMM_WORLD has 1 rank(s), but the launcher started 2 (PMI_SIZE=2)"),
        "{err}"
    );
    assert!(!out.contains("Avg bus bandwidth"), "it ran:\n{out}");
}

// ---- across the emulated cluster ----

fn cluster(test: &str) -> Option<Cluster> {
    if !Cluster::check_or_skip(test) {
        return None;
    }
    Some(
        Cluster::up(ClusterSpec {
            hosts: 2,
            rails: 2,
            rail_rate: None,
        })
        .unwrap_or_else(|e| panic!("{test}: cluster up: {e}")),
    )
}

/// Open MPI on the management network, ranks spread over n1 and n2, railring's rails on `rail*`.
fn cluster_mpirun_argv(c: &Cluster, hostfile: &Path, np: usize, tmp: &ScratchDir) -> Vec<String> {
    let mut v = mpirun_argv(np, tmp);
    v.extend([
        "--hostfile".into(),
        hostfile.display().to_string(),
        "--mca".into(),
        "plm_rsh_agent".into(),
        c.ssh_command(),
        "--mca".into(),
        "btl_tcp_if_include".into(),
        "mgmt0".into(),
        "--mca".into(),
        "oob_tcp_if_include".into(),
        "mgmt0".into(),
        "-x".into(),
        "RAILRING_SOCKET_IFNAME=rail".into(),
    ]);
    v
}

fn assert_clean(c: &Cluster) {
    for h in ["head".to_string()].into_iter().chain(c.host_names()) {
        if let Err(left) = c.wait_no_survivors(&h, Duration::from_secs(10)) {
            panic!("processes left on {h} after mpirun exited: {left:?}");
        }
    }
}

#[test]
fn mpirun_across_cluster_hosts() {
    let Some(c) = cluster("mpirun_across_cluster_hosts") else {
        return;
    };
    let hf = c.hostfile(2).unwrap();
    for mode in ["init", "from-mpi"] {
        let tmp = ScratchDir::new("rr-mpirun");
        let mut argv = cluster_mpirun_argv(&c, &hf, 4, &tmp);
        argv.extend([MPIPROG.to_string(), mode.to_string()]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let cmd = clean(c.exec("head", &argv));
        let o = run_limited(
            cmd,
            Duration::from_secs(180),
            &format!("mpirun on head -np 4 rr-mpiprog {mode}"),
        );
        let ranks = assert_all_ok(&o, 4, mode);
        for (r, (nodes, host)) in ranks.iter().enumerate() {
            assert_eq!(*nodes, 2, "rank {r}: two hosts are two nodes");
            assert_eq!(
                host,
                if r < 2 { "n1" } else { "n2" },
                "rank {r} placed by the hostfile"
            );
        }
        // railring's data between n1 and n2 crossed a rail, not the management network
        let rail: u64 = (0..2)
            .map(|r| c.rail_bytes("n1", r).map(|(tx, _)| tx).unwrap_or(0))
            .sum();
        assert!(
            rail > (1 << 18) * 4,
            "mode {mode}: only {rail} bytes left n1 over its rails"
        );
    }
    assert_clean(&c);
}

#[test]
fn railcompare_across_cluster_hosts() {
    let dir = tools();
    let Some(c) = cluster("railcompare_across_cluster_hosts") else {
        return;
    };
    let hf = c.hostfile(1).unwrap();
    let svg = c.dir().join("cmp.svg");
    let json = c.dir().join("cmp.json");
    let rc = dir.join("railcompare").display().to_string();
    let ssh = c.ssh_command();
    // railcompare gives its mpirun a fresh TMPDIR on head; the daemons on n1 and n2 get this
    // run's own session directory base too (see `mpirun_argv`).
    let tmp = ScratchDir::new("rr-mpirun");
    let mpirun_args = format!(
        "--mca btl_tcp_if_include mgmt0 --mca oob_tcp_if_include mgmt0 -x RAILRING_SOCKET_IFNAME=rail --mca orte_tmpdir_base {}",
        tmp.path().display()
    );
    let argv = [
        rc.as_str(),
        "-np",
        "2",
        "--hostfile",
        hf.to_str().unwrap(),
        "--ssh",
        &ssh,
        "--mpirun-args",
        &mpirun_args,
        "--railrun-args",
        "-x RAILRING_SOCKET_IFNAME=rail",
        "--rounds",
        "1",
        "--svg",
        svg.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--",
        "allreduce",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "4",
        "-n",
        "2",
        "-w",
        "1",
    ];
    let cmd = clean(c.exec("head", &argv));
    let o = run_limited(cmd, Duration::from_secs(300), "railcompare across n1, n2");
    let sizes: Vec<usize> = (0..7).map(|k| 8usize << (2 * k)).collect();
    assert_compare_ok(&o, &sizes, &svg, &json);
    assert_clean(&c);
}
