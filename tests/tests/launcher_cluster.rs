//! railrun across the emulated cluster (`railring_tests::cluster`): railrun runs on `head` and
//! reaches `n1`, `n2` through real OpenSSH, one `railrun --agent` per node.
//!
//! Needs root (namespaces); without it every test prints `SKIPPED: ...` (and fails under `CI`).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use railring_tests::cluster::{Cluster, ClusterSpec};
use railring_tests::proc::{collect, wait_timeout};

const TESTPROG: &str = env!("CARGO_BIN_EXE_rr-testprog");

/// The railrun binary under test.
fn railrun_bin() -> &'static Path {
    railring_tests::bins::railrun()
}

fn up(test: &str, hosts: usize) -> Option<Cluster> {
    if !Cluster::check_or_skip(test) {
        return None;
    }
    railrun_bin();
    Some(
        Cluster::up(ClusterSpec {
            hosts,
            rails: 1,
            rail_rate: None,
        })
        .unwrap_or_else(|e| panic!("{test}: cluster up: {e}")),
    )
}

/// `railrun --ssh <cluster ssh> ARGS...` on head.
fn railrun_on_head(c: &Cluster, args: &[&str]) -> Command {
    let bin = railrun_bin().to_str().unwrap().to_string();
    let ssh = c.ssh_command();
    let mut argv: Vec<&str> = vec![&bin, "--ssh", &ssh, "--connect-timeout", "15"];
    argv.extend_from_slice(args);
    let mut cmd = c.exec("head", &argv);
    cmd.env_remove("SLURM_JOB_NODELIST")
        .env_remove("SLURM_NODELIST")
        .env_remove("RAILRUN_SSH");
    cmd.stdin(Stdio::null());
    cmd
}

fn run_limited(mut cmd: Command, limit: Duration) -> (Output, Duration) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawn railrun on head");
    let (to, te) = collect(&mut child);
    let st = match wait_timeout(&mut child, limit) {
        Some(st) => st,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "railrun did not finish within {limit:?}; stderr so far: {}",
                te.join().unwrap()
            );
        }
    };
    let wall = t0.elapsed();
    (
        Output {
            status: st,
            stdout: to.join().unwrap().into_bytes(),
            stderr: te.join().unwrap().into_bytes(),
        },
        wall,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// No process of the job is left on any host (ssh sessions included).
fn assert_clean(c: &Cluster) {
    let mut hosts = vec!["head".to_string()];
    hosts.extend(c.host_names());
    for h in hosts {
        if let Err(left) = c.wait_no_survivors(&h, Duration::from_secs(5)) {
            panic!("processes left on {h} after railrun exited: {left:?}");
        }
    }
}

/// Ranks of the job (by marker) living on `host`: (pid, rank).
fn ranks_on(c: &Cluster, host: &str, marker: &str) -> Vec<(u32, usize)> {
    c.pids_on(host)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("rr-testprog") && cmd.contains(marker))
        .filter_map(|(pid, _)| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            env.split(|&b| b == 0)
                .find_map(|kv| kv.strip_prefix(b"RAILRING_RANK="))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                .map(|r| (pid, r))
        })
        .collect()
}

fn wait_ranks(c: &Cluster, host: &str, marker: &str, n: usize) -> Vec<(u32, usize)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = ranks_on(c, host, marker);
        if v.len() >= n {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "ranks did not start on {host}: {:?}",
            c.pids_on(host)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ranks_spread_over_two_hosts() {
    let Some(c) = up("ranks_spread_over_two_hosts", 2) else {
        return;
    };
    let hf = c.hostfile(2).unwrap();
    let cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "4",
            "-x",
            "RRTEST_X=from-head",
            "--tag-output",
            TESTPROG,
            "env",
        ],
    );
    let (o, _) = run_limited(cmd, Duration::from_secs(90));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    let get = |r: usize, k: &str| -> String {
        let p = format!("[{r}] {k}=");
        out.lines()
            .find_map(|l| l.strip_prefix(&p))
            .unwrap_or_else(|| panic!("rank {r}: no {k} in\n{out}"))
            .to_string()
    };
    let port = get(0, "MASTER_PORT");
    for r in 0..4 {
        let (host, node, local) = if r < 2 {
            ("n1", 0, r)
        } else {
            ("n2", 1, r - 2)
        };
        assert_eq!(get(r, "HOST"), host);
        assert_eq!(get(r, "RAILRING_RANK"), r.to_string());
        assert_eq!(get(r, "RANK"), r.to_string());
        assert_eq!(get(r, "OMPI_COMM_WORLD_RANK"), r.to_string());
        assert_eq!(get(r, "RAILRING_WORLD_SIZE"), "4");
        assert_eq!(get(r, "RAILRING_NODE_RANK"), node.to_string());
        assert_eq!(get(r, "RAILRING_NNODES"), "2");
        assert_eq!(get(r, "RAILRING_LOCAL_RANK"), local.to_string());
        assert_eq!(get(r, "LOCAL_WORLD_SIZE"), "2");
        assert_eq!(get(r, "MASTER_ADDR"), "n1");
        assert_eq!(get(r, "MASTER_PORT"), port);
        assert_eq!(get(r, "RRTEST_X"), "from-head");
        // Every rank talks to a store on its own node (the agent's relay).
        assert!(get(r, "RAILRING_STORE_ADDR").starts_with("127.0.0.1:"));
        assert_eq!(get(r, "RAILRING_JOB_SECRET").len(), 64);
    }
    assert_ne!(get(0, "RAILRING_STORE_ADDR"), "");
    assert!(port.parse::<u16>().unwrap() > 0);
    assert_clean(&c);
}

