//! Fault injection on the emulated cluster: railrun on `head` runs `rr-soak` (random checked
//! collectives) on n1 and n2 (2 ranks each, over real sshd and a veth rail), and a fault is
//! injected at a random point of the running collectives: kill -9 of a rank, of a node's agent,
//! of the ssh client to a node, of the sshd session on a node; SIGSTOP of a rank (a hang, with
//! RAILRING_TIMEOUT=10); a rail taken down and brought back (a flap: loses nothing); a node that
//! goes silent (its management link down: no RST ever comes); a host unreachable at start;
//! SIGINT / SIGTERM / SIGHUP to railrun; two jobs on the same hosts at once.
//!
//! For each: the job ends within 10 s of the fault (RAILRING_TIMEOUT + 10 s for a hang), naming
//! the rank, host and cause; no process of the job survives on any host; no `/dev/shm` segment
//! is left; no rank ever reports a wrong result. A summary table (fault, time to end, message,
//! survivors) is printed on stderr.
//!
//! The CI runs a short list once (`fault_suite_short`: 8 faults); `scripts/faults` runs every
//! fault several times at random points (`RAILRING_FAULTS=long`, `RAILRING_FAULTS_ROUNDS=N`);
//! `scripts/faults N stop` only the hang, N times (its message depends on where the rank stops),
//! `scripts/faults N flap` only the rail flap.
//! Needs root (namespaces); prints SKIPPED otherwise (and fails under CI).

use railring_tests::cluster::{Cluster, ClusterSpec};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SOAK: &str = env!("CARGO_BIN_EXE_rr-soak");

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    KillRank,
    KillAgent,
    KillSsh,
    KillSshd,
    StopRank,
    RailFlap,
    SilentNode,
    Unreachable,
    Signal(i32),
    TwoJobs,
}

impl Fault {
    fn name(&self) -> String {
        match self {
            Fault::KillRank => "kill -9 rank".into(),
            Fault::KillAgent => "kill -9 agent".into(),
            Fault::KillSsh => "kill -9 ssh client".into(),
            Fault::KillSshd => "kill -9 sshd session".into(),
            Fault::StopRank => "SIGSTOP rank (TIMEOUT=10)".into(),
            Fault::RailFlap => "rail down 2 s, up".into(),
            Fault::SilentNode => "node silent (mgmt down)".into(),
            Fault::Unreachable => "host unreachable at start".into(),
            Fault::Signal(s) => format!("{} to railrun", sig_name(*s)),
            Fault::TwoJobs => "two jobs at once".into(),
        }
    }
}

fn sig_name(s: i32) -> &'static str {
    match s {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// One row of the summary.
struct Row {
    fault: String,
    secs: f64,
    message: String,
    survivors: usize,
}

/// A railrun job on head whose output is gathered line by line while it runs.
struct Job {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Job {
    fn start(c: &Cluster, hostfile: &str, env: &[(&str, &str)], soak: &[&str]) -> Job {
        let bin = railring_tests::bins::railrun()
            .to_str()
            .unwrap()
            .to_string();
        let ssh = c.ssh_command();
        let mut argv: Vec<String> = vec![
            bin,
            "--ssh".into(),
            ssh,
            "--connect-timeout".into(),
            "5".into(),
            "--timeout".into(),
            "120".into(),
            "-np".into(),
            "4".into(),
            "--hostfile".into(),
            hostfile.into(),
            "-x".into(),
            "RAILRING_SOCKET_IFNAME=rail".into(),
        ];
        for (k, v) in env {
            argv.push("-x".into());
            argv.push(format!("{k}={v}"));
        }
        argv.push(SOAK.into());
        argv.extend(soak.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut cmd: Command = c.exec("head", &refs);
        cmd.env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURM_NODELIST")
            .env_remove("RAILRUN_SSH")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            if k.starts_with("RAILRUN_") || *k == "TMPDIR" {
                cmd.env(k, v);
            }
        }
        let mut child = cmd.spawn().expect("spawn railrun on head");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for r in [out, err] {
            let lines = lines.clone();
            readers.push(std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(l);
                }
            }));
        }
        Job {
            child,
            lines,
            readers,
        }
    }

    fn count(&self, pat: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(pat))
            .count()
    }

    /// Wait until `pat` was printed `n` times (false after `limit`, or when railrun ended).
    fn wait_for(&mut self, pat: &str, n: usize, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            if self.count(pat) >= n {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.count(pat) >= n;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Wait for railrun to end (killing it after `limit`): (exit code, when it ended, text).
    fn finish(mut self, limit: Duration) -> (Option<i32>, Instant, String) {
        let t = Instant::now();
        let code = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.code(),
                _ if t.elapsed() > limit => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let ended = Instant::now();
        for r in self.readers {
            let _ = r.join();
        }
        let text = self.lines.lock().unwrap().join("\n");
        (code, ended, text)
    }
}

/// Pids on `host` whose command line contains `pat`.
fn pids(c: &Cluster, host: &str, pat: &str) -> Vec<u32> {
    c.pids_on(host)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(pat))
        .map(|(p, _)| p)
        .collect()
}

