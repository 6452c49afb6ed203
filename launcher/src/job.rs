//! A railrun job from start to end: placement, the bootstrap store, local ranks, one SSH agent
//! per remote node, output, and the lifecycle rules (first failure ends the job everywhere,
//! signals, `--timeout`, no survivors).

use crate::cli::{DryRun, RunOpts};
use crate::host_source;
use crate::placement::{self, Placement, PlacementRequest};
use crate::proto::{self, ExitKind, FrameWriter, JobSpec, Msg, RankSpec, Stream};
use crate::spawn::{self, Launch, RankEvents};
use crate::stdio::Sink;
use railring::bootstrap::store::{self, Backend, Store};
use railring::bootstrap::wire::{Request, Response};
use std::collections::VecDeque;
use std::io::{BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Exit code when a bad host source or placement stops the job before it starts.
pub const EXIT_CONFIG: i32 = 1;
/// Exit code for a bad command line.
pub const EXIT_USAGE: i32 = 2;
/// Exit code after `--timeout`.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit code when the program cannot be found or started.
pub const EXIT_NOT_STARTED: i32 = 127;
/// Exit code when a node's agent cannot be reached or is lost.
pub const EXIT_AGENT: i32 = 255;

/// Default grace between SIGTERM and SIGKILL (env `RAILRUN_KILL_GRACE`, seconds).
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(3);

static SIGNALLED: AtomicI32 = AtomicI32::new(0);
static SIGNAL_COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

fn install_signal_handlers() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let sa = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only touches atomics.
        let _ = unsafe { sigaction(s, &sa) };
    }
}

/// Find the program: a name with a `/` is used as is (made absolute); otherwise `$PATH`, then
/// the directory holding the railrun executable.
pub fn resolve_program(name: &str) -> Result<PathBuf, String> {
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    if name.contains('/') {
        return Ok(cwd.join(name).components().collect());
    }
    let is_exec = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let dir = if dir.as_os_str().is_empty() {
                cwd.clone()
            } else {
                cwd.join(dir)
            };
            let c = dir.join(name);
            if is_exec(&c) {
                return Ok(c.components().collect());
            }
        }
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    if let Some(d) = &exe_dir {
        let c = d.join(name);
        if is_exec(&c) {
            return Ok(c);
        }
    }
    Err(format!(
        "program `{name}` not found: not in $PATH{} (give a path with a `/` to run a program from elsewhere)",
        exe_dir.map(|d| format!(" nor next to railrun in {}", d.display())).unwrap_or_default()
    ))
}

/// How railrun starts the agent of a remote node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentLauncher {
    /// `ssh [opts] HOST 'exec railrun --agent'` (`--ssh` / `RAILRUN_SSH`).
    Ssh,
    /// `srun --nodes=1 --ntasks=1 --nodelist=HOST --overlap ... railrun --agent`, a one-task job
    /// step of the current Slurm allocation on that node (this srun binary).
    Srun(PathBuf),
}

/// Is a Slurm node list in the environment (what makes the host source the allocation when
/// neither `--hostfile` nor `-H` is given; see [`host_source::resolve_hosts`])?
pub fn slurm_nodelist_set(env: &dyn Fn(&str) -> Option<String>) -> bool {
    ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .iter()
        .any(|v| env(v).is_some_and(|s| !s.trim().is_empty()))
}

/// `name` in `$PATH` (an executable regular file), as an absolute path.
pub fn find_in_path(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = env("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|c| {
            std::fs::metadata(c)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Choose how to start remote agents. `RAILRUN_LAUNCHER=ssh|srun` decides when set; otherwise
/// srun when the hosts come from the Slurm allocation (`slurm_hosts`), the allocation is ours
/// (`SLURM_JOB_ID`), `srun` is on `$PATH` and no `--ssh` was given on the command line; else ssh.
pub fn choose_agent_launcher(
    slurm_hosts: bool,
    ssh_flag: bool,
    env: &dyn Fn(&str) -> Option<String>,
    find: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<AgentLauncher, String> {
    let in_allocation = env("SLURM_JOB_ID").is_some_and(|s| !s.trim().is_empty());
    match env("RAILRUN_LAUNCHER")
        .map(|s| s.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("auto") => {
            if slurm_hosts && in_allocation && !ssh_flag {
                if let Some(p) = find("srun") {
                    return Ok(AgentLauncher::Srun(p));
                }
            }
            Ok(AgentLauncher::Ssh)
        }
        Some("ssh") => Ok(AgentLauncher::Ssh),
        Some("srun") => {
            if !in_allocation {
                return Err("RAILRUN_LAUNCHER=srun: not inside a Slurm allocation (SLURM_JOB_ID is not set); \
                            run railrun from salloc or sbatch, or use RAILRUN_LAUNCHER=ssh"
                    .into());
            }
            find("srun")
                .map(AgentLauncher::Srun)
                .ok_or_else(|| "RAILRUN_LAUNCHER=srun: `srun` is not in $PATH".to_string())
        }
        Some(_) => Err(format!(
            "RAILRUN_LAUNCHER=`{}`: expected ssh, srun or auto",
            env("RAILRUN_LAUNCHER")
                .unwrap_or_default()
                .chars()
                .take(64)
                .collect::<String>()
        )),
    }
}

/// The command line that starts one node's agent. For ssh: the remote shell words, batch mode,
/// the connect timeout, `[user@]host` and `exec AGENT --agent`. For srun (Slurm 22.05 or later,
/// for `--overlap` sharing every resource): a one-task step on that node, unbuffered so the
/// binary frames flow as written (22.05 gives the task a raw pty for stdout; stdin stays a
/// pipe), not bound to CPUs, without MPI setup, killed with the step on a bad exit.
pub fn agent_argv(
    launcher: &AgentLauncher,
    ssh: &[String],
    connect_timeout: Duration,
    user: Option<&str>,
    host: &str,
    agent_path: &str,
    verbose: u8,
) -> Vec<String> {
    match launcher {
        AgentLauncher::Ssh => {
            let mut remote_cmd = format!("exec {} --agent", crate::cli::shell_quote(agent_path));
            if verbose > 1 {
                remote_cmd.push_str(" -v");
            }
            let target = match user {
                Some(u) => format!("{u}@{host}"),
                None => host.to_string(),
            };
            let mut v: Vec<String> = ssh.to_vec();
            if v.is_empty() {
                v.push("ssh".into());
            }
            v.extend([
                "-o".into(),
                "BatchMode=yes".into(),
                "-o".into(),
                format!("ConnectTimeout={}", connect_timeout.as_secs().max(1)),
                target,
                remote_cmd,
            ]);
            v
        }
        AgentLauncher::Srun(srun) => {
            let mut v: Vec<String> = vec![
                srun.to_string_lossy().into_owned(),
                "--nodes=1".into(),
                "--ntasks=1".into(),
                "--ntasks-per-node=1".into(),
                format!("--nodelist={host}"),
                "--overlap".into(),
                "--export=ALL".into(),
                "--kill-on-bad-exit=1".into(),
                "--unbuffered".into(),
                "--cpu-bind=none".into(),
                "--mpi=none".into(),
                "--job-name=railrun-agent".into(),
                agent_path.to_string(),
                "--agent".into(),
            ];
            if verbose > 1 {
                v.push("-v".into());
            }
            v
        }
    }
}

/// A short unique job id, `[a-z0-9]{10}`.
pub fn new_job_id() -> String {
    let mut b = [0u8; 10];
    if railring::bootstrap::auth::random_bytes(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let x = t ^ ((std::process::id() as u128) << 64);
        for (i, v) in b.iter_mut().enumerate() {
            *v = (x >> (i * 8)) as u8;
        }
    }
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    b.iter().map(|x| A[*x as usize % A.len()] as char).collect()
}

fn kill_grace() -> Duration {
    match std::env::var("RAILRUN_KILL_GRACE") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Duration::from_secs_f64(s),
            _ => {
                eprintln!("railrun: RAILRUN_KILL_GRACE=`{v}` is not a number of seconds (0..3600); using 3");
                DEFAULT_KILL_GRACE
            }
        },
        Err(_) => DEFAULT_KILL_GRACE,
    }
}

/// `railrun [options] PROGRAM ...`: returns the exit code.
pub fn run(opts: &RunOpts) -> i32 {
    let env = |k: &str| std::env::var(k).ok();
    let src =
        match host_source::resolve_hosts(opts.hostfile.as_deref(), opts.hosts.as_deref(), &env) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("railrun: {e}");
                return EXIT_CONFIG;
            }
        };
    let req = PlacementRequest {
        np: opts.np,
        ppn: opts.ppn,
        map_by: opts.map_by,
        oversubscribe: opts.oversubscribe,
    };
    let pl = match placement::place(&src, &req) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("railrun: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Some(d) = opts.dry_run {
        let mut out = match d {
            DryRun::Table => pl.table(),
            DryRun::Json => pl.to_json(),
        };
        if !out.ends_with('\n') {
            out.push('\n');
        }
        if opts.report_bindings && d == DryRun::Table {
            out.push_str(&report_bindings(&pl, opts.bind_to));
        }
        let _ = std::io::stdout().write_all(out.as_bytes());
        let _ = std::io::stdout().flush();
        return 0;
    }
    if opts.report_bindings {
        eprint!("{}", report_bindings(&pl, opts.bind_to));
    }
    let program = match resolve_program(&opts.program) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("railrun: {e}");
            return EXIT_NOT_STARTED;
        }
    };
    let sink = match &opts.output_dir {
        Some(d) => match Sink::dir(d, pl.np(), opts.tag_output) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("railrun: {e}");
                return EXIT_CONFIG;
            }
        },
        None => Sink::terminal(opts.tag_output),
    };
    let mut job = match Job::new(opts, pl, program, Arc::new(sink)) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("railrun: {e}");
            return EXIT_CONFIG;
        }
    };
    job.run()
}

