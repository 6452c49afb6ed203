//! A railrun job from start to end: placement, the bootstrap store, local ranks, one agent per
//! remote node, output, and the lifecycle rules (first failure ends the job everywhere,
//! signals, `--timeout`, no survivors). This file is the job's state machine; beside it:
//! [`agent_command`] (how a remote node's agent is started), [`agents`] (connecting to the
//! agents and hearing them), [`launch`] (the rank environment and
//! starting the ranks), [`program`] (finding executables), [`stdin`] (rank 0's stdin) and
//! [`bindings`] (`--report-bindings`).

mod agent_command;
mod agents;
mod bindings;
mod launch;
mod mpi_family;
mod prepare;
mod program;
mod stdin;

pub use agent_command::{agent_argv, choose_agent_launcher, slurm_nodelist_set, AgentLauncher};
pub use bindings::report_bindings;
pub use program::{find_in_path, resolve_program};

use crate::cli::{DryRun, RunOpts};
use crate::host_source;
use crate::node_ranks::NodeRanks;
use crate::placement::Placement;
use crate::proto::{self, ExitKind, Msg};
use crate::signals;
use crate::spawn;
use crate::stdio::Sink;
use agents::Agent;
use railring::store::Store;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
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
/// Exit code when railrun's stdout or stderr was closed by its reader (`| head`): 128 +
/// SIGPIPE, what a shell reports for a process killed by SIGPIPE.
pub const EXIT_PIPE: i32 = 128 + libc::SIGPIPE;

