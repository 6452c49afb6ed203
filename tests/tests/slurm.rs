//! railring under a real Slurm (`railring_tests::slurm`: slurmctld on `head`, slurmd on `n1`,
//! `n2` of the emulated cluster): `srun` direct launch, the example batch script under
//! `sbatch`, railrun inside an allocation (agents started with srun), and the torchrun-style
//! environment.
//!
//! Needs root and `slurm-wlm` + `munge`; otherwise each test prints `SKIPPED: ...` (and fails
//! under `CI`). Tests run one at a time (one Slurm per test, torn down on drop, even on panic).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use railring_tests::cluster::{Cluster, ClusterSpec};
use railring_tests::slurm::{run_timeout, Ran, Slurm};

const TESTPROG: &str = env!("CARGO_BIN_EXE_rr-testprog");
const RAILPERF_ARGS: &[&str] = &[
    "allreduce",
    "-b",
    "8",
    "-e",
    "1M",
    "-f",
    "4",
    "-n",
    "2",
    "-w",
    "1",
];
const JOB_LIMIT: Duration = Duration::from_secs(40);

/// One Slurm at a time: the machine has few cores and Slurm daemons are not free.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

fn railrun() -> &'static Path {
    railring_tests::bins::railrun()
}

fn railperf() -> &'static Path {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| railring_tests::bins::workspace_bin("railring-examples", "railperf"))
}

fn s(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_string()
}

/// Slurm on a 2-host cluster with one rail, or None (skipped).
fn up(test: &str) -> Option<(MutexGuard<'static, ()>, Slurm)> {
    if !Slurm::check_or_skip(test) {
        return None;
    }
    let g = serial();
    railrun();
    railperf();
    let t0 = Instant::now();
    let slurm = Slurm::up(
        ClusterSpec {
            hosts: 2,
            rails: 1,
            rail_rate: None,
        },
        4,
    )
    .unwrap_or_else(|e| panic!("{test}: slurm up: {e}"));
    eprintln!(
        "{test}: cluster + Slurm up in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    Some((g, slurm))
}

/// What railperf printed: the host of each rank, the #wrong columns of every row, the summary.
#[derive(Debug, Default)]
struct Perf {
    rank_hosts: Vec<(usize, String)>,
    rows: usize,
    wrong: u64,
    ok_summaries: usize,
}

/// Parse one or more railperf tables.
fn parse_perf(out: &str) -> Perf {
    let mut p = Perf::default();
    for line in out.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#  Rank") {
            // "#  Rank  0 Group  0 Pid  28928 on         n1 device ..."
            let w: Vec<&str> = rest.split_whitespace().collect();
            let rank = w.first().and_then(|r| r.parse().ok());
            let host = w.iter().position(|x| *x == "on").and_then(|i| w.get(i + 1));
            if let (Some(r), Some(h)) = (rank, host) {
                p.rank_hosts.push((r, h.to_string()));
            }
        } else if t.starts_with("# Out of bounds values : 0 OK") {
            p.ok_summaries += 1;
        } else if !t.starts_with('#') && !t.is_empty() {
            let w: Vec<&str> = t.split_whitespace().collect();
            // size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
            if w.len() == 13 && w[0].parse::<u64>().is_ok() {
                p.rows += 1;
                p.wrong += w[8].parse::<u64>().unwrap_or(u64::MAX / 4)
                    + w[12].parse::<u64>().unwrap_or(u64::MAX / 4);
            }
        }
    }
    p
}