#[test]
fn store_works_across_hosts_through_the_relay() {
    let Some(c) = up("store_works_across_hosts_through_the_relay", 2) else {
        return;
    };
    let hf = c.hostfile(2).unwrap();
    let cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "4",
            TESTPROG,
            "store",
        ],
    );
    let (o, _) = run_limited(cmd, Duration::from_secs(90));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    for r in 0..4 {
        for (k, h) in [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")] {
            assert!(
                out.contains(&format!(
                    "STORE rank={r} rank/{k}=hello from rank {k} on {h}"
                )),
                "{out}"
            );
        }
        assert!(out.contains(&format!("STORE rank={r} count=4")), "{out}");
    }
    assert_clean(&c);
}

#[test]
fn stdin_reaches_remote_rank_0() {
    let Some(c) = up("stdin_reaches_remote_rank_0", 2) else {
        return;
    };
    let hf = c.hostfile(1).unwrap();
    let mut cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "2",
            "--tag-output",
            TESTPROG,
            "echo-stdin",
        ],
    );
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut si = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = si.write_all(b"over ssh\n");
    });
    let (to, te) = collect(&mut child);
    let st = wait_timeout(&mut child, Duration::from_secs(60)).expect("railrun hung");
    assert!(st.success(), "{}", te.join().unwrap());
    assert_eq!(to.join().unwrap(), "[0] over ssh\n");
    assert_clean(&c);
}

