//! A real Slurm (Debian's `slurm-wlm` + `munge`) on the emulated cluster: `slurmctld` on
//! `head`, one `slurmd` per compute host (`n1`, `n2`, …), each inside its host's network, UTS
//! and mount namespaces (through [`Cluster::exec`]), so jobs run on "nodes" with their own
//! hostname, addresses, `/dev/shm` and `/etc/hosts`.
//!
//! ```text
//! head: munged (socket <dir>/slurm/munge/munge.sock, key 0400), slurmctld -D
//! nK:   slurmd -D   (NodeName=nK NodeAddr=<mgmt address>; spool, pid, log per node with %n)
//! ```
//!
//! Everything lives under `<cluster dir>/slurm/` (`slurm.conf`, `cgroup.conf`, state, spool,
//! logs) and is removed with the cluster. Commands run with `SLURM_CONF` pointing at our
//! `slurm.conf` and without any `SLURM_*`/`RAILRING_*`/torchrun variables of the calling
//! process (a test run inside a real Slurm job must not leak into the emulated one).
//!
//! Workarounds (see `shared/notes/slurm-in-namespaces.md`): hosts are entered through the
//! holder made by `ip netns exec`, which remounted `/sys` without the cgroup mounts, so
//! `cgroup.conf` says `CgroupPlugin=cgroup/v1` + `CgroupAutomount=no` (with
//! `proctrack/linuxproc` and `task/none` no cgroup is touched); the munge socket's directory is
//! 0755; `SlurmdParameters=config_overrides` lets every node claim the same CPUs on one small
//! machine. [`Slurm::up`] returns once `sinfo -N` shows every node idle.
//!
//! Teardown ([`Slurm::down`], also on `Drop`): SIGKILL the daemons we started and reap them,
//! then tear the cluster down (which kills whatever is left in its namespaces: slurmstepd,
//! tasks, munged).

use crate::cluster::{Cluster, ClusterSpec, HEAD};
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Programs a Slurm test needs on `$PATH`.
pub const TOOLS: &[&str] = &[
    "munged",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "salloc",
    "sinfo",
    "scontrol",
    "scancel",
];
/// How long [`Slurm::up`] waits for every node to be idle.
pub const IDLE_WAIT: Duration = Duration::from_secs(30);

fn is_ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false")),
        Err(_) => false,
    }
}

/// `name` in `$PATH` or the sbin directories (Debian puts the daemons in /usr/sbin).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/sbin", "/sbin", "/usr/local/sbin"]
                .iter()
                .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Output of a command run with a deadline.
#[derive(Debug)]
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub elapsed: Duration,
}

impl Ran {
    pub fn success(&self) -> bool {
        self.status.map(|s| s.success()).unwrap_or(false)
    }
    /// Everything, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status {:?}{} after {:.1} s\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            if self.timed_out {
                " (TIMED OUT, killed)"
            } else {
                ""
            },
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// Run `cmd` (stdin null, output captured) and kill it after `timeout`.
pub fn run_timeout(mut cmd: Command, timeout: Duration) -> Result<Ran, String> {
    let t0 = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let (out, err) = crate::proc::collect(&mut child);
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if t0.elapsed() >= timeout => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    };
    // A grandchild may hold the pipes open after a kill: don't wait for it forever.
    let join = |h: std::thread::JoinHandle<String>| {
        let until = Instant::now() + Duration::from_secs(5);
        while !h.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        if h.is_finished() {
            h.join().unwrap_or_default()
        } else {
            "<output still open after 5 s>".to_string()
        }
    };
    Ok(Ran {
        status,
        stdout: join(out),
        stderr: join(err),
        timed_out,
        elapsed: t0.elapsed(),
    })
}

/// A running Slurm on an emulated cluster; torn down on drop.
pub struct Slurm {
    cluster: Cluster,
    dir: PathBuf,
    conf: PathBuf,
    daemons: Mutex<Vec<(String, Child)>>,
}