/// A short unique job id, `[a-z0-9]{10}`.
pub fn new_job_id() -> String {
    let mut b = [0u8; 10];
    if railring::store::auth::random_bytes(&mut b).is_err() {
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

/// `RAILRUN_KILL_GRACE` (declared in `railring::knobs`; checked by [`check_knobs`] first).
fn kill_grace() -> Duration {
    let k = railring::knobs::knob(railring::knobs::RAILRUN_KILL_GRACE);
    k.seconds(std::env::var(k.name).ok().as_deref(), k.default_seconds())
        .unwrap_or(k.default_seconds())
}

/// railrun's own knobs, checked before anything starts (whether or not this job would read
/// them: a typo is said at once, not on the day a job first runs on several nodes).
fn check_knobs() -> Result<(), String> {
    use railring::knobs::{knob, RAILRUN_HEARTBEAT, RAILRUN_KILL_GRACE};
    let get = |n: &str| std::env::var(n).ok();
    let grace = knob(RAILRUN_KILL_GRACE);
    grace.seconds(get(RAILRUN_KILL_GRACE).as_deref(), grace.default_seconds())?;
    proto::heartbeat_timeout(get(RAILRUN_HEARTBEAT).as_deref())?;
    agents::fanout()?;
    Ok(())
}

/// `railrun [options] PROGRAM ...`: returns the exit code.
pub fn run(given: &RunOpts) -> i32 {
    if let Err(e) = check_knobs() {
        eprintln!("railrun: {e}");
        return EXIT_CONFIG;
    }
    let mut opts = given.clone();
    let (pl, fabric) = match prepare::place(&mut opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("railrun: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Some(d) = opts.dry_run {
        return dry_run(&opts, &pl, d, fabric.as_ref());
    }
    if opts.display_map {
        let _ = std::io::stdout().write_all(pl.table().as_bytes());
        let _ = std::io::stdout().flush();
    }
    if let Err(e) = prepare::before_start(&mut opts) {
        eprintln!("railrun: {e}");
        return EXIT_CONFIG;
    }
    let opts = &opts;
    let program = match resolve_program(&opts.program) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("railrun: {e}");
            return EXIT_NOT_STARTED;
        }
    };
    if let Err((code, e)) = launch::preflight(opts, &pl, &program) {
        eprintln!("railrun: {e}");
        return code;
    }
    if opts.report_bindings {
        eprint!("{}", report_bindings(&pl, opts));
    }
    let sink = match &opts.output_dir {
        Some(d) => match Sink::dir(d, pl.np(), opts.tag_output) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("railrun: {e}");
                return EXIT_CONFIG;
            }
        },
        None => Sink::terminal(opts.tag_output).merging_stderr(opts.merge_stderr),
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

/// `--dry-run`: the placement (table or JSON; with `--report-bindings`, the table is followed
/// by the bindings) on stdout, nothing started.
fn dry_run(
    opts: &RunOpts,
    pl: &Placement,
    d: DryRun,
    fabric: Option<&(crate::plan::fabric_file::FabricFile, String)>,
) -> i32 {
    let mut out = match d {
        DryRun::Table => pl.table(),
        DryRun::Json => pl.to_json(),
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if opts.report_bindings && d == DryRun::Table {
        out.push_str(&report_bindings(pl, opts));
    }
    if let (Some((ff, path)), DryRun::Table) = (fabric, d) {
        match crate::plan::order::describe(pl, ff, path, !opts.fabric_keep_order) {
            Ok(s) => out.push_str(&s),
            Err(e) => {
                eprintln!("railrun: --fabric {path}: {e}");
                return EXIT_CONFIG;
            }
        }
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    let _ = std::io::stdout().flush();
    0
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
        /// The agent that reported it; `None`: a rank on this machine.
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

#[derive(Clone)]
struct RankState {
    node: usize,
    /// Over for the job: ended, lost, never started, or given up on.
    done: bool,
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
    /// The ranks on this machine (and the store they connect to).
    local: NodeRanks,
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
    stdin_target: Option<stdin::StdinTarget>,
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
                done: false,
            });
        }
        let secret = railring::store::auth::new_secret()
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
            local: NodeRanks::new(),
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

    /// Rank `r` is over for the job (a rank on this machine is no longer signalled).
    fn set_done(&mut self, r: usize) {
        self.ranks[r].done = true;
        self.local.mark_exited(r as u32);
    }

    fn run(&mut self) -> i32 {
        signals::install();
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

    /// `sig` to every running rank: here directly, elsewhere through its node's agent.
    fn signal_all(&mut self, sig: i32) {
        self.local.signal(sig, false);
        for a in &self.agents {
            if a.spawned && !a.gone {
                let _ = a.writer.send(&Msg::Kill { signal: sig });
            }
        }
    }

    // ---------------------------------------------------------------- running

    /// A signal, `--timeout`, or a closed stdout/stderr: start killing the job (once); returns
    /// the code when it did.
    fn check_signal_or_timeout(&mut self) -> Option<i32> {
        if let Some(which) = self.sink.closed() {
            if self.kill_started.is_none() {
                // Like mpirun on SIGPIPE: the reader is gone, so is the job. Said only with -v
                // (`| head` is ordinary use); the exit status tells scripts.
                let msg = format!(
                    "{which} was closed by its reader; stopping the job: SIGTERM to {} rank(s), SIGKILL after {:.1} s",
                    self.live_ranks(),
                    self.grace.as_secs_f64()
                );
                if self.opts.verbose > 0 {
                    self.say(&msg);
                }
                self.failure = Some(Failure { code: EXIT_PIPE });
                self.start_kill();
                return Some(EXIT_PIPE);
            }
        }
        if let Some(sig) = signals::take() {
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
            } else if !self.kill_hard && signals::count() > 1 {
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

    /// Until every rank is done: handle events, signals and `--timeout`, and escalate a kill.
    fn event_loop(&mut self) {
        while !self.all_done() {
            self.check_signal_or_timeout();
            self.check_heartbeats();
            if let Some(t0) = self.kill_started {
                if !self.escalate_kill(t0.elapsed()) {
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

    /// `elapsed` since the kill started: SIGKILL after the grace; 10 s later give up on the
    /// ranks that never reported their end (false: stop waiting).
    fn escalate_kill(&mut self, elapsed: Duration) -> bool {
        if !self.kill_hard && elapsed >= self.grace {
            self.say(&format!(
                "{} rank(s) still running {:.1} s after SIGTERM; sending SIGKILL",
                self.live_ranks(),
                self.grace.as_secs_f64()
            ));
            self.kill_hard = true;
            self.signal_all(libc::SIGKILL);
        }
        if elapsed >= self.grace + Duration::from_secs(10) {
            let left: Vec<usize> = (0..self.ranks.len())
                .filter(|&r| !self.ranks[r].done)
                .collect();
            self.say(&format!(
                "{} rank(s) did not report their end (e.g. rank {} on {}); giving up on them",
                left.len(),
                left[0],
                self.host_of(left[0])
            ));
            for r in left {
                self.set_done(r);
            }
            return false;
        }
        true
    }

    /// The rank an event is about, when the event comes from where that rank runs (this
    /// machine for `from: None`, else its node's agent).
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
            Ev::Exited { rank, exit, from } => self.rank_exited(rank, exit, from),
            Ev::SpawnFailed { rank, error, from } => {
                let Some(r) = self.rank_is_from(rank, from) else {
                    return;
                };
                if self.ranks[r].done {
                    return;
                }
                self.set_done(r);
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
            Ev::AgentGone { agent, why } => self.agent_lost(agent, &why),
            Ev::Hello { .. } => {}
        }
    }

    /// A rank ended: the first failure ends the job.
    fn rank_exited(&mut self, rank: u32, exit: ExitKind, from: Option<usize>) {
        let Some(r) = self.rank_is_from(rank, from) else {
            return;
        };
        if self.ranks[r].done {
            return;
        }
        self.set_done(r);
        if self.opts.verbose > 1 && (exit.success() || self.kill_started.is_some()) {
            self.vlog(&format!(
                "rank {r} on host {} {}",
                self.host_of(r),
                exit.describe()
            ));
        }
        if !exit.success() {
            let host = self.host_of(r).to_string();
            let text = format!("rank {r} on host {host} {}", exit.describe());
            // A rank killed by a signal railrun did not send (not its SIGTERM, and before any
            // SIGKILL of its own) is a cause in its own right, even when a peer's echo of it (a
            // rank that saw it vanish and exited) reached railrun first: name it too.
            if self.failure.is_some()
                && !self.kill_hard
                && matches!(exit, ExitKind::Signal(s) if s != libc::SIGTERM)
            {
                self.say(&format!("also: {text}"));
            }
            self.fail(exit.exit_code(), text);
        }
    }

    /// An agent's connection is lost: its running ranks are lost with it.
    fn agent_lost(&mut self, agent: usize, why: &str) {
        self.agents[agent].gone = true;
        let node = self.agents[agent].node;
        let lost: Vec<usize> = self.nodes[node]
            .ranks
            .iter()
            .copied()
            .filter(|&r| !self.ranks[r].done)
            .collect();
        for &r in &lost {
            self.set_done(r);
        }
        if !lost.is_empty() && (self.failure.is_some() || self.kill_started.is_some()) {
            // The job is already ending for another reason, often this loss's own echo (ranks
            // elsewhere that saw their peers on this host vanish reported first): say it too.
            let text = self.agent_failure_text(agent, why);
            self.say(&format!(
                "also lost the agent on host {} with {} rank(s) running: {text}",
                self.agents[agent].host,
                lost.len()
            ));
        } else if !lost.is_empty() {
            let text = self.agent_failure_text(agent, why);
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

    // ---------------------------------------------------------------- teardown

    /// Stop every agent (Bye: it kills and reaps what is left on its node), wait for the ssh
    /// processes (bounded), then kill and reap anything of the job left on this machine.
    fn teardown(&mut self) {
        self.say_bye_to_agents();
        self.reap_remote_shells();
        // Local ranks' groups (descendants left in them) and orphans re-parented to us.
        self.local.signal(libc::SIGKILL, true);
        let n = spawn::kill_orphans(&[]);
        if n > 0 {
            self.vlog(&format!("killed {n} leftover process(es) of the job"));
        }
        // Segments of ranks killed while starting up: every file of this job (its processes
        // here are dead), and those of other dead jobs.
        railring::transport::shm::sweep_after_job(
            std::path::Path::new("/dev/shm"),
            Some(&self.job_id),
        );
        self.local.close_store();
        self.sink.flush();
    }

    /// Bye to every agent still there, and wait (bounded) for each to confirm or vanish.
    fn say_bye_to_agents(&mut self) {
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
            self.check_heartbeats();
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
    }

    /// Wait for every remote shell to end (3 s in all), killing the ones that do not.
    fn reap_remote_shells(&mut self) {
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
    fn fmt_seconds() {
        assert_eq!(fmt_secs(Duration::from_secs(3)), "3");
        assert_eq!(fmt_secs(Duration::from_millis(1500)), "1.5");
    }
}