/// The rank number of a rank process (from its environment).
fn rank_of(pid: u32) -> Option<usize> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"RAILRING_RANK="))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) on a pid we just listed.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

fn sh(c: &Cluster, host: &str, cmd: &str) {
    let st = c
        .exec(host, &["sh", "-c", cmd])
        .status()
        .expect("run a command on a host");
    assert!(st.success(), "`{cmd}` on {host} failed");
}

/// Processes of the job (agents, ranks, ssh clients) left on any host, after waiting up to
/// `wait`. sshd's own per-connection processes are not the job's: they are left out.
fn survivors(c: &Cluster, wait: Duration) -> Vec<String> {
    let deadline = Instant::now() + wait;
    loop {
        let mut left = Vec::new();
        for h in std::iter::once("head".to_string()).chain(c.host_names()) {
            for (p, cmd) in c.pids_on(&h) {
                if cmd.contains("rr-soak") || cmd.contains("railrun") || cmd.starts_with("ssh ") {
                    left.push(format!("{h}: {p} {cmd}"));
                }
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// railring segments left in any host's /dev/shm.
fn shm_left(c: &Cluster) -> Vec<String> {
    let mut left = Vec::new();
    for h in c.host_names() {
        let out = c
            .exec(&h, &["ls", "-A", "/dev/shm"])
            .output()
            .expect("ls /dev/shm");
        for f in String::from_utf8_lossy(&out.stdout).lines() {
            if f.starts_with("railring-") {
                left.push(format!("{h}:/dev/shm/{f}"));
            }
        }
    }
    left
}

/// A private temporary directory for one run: railrun and every rank get it as `TMPDIR`, so
/// anything the job leaves in a temporary directory is found there (and nothing else is).
fn job_tmpdir() -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "rr-faults-jobtmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&d).expect("job tmpdir");
    d
}

fn left_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A small random source for the injection points (seeded from the clock, printed).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// One fault, injected at a random point; returns its summary row after checking everything.
fn run_fault(c: &Cluster, hostfile: &str, fault: Fault, rng: &mut Rng) -> Row {
    let seed = 1 + rng.below(1 << 30);
    let max_count = [1000u64, 70_000, 1 << 18][rng.below(3) as usize].to_string();
    let seed_s = seed.to_string();
    let long = [
        "--seconds",
        "60",
        "--calls",
        "100000000",
        "--progress",
        "20",
    ];
    let mut soak: Vec<&str> = long.to_vec();
    soak.extend(["--seed", &seed_s, "--max-count", &max_count]);
    let tmpdir = job_tmpdir();
    let tmp_s = tmpdir.to_str().unwrap().to_string();
    let mut env: Vec<(&str, &str)> = vec![("TMPDIR", &tmp_s)];
    if fault == Fault::StopRank {
        env.push(("RAILRING_TIMEOUT", "10"));
    }
    let short = [
        "--calls",
        "400",
        "--progress",
        "20",
        "--seed",
        &seed_s,
        "--max-count",
        &max_count,
    ];
    let flap_or_two = matches!(fault, Fault::RailFlap | Fault::TwoJobs);
    if flap_or_two {
        soak = short.to_vec();
    }
    if fault == Fault::Unreachable {
        sh(c, "n2", "ip link set mgmt0 down");
    }
    let mut job = Job::start(c, hostfile, &env, &soak);
    let mut second = (fault == Fault::TwoJobs).then(|| Job::start(c, hostfile, &env, &soak));
    let what = fault.name();
    let mut t_fault = Instant::now();
    if fault != Fault::Unreachable {
        assert!(
            job.wait_for("PROGRESS", 4, Duration::from_secs(60)),
            "{what}: the job did not start: {}",
            job.lines.lock().unwrap().join("\n")
        );
        // a random point of the running collectives
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        t_fault = Instant::now();
    }
    let mut expect: Vec<String> = Vec::new();
    let mut hang = Duration::ZERO;
    let mut success = false;
    match fault {
        Fault::KillRank => {
            let host = if rng.below(2) == 0 { "n1" } else { "n2" };
            let p = pids(c, host, "rr-soak");
            let pid = p[rng.below(p.len() as u64) as usize];
            let r = rank_of(pid).expect("rank of a rank process");
            t_fault = Instant::now();
            kill(pid, libc::SIGKILL);
            expect = vec![format!("rank {r} on host {host} killed by signal 9")];
        }
        Fault::KillAgent => {
            let p = pids(c, "n1", "--agent");
            assert!(!p.is_empty(), "no agent on n1: {:?}", c.pids_on("n1"));
            kill(p[0], libc::SIGKILL);
            expect = vec!["host n1".into()];
        }
        Fault::KillSsh => {
            let p: Vec<u32> = c
                .pids_on("head")
                .into_iter()
                .filter(|(_, cmd)| cmd.starts_with("ssh ") && cmd.contains(" n2 "))
                .map(|(p, _)| p)
                .collect();
            assert!(
                !p.is_empty(),
                "no ssh to n2 on head: {:?}",
                c.pids_on("head")
            );
            kill(p[0], libc::SIGKILL);
            expect = vec!["host n2".into()];
        }
        Fault::KillSshd => {
            let p: Vec<u32> = c
                .pids_on("n2")
                .into_iter()
                .filter(|(_, cmd)| cmd.starts_with("sshd:"))
                .map(|(p, _)| p)
                .collect();
            assert!(
                !p.is_empty(),
                "no sshd session on n2: {:?}",
                c.pids_on("n2")
            );
            for pid in p {
                kill(pid, libc::SIGKILL);
            }
            expect = vec!["host n2".into()];
        }
        Fault::StopRank => {
            let p = pids(c, "n1", "rr-soak");
            let r = rank_of(p[0]).expect("rank");
            t_fault = Instant::now();
            kill(p[0], libc::SIGSTOP);
            hang = Duration::from_secs(10);
            expect = vec![
                "no progress for 10 s (RAILRING_TIMEOUT)".into(),
                format!("{r}"),
            ];
        }
        Fault::RailFlap => {
            sh(c, "n2", "ip link set rail0 down");
            std::thread::sleep(Duration::from_secs(2));
            sh(c, "n2", "ip link set rail0 up");
            success = true;
        }
        Fault::SilentNode => {
            sh(c, "n2", "ip link set mgmt0 down");
            expect = vec!["host n2".into(), "no word from railrun's agent".into()];
        }
        Fault::Unreachable => {
            expect = vec!["host n2".into()];
        }
        Fault::Signal(s) => {
            let p: Vec<u32> = c
                .pids_on("head")
                .into_iter()
                .filter(|(_, cmd)| cmd.contains("railrun") && cmd.contains("--ssh"))
                .map(|(p, _)| p)
                .collect();
            kill(p[0], s);
            expect = vec![format!("got {}", sig_name(s))];
        }
        Fault::TwoJobs => success = true,
    }
    let limit = if success {
        Duration::from_secs(110)
    } else {
        Duration::from_secs(10) + hang + Duration::from_secs(20)
    };
    let (code, ended, text) = job.finish(limit);
    let mut text = text;
    if let Some(j2) = second.take() {
        let (code2, _, text2) = j2.finish(Duration::from_secs(110));
        assert_eq!(code2, Some(0), "{what}: the second job failed:\n{text2}");
        assert_eq!(
            text2.matches("SOAK rank").count(),
            4,
            "{what}: second job:\n{text2}"
        );
        text.push_str(&text2);
    }
    if fault == Fault::SilentNode {
        // Before the link comes back: the isolated node's agent must have killed its ranks by
        // itself (the heartbeat limit, then SIGTERM and the kill grace).
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut left;
        loop {
            left = pids(c, "n2", "rr-soak");
            left.extend(pids(c, "n2", "--agent"));
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        sh(c, "n2", "ip link set mgmt0 up");
        assert!(
            left.is_empty(),
            "{what}: the isolated node kept the job's processes: {left:?}"
        );
    }
    if fault == Fault::Unreachable {
        sh(c, "n2", "ip link set mgmt0 up");
    }
    // what a failure shows: everything but the progress ticks (which would bury the error in
    // a CI log that keeps only the head and the tail), then the last ticks (where a job that
    // stalled got to)
    let ticks: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("PROGRESS rank"))
        .collect();
    let shown = text
        .lines()
        .filter(|l| !l.starts_with("PROGRESS rank"))
        .chain(ticks[ticks.len().saturating_sub(8)..].iter().copied())
        .collect::<Vec<_>>()
        .join("\n");
    let secs = ended.duration_since(t_fault).as_secs_f64();
    let left = survivors(c, Duration::from_secs(10));
    let shm = shm_left(c);
    assert!(
        !text.contains("WRONG"),
        "{what}: a rank reported a wrong result:\n{shown}"
    );
    if success {
        assert_eq!(code, Some(0), "{what}: the job failed:\n{shown}");
        assert!(text.matches("SOAK rank").count() >= 4, "{what}:\n{shown}");
    } else {
        assert!(
            code.is_some_and(|c| c != 0),
            "{what}: exit {code:?}:\n{shown}"
        );
        for e in &expect {
            assert!(
                text.contains(e.as_str()),
                "{what}: the message does not name `{e}`:\n{shown}"
            );
        }
        let bound = Duration::from_secs(10) + hang;
        assert!(
            secs <= bound.as_secs_f64(),
            "{what}: the job ended {secs:.1} s after the fault (bound {bound:?}):\n{shown}"
        );
    }
    assert!(left.is_empty(), "{what}: survivors: {left:?}\n{shown}");
    assert!(shm.is_empty(), "{what}: /dev/shm left: {shm:?}");
    // railrun's first word on the failure; for a hang, the rank's own error says the cause
    let line = if hang > Duration::ZERO {
        text.lines().find(|l| l.starts_with("ERROR after"))
    } else {
        text.lines()
            .find(|l| l.starts_with("railrun: ") && !l.contains("[n"))
    };
    let message = line
        .unwrap_or(if success {
            "(completed: every rank checked every element)"
        } else {
            ""
        })
        .trim_start_matches("railrun: ")
        .chars()
        .take(120)
        .collect();
    let tmp = left_in(&tmpdir);
    assert!(tmp.is_empty(), "{what}: temporary files left: {tmp:?}");
    let _ = std::fs::remove_dir_all(&tmpdir);
    Row {
        fault: what,
        secs: if success { 0.0 } else { secs },
        message,
        survivors: left.len(),
    }
}

fn table(rows: &[Row]) -> String {
    let mut s =
        String::from("| fault | end after fault (s) | message | survivors |\n|---|---|---|---|\n");
    for r in rows {
        let t = if r.secs == 0.0 {
            "- (completes)".to_string()
        } else {
            format!("{:.2}", r.secs)
        };
        s.push_str(&format!(
            "| {} | {t} | {} | {} |\n",
            r.fault,
            r.message.replace('|', "/"),
            r.survivors
        ));
    }
    s
}

fn suite(test: &str, faults: &[Fault], rounds: usize) {
    if !Cluster::check_or_skip(test) {
        return;
    }
    railring_tests::bins::railrun();
    let c = Cluster::up(ClusterSpec {
        hosts: 2,
        rails: 1,
        rail_rate: None,
    })
    .unwrap_or_else(|e| panic!("{test}: cluster up: {e}"));
    let hf = c.hostfile(2).unwrap();
    let hf = hf.to_str().unwrap();
    // RAILRING_FAULTS_SEED replays a printed seed (the same soak seeds, sizes and injection
    // points; the timing is the machine's)
    let seed = std::env::var("RAILRING_FAULTS_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
        | 1;
    let _ = writeln!(std::io::stderr(), "{test}: injection seed {seed}");
    let mut rng = Rng(seed);
    let mut rows = Vec::new();
    for _ in 0..rounds {
        for &f in faults {
            rows.push(run_fault(&c, hf, f, &mut rng));
        }
    }
    let t = table(&rows);
    let _ = writeln!(std::io::stderr(), "{t}");
    if let Ok(p) = std::env::var("RAILRING_FAULTS_TABLE") {
        let _ = std::fs::write(p, &t);
    }
}

/// The CI's list: one of each kind of death (rank, agent, ssh client), a hang, a rail flap, a
/// silent node (the heartbeat), a signal to railrun and two jobs at once.
#[test]
fn fault_suite_short() {
    let mode = std::env::var("RAILRING_FAULTS").unwrap_or_default();
    let rounds = std::env::var("RAILRING_FAULTS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    if mode == "stop" {
        return suite("fault_suite_stop", &[Fault::StopRank], rounds);
    }
    if mode == "flap" {
        return suite("fault_suite_flap", &[Fault::RailFlap], rounds);
    }
    if mode == "long" {
        return suite(
            "fault_suite_long",
            &[
                Fault::KillRank,
                Fault::KillAgent,
                Fault::KillSsh,
                Fault::KillSshd,
                Fault::StopRank,
                Fault::RailFlap,
                Fault::SilentNode,
                Fault::Unreachable,
                Fault::Signal(libc::SIGINT),
                Fault::Signal(libc::SIGTERM),
                Fault::Signal(libc::SIGHUP),
                Fault::TwoJobs,
            ],
            rounds,
        );
    }
    suite(
        "fault_suite_short",
        &[
            Fault::KillRank,
            Fault::KillAgent,
            Fault::KillSsh,
            Fault::StopRank,
            Fault::RailFlap,
            Fault::SilentNode,
            Fault::Signal(libc::SIGTERM),
            Fault::TwoJobs,
        ],
        1,
    );
}

/// Run `script` (sh) in a private mount namespace whose /dev/shm is a fresh tmpfs of `size`,
/// with $RAILRUN and $SOAK set; None when that needs root we do not have.
fn in_private_shm(test: &str, size: &str, script: &str) -> Option<std::process::Output> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        if std::env::var_os("CI").is_some() {
            panic!("{test}: needs root under CI");
        }
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: needs root (a private /dev/shm)"
        );
        return None;
    }
    let railrun = railring_tests::bins::railrun();
    let full = format!("mount -t tmpfs -o size={size} tmpfs /dev/shm && {script}");
    Some(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &full])
            .env("RAILRUN", railrun)
            .env("SOAK", SOAK)
            .env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURM_NODELIST")
            .stdin(Stdio::null())
            .output()
            .expect("unshare"),
    )
}