/// Variables of the calling process never passed to Slurm commands.
fn scrubbed(k: &OsStr) -> bool {
    let k = k.to_string_lossy();
    k.starts_with("SLURM_")
        || k.starts_with("SBATCH_")
        || k.starts_with("SALLOC_")
        || k.starts_with("SRUN_")
        || k.starts_with("RAILRING_")
        || k.starts_with("RAILRUN_")
        || k.starts_with("TORCHELASTIC_")
        || [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ]
        .contains(&k.as_ref())
}

impl Slurm {
    /// Ok if Slurm can run here (the emulated cluster can, and the tools are installed).
    pub fn available() -> Result<(), String> {
        Cluster::available()?;
        let missing: Vec<&str> = TOOLS
            .iter()
            .copied()
            .filter(|t| which(t).is_none())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "missing {} (apt-get install slurm-wlm munge)",
                missing.join(", ")
            ))
        }
    }

    /// For tests: `true` when Slurm can be used; otherwise prints `SKIPPED: <test>: <why>` and
    /// returns false, or panics when `CI` is set.
    pub fn check_or_skip(test: &str) -> bool {
        match Self::available() {
            Ok(()) => true,
            Err(why) if is_ci() => {
                panic!("{test}: Slurm on the emulated cluster unavailable under CI: {why}")
            }
            Err(why) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: {test}: Slurm on the emulated cluster unavailable: {why}"
                );
                false
            }
        }
    }

    /// Build a cluster and start munged, slurmctld and one slurmd per compute host; returns when
    /// every node is idle. `cpus` is what each node claims (CR_CPU scheduling).
    pub fn up(spec: ClusterSpec, cpus: usize) -> Result<Slurm, String> {
        Self::available()?;
        let cluster = Cluster::up(spec)?;
        let dir = cluster.dir().join("slurm");
        let conf = dir.join("slurm.conf");
        let s = Slurm {
            cluster,
            dir,
            conf,
            daemons: Mutex::new(Vec::new()),
        };
        // On error `s` drops here: daemons killed, cluster torn down.
        s.start(cpus)?;
        Ok(s)
    }

    fn start(&self, cpus: usize) -> Result<(), String> {
        let d = &self.dir;
        let mk = |p: &Path, mode: u32| -> Result<(), String> {
            fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
            fs::set_permissions(p, fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", p.display()))
        };
        mk(d, 0o755)?;
        for sub in ["munge", "state", "log"] {
            mk(&d.join(sub), 0o755)?;
        }
        let hosts = self.cluster.host_names();
        for h in &hosts {
            mk(&d.join(format!("spool-{h}")), 0o755)?;
        }
        // munge: a fresh key, 0400.
        let key = d.join("munge.key");
        let mut k = [0u8; 1024];
        fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut k))
            .map_err(|e| format!("/dev/urandom: {e}"))?;
        fs::write(&key, k).map_err(|e| format!("write {}: {e}", key.display()))?;
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400))
            .map_err(|e| format!("chmod munge key: {e}"))?;
        let sock = d.join("munge/munge.sock");

        let mut nodes = String::new();
        for h in &hosts {
            nodes.push_str(&format!(
                "NodeName={h} NodeAddr={} CPUs={cpus} State=UNKNOWN\n",
                self.cluster.mgmt_addr(h)
            ));
        }
        let p = |x: &str| d.join(x).display().to_string();
        let conf = format!(
            "# written by railring_tests::slurm\n\
             ClusterName=rrtest\n\
             SlurmctldHost={HEAD}({head_addr})\n\
             SlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={sock}\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctldpid}\nSlurmdPidFile={dpid}\n\
             SlurmctldLogFile={ctldlog}\nSlurmdLogFile={dlog}\n\
             SlurmctldDebug=info\nSlurmdDebug=info\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n\
             MpiDefault=none\nSwitchType=switch/none\nReturnToService=2\n\
             SchedulerType=sched/backfill\n\
             AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\n\
             SlurmdParameters=config_overrides\n\
             InactiveLimit=0\nKillWait=2\nMinJobAge=300\nMessageTimeout=10\n\
             {nodes}\
             PartitionName=rr Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP\n",
            head_addr = self.cluster.mgmt_addr(HEAD),
            sock = sock.display(),
            state = p("state"),
            spool = p("spool-%n"),
            ctldpid = p("slurmctld.pid"),
            dpid = p("slurmd-%n.pid"),
            ctldlog = p("log/slurmctld.log"),
            dlog = p("log/slurmd-%n.log"),
            nodelist = hosts.join(","),
        );
        fs::write(&self.conf, conf).map_err(|e| format!("write slurm.conf: {e}"))?;
        fs::write(
            d.join("cgroup.conf"),
            "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n",
        )
        .map_err(|e| format!("write cgroup.conf: {e}"))?;

        let munged = which("munged").ok_or("munged not found")?;
        self.spawn_daemon(
            HEAD,
            "munged",
            &[
                munged.display().to_string(),
                "--foreground".into(),
                "--force".into(),
                format!("--socket={}", sock.display()),
                format!("--key-file={}", key.display()),
                format!("--pid-file={}", p("munge/munged.pid")),
                format!("--log-file={}", p("log/munged.log")),
                format!("--seed-file={}", p("munge/munged.seed")),
            ],
        )?;
        let until = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            if Instant::now() >= until {
                return Err(format!(
                    "munged did not create {} within 10 s\n{}",
                    sock.display(),
                    self.logs()
                ));
            }
            self.check_daemons()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        let ctld = which("slurmctld").ok_or("slurmctld not found")?;
        let conf = self.conf.display().to_string();
        self.spawn_daemon(
            HEAD,
            "slurmctld",
            &[
                ctld.display().to_string(),
                "-D".into(),
                "-i".into(),
                "-f".into(),
                conf.clone(),
            ],
        )?;
        let slurmd = which("slurmd").ok_or("slurmd not found")?;
        for h in &hosts {
            self.spawn_daemon(
                h,
                &format!("slurmd-{h}"),
                &[
                    slurmd.display().to_string(),
                    "-D".into(),
                    "-f".into(),
                    conf.clone(),
                ],
            )?;
        }
        self.wait_idle(IDLE_WAIT)
    }

    fn spawn_daemon(&self, host: &str, name: &str, argv: &[String]) -> Result<(), String> {
        let log = self.dir.join(format!("log/{name}.out"));
        let f = fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let f2 = f.try_clone().map_err(|e| e.to_string())?;
        let mut c = self.cluster.exec_os(host, argv);
        self.scrub(&mut c);
        c.stdin(Stdio::null()).stdout(f).stderr(f2);
        let child = c
            .spawn()
            .map_err(|e| format!("start {name} on {host}: {e}"))?;
        self.daemons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), child));
        Ok(())
    }

    /// Err if one of our daemons has exited.
    fn check_daemons(&self) -> Result<(), String> {
        let dead = {
            let mut g = self.daemons.lock().unwrap_or_else(|e| e.into_inner());
            g.iter_mut()
                .find_map(|(name, child)| match child.try_wait() {
                    Ok(Some(st)) => Some(format!("{name} exited ({st})")),
                    _ => None,
                })
        };
        match dead {
            Some(d) => Err(format!("{d}\n{}", self.logs())),
            None => Ok(()),
        }
    }

    fn scrub(&self, c: &mut Command) {
        for (k, _) in std::env::vars_os() {
            if scrubbed(&k) {
                c.env_remove(&k);
            }
        }
        c.env("SLURM_CONF", &self.conf);
    }

    /// Wait until `sinfo -N` shows every node idle.
    pub fn wait_idle(&self, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        let want = self.cluster.host_names().len();
        loop {
            self.check_daemons()?;
            let r = run_timeout(
                self.cmd(HEAD, &["sinfo", "-N", "-h", "-o", "%N %t"]),
                Duration::from_secs(10),
            )?;
            let last = format!("{}{}", r.stdout, r.stderr);
            let idle = r
                .stdout
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("idle"))
                .count();
            if r.success() && idle == want {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "nodes not idle within {:.0} s; sinfo said: {last}\n{}",
                    timeout.as_secs_f64(),
                    self.logs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A command on `host` (in its namespaces) with our `SLURM_CONF` and a clean environment.
    pub fn cmd<S: AsRef<OsStr>>(&self, host: &str, argv: &[S]) -> Command {
        let mut c = self.cluster.exec_os(host, argv);
        self.scrub(&mut c);
        c
    }

    /// `cmd` run to completion with a deadline.
    pub fn run<S: AsRef<OsStr>>(
        &self,
        host: &str,
        argv: &[S],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Ran, String> {
        let mut c = self.cmd(host, argv);
        for (k, v) in env {
            c.env(k, v);
        }
        run_timeout(c, timeout)
    }

    /// `sbatch --parsable ARGS...` on `host`: the job id.
    pub fn sbatch<S: AsRef<OsStr>>(
        &self,
        host: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Result<u32, String> {
        let mut argv: Vec<&OsStr> = vec![OsStr::new("sbatch"), OsStr::new("--parsable")];
        argv.extend(args.iter().map(|a| a.as_ref()));
        let r = self.run(host, &argv, env, Duration::from_secs(20))?;
        if !r.success() {
            return Err(format!("sbatch failed: {}", r.describe()));
        }
        let id = r.stdout.trim().split(';').next().unwrap_or("");
        id.parse()
            .map_err(|_| format!("sbatch printed `{}`, expected a job id", r.stdout.trim()))
    }

    /// Poll `scontrol show job` until the job has ended: its final `JobState` and `ExitCode`
    /// (e.g. `("COMPLETED", "0:0")`). Err after `timeout` (the job is then cancelled).
    pub fn wait_job(&self, id: u32, timeout: Duration) -> Result<(String, String), String> {
        const ENDED: &[&str] = &[
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "PREEMPTED",
            "BOOT_FAIL",
            "DEADLINE",
        ];
        let until = Instant::now() + timeout;
        let idstr = id.to_string();
        let mut last = String::new();
        while Instant::now() < until {
            let r = run_timeout(
                self.cmd(HEAD, &["scontrol", "show", "job", "-o", &idstr]),
                Duration::from_secs(10),
            )?;
            last = r.stdout.clone() + &r.stderr;
            let field = |k: &str| {
                r.stdout
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(String::from)
                    .unwrap_or_default()
            };
            let state = field("JobState=");
            if ENDED.contains(&state.as_str()) {
                return Ok((state, field("ExitCode=")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = run_timeout(
            self.cmd(HEAD, &["scancel", &idstr]),
            Duration::from_secs(10),
        );
        Err(format!(
            "job {id} did not end within {:.0} s; last: {last}\n{}",
            timeout.as_secs_f64(),
            self.logs()
        ))
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// `<cluster dir>/slurm`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The last lines of every daemon log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let Ok(rd) = fs::read_dir(self.dir.join("log")) else {
            return out;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            let text = fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out.push_str(&format!(
                "--- {} (last {} lines) ---\n{}\n",
                f.display(),
                tail.len(),
                tail.join("\n")
            ));
        }
        out
    }

    /// Kill our daemons (SIGKILL, reaped), then tear the cluster down. Idempotent.
    pub fn down(&self) -> Result<(), String> {
        let mut g = self.daemons.lock().unwrap_or_else(|e| e.into_inner());
        for (_, child) in g.iter_mut() {
            let _ = child.kill();
        }
        for (_, mut child) in g.drain(..) {
            let _ = child.wait();
        }
        drop(g);
        self.cluster.down()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("slurm harness: {e}");
        }
    }
}