/// One node of the job.
struct Node {
    host: String,
    user: Option<String>,
    local: bool,
    ranks: Vec<usize>,
    /// Index into `Job::agents` for remote nodes.
    agent: Option<usize>,
}

/// What railrun's threads tell the main thread.
enum Ev {
    Hello {
        agent: usize,
        hostname: String,
        pid: u32,
        free_port: u16,
        version: String,
    },
    Started {
        agent: usize,
        pids: Vec<(u32, u32)>,
    },
    Exited {
        rank: u32,
        exit: ExitKind,
        from: Option<usize>,
    },
    SpawnFailed {
        rank: u32,
        error: String,
        from: Option<usize>,
    },
    AgentBye {
        agent: usize,
    },
    AgentGone {
        agent: usize,
        why: String,
    },
}

#[derive(Default)]
struct StderrLog {
    lines: VecDeque<String>,
    forward: bool,
    done: bool,
}

/// The SSH connection to one node's agent.
struct Agent {
    node: usize,
    host: String,
    child: Child,
    writer: Arc<FrameWriter<ChildStdin>>,
    stderr: Arc<Mutex<StderrLog>>,
    hello: Option<(String, u32, u16)>,
    spawned: bool,
    gone: bool,
    bye: bool,
    reaped: bool,
}

#[derive(Clone)]
struct RankState {
    node: usize,
    pid: Option<u32>,
    done: bool,
}

struct LocalEvents {
    sink: Arc<Sink>,
    tx: Mutex<mpsc::Sender<Ev>>,
}

impl RankEvents for LocalEvents {
    fn output(&self, rank: u32, stream: Stream, line: &[u8]) {
        self.sink.line(rank, stream, line);
    }
    fn exited(&self, rank: u32, exit: ExitKind) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Ev::Exited {
                rank,
                exit,
                from: None,
            });
    }
}

/// Why the job ends early: printed once, decides the exit code.
struct Failure {
    code: i32,
}

struct Job<'a> {
    opts: &'a RunOpts,
    pl: Placement,
    program: PathBuf,
    sink: Arc<Sink>,
    nodes: Vec<Node>,
    agents: Vec<Agent>,
    ranks: Vec<RankState>,
    tx: mpsc::Sender<Ev>,
    rx: mpsc::Receiver<Ev>,
    store: Arc<Store>,
    secret: String,
    job_id: String,
    grace: Duration,
    start: Instant,
    failure: Option<Failure>,
    kill_started: Option<Instant>,
    kill_hard: bool,
    stdin_target: Option<StdinTarget>,
    _server: Option<store::ServerHandle>,
}

enum StdinTarget {
    Local(ChildStdin),
    Remote(Arc<FrameWriter<ChildStdin>>),
}