#[test]
fn kill_9_of_a_remote_rank_ends_the_job_everywhere() {
    let Some(c) = up("kill_9_of_a_remote_rank_ends_the_job_everywhere", 2) else {
        return;
    };
    let hf = c.hostfile(2).unwrap();
    let mk = format!("rrmark-k9-{}", std::process::id());
    let mut cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "4",
            TESTPROG,
            "sleep",
            "120",
            &mk,
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (_to, te) = collect(&mut child);
    wait_ranks(&c, "n1", &mk, 2);
    let on_n2 = wait_ranks(&c, "n2", &mk, 2);
    let (pid, rank) = on_n2[0];
    let t0 = Instant::now();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let st = wait_timeout(&mut child, Duration::from_secs(30))
        .expect("railrun did not end after a rank was killed");
    let err = te.join().unwrap();
    assert_eq!(st.code(), Some(137), "{err}");
    assert!(
        err.contains(&format!(
            "rank {rank} on host n2 killed by signal 9 (SIGKILL)"
        )),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    assert_clean(&c);
}

#[test]
fn unreachable_host_fails_fast_naming_it() {
    let Some(c) = up("unreachable_host_fails_fast_naming_it", 1) else {
        return;
    };
    // n9 points at an address of the test range that nothing answers.
    let dir = c.dir().join("n9-test");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("ssh_config");
    std::fs::write(
        &cfg,
        format!(
            "Host n9\n  HostName 10.77.0.99\n  User root\n  IdentityFile {id}\n  StrictHostKeyChecking no\n  \
             UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n\nHost *\n  Include {inc}\n",
            id = c.dir().join("id_ed25519").display(),
            inc = c.ssh_config().display()
        ),
    )
    .unwrap();
    let hf = dir.join("hostfile");
    std::fs::write(&hf, "n1 slots=1\nn9 slots=1\n").unwrap();
    let bin = railrun_bin().to_str().unwrap().to_string();
    let ssh = format!("ssh -F {}", cfg.display());
    let mut cmd = c.exec(
        "head",
        &[
            &bin,
            "--ssh",
            &ssh,
            "--connect-timeout",
            "4",
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "2",
            TESTPROG,
            "sleep",
            "60",
        ],
    );
    cmd.stdin(Stdio::null());
    let (o, wall) = run_limited(cmd, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(err.contains("n9"), "{err}");
    assert!(!err.contains("host n1"), "blamed the wrong host: {err}");
    assert!(
        wall < Duration::from_secs(10),
        "took {wall:?} with --connect-timeout 4: {err}"
    );
    assert_clean(&c);
}

#[test]
fn program_missing_on_one_node_fails_naming_the_host() {
    let Some(c) = up("program_missing_on_one_node_fails_naming_the_host", 2) else {
        return;
    };
    // /dev/shm is private per host: the program exists on n1 only.
    let prog = format!("/dev/shm/rr-testprog-{}", std::process::id());
    let st = c.exec("n1", &["cp", TESTPROG, &prog]).status().unwrap();
    assert!(st.success());
    let hf = c.hostfile(1).unwrap();
    let mk = format!("rrmark-missing-{}", std::process::id());
    let cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "2",
            &prog,
            "sleep",
            "60",
            &mk,
        ],
    );
    let (o, wall) = run_limited(cmd, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(
        err.contains(&format!("rank 1 on host n2: cannot start {prog}")),
        "{err}"
    );
    assert!(wall < Duration::from_secs(20), "took {wall:?}");
    assert_clean(&c);
}

#[test]
fn ctrl_c_cleans_up_every_host() {
    let Some(c) = up("ctrl_c_cleans_up_every_host", 2) else {
        return;
    };
    let hf = c.hostfile(2).unwrap();
    let mk = format!("rrmark-cc-{}", std::process::id());
    let mut cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "4",
            TESTPROG,
            "sleep",
            "120",
            &mk,
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (_to, te) = collect(&mut child);
    wait_ranks(&c, "n1", &mk, 2);
    wait_ranks(&c, "n2", &mk, 2);
    // nsenter exec()s railrun: the child's pid is railrun's.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = wait_timeout(&mut child, Duration::from_secs(30))
        .expect("railrun did not stop after SIGINT");
    let err = te.join().unwrap();
    assert_eq!(st.code(), Some(130), "{err}");
    assert!(err.contains("SIGINT"), "{err}");
    assert_clean(&c);
}

#[test]
fn head_and_nodes_share_one_store() {
    let Some(c) = up("head_and_nodes_share_one_store", 1) else {
        return;
    };
    // head's ranks are railrun's children (local store), n1's go through n1's agent (relay).
    let cmd = railrun_on_head(&c, &["-H", "head:2,n1:2", "-np", "4", TESTPROG, "store"]);
    let (o, _) = run_limited(cmd, Duration::from_secs(90));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    for r in 0..4 {
        for (k, h) in [(0, "head"), (1, "head"), (2, "n1"), (3, "n1")] {
            assert!(
                out.contains(&format!(
                    "STORE rank={r} rank/{k}=hello from rank {k} on {h}"
                )),
                "{out}"
            );
        }
    }
    let cmd = railrun_on_head(
        &c,
        &["-H", "head,n1", "-np", "2", "--tag-output", TESTPROG, "env"],
    );
    let (o, _) = run_limited(cmd, Duration::from_secs(90));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
    // node 0 is head, and other nodes must be able to reach it: its name, not 127.0.0.1.
    assert!(
        out.contains("[0] MASTER_ADDR=head") && out.contains("[1] MASTER_ADDR=head"),
        "{out}"
    );
    assert!(out.contains("[1] HOST=n1"), "{out}");
    assert_clean(&c);
}

#[test]
fn railrun_killed_hard_leaves_nothing_on_the_nodes() {
    let Some(c) = up("railrun_killed_hard_leaves_nothing_on_the_nodes", 2) else {
        return;
    };
    let hf = c.hostfile(2).unwrap();
    let mk = format!("rrmark-hard-{}", std::process::id());
    let mut cmd = railrun_on_head(
        &c,
        &[
            "--hostfile",
            hf.to_str().unwrap(),
            "-np",
            "4",
            TESTPROG,
            "sleep",
            "120",
            &mk,
        ],
    );
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    wait_ranks(&c, "n1", &mk, 2);
    wait_ranks(&c, "n2", &mk, 2);
    // SIGKILL: railrun cannot clean up; its ssh processes die with it (PDEATHSIG), each agent
    // sees its SSH channel close and kills its ranks.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_clean(&c);
}