/// Defect: a small /dev/shm (Docker's 64 MiB) gave SIGBUS in the middle of a collective. Now
/// the node's first rank reserves the whole segment at init and fails with what it needs.
#[test]
fn a_small_dev_shm_is_an_error_at_init() {
    let Some(out) = in_private_shm(
        "a_small_dev_shm_is_an_error_at_init",
        "8M",
        "timeout 60 \"$RAILRUN\" -np 4 \"$SOAK\" --calls 20 --max-count 4000000; echo EXIT=$?",
    ) else {
        return;
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("EXIT=0"), "{text}");
    assert!(
        !text.contains("SIGBUS") && !text.contains("signal 7"),
        "{text}"
    );
    assert!(
        text.contains("needs") && text.contains("MiB free") && text.contains("--shm-size"),
        "{text}"
    );
}

/// Defect: segments leaked when railrun was SIGKILLed during start-up, and nothing cleaned them.
/// Now the next start on the node (and railrun's own teardown) sweeps the dead jobs' segments.
#[test]
fn railrun_killed_during_startup_leaves_nothing_after_the_next_job() {
    let script = r#"
        for d in 0.05 0.1 0.15 0.2 0.3 0.5; do
            "$RAILRUN" -np 4 "$SOAK" --calls 200 >/dev/null 2>&1 &
            pid=$!
            sleep $d
            kill -9 $pid
            wait $pid 2>/dev/null
            sleep 0.3
            echo "killed after $d s: LEFT=$(ls /dev/shm | grep -c '^railring-')"
        done
        sleep 1
        "$RAILRUN" -np 4 "$SOAK" --calls 20 >/dev/null 2>&1; echo EXIT=$?
        echo AFTER=$(ls /dev/shm | grep -c '^railring-')
    "#;
    let Some(out) = in_private_shm(
        "railrun_killed_during_startup_leaves_nothing_after_the_next_job",
        "512M",
        script,
    ) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = writeln!(std::io::stderr(), "{text}");
    assert!(
        text.contains("EXIT=0"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("AFTER=0"), "{text}");
}