impl<'a> Job<'a> {
    fn new(
        opts: &'a RunOpts,
        pl: Placement,
        program: PathBuf,
        sink: Arc<Sink>,
    ) -> Result<Job<'a>, String> {
        let mut nodes: Vec<Node> = pl
            .hosts
            .iter()
            .map(|h| Node {
                host: h.clone(),
                user: None,
                local: host_source::is_local(h),
                ranks: Vec::new(),
                agent: None,
            })
            .collect();
        let mut ranks = Vec::with_capacity(pl.np());
        for r in &pl.ranks {
            let Some(n) = nodes.get_mut(r.node_rank) else {
                return Err(format!(
                    "placement: rank {} has node_rank {} of {}",
                    r.rank,
                    r.node_rank,
                    pl.hosts.len()
                ));
            };
            n.ranks.push(r.rank);
            if n.user.is_none() {
                n.user = r.user.clone();
            }
            ranks.push(RankState {
                node: r.node_rank,
                pid: None,
                done: false,
            });
        }
        let secret = railring::bootstrap::auth::new_secret()
            .map_err(|e| format!("cannot create the job secret: {e}"))?;
        let (tx, rx) = mpsc::channel();
        Ok(Job {
            opts,
            pl,
            program,
            sink,
            nodes,
            agents: Vec::new(),
            ranks,
            tx,
            rx,
            store: Store::new(),
            secret,
            job_id: new_job_id(),
            grace: kill_grace(),
            start: Instant::now(),
            failure: None,
            kill_started: None,
            kill_hard: false,
            stdin_target: None,
            _server: None,
        })
    }

    fn vlog(&self, msg: &str) {
        if self.opts.verbose > 0 {
            self.sink.message(&format!("railrun: {msg}"));
        }
    }

    fn say(&self, msg: &str) {
        self.sink.message(&format!("railrun: {msg}"));
    }

    fn host_of(&self, rank: usize) -> &str {
        self.pl
            .ranks
            .get(rank)
            .map(|r| r.host.as_str())
            .unwrap_or("?")
    }

    fn live_ranks(&self) -> usize {
        self.ranks.iter().filter(|r| !r.done).count()
    }

    fn all_done(&self) -> bool {
        self.ranks.iter().all(|r| r.done)
    }

    fn run(&mut self) -> i32 {
        install_signal_handlers();
        spawn::become_subreaper();
        self.vlog(&format!(
            "job {}: {} rank(s) on {} node(s), program {}",
            self.job_id,
            self.pl.np(),
            self.pl.nnodes(),
            self.program.display()
        ));
        if self.nodes.iter().any(|n| !n.local) && !self.connect_agents() {
            self.teardown();
            return self.failure.as_ref().map(|f| f.code).unwrap_or(EXIT_AGENT);
        }
        self.launch();
        self.event_loop();
        self.teardown();
        match &self.failure {
            Some(f) => f.code,
            None => 0,
        }
    }

    /// Record the first failure, say why, and start killing the job.
    fn fail(&mut self, code: i32, msg: String) {
        if self.failure.is_some() || self.kill_started.is_some() {
            return;
        }
        self.say(&msg);
        self.failure = Some(Failure { code });
        self.start_kill();
    }

    fn start_kill(&mut self) {
        if self.kill_started.is_some() {
            return;
        }
        self.kill_started = Some(Instant::now());
        let n = self.live_ranks();
        if n > 0 {
            self.vlog(&format!(
                "sending SIGTERM to {n} remaining rank(s); SIGKILL after {:.1} s",
                self.grace.as_secs_f64()
            ));
        }
        self.signal_all(libc::SIGTERM);
    }

    fn signal_all(&mut self, sig: i32) {
        for r in &self.ranks {
            if let (false, Some(pid)) = (r.done, r.pid) {
                spawn::kill_group(pid, sig);
            }
        }
        for a in &self.agents {
            if a.spawned && !a.gone {
                let _ = a.writer.send(&Msg::Kill { signal: sig });
            }
        }
    }

    // ---------------------------------------------------------------- agents

    fn ssh_argv(&self) -> Result<Vec<String>, String> {
        let cmd = match (
            &self.opts.ssh,
            std::env::var("RAILRUN_SSH")
                .ok()
                .filter(|s| !s.trim().is_empty()),
        ) {
            (Some(s), _) => s.clone(),
            (None, Some(s)) => s,
            (None, None) => "ssh".to_string(),
        };
        crate::cli::split_words(&cmd).map_err(|e| e.to_string())
    }

    fn agent_path(&self) -> Result<String, String> {
        if let Some(p) = &self.opts.launch_agent {
            return Ok(p.clone());
        }
        let exe = std::env::current_exe().map_err(|e| {
            format!("cannot find railrun's own path for the remote agent (use --launch-agent): {e}")
        })?;
        exe.to_str().map(String::from).ok_or_else(|| {
            format!(
                "railrun's path {} is not UTF-8 (use --launch-agent)",
                exe.display()
            )
        })
    }

    /// Start one agent per remote node (over ssh, or `srun` inside a Slurm allocation), in
    /// parallel, and wait for every agent's Hello.
    /// False when the job cannot go on (the failure is recorded and reported).
    fn connect_agents(&mut self) -> bool {
        let env = |k: &str| std::env::var(k).ok();
        let slurm_hosts =
            self.opts.hostfile.is_none() && self.opts.hosts.is_none() && slurm_nodelist_set(&env);
        let launcher =
            match choose_agent_launcher(slurm_hosts, self.opts.ssh.is_some(), &env, &|n: &str| {
                find_in_path(n, &env)
            }) {
                Ok(l) => l,
                Err(e) => {
                    self.say(&e);
                    self.failure = Some(Failure { code: EXIT_CONFIG });
                    return false;
                }
            };
        let ssh = match &launcher {
            AgentLauncher::Ssh => self.ssh_argv(),
            AgentLauncher::Srun(_) => Ok(Vec::new()),
        };
        let (ssh, agent_path) = match (ssh, self.agent_path()) {
            (Ok(s), Ok(p)) => (s, p),
            (Err(e), _) | (_, Err(e)) => {
                self.say(&e);
                self.failure = Some(Failure { code: EXIT_CONFIG });
                return false;
            }
        };
        let ct = self.opts.connect_timeout;
        if let AgentLauncher::Srun(p) = &launcher {
            self.vlog(&format!(
                "starting the agents with {} (Slurm allocation {})",
                p.display(),
                env("SLURM_JOB_ID").unwrap_or_default()
            ));
        }
        for ni in 0..self.nodes.len() {
            if self.nodes[ni].local {
                continue;
            }
            let node = &self.nodes[ni];
            let argv = agent_argv(
                &launcher,
                &ssh,
                ct,
                node.user.as_deref(),
                &node.host,
                &agent_path,
                self.opts.verbose,
            );
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // SAFETY: async-signal-safe calls only. Own session: a Ctrl-C on the terminal reaches
            // railrun alone, which then stops the job in order. PDEATHSIG: if railrun dies, ssh
            // dies, the agent sees its stdin close and kills its ranks.
            unsafe {
                let parent = libc::getpid();
                cmd.pre_exec(move || {
                    libc::setsid();
                    libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    );
                    if libc::getppid() != parent {
                        libc::_exit(137);
                    }
                    Ok(())
                });
            }
            if self.opts.verbose > 0 {
                let shown: Vec<String> = std::iter::once(cmd.get_program())
                    .chain(cmd.get_args())
                    .map(|a| crate::cli::shell_quote(&a.to_string_lossy()))
                    .collect();
                self.vlog(&shown.join(" "));
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    self.fail(
                        EXIT_AGENT,
                        format!(
                            "cannot run the remote shell `{}` for host {}: {e}",
                            argv[0], node.host
                        ),
                    );
                    return false;
                }
            };
            let ai = self.agents.len();
            let host = node.host.clone();
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                self.fail(
                    EXIT_AGENT,
                    format!("host {host}: ssh started without its pipes"),
                );
                return false;
            };
            let writer = Arc::new(FrameWriter::new(stdin));
            let log = Arc::new(Mutex::new(StderrLog::default()));
            self.spawn_agent_stderr(ai, host.clone(), stderr, log.clone());
            self.spawn_agent_reader(ai, ni, stdout, writer.clone());
            self.agents.push(Agent {
                node: ni,
                host,
                child,
                writer,
                stderr: log,
                hello: None,
                spawned: false,
                gone: false,
                bye: false,
                reaped: false,
            });
            self.nodes[ni].agent = Some(ai);
        }
        // Wait for every Hello: ssh's own ConnectTimeout covers the TCP connect; this deadline
        // covers everything (authentication, a hung remote shell).
        let deadline = Instant::now() + ct + Duration::from_millis(500);
        while self.agents.iter().any(|a| a.hello.is_none()) {
            if let Some(code) = self.check_signal_or_timeout() {
                let _ = code;
                return false;
            }
            if Instant::now() >= deadline {
                let slow: Vec<usize> = (0..self.agents.len())
                    .filter(|&i| self.agents[i].hello.is_none())
                    .collect();
                let i = slow[0];
                let tail = self.stderr_tail(i, Duration::from_millis(0));
                let more = if slow.len() > 1 {
                    format!(" (and {} more host(s))", slow.len() - 1)
                } else {
                    String::new()
                };
                self.fail(
                    EXIT_AGENT,
                    format!(
                        "host {}{more}: no answer from railrun's agent within {:.0} s (--connect-timeout){}",
                        self.agents[i].host,
                        ct.as_secs_f64(),
                        if tail.is_empty() { "; ssh printed nothing".to_string() } else { format!("; ssh said: {tail}") }
                    ),
                );
                return false;
            }
            match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Ev::Hello {
                    agent,
                    hostname,
                    pid,
                    free_port,
                    version,
                }) => {
                    self.vlog(&format!(
                        "agent on {} (hostname {hostname}, pid {pid}) is up",
                        self.agents[agent].host
                    ));
                    if version != env!("CARGO_PKG_VERSION") {
                        self.say(&format!(
                            "warning: the agent on host {} is railrun {version}, this is railrun {} (see --launch-agent)",
                            self.agents[agent].host,
                            env!("CARGO_PKG_VERSION")
                        ));
                    }
                    self.agents[agent].hello = Some((hostname, pid, free_port));
                    self.agents[agent]
                        .stderr
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .forward = true;
                }
                Ok(Ev::AgentGone { agent, why }) => {
                    self.agents[agent].gone = true;
                    let msg = self.agent_failure_text(agent, &why);
                    self.fail(
                        EXIT_AGENT,
                        format!(
                            "cannot start railrun's agent on host {}: {msg}",
                            self.agents[agent].host
                        ),
                    );
                    return false;
                }
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
        true
    }

    /// The last lines ssh wrote on stderr, joined; waits up to `wait` for ssh to finish writing.
    fn stderr_tail(&self, agent: usize, wait: Duration) -> String {
        let until = Instant::now() + wait;
        loop {
            let g = self.agents[agent]
                .stderr
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if g.done || Instant::now() >= until {
                return g
                    .lines
                    .iter()
                    .map(|s| s.trim_end())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" | ");
            }
            drop(g);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// "ssh exited with code 255: <stderr>" for a lost agent (waits briefly for ssh to end).
    fn agent_failure_text(&mut self, agent: usize, why: &str) -> String {
        let until = Instant::now() + Duration::from_secs(2);
        let mut status = None;
        while Instant::now() < until {
            match self.agents[agent].child.try_wait() {
                Ok(Some(st)) => {
                    self.agents[agent].reaped = true;
                    status = Some(st);
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        let tail = self.stderr_tail(agent, Duration::from_millis(500));
        let st = match status {
            Some(st) => format!("ssh {}", ExitKind::from_status(st).describe()),
            None => why.to_string(),
        };
        if tail.is_empty() {
            st
        } else {
            format!("{st}: {tail}")
        }
    }

    fn spawn_agent_stderr(
        &self,
        _agent: usize,
        host: String,
        stderr: impl Read + Send + 'static,
        log: Arc<Mutex<StderrLog>>,
    ) {
        let sink = self.sink.clone();
        let _ = std::thread::Builder::new()
            .name(format!("rr-ssh-err-{host}"))
            .spawn(move || {
                crate::stdio::for_each_line(stderr, |line| {
                    let text = String::from_utf8_lossy(line).trim_end().to_string();
                    let mut g = log.lock().unwrap_or_else(|e| e.into_inner());
                    if g.forward {
                        if text.starts_with("railrun agent") {
                            sink.message(&text);
                        } else {
                            sink.message(&format!("railrun: [{host}] {text}"));
                        }
                    }
                    g.lines.push_back(text);
                    if g.lines.len() > 20 {
                        g.lines.pop_front();
                    }
                    true
                });
                log.lock().unwrap_or_else(|e| e.into_inner()).done = true;
            });
    }

    fn spawn_agent_reader(
        &self,
        agent: usize,
        node: usize,
        stdout: impl Read + Send + 'static,
        writer: Arc<FrameWriter<ChildStdin>>,
    ) {
        let tx = self.tx.clone();
        let sink = self.sink.clone();
        let store = self.store.clone();
        let world = self.pl.np();
        let mine: Vec<bool> = self.pl.ranks.iter().map(|r| r.node_rank == node).collect();
        let verbose = self.opts.verbose;
        let host = self.nodes[node].host.clone();
        let _ = std::thread::Builder::new()
            .name(format!("rr-agent-{host}"))
            .spawn(move || {
                let mut r = BufReader::with_capacity(256 * 1024, stdout);
                let gone = |why: String| {
                    let _ = tx.send(Ev::AgentGone { agent, why });
                };
                match proto::read_magic(&mut r) {
                    Ok(skipped) => {
                        if verbose > 0 && !skipped.is_empty() {
                            sink.message(&format!(
                            "railrun: [{host}] remote shell printed before the agent started: {}",
                            String::from_utf8_lossy(&skipped).trim_end()
                        ));
                        }
                    }
                    Err(e) => return gone(e.to_string()),
                }
                let ours = |rank: u32| (rank as usize) < world && mine[rank as usize];
                loop {
                    match proto::read_msg(&mut r) {
                        Ok(Some(Msg::Hello {
                            hostname,
                            pid,
                            free_port,
                            version,
                        })) => {
                            let _ = tx.send(Ev::Hello {
                                agent,
                                hostname,
                                pid,
                                free_port,
                                version,
                            });
                        }
                        Ok(Some(Msg::Output { rank, stream, data })) => {
                            if ours(rank) {
                                sink.line(rank, stream, &data);
                            }
                        }
                        Ok(Some(Msg::RankExited { rank, exit })) => {
                            if ours(rank) {
                                let _ = tx.send(Ev::Exited {
                                    rank,
                                    exit,
                                    from: Some(agent),
                                });
                            }
                        }
                        Ok(Some(Msg::SpawnFailed { rank, error })) => {
                            if ours(rank) {
                                let _ = tx.send(Ev::SpawnFailed {
                                    rank,
                                    error,
                                    from: Some(agent),
                                });
                            }
                        }
                        Ok(Some(Msg::Started { pids })) => {
                            let _ = tx.send(Ev::Started { agent, pids });
                        }
                        Ok(Some(Msg::StoreReq { conn, id, frame })) => {
                            let store = store.clone();
                            let writer = writer.clone();
                            // One thread per request: Get/Wait block until their keys appear.
                            let _ = std::thread::Builder::new()
                                .name("rr-store-relay".into())
                                .spawn(move || {
                                    let resp = match Request::decode(&frame) {
                                        Ok(req) => store.handle(req),
                                        Err(e) => Response::Error(e.to_string()),
                                    };
                                    let _ = writer.send(&Msg::StoreResp {
                                        conn,
                                        id,
                                        frame: resp.encode(),
                                    });
                                });
                        }
                        Ok(Some(Msg::Bye)) => {
                            let _ = tx.send(Ev::AgentBye { agent });
                        }
                        Ok(Some(other)) => {
                            return gone(format!(
                                "protocol error: unexpected {:?} from the agent",
                                msg_name(&other)
                            ));
                        }
                        Ok(None) => return gone("the connection closed".into()),
                        Err(e) => return gone(format!("connection failed: {e}")),
                    }
                }
            });
    }

    // ---------------------------------------------------------------- launch

    fn master(&self) -> (String, u16) {
        let Some(n0) = self.nodes.first() else {
            return ("127.0.0.1".into(), 0);
        };
        if n0.local {
            let port = crate::agent::free_port();
            if self.nodes.len() == 1 {
                return ("127.0.0.1".into(), port);
            }
            let h = &n0.host;
            let lh = h.eq_ignore_ascii_case("localhost") || h.starts_with("127.") || h == "::1";
            let name = if lh {
                nix::unistd::gethostname()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| h.clone())
            } else {
                h.clone()
            };
            return (name, port);
        }
        let port = n0
            .agent
            .and_then(|a| self.agents[a].hello.as_ref().map(|h| h.2))
            .unwrap_or(0);
        (n0.host.clone(), port)
    }

    /// Variables common to every rank: `-x` first, then railrun's own names.
    fn job_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        for x in &self.opts.env {
            match &x.value {
                Some(v) => env.push((x.name.clone(), v.clone())),
                None => match std::env::var(&x.name) {
                    Ok(v) => env.push((x.name.clone(), v)),
                    Err(_) => self.say(&format!(
                        "-x {}: not set (or not UTF-8) in railrun's environment; not forwarded",
                        x.name
                    )),
                },
            }
        }
        let (maddr, mport) = self.master();
        let world = self.pl.np().to_string();
        for (k, v) in [
            ("RAILRING_WORLD_SIZE", world.clone()),
            ("RAILRING_NNODES", self.pl.nnodes().to_string()),
            ("RAILRING_JOB_ID", self.job_id.clone()),
            ("WORLD_SIZE", world.clone()),
            ("OMPI_COMM_WORLD_SIZE", world),
            ("MASTER_ADDR", maddr),
            ("MASTER_PORT", mport.to_string()),
        ] {
            env.push((k.to_string(), v));
        }
        if let Some(b) = self.opts.bind_to {
            env.push(("RAILRING_BIND_TO".into(), b.as_str().into()));
        }
        env
    }

    fn rank_spec(&self, rank: usize) -> RankSpec {
        let r = &self.pl.ranks[rank];
        let (rk, lr, ls, nr) = (
            r.rank.to_string(),
            r.local_rank.to_string(),
            r.local_size.to_string(),
            r.node_rank.to_string(),
        );
        let env = [
            ("RAILRING_RANK", &rk),
            ("RAILRING_LOCAL_RANK", &lr),
            ("RAILRING_LOCAL_SIZE", &ls),
            ("RAILRING_NODE_RANK", &nr),
            ("RANK", &rk),
            ("LOCAL_RANK", &lr),
            ("LOCAL_WORLD_SIZE", &ls),
            ("OMPI_COMM_WORLD_RANK", &rk),
            ("OMPI_COMM_WORLD_LOCAL_RANK", &lr),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", &ls),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
        RankSpec {
            rank: r.rank as u32,
            env,
            stdin: r.rank == 0,
        }
    }

    fn launch(&mut self) {
        let env = self.job_env();
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let args = self.opts.args.clone();
        // Remote nodes first: their agents start their ranks while we start ours.
        for ai in 0..self.agents.len() {
            let node = self.agents[ai].node;
            let spec = JobSpec {
                program: self.program.to_string_lossy().into_owned(),
                args: args.clone(),
                cwd: cwd.to_string_lossy().into_owned(),
                env: env.clone(),
                secret: self.secret.clone(),
                kill_grace_ms: self.grace.as_millis() as u64,
                ranks: self.nodes[node]
                    .ranks
                    .iter()
                    .map(|&r| self.rank_spec(r))
                    .collect(),
            };
            if self.nodes[node].ranks.contains(&0) {
                self.stdin_target = Some(StdinTarget::Remote(self.agents[ai].writer.clone()));
            }
            self.agents[ai].spawned = true;
            if let Err(e) = self.agents[ai].writer.send(&Msg::Spawn(spec)) {
                // The reader thread reports the lost agent; note it for verbose runs.
                self.vlog(&format!(
                    "cannot send the job to the agent on {}: {e}",
                    self.agents[ai].host
                ));
            }
        }
        let local: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| self.nodes[n].local)
            .collect();
        if !local.is_empty() {
            let server = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| store::serve(l, &self.secret, self.store.clone()));
            let server = match server {
                Ok(s) => s,
                Err(e) => {
                    for n in &local {
                        for &r in &self.nodes[*n].ranks.clone() {
                            self.ranks[r].done = true;
                        }
                    }
                    self.fail(
                        EXIT_CONFIG,
                        format!("cannot serve the bootstrap store on 127.0.0.1: {e}"),
                    );
                    return;
                }
            };
            let extra = vec![
                ("RAILRING_STORE_ADDR".to_string(), server.addr.to_string()),
                ("RAILRING_JOB_SECRET".to_string(), self.secret.clone()),
            ];
            self._server = Some(server);
            let events: Arc<dyn RankEvents> = Arc::new(LocalEvents {
                sink: self.sink.clone(),
                tx: Mutex::new(self.tx.clone()),
            });
            let program = self.program.clone();
            let launch = Launch {
                program: &program,
                args: &args,
                cwd: &cwd,
                env: &env,
            };
            let local_ranks: Vec<usize> = local
                .iter()
                .flat_map(|&n| self.nodes[n].ranks.clone())
                .collect();
            for (i, &r) in local_ranks.iter().enumerate() {
                if self.kill_started.is_some() {
                    self.ranks[r].done = true;
                    continue;
                }
                let spec = self.rank_spec(r);
                match spawn::spawn_rank(&launch, &spec, &extra, events.clone()) {
                    Ok(p) => {
                        self.ranks[r].pid = Some(p.pid);
                        if let Some(s) = p.stdin {
                            self.stdin_target = Some(StdinTarget::Local(s));
                        }
                    }
                    Err(e) => {
                        for &rest in &local_ranks[i..] {
                            self.ranks[rest].done = true;
                        }
                        let host = self.host_of(r).to_string();
                        self.fail(
                            EXIT_NOT_STARTED,
                            format!(
                                "rank {r} on host {host}: cannot start {}: {e}",
                                self.program.display()
                            ),
                        );
                        break;
                    }
                }
            }
            self.vlog(&format!(
                "started {} local rank(s)",
                local_ranks
                    .iter()
                    .filter(|&&r| self.ranks[r].pid.is_some())
                    .count()
            ));
        }
        self.start_stdin();
    }

    /// railrun's stdin goes to rank 0 (not when railrun is a background job of a terminal,
    /// where reading would stop it).
    fn start_stdin(&mut self) {
        let Some(target) = self.stdin_target.take() else {
            return;
        };
        // SAFETY: plain syscalls on fd 0.
        let background = unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) != libc::getpgrp() };
        if background {
            if let StdinTarget::Remote(w) = &target {
                let _ = w.send(&Msg::StdinEof);
            }
            return;
        }
        let _ = std::thread::Builder::new()
            .name("rr-stdin".into())
            .spawn(move || {
                let mut input = std::io::stdin().lock();
                let mut buf = vec![0u8; 64 * 1024];
                match target {
                    StdinTarget::Local(mut s) => loop {
                        match input.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    },
                    StdinTarget::Remote(w) => loop {
                        match input.read(&mut buf) {
                            Ok(0) | Err(_) => {
                                let _ = w.send(&Msg::StdinEof);
                                return;
                            }
                            Ok(n) => {
                                if w.send(&Msg::Stdin {
                                    data: buf[..n].to_vec(),
                                })
                                .is_err()
                                {
                                    return;
                                }
                            }
                        }
                    },
                }
            });
    }

    // ---------------------------------------------------------------- running

    /// A signal or `--timeout`: start killing the job (once); returns the code when it did.
    fn check_signal_or_timeout(&mut self) -> Option<i32> {
        let sig = SIGNALLED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            if self.kill_started.is_none() {
                let n = self.live_ranks();
                let code = 128 + sig;
                self.fail(
                    code,
                    format!(
                        "got {}; stopping the job: SIGTERM to {n} rank(s), SIGKILL after {:.1} s",
                        proto::signal_name(sig),
                        self.grace.as_secs_f64()
                    ),
                );
                return Some(code);
            } else if !self.kill_hard && SIGNAL_COUNT.load(Ordering::SeqCst) > 1 {
                self.say(&format!(
                    "got {} again; SIGKILL to every rank now",
                    proto::signal_name(sig)
                ));
                self.kill_hard = true;
                self.signal_all(libc::SIGKILL);
            }
        }
        if let Some(t) = self.opts.timeout {
            if self.kill_started.is_none() && self.start.elapsed() >= t {
                self.fail(
                    EXIT_TIMEOUT,
                    format!(
                        "the job did not finish within --timeout {} s; killing all {} rank(s)",
                        fmt_secs(t),
                        self.live_ranks()
                    ),
                );
                return Some(EXIT_TIMEOUT);
            }
        }
        None
    }

    fn event_loop(&mut self) {
        while !self.all_done() {
            self.check_signal_or_timeout();
            if let Some(t0) = self.kill_started {
                let el = t0.elapsed();
                if !self.kill_hard && el >= self.grace {
                    self.say(&format!(
                        "{} rank(s) still running {:.1} s after SIGTERM; sending SIGKILL",
                        self.live_ranks(),
                        self.grace.as_secs_f64()
                    ));
                    self.kill_hard = true;
                    self.signal_all(libc::SIGKILL);
                }
                if el >= self.grace + Duration::from_secs(10) {
                    let left: Vec<usize> = (0..self.ranks.len())
                        .filter(|&r| !self.ranks[r].done)
                        .collect();
                    self.say(&format!("{} rank(s) did not report their end (e.g. rank {} on {}); giving up on them", left.len(), left[0], self.host_of(left[0])));
                    for r in left {
                        self.ranks[r].done = true;
                    }
                    break;
                }
            }
            match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(ev) => self.handle(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    fn rank_is_from(&self, rank: u32, from: Option<usize>) -> Option<usize> {
        let r = rank as usize;
        let st = self.ranks.get(r)?;
        let node = &self.nodes[st.node];
        match from {
            None if node.local => Some(r),
            Some(a) if node.agent == Some(a) => Some(r),
            _ => None,
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Exited { rank, exit, from } => {
                let Some(r) = self.rank_is_from(rank, from) else {
                    return;
                };
                if self.ranks[r].done {
                    return;
                }
                self.ranks[r].done = true;
                if self.opts.verbose > 1 && (exit.success() || self.kill_started.is_some()) {
                    self.vlog(&format!(
                        "rank {r} on host {} {}",
                        self.host_of(r),
                        exit.describe()
                    ));
                }
                if !exit.success() {
                    let host = self.host_of(r).to_string();
                    self.fail(
                        exit.exit_code(),
                        format!("rank {r} on host {host} {}", exit.describe()),
                    );
                }
            }
            Ev::SpawnFailed { rank, error, from } => {
                let Some(r) = self.rank_is_from(rank, from) else {
                    return;
                };
                if self.ranks[r].done {
                    return;
                }
                self.ranks[r].done = true;
                let host = self.host_of(r).to_string();
                self.fail(
                    EXIT_NOT_STARTED,
                    format!("rank {r} on host {host}: {error}"),
                );
            }
            Ev::Started { agent, pids } => {
                if self.opts.verbose > 0 {
                    self.vlog(&format!(
                        "host {}: started rank(s) {:?} (rank, pid)",
                        self.agents[agent].host, pids
                    ));
                }
            }
            Ev::AgentBye { agent } => self.agents[agent].bye = true,
            Ev::AgentGone { agent, why } => {
                self.agents[agent].gone = true;
                let node = self.agents[agent].node;
                let lost: Vec<usize> = self.nodes[node]
                    .ranks
                    .iter()
                    .copied()
                    .filter(|&r| !self.ranks[r].done)
                    .collect();
                for &r in &lost {
                    self.ranks[r].done = true;
                }
                if !lost.is_empty() {
                    let text = self.agent_failure_text(agent, &why);
                    let host = self.agents[agent].host.clone();
                    self.fail(
                        EXIT_AGENT,
                        format!(
                            "lost the agent on host {host} with {} rank(s) running: {text}",
                            lost.len()
                        ),
                    );
                }
            }
            Ev::Hello { .. } => {}
        }
    }

    // ---------------------------------------------------------------- teardown

    /// Stop every agent (Bye: it kills and reaps what is left on its node), wait for the ssh
    /// processes (bounded), then kill and reap anything of the job left on this machine.
    fn teardown(&mut self) {
        for a in &mut self.agents {
            if a.hello.is_none() && !a.reaped {
                // Still connecting (or hung): nothing was started there; stop ssh now.
                let _ = a.child.kill();
                let _ = a.child.wait();
                a.reaped = true;
                a.gone = true;
            }
            if !a.gone {
                let _ = a.writer.send(&Msg::Bye);
            }
        }
        let deadline =
            Instant::now() + Duration::from_secs(8) + self.grace.min(Duration::from_secs(5));
        while self.agents.iter().any(|a| !a.gone && !a.bye) && Instant::now() < deadline {
            self.check_signal_or_timeout();
            match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Ev::AgentBye { agent }) => self.agents[agent].bye = true,
                Ok(Ev::AgentGone { agent, .. }) => self.agents[agent].gone = true,
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        for a in &self.agents {
            if !a.gone && !a.bye {
                self.say(&format!(
                    "the agent on host {} did not confirm its end; closing its connection",
                    a.host
                ));
            }
            a.writer.close();
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for a in &mut self.agents {
            if a.reaped {
                continue;
            }
            loop {
                match a.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = a.child.kill();
                        let _ = a.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            a.reaped = true;
        }
        // Local ranks' groups (descendants left in them) and orphans re-parented to us.
        for r in &self.ranks {
            if let Some(pid) = r.pid {
                spawn::kill_group(pid, libc::SIGKILL);
            }
        }
        let n = spawn::kill_orphans(&[]);
        if n > 0 {
            self.vlog(&format!("killed {n} leftover process(es) of the job"));
        }
        self._server = None;
        self.sink.flush();
    }
}

fn msg_name(m: &Msg) -> &'static str {
    match m {
        Msg::Hello { .. } => "Hello",
        Msg::Spawn(_) => "Spawn",
        Msg::Started { .. } => "Started",
        Msg::RankExited { .. } => "RankExited",
        Msg::SpawnFailed { .. } => "SpawnFailed",
        Msg::Output { .. } => "Output",
        Msg::Stdin { .. } => "Stdin",
        Msg::StdinEof => "StdinEof",
        Msg::StoreReq { .. } => "StoreReq",
        Msg::StoreResp { .. } => "StoreResp",
        Msg::Kill { .. } => "Kill",
        Msg::Bye => "Bye",
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s:.1}")
    }
}

/// `--report-bindings`: GPU / NIC(s) / CPUs per rank, from this machine's topology for ranks on
/// local hosts; remote ranks are bound by themselves when they start.
pub fn report_bindings(pl: &Placement, bind_to: Option<crate::cli::BindTo>) -> String {
    use railring::topology::{format_cpulist, BindOptions, BindTo, Topology};
    let mut out = String::from("railrun: bindings:\n");
    let mut local_cache: Option<Result<(Topology, BindOptions), String>> = None;
    let mut per_size: std::collections::HashMap<
        usize,
        Result<Vec<railring::topology::Binding>, String>,
    > = Default::default();
    for r in &pl.ranks {
        let head = format!(
            "  rank {} on {} (local rank {}/{})",
            r.rank, r.host, r.local_rank, r.local_size
        );
        if !host_source::is_local(&r.host) {
            out.push_str(&format!("{head}: (remote: bound at start)\n"));
            continue;
        }
        let topo = local_cache.get_or_insert_with(|| {
            let t = Topology::discover().map_err(|e| e.to_string())?;
            let mut o = BindOptions::from_env().map_err(|e| e.to_string())?;
            if let Some(b) = bind_to {
                o.bind_to = match b {
                    crate::cli::BindTo::None => BindTo::None,
                    crate::cli::BindTo::Numa => BindTo::Numa,
                    crate::cli::BindTo::Core => BindTo::Core,
                };
            }
            Ok((t, o))
        });
        let (t, o) = match topo {
            Ok(x) => x,
            Err(e) => {
                out.push_str(&format!("{head}: topology unavailable: {e}\n"));
                continue;
            }
        };
        let b = per_size
            .entry(r.local_size)
            .or_insert_with(|| t.bindings(r.local_size, o).map_err(|e| e.to_string()));
        match b {
            Ok(v) => match v.get(r.local_rank) {
                Some(b) => {
                    let gpu = match &b.gpu {
                        Some(g) => format!(
                            "GPU {} (cuda {}{})",
                            g.index,
                            g.cuda_ordinal,
                            g.busid
                                .as_deref()
                                .map(|s| format!(", {s}"))
                                .unwrap_or_default()
                        ),
                        None => "no GPU".into(),
                    };
                    let nics = if b.nics.is_empty() {
                        "no NIC".to_string()
                    } else {
                        b.nics
                            .iter()
                            .map(|n| format!("{} ({})", n.name, n.path_class))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    let cpus = if b.cpus.is_empty() {
                        "CPUs unbound".to_string()
                    } else {
                        format!("CPUs {}", format_cpulist(&b.cpus))
                    };
                    let numa = b.numa.map(|n| format!(" (NUMA {n})")).unwrap_or_default();
                    out.push_str(&format!(
                        "{head}: {gpu} | NIC {nics} | {cpus}{numa} | {}\n",
                        b.reason
                    ));
                }
                None => out.push_str(&format!("{head}: no binding computed\n")),
            },
            Err(e) => out.push_str(&format!("{head}: cannot compute a binding: {e}\n")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_short_and_distinct() {
        let a = new_job_id();
        let b = new_job_id();
        assert_eq!(a.len(), 10);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
            "{a}"
        );
        assert_ne!(a, b);
    }

    #[test]
    fn program_lookup() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            resolve_program("./x/../prog").unwrap(),
            cwd.join("x/../prog").components().collect::<PathBuf>()
        );
        assert_eq!(
            resolve_program("/bin/true").unwrap(),
            PathBuf::from("/bin/true")
        );
        let sh = resolve_program("sh").unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        let e = resolve_program("railrun-no-such-program").unwrap_err();
        assert!(
            e.contains("railrun-no-such-program") && e.contains("not found"),
            "{e}"
        );
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn agent_launcher_choice() {
        let srun = PathBuf::from("/opt/slurm/bin/srun");
        let found = |_: &str| Some(PathBuf::from("/opt/slurm/bin/srun"));
        let missing = |_: &str| None;
        let alloc = env_of(&[("SLURM_JOB_ID", "42"), ("SLURM_JOB_NODELIST", "n[1-2]")]);
        assert_eq!(
            choose_agent_launcher(true, false, &alloc, &found),
            Ok(AgentLauncher::Srun(srun.clone()))
        );
        // Not the allocation's hosts, no srun, --ssh given, or no allocation: ssh.
        assert_eq!(
            choose_agent_launcher(false, false, &alloc, &found),
            Ok(AgentLauncher::Ssh)
        );
        assert_eq!(
            choose_agent_launcher(true, false, &alloc, &missing),
            Ok(AgentLauncher::Ssh)
        );
        assert_eq!(
            choose_agent_launcher(true, true, &alloc, &found),
            Ok(AgentLauncher::Ssh)
        );
        assert_eq!(
            choose_agent_launcher(true, false, &env_of(&[("SLURM_NODELIST", "a")]), &found),
            Ok(AgentLauncher::Ssh)
        );
        // RAILRUN_LAUNCHER overrides.
        let e = env_of(&[("SLURM_JOB_ID", "42"), ("RAILRUN_LAUNCHER", "ssh")]);
        assert_eq!(
            choose_agent_launcher(true, false, &e, &found),
            Ok(AgentLauncher::Ssh)
        );
        let e = env_of(&[("SLURM_JOB_ID", "42"), ("RAILRUN_LAUNCHER", " SRUN ")]);
        assert_eq!(
            choose_agent_launcher(false, true, &e, &found),
            Ok(AgentLauncher::Srun(srun))
        );
        let err = choose_agent_launcher(true, false, &e, &missing).unwrap_err();
        assert!(
            err.contains("RAILRUN_LAUNCHER") && err.contains("PATH"),
            "{err}"
        );
        let err = choose_agent_launcher(
            true,
            false,
            &env_of(&[("RAILRUN_LAUNCHER", "srun")]),
            &found,
        )
        .unwrap_err();
        assert!(err.contains("SLURM_JOB_ID"), "{err}");
        let err =
            choose_agent_launcher(true, false, &env_of(&[("RAILRUN_LAUNCHER", "pbs")]), &found)
                .unwrap_err();
        assert!(
            err.contains("RAILRUN_LAUNCHER") && err.contains("pbs"),
            "{err}"
        );
        assert_eq!(
            choose_agent_launcher(
                true,
                false,
                &env_of(&[("RAILRUN_LAUNCHER", "auto")]),
                &found
            ),
            Ok(AgentLauncher::Ssh)
        );
    }

    #[test]
    fn agent_command_lines() {
        let ct = Duration::from_secs(15);
        let srun = AgentLauncher::Srun(PathBuf::from("/usr/bin/srun"));
        let v = agent_argv(&srun, &[], ct, Some("ignored"), "n2", "/opt/rr/railrun", 0);
        assert_eq!(
            v,
            [
                "/usr/bin/srun",
                "--nodes=1",
                "--ntasks=1",
                "--ntasks-per-node=1",
                "--nodelist=n2",
                "--overlap",
                "--export=ALL",
                "--kill-on-bad-exit=1",
                "--unbuffered",
                "--cpu-bind=none",
                "--mpi=none",
                "--job-name=railrun-agent",
                "/opt/rr/railrun",
                "--agent",
            ]
        );
        let v = agent_argv(&srun, &[], ct, None, "n2", "/a b/railrun", 2);
        assert_eq!(
            &v[v.len() - 3..],
            ["/a b/railrun", "--agent", "-v"],
            "srun passes argv, no shell quoting"
        );

        let ssh = vec!["ssh".to_string(), "-F".into(), "/tmp/cfg".into()];
        let v = agent_argv(
            &AgentLauncher::Ssh,
            &ssh,
            ct,
            Some("bob"),
            "n1",
            "/opt/rr/railrun",
            0,
        );
        assert_eq!(
            v,
            [
                "ssh",
                "-F",
                "/tmp/cfg",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=15",
                "bob@n1",
                "exec /opt/rr/railrun --agent"
            ]
        );
        let v = agent_argv(
            &AgentLauncher::Ssh,
            &[],
            Duration::from_millis(10),
            None,
            "n1",
            "/a b/railrun",
            2,
        );
        assert_eq!(v[0], "ssh");
        assert_eq!(v[4], "ConnectTimeout=1");
        assert_eq!(v[5], "n1");
        assert_eq!(
            v[6],
            format!(
                "exec {} --agent -v",
                crate::cli::shell_quote("/a b/railrun")
            )
        );
    }

    #[test]
    fn path_lookup() {
        let env = env_of(&[("PATH", "relative:/nonexistent:/bin:/usr/bin")]);
        let sh = find_in_path("sh", &env).expect("sh in /bin or /usr/bin");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(find_in_path("railrun-no-such-program", &env), None);
        assert_eq!(find_in_path("sh", &env_of(&[])), None);
        assert!(slurm_nodelist_set(&env_of(&[("SLURM_NODELIST", "n1")])));
        assert!(!slurm_nodelist_set(&env_of(&[("SLURM_JOB_NODELIST", " ")])));
    }

    #[test]
    fn fmt_seconds() {
        assert_eq!(fmt_secs(Duration::from_secs(3)), "3");
        assert_eq!(fmt_secs(Duration::from_millis(1500)), "1.5");
    }
}
