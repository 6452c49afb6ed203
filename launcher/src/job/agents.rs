//! Remote nodes: railrun starts one agent per remote node (the command line is
//! [`super::agent_command`]'s), waits for every agent's `Hello`, and reads what each agent says
//! (its ranks' output and exits, store requests it relays) on a thread of its own.
//!
//! Heartbeat: railrun and each agent send a `Ping` every second; an agent that railrun hears
//! nothing from for `RAILRUN_HEARTBEAT` seconds (default 6) is lost: railrun kills its remote
//! shell, names the host and ends the job, while the agent, hearing nothing from railrun, kills
//! its ranks by itself a little later (`agent/heartbeat.rs`; [`crate::proto::Liveness`]).

use super::agent_command::{agent_argv, remote_shell, AgentCommand};
use super::{Ev, Job, EXIT_AGENT};
use crate::proto::{self, ExitKind, FrameWriter, Liveness, Msg};
use crate::stdio::Sink;
use railring::store::wire::{Request, Response};
use railring::store::{Backend, Store};
use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::process::{Child, ChildStdin};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The last lines the remote shell (ssh or srun) wrote on stderr, for error messages; once the
/// agent is up, each line is also forwarded to railrun's stderr.
#[derive(Default)]
struct StderrLog {
    lines: VecDeque<String>,
    forward: bool,
    done: bool,
}

/// The connection to one node's agent.
pub(super) struct Agent {
    pub(super) node: usize,
    pub(super) host: String,
    pub(super) child: Child,
    pub(super) writer: Arc<FrameWriter<ChildStdin>>,
    stderr: Arc<Mutex<StderrLog>>,
    /// (hostname, pid, free port) from its `Hello`.
    pub(super) hello: Option<(String, u32, u16)>,
    /// It was sent the job.
    pub(super) spawned: bool,
    /// Its connection is lost.
    pub(super) gone: bool,
    /// It confirmed the end of the job.
    pub(super) bye: bool,
    /// The remote shell was waited for.
    pub(super) reaped: bool,
    /// When railrun last heard a frame from it.
    heard: Arc<Liveness>,
    /// Silence after which it is declared lost (`RAILRUN_HEARTBEAT`).
    heartbeat: Duration,
}