/// 4 ranks: 0 and 1 on n1, 2 and 3 on n2 (block distribution), every row checked, none wrong.
fn assert_perf_ok(out: &str, tables: usize, what: &str) {
    let p = parse_perf(out);
    let mut hosts = p.rank_hosts.clone();
    hosts.sort();
    let want: Vec<(usize, String)> = (0..tables)
        .flat_map(|_| [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")])
        .map(|(r, h)| (r, h.to_string()))
        .collect();
    let mut want = want;
    want.sort();
    assert_eq!(
        hosts, want,
        "{what}: ranks not spread over n1 and n2 as expected\n{out}"
    );
    assert!(
        p.rows >= tables * 5,
        "{what}: expected at least {} result rows, got {}\n{out}",
        tables * 5,
        p.rows
    );
    assert_eq!(p.wrong, 0, "{what}: wrong results\n{out}");
    assert_eq!(
        p.ok_summaries, tables,
        "{what}: expected {tables} `Out of bounds values : 0 OK`\n{out}"
    );
}

/// No railrun, railperf or srun left on any host.
fn assert_no_job_processes(c: &Cluster) {
    let mut hosts = vec!["head".to_string()];
    hosts.extend(c.host_names());
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<(String, u32, String)> = hosts
            .iter()
            .flat_map(|h| {
                c.pids_on(h)
                    .into_iter()
                    .map(move |(p, cmd)| (h.clone(), p, cmd))
            })
            .filter(|(_, _, cmd)| {
                ["railrun", "railperf", "srun", "rr-testprog"]
                    .iter()
                    .any(|n| cmd.contains(n))
            })
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= until {
            panic!("processes of the job left after it ended: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn must(r: Result<Ran, String>, what: &str, slurm: &Slurm) -> Ran {
    let r = r.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        r.success(),
        "{what} failed: {}\n{}",
        r.describe(),
        slurm.logs()
    );
    r
}

#[test]
fn srun_direct_launch_two_hosts() {
    let Some((_g, slurm)) = up("srun_direct_launch_two_hosts") else {
        return;
    };
    let c = slurm.cluster();
    let before: Vec<(u64, u64)> = ["n1", "n2"]
        .iter()
        .map(|h| c.rail_bytes(h, 0).unwrap())
        .collect();
    let mut argv = vec![
        "srun".to_string(),
        "-N".into(),
        "2".into(),
        "--ntasks-per-node=2".into(),
        s(railperf()),
    ];
    argv.extend(RAILPERF_ARGS.iter().map(|a| a.to_string()));
    let t0 = Instant::now();
    let r = must(
        slurm.run(
            "head",
            &argv,
            &[("RAILRING_SOCKET_IFNAME", "rail")],
            JOB_LIMIT,
        ),
        "srun railperf",
        &slurm,
    );
    eprintln!("srun railperf: {:.2} s", t0.elapsed().as_secs_f64());
    assert_perf_ok(&r.stdout, 1, "srun railperf");
    // No secret was exported: the derived one is guessable, and rank 0 (only) says so.
    let warns = r.stderr.matches("no RAILRING_JOB_SECRET").count();
    assert_eq!(
        warns, 1,
        "expected one warning about the guessable secret (rank 0):\n{}",
        r.stderr
    );
    // The data went over the rail between the hosts, not over management.
    for (i, h) in ["n1", "n2"].iter().enumerate() {
        let (tx, rx) = c.rail_bytes(h, 0).unwrap();
        assert!(
            tx - before[i].0 > 512 * 1024 && rx - before[i].1 > 512 * 1024,
            "{h}: rail0 carried little: tx {tx} rx {rx}"
        );
    }
    assert_no_job_processes(c);

    // With the secret exported no warning; with a rank that has a different secret the job
    // fails instead of mixing with strangers.
    let mut argv = vec![
        "srun".to_string(),
        "-N".into(),
        "2".into(),
        "--ntasks-per-node=1".into(),
        s(railperf()),
    ];
    argv.extend(
        ["allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
            .iter()
            .map(|a| a.to_string()),
    );
    let env = [
        ("RAILRING_SOCKET_IFNAME", "rail"),
        ("RAILRING_JOB_SECRET", "0123456789abcdef0123456789abcdef"),
    ];
    let r = must(
        slurm.run("head", &argv, &env, JOB_LIMIT),
        "srun railperf with a secret",
        &slurm,
    );
    assert!(
        !r.stderr.contains("RAILRING_JOB_SECRET"),
        "{}",
        r.describe()
    );
    let bad = vec![
        "srun".to_string(),
        "-N".into(),
        "2".into(),
        "--ntasks-per-node=1".into(),
        "--kill-on-bad-exit=1".into(),
        // Each task's stderr to its own file, written by its node's slurmstepd: srun, ending
        // the step on the bad exit, may drop output it has not forwarded yet.
        format!("--error={}/bad.%t.err", slurm.dir().display()),
        "bash".into(),
        "-c".into(),
        format!(
            r#"[ "$SLURM_PROCID" = 1 ] && export RAILRING_JOB_SECRET=other; exec {} allreduce -b 8 -e 8 -n 1 -w 0"#,
            s(railperf())
        ),
    ];
    let env = [
        ("RAILRING_SOCKET_IFNAME", "rail"),
        ("RAILRING_JOB_SECRET", "right"),
        ("RAILRING_CONNECT_TIMEOUT", "3"),
    ];
    let r = slurm.run("head", &bad, &env, JOB_LIMIT).unwrap();
    assert!(
        !r.success() && !r.timed_out,
        "a rank with another secret must fail the step: {}",
        r.describe()
    );
    let err = |t: usize| std::fs::read_to_string(slurm.dir().join(format!("bad.{t}.err")));
    // The rank with the other secret says what is wrong with it; the store's rank names the
    // rejected connection.
    let e1 = err(1).unwrap_or_default();
    assert!(
        e1.contains("RAILRING_JOB_SECRET") && e1.contains("not its"),
        "the rank with another secret should say so: {e1:?}\n{}",
        r.describe()
    );
    let e0 = err(0).unwrap_or_default();
    assert!(
        e0.contains("failed to prove the job secret"),
        "the store's rank should name the rejected connection: {e0:?}\n{}",
        r.describe()
    );
    assert_no_job_processes(c);
}

#[test]
fn sbatch_example_script() {
    let Some((_g, slurm)) = up("sbatch_example_script") else {
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/slurm/job.sh");
    let out = slurm.dir().join("job.out");
    let bindir = railrun().parent().unwrap().to_path_buf();
    assert_eq!(
        railperf().parent().unwrap(),
        bindir,
        "railrun and railperf in one directory"
    );
    let path = format!(
        "{}:{}",
        s(&bindir),
        std::env::var("PATH").unwrap_or_default()
    );
    let args = ["-N", "2", "--ntasks-per-node=2", "-o", &s(&out), script];
    let env = [
        ("PATH", path.as_str()),
        ("RAILPERF_ARGS", "-b 8 -e 1M -f 4 -n 2 -w 1"),
    ];
    let t0 = Instant::now();
    let id = slurm
        .sbatch("head", &args, &env)
        .unwrap_or_else(|e| panic!("{e}\n{}", slurm.logs()));
    let (state, exit) = slurm
        .wait_job(id, JOB_LIMIT)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "sbatch job {id}: {state} {exit} after {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    let text = std::fs::read_to_string(&out).unwrap_or_else(|e| format!("<no output file: {e}>"));
    assert_eq!(
        (state.as_str(), exit.as_str()),
        ("COMPLETED", "0:0"),
        "batch job failed\n--- job output ---\n{text}\n{}",
        slurm.logs()
    );
    for marker in ["== railrun", "== srun", "== done"] {
        assert!(
            text.contains(marker),
            "missing `{marker}` in the job output:\n{text}"
        );
    }
    assert!(
        !text.contains("no RAILRING_JOB_SECRET"),
        "the script exports the secret:\n{text}"
    );
    let (first, second) = text.split_once("== srun").unwrap();
    assert_perf_ok(first, 1, "railrun in the batch script");
    assert_perf_ok(second, 1, "srun in the batch script");
    assert_no_job_processes(slurm.cluster());
}

#[test]
fn railrun_in_allocation_launches_agents_with_srun() {
    let Some((_g, slurm)) = up("railrun_in_allocation_launches_agents_with_srun") else {
        return;
    };
    // salloc on head (the login node): both nodes are remote, both agents come through srun.
    let mut argv = vec![
        "salloc".to_string(),
        "-N".into(),
        "2".into(),
        "--ntasks-per-node=2".into(),
        s(railrun()),
        "-v".into(),
        s(railperf()),
    ];
    argv.extend(RAILPERF_ARGS.iter().map(|a| a.to_string()));
    let t0 = Instant::now();
    let r = must(
        slurm.run(
            "head",
            &argv,
            &[("RAILRING_SOCKET_IFNAME", "rail")],
            JOB_LIMIT,
        ),
        "salloc railrun",
        &slurm,
    );
    eprintln!("salloc railrun: {:.2} s", t0.elapsed().as_secs_f64());
    assert_perf_ok(&r.stdout, 1, "railrun in salloc");
    assert!(
        r.stderr.contains("starting the agents with") && r.stderr.contains("srun"),
        "{}",
        r.describe()
    );
    for h in ["n1", "n2"] {
        assert!(
            r.stderr.contains(&format!("--nodelist={h} --overlap")),
            "no srun agent for {h}: {}",
            r.describe()
        );
        assert!(
            r.stderr.contains(&format!("agent on {h} (hostname {h},")),
            "agent on {h} not up: {}",
            r.describe()
        );
    }
    assert!(
        !r.stderr.contains(" ssh "),
        "ssh must not be used: {}",
        r.describe()
    );
    assert_no_job_processes(slurm.cluster());

    // RAILRUN_LAUNCHER=srun outside an allocation is a clear error, not a new allocation.
    let r = slurm
        .run(
            "head",
            &[s(railrun()), "-H".into(), "n1,n2".into(), "true".into()],
            &[("RAILRUN_LAUNCHER", "srun")],
            JOB_LIMIT,
        )
        .unwrap();
    assert!(
        !r.success() && r.stderr.contains("SLURM_JOB_ID"),
        "{}",
        r.describe()
    );
}

#[test]
fn railrun_killed_in_allocation_leaves_no_survivors() {
    let Some((_g, slurm)) = up("railrun_killed_in_allocation_leaves_no_survivors") else {
        return;
    };
    let c = slurm.cluster();
    // rr-testprog sleeps until killed; railrun gets SIGKILL (no chance to clean up): srun dies
    // with it (PDEATHSIG), Slurm ends the agent steps, the agents' stdin closes, ranks die.
    // The allocation outlives railrun (the shell sleeps on), so what ends the ranks is railrun's
    // death, not the end of the allocation. Paths go through the environment so that only
    // railrun itself has "railrun" in its command line.
    let argv = [
        "salloc",
        "-N",
        "2",
        "--ntasks-per-node=1",
        "bash",
        "-c",
        r#""$RR" "$TP" sleep 600; exec sleep 60"#,
    ];
    let mut cmd = slurm.cmd("head", &argv);
    cmd.env("RR", railrun()).env("TP", TESTPROG);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("salloc");
    let until = Instant::now() + JOB_LIMIT;
    let ranks_up = || {
        ["n1", "n2"].iter().all(|h| {
            c.pids_on(h)
                .iter()
                .any(|(_, cmd)| cmd.contains("rr-testprog"))
        })
    };
    while !ranks_up() {
        if Instant::now() >= until || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ranks did not start on n1 and n2\n{}", slurm.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let is_railrun = |cmd: &str| {
        cmd.split_whitespace()
            .next()
            .is_some_and(|a| a.ends_with("/railrun"))
    };
    let rr: Vec<u32> = c
        .pids_on("head")
        .into_iter()
        .filter(|(_, cmd)| is_railrun(cmd))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(rr.len(), 1, "one railrun on head: {:?}", c.pids_on("head"));
    // SAFETY: plain syscall on a process of this test.
    unsafe { libc::kill(rr[0] as i32, libc::SIGKILL) };
    let _ = child.kill();
    let _ = child.wait();
    assert_no_job_processes(c);
}

#[test]
fn torchrun_style_env_two_hosts() {
    // No Slurm: RANK/WORLD_SIZE/MASTER_* set by hand on two hosts, as torchrun would.
    if !Cluster::check_or_skip("torchrun_style_env_two_hosts") {
        return;
    }
    let _g = serial();
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 1,
        rail_rate: None,
    })
    .expect("cluster up");
    let perf = s(railperf());
    let mut kids = Vec::new();
    for rank in 0..4usize {
        let host = if rank < 2 { "n1" } else { "n2" };
        let mut argv = vec![perf.as_str()];
        argv.extend_from_slice(RAILPERF_ARGS);
        let mut cmd = c.exec(host, &argv);
        for (k, _) in std::env::vars() {
            if k.starts_with("SLURM_")
                || k.starts_with("RAILRING_")
                || k.starts_with("TORCHELASTIC_")
            {
                cmd.env_remove(k);
            }
        }
        cmd.envs([
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "4".into()),
            ("LOCAL_RANK", (rank % 2).to_string()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "n1".into()),
            ("MASTER_PORT", "29500".into()),
            ("RAILRING_SOCKET_IFNAME", "rail".into()),
            ("RAILRING_JOB_SECRET", "torch-secret-for-this-test".into()),
        ]);
        kids.push((rank, run_in_thread(cmd)));
    }
    let mut rank0 = None;
    for (rank, h) in kids {
        let r = h.join().expect("runner thread").expect("run railperf");
        assert!(r.success(), "rank {rank}: {}", r.describe());
        assert!(
            !r.stderr.contains("RAILRING_JOB_SECRET"),
            "rank {rank}: {}",
            r.describe()
        );
        if rank == 0 {
            rank0 = Some(r);
        }
    }
    assert_perf_ok(&rank0.unwrap().stdout, 1, "torchrun-style env");
}

fn run_in_thread(cmd: Command) -> std::thread::JoinHandle<Result<Ran, String>> {
    std::thread::spawn(move || run_timeout(cmd, JOB_LIMIT))
}