impl Job<'_> {
    /// Start one agent per remote node (over ssh, or `srun` inside a Slurm allocation), in
    /// parallel — at most [`fanout`] connecting at once, the next starting as soon as one says
    /// Hello — and wait for every agent's Hello.
    /// False when the job cannot go on (the failure is recorded and reported).
    pub(super) fn connect_agents(&mut self) -> bool {
        let Some(how) = self.agent_command() else {
            return false;
        };
        let heartbeat = match proto::heartbeat_timeout(
            std::env::var(railring::knobs::RAILRUN_HEARTBEAT)
                .ok()
                .as_deref(),
        ) {
            Ok(t) => t,
            Err(e) => {
                self.fail(super::EXIT_CONFIG, e);
                return false;
            }
        };
        let fanout = match fanout() {
            Ok(n) => n,
            Err(e) => {
                self.fail(super::EXIT_CONFIG, e);
                return false;
            }
        };
        let mut pending: VecDeque<usize> = (0..self.nodes.len())
            .filter(|&ni| !self.nodes[ni].local)
            .collect();
        raise_fd_limit(pending.len());
        let mut started: Vec<Instant> = Vec::with_capacity(pending.len());
        while started.len() < fanout {
            let Some(ni) = pending.pop_front() else { break };
            if !self.start_agent(ni, &how, heartbeat) {
                return false;
            }
            started.push(Instant::now());
        }
        self.wait_for_hellos(&how, heartbeat, &mut pending, &mut started)
    }

    /// Start node `ni`'s agent and the threads reading its stdout and stderr. False when the
    /// job cannot go on (the failure is recorded and reported).
    fn start_agent(&mut self, ni: usize, how: &AgentCommand, heartbeat: Duration) -> bool {
        let node = &self.nodes[ni];
        let argv = agent_argv(
            &how.launcher,
            &how.ssh,
            self.opts.connect_timeout,
            node.user.as_deref(),
            &node.host,
            &how.agent_path,
            self.opts.verbose,
        );
        let mut cmd = remote_shell(&argv);
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
        let heard = Liveness::new();
        self.spawn_agent_stderr(host.clone(), stderr, log.clone());
        self.spawn_agent_reader(ai, ni, stdout, writer.clone(), heard.clone());
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
            heard,
            heartbeat,
        });
        self.nodes[ni].agent = Some(ai);
        true
    }

    /// Wait for every agent's Hello, starting the `pending` nodes' agents as earlier ones answer
    /// (`started[i]`: when agent i was started). ssh's own ConnectTimeout covers the TCP
    /// connect; this deadline (each agent's start + `--connect-timeout`) covers everything
    /// (authentication, a hung remote shell). False when the job cannot go on (the failure is
    /// recorded and reported).
    fn wait_for_hellos(
        &mut self,
        how: &AgentCommand,
        heartbeat: Duration,
        pending: &mut VecDeque<usize>,
        started: &mut Vec<Instant>,
    ) -> bool {
        let ct = self.opts.connect_timeout;
        let grace = ct + Duration::from_millis(500);
        while !pending.is_empty() || self.agents.iter().any(|a| a.hello.is_none()) {
            if self.check_signal_or_timeout().is_some() {
                return false;
            }
            let now = Instant::now();
            if (0..self.agents.len())
                .any(|i| self.agents[i].hello.is_none() && now >= started[i] + grace)
            {
                self.fail_slow_agents(ct, started);
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
                    self.agent_up(agent, (hostname, pid, free_port), &version);
                    if let Some(ni) = pending.pop_front() {
                        if !self.start_agent(ni, how, heartbeat) {
                            return false;
                        }
                        started.push(Instant::now());
                    }
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

    /// Declare lost every agent that railrun heard nothing from (not even a ping) for its
    /// heartbeat limit: its node is unreachable (a cable, a switch, a powered-off host: no RST
    /// ever comes) or hung. Its remote shell is killed (which also unblocks any write towards
    /// it); its ranks are lost with it, which ends the job naming the host. The agent on the far
    /// side, hearing nothing from railrun either, kills its ranks by itself.
    pub(super) fn check_heartbeats(&mut self) {
        for ai in 0..self.agents.len() {
            let a = &mut self.agents[ai];
            if a.hello.is_none() || a.gone || a.bye || a.reaped {
                continue;
            }
            let silent = a.heard.silent_for();
            if silent < a.heartbeat {
                continue;
            }
            a.writer.abandon();
            let _ = a.child.kill();
            let _ = a.child.wait();
            a.reaped = true;
            a.gone = true;
            let host = a.host.clone();
            let node = a.node;
            let lost: Vec<usize> = self.nodes[node]
                .ranks
                .iter()
                .copied()
                .filter(|&r| !self.ranks[r].done)
                .collect();
            for &r in &lost {
                self.set_done(r);
            }
            let what = format!(
                "no word from railrun's agent on host {host} for {:.1} s (heartbeat limit \
                 RAILRUN_HEARTBEAT={}): the host is unreachable or hung",
                silent.as_secs_f64(),
                a_secs(self.agents[ai].heartbeat)
            );
            if lost.is_empty() {
                self.say(&format!("{what}; none of its ranks was running"));
            } else if self.failure.is_some() || self.kill_started.is_some() {
                self.say(&format!(
                    "also lost the agent on host {host} with {} rank(s) running: {what}",
                    lost.len()
                ));
            } else {
                self.fail(
                    EXIT_AGENT,
                    format!(
                        "lost the agent on host {host} with {} rank(s) running (rank {}): {what}; \
                         its agent kills them when it notices",
                        lost.len(),
                        lost[0]
                    ),
                );
            }
        }
    }

    /// The connect deadline passed: fail naming the first silent host and what its ssh said.
    fn fail_slow_agents(&mut self, ct: Duration, started: &[Instant]) {
        let now = Instant::now();
        let grace = ct + Duration::from_millis(500);
        let slow: Vec<usize> = (0..self.agents.len())
            .filter(|&i| self.agents[i].hello.is_none() && now >= started[i] + grace)
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
    }

    /// An agent's Hello: note it, warn about a version mismatch, and forward its ssh's stderr
    /// from now on.
    fn agent_up(&mut self, agent: usize, hello: (String, u32, u16), version: &str) {
        self.vlog(&format!(
            "agent on {} (hostname {}, pid {}) is up",
            self.agents[agent].host, hello.0, hello.1
        ));
        if version != env!("CARGO_PKG_VERSION") {
            self.say(&format!(
                "warning: the agent on host {} is railrun {version}, this is railrun {} (see --launch-agent)",
                self.agents[agent].host,
                env!("CARGO_PKG_VERSION")
            ));
        }
        self.agents[agent].hello = Some(hello);
        proto::spawn_pinger(
            self.agents[agent].writer.clone(),
            self.agents[agent].heartbeat.as_millis() as u64,
        );
        self.agents[agent]
            .stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forward = true;
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
    pub(super) fn agent_failure_text(&mut self, agent: usize, why: &str) -> String {
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

    /// The thread keeping the last 20 lines of the remote shell's stderr (and forwarding them
    /// once the agent is up).
    fn spawn_agent_stderr(
        &self,
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

    /// The thread reading agent `agent`'s frames (node `node`).
    fn spawn_agent_reader(
        &self,
        agent: usize,
        node: usize,
        stdout: impl Read + Send + 'static,
        writer: Arc<FrameWriter<ChildStdin>>,
        heard: Arc<Liveness>,
    ) {
        let host = self.nodes[node].host.clone();
        let reader = AgentReader {
            heard,
            agent,
            host: host.clone(),
            tx: self.tx.clone(),
            sink: self.sink.clone(),
            store: self.store.clone(),
            writer,
            mine: self.pl.ranks.iter().map(|r| r.node_rank == node).collect(),
            verbose: self.opts.verbose,
        };
        let _ = std::thread::Builder::new()
            .name(format!("rr-agent-{host}"))
            .spawn(move || reader.run(stdout));
    }
}

/// What the thread reading one agent's frames needs.
struct AgentReader {
    heard: Arc<Liveness>,
    agent: usize,
    host: String,
    tx: mpsc::Sender<Ev>,
    sink: Arc<Sink>,
    store: Arc<Store>,
    writer: Arc<FrameWriter<ChildStdin>>,
    /// Indexed by rank: is it on this agent's node?
    mine: Vec<bool>,
    verbose: u8,
}

impl AgentReader {
    /// Skip what the remote shell printed before the agent's greeting, then handle frames until
    /// the connection ends (`Ev::AgentGone`).
    fn run(self, stdout: impl Read) {
        let mut r = BufReader::with_capacity(256 * 1024, stdout);
        match proto::read_magic(&mut r) {
            Ok(skipped) => {
                if self.verbose > 0 && !skipped.is_empty() {
                    self.sink.message(&format!(
                        "railrun: [{}] remote shell printed before the agent started: {}",
                        self.host,
                        String::from_utf8_lossy(&skipped).trim_end()
                    ));
                }
            }
            Err(e) => return self.gone(e.to_string()),
        }
        loop {
            match proto::read_msg(&mut r) {
                Ok(Some(msg)) => {
                    self.heard.heard();
                    if let Err(why) = self.handle(msg) {
                        return self.gone(why);
                    }
                }
                Ok(None) => return self.gone("the connection closed".into()),
                Err(e) => return self.gone(format!("connection failed: {e}")),
            }
        }
    }

    fn gone(&self, why: String) {
        let _ = self.tx.send(Ev::AgentGone {
            agent: self.agent,
            why,
        });
    }

    fn ours(&self, rank: u32) -> bool {
        (rank as usize) < self.mine.len() && self.mine[rank as usize]
    }

    /// One frame from the agent; `Err` for a message an agent never sends.
    fn handle(&self, msg: Msg) -> Result<(), String> {
        let agent = self.agent;
        match msg {
            Msg::Hello {
                hostname,
                pid,
                free_port,
                version,
            } => {
                let _ = self.tx.send(Ev::Hello {
                    agent,
                    hostname,
                    pid,
                    free_port,
                    version,
                });
            }
            Msg::Output { rank, stream, data } => {
                if self.ours(rank) {
                    self.sink.line(rank, stream, &data);
                }
            }
            Msg::RankExited { rank, exit } => {
                if self.ours(rank) {
                    let _ = self.tx.send(Ev::Exited {
                        rank,
                        exit,
                        from: Some(agent),
                    });
                }
            }
            Msg::SpawnFailed { rank, error } => {
                if self.ours(rank) {
                    let _ = self.tx.send(Ev::SpawnFailed {
                        rank,
                        error,
                        from: Some(agent),
                    });
                }
            }
            Msg::Started { pids } => {
                let _ = self.tx.send(Ev::Started { agent, pids });
            }
            Msg::StoreReq { conn, id, frame } => self.serve_store_request(conn, id, frame),
            Msg::Bye => {
                let _ = self.tx.send(Ev::AgentBye { agent });
            }
            Msg::Ping { .. } => {}
            other => {
                return Err(format!(
                    "protocol error: unexpected {:?} from the agent",
                    msg_name(&other)
                ))
            }
        }
        Ok(())
    }

    /// Answer a store request the agent relays, on a thread of its own: Get/Wait block until
    /// their keys appear.
    fn serve_store_request(&self, conn: u64, id: u64, frame: Vec<u8>) {
        let store = self.store.clone();
        let writer = self.writer.clone();
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
}

/// `6` for 6 s, `2.5` for 2.5 s.
fn a_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s:.1}")
    }
}

/// Agents connecting at once (ssh handshakes and agent start-ups in flight):
/// `RAILRUN_FANOUT`, default 64 — pdsh's and clush's default is 32 to 64; every host's sshd
/// sees one connection, but the head runs all the handshakes. A value that is not a whole
/// number ≥ 1 is an error, not the default.
pub(super) fn fanout() -> Result<usize, String> {
    let k = railring::knobs::knob(railring::knobs::RAILRUN_FANOUT);
    k.number(std::env::var(k.name).ok().as_deref(), k.default_number())
        .map(|n| n as usize)
        .map_err(String::from)
}

/// Each agent holds three pipes for the whole job: raise the soft open-file limit towards the
/// hard one when `agents` need more than it allows (a default soft limit of 1024 would stop a job
/// at about 300 nodes).
fn raise_fd_limit(agents: usize) {
    let need = (agents as u64).saturating_mul(4).saturating_add(256);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < need {
            lim.rlim_cur = need.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
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
        Msg::Ping { .. } => "Ping",
    }
}
