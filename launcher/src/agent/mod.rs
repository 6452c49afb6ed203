//! `railrun --agent`: the remote side, started by the launcher over SSH, one per node.
//!
//! It talks to the launcher only through its stdin/stdout (the SSH channel; see
//! [`crate::proto`]), never by opening a connection back: it greets with `Hello`, starts the ranks
//! of the `Spawn` it gets, forwards their output and exits, serves their bootstrap-store
//! connections on `127.0.0.1` with a relay that forwards every request as a `StoreReq` frame, and
//! kills its ranks on `Kill`. It kills and reaps every rank (and their leftovers) before it
//! answers `Bye`, and also when it loses the launcher (stdin closed or broken) or gets SIGTERM,
//! SIGINT or SIGHUP.

mod heartbeat;
mod relay;

use crate::node_ranks::{JobIdent, NodeRanks, ServeError};
use crate::proto::{self, ExitKind, FrameWriter, JobSpec, Msg, Stream};
use crate::signals;
use crate::spawn::{self, RankCommand, RankEvents};
use heartbeat::Heartbeat;
use relay::Relay;
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::io::FromRawFd;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

type Writer = Arc<FrameWriter<File>>;

/// Take the protocol channel off fds 0/1: returns (input, output) as close-on-exec files, and
/// leaves fd 0 on /dev/null and fd 1 on stderr, so nothing else can read or corrupt the frames.
fn take_stdio() -> io::Result<(File, File)> {
    // SAFETY: plain fd syscalls; every returned fd is checked.
    unsafe {
        let inp = libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 3);
        if inp < 0 {
            return Err(io::Error::last_os_error());
        }
        let out = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
        if out < 0 {
            return Err(io::Error::last_os_error());
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::close(null);
        }
        libc::dup2(2, 1);
        Ok((File::from_raw_fd(inp), File::from_raw_fd(out)))
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "?".into())
}

/// A TCP port that was free a moment ago (bound on port 0, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

enum Ev {
    Msg(Msg),
    Exited(u32, ExitKind),
    Lost(String),
}

struct AgentEvents {
    writer: Writer,
    tx: Mutex<mpsc::Sender<Ev>>,
}

impl RankEvents for AgentEvents {
    fn output(&self, rank: u32, stream: Stream, line: &[u8]) {
        let _ = self.writer.send(&Msg::Output {
            rank,
            stream,
            data: line.to_vec(),
        });
    }
    fn exited(&self, rank: u32, exit: ExitKind) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Ev::Exited(rank, exit));
    }
}

struct Log {
    host: String,
    verbose: u8,
}
impl Log {
    fn say(&self, msg: &str) {
        let _ = writeln!(io::stderr(), "railrun agent on {}: {msg}", self.host);
    }
    fn v(&self, msg: &str) {
        if self.verbose > 0 {
            self.say(msg);
        }
    }
}

/// Run the agent; returns the process exit code.
pub fn run(verbose: u8) -> i32 {
    let host = hostname();
    let log = Log {
        host: host.clone(),
        verbose,
    };
    let (inp, out) = match take_stdio() {
        Ok(x) => x,
        Err(e) => {
            log.say(&format!("cannot set up the launcher channel: {e}"));
            return 1;
        }
    };
    spawn::become_subreaper();
    signals::install();
    let Some(writer) = greet(out, host) else {
        return 1;
    };
    log.v("connected");
    let relay = Relay::new(writer.clone());
    let (tx, rx) = mpsc::channel::<Ev>();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Option<Vec<u8>>>();
    let heartbeat = Heartbeat::new();
    if read_launcher(inp, relay.clone(), tx.clone(), stdin_tx, heartbeat.clone()).is_err() {
        return 1;
    }
    proto::spawn_pinger(writer.clone(), 0);
    let mut st = AgentState {
        log,
        writer,
        relay,
        tx,
        rx,
        stdin_rx: Some(stdin_rx),
        ranks: NodeRanks::new(),
        grace: Duration::from_secs(3),
        job: None,
        heartbeat,
    };
    st.main_loop()
}

/// The magic line, then `Hello`: returns the frame writer, `None` when the launcher is gone.
fn greet(mut out: File, host: String) -> Option<Writer> {
    let mut greeting = proto::MAGIC.to_vec();
    greeting.push(b'\n');
    if out.write_all(&greeting).and_then(|_| out.flush()).is_err() {
        return None;
    }
    let writer: Writer = Arc::new(FrameWriter::new(out));
    let hello = Msg::Hello {
        hostname: host,
        pid: std::process::id(),
        free_port: free_port(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    writer.send(&hello).ok()?;
    Some(writer)
}

/// The thread reading the launcher's frames: store answers go to the relay, stdin frames to
/// `stdin_tx` (`None`: end of stdin), everything else to the main loop; a lost channel fails
/// the relay and says `Ev::Lost`.
fn read_launcher(
    inp: File,
    relay: Arc<Relay>,
    tx: mpsc::Sender<Ev>,
    stdin_tx: mpsc::Sender<Option<Vec<u8>>>,
    heartbeat: Arc<Heartbeat>,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("rr-agent-in".into())
        .spawn(move || {
            let mut r = BufReader::with_capacity(256 * 1024, inp);
            loop {
                let msg = proto::read_msg(&mut r);
                if let Ok(Some(m)) = &msg {
                    if heartbeat.heard(m) {
                        continue;
                    }
                }
                match msg {
                    Ok(Some(Msg::StoreResp { id, frame, .. })) => relay.deliver(id, frame),
                    Ok(Some(Msg::Stdin { data })) => {
                        let _ = stdin_tx.send(Some(data));
                    }
                    Ok(Some(Msg::StdinEof)) => {
                        let _ = stdin_tx.send(None);
                    }
                    Ok(Some(m)) => {
                        if tx.send(Ev::Msg(m)).is_err() {
                            break;
                        }
                    }
                    Ok(None) => {
                        relay.fail_all();
                        let _ = tx.send(Ev::Lost("the launcher closed the connection".into()));
                        break;
                    }
                    Err(e) => {
                        relay.fail_all();
                        let _ = tx.send(Ev::Lost(format!("launcher channel: {e}")));
                        break;
                    }
                }
            }
        })
        .map(|_| ())
}

struct AgentState {
    log: Log,
    writer: Writer,
    relay: Arc<Relay>,
    tx: mpsc::Sender<Ev>,
    rx: mpsc::Receiver<Ev>,
    stdin_rx: Option<mpsc::Receiver<Option<Vec<u8>>>>,
    ranks: NodeRanks,
    grace: Duration,
    /// The job's id once a Spawn came (a second one is ignored).
    job: Option<String>,
    heartbeat: Arc<Heartbeat>,
}

impl AgentState {
    fn main_loop(&mut self) -> i32 {
        loop {
            if let Some(sig) = signals::take() {
                self.log.say(&format!(
                    "got {}; killing this node's ranks",
                    proto::signal_name(sig)
                ));
                return self.shutdown(false);
            }
            if let Some(code) = self.check_heartbeat() {
                return code;
            }
            let ev = match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(ev) => ev,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.shutdown(false),
            };
            match ev {
                Ev::Msg(Msg::Spawn(spec)) => {
                    if self.job.is_some() {
                        self.log.say("ignoring a second Spawn");
                    } else {
                        self.job = Some(spec.job_id.clone());
                        self.spawn(spec);
                    }
                }
                Ev::Msg(Msg::Kill { signal }) => {
                    self.log.v(&format!("Kill {}", proto::signal_name(signal)));
                    self.ranks.signal(signal, false);
                }
                Ev::Msg(Msg::Bye) => {
                    self.log.v("Bye");
                    return self.shutdown(true);
                }
                Ev::Msg(other) => self
                    .log
                    .v(&format!("ignoring unexpected message {other:?}")),
                Ev::Exited(rank, exit) => self.exited(rank, exit),
                Ev::Lost(why) => {
                    if self.ranks.any_running() {
                        self.log.say(&format!("{why}; killing this node's ranks"));
                    }
                    return self.shutdown(false);
                }
            }
        }
    }

    /// Railrun went silent past the heartbeat limit: stop writing to it (the channel may never
    /// drain), say why on stderr, kill and reap this node's ranks, and exit.
    fn check_heartbeat(&mut self) -> Option<i32> {
        let why = self.heartbeat.lost()?;
        self.writer.abandon();
        self.relay.fail_all();
        self.log.say(&format!("{why}; killing this node's ranks"));
        Some(self.shutdown(false))
    }

    fn exited(&mut self, rank: u32, exit: ExitKind) {
        if self.ranks.mark_exited(rank) {
            let _ = self.writer.send(&Msg::RankExited { rank, exit });
        }
    }

    /// Start the node's ranks of a `Spawn`: the relay, then every rank; `Started` when all run,
    /// `SpawnFailed` for the first that cannot start and every rank after it.
    fn spawn(&mut self, spec: JobSpec) {
        self.grace = Duration::from_millis(spec.kill_grace_ms.min(3_600_000));
        // The relay for this node's ranks: 127.0.0.1 only, guarded by the job secret; the PMI-1
        // server over it.
        let job = JobIdent {
            id: &spec.job_id,
            world_size: spec.world_size,
        };
        if let Err(e) = self
            .ranks
            .serve_store(&spec.secret, self.relay.clone(), job)
        {
            let error = match e {
                ServeError::Bind(e) => format!("cannot open the store relay on 127.0.0.1: {e}"),
                ServeError::Serve(e) => format!("cannot serve the store relay: {e}"),
            };
            return self.spawn_failed(&spec, 0, error);
        }
        let cwd = self.working_dir(&spec.cwd);
        let program = PathBuf::from(&spec.program);
        let cmd = RankCommand {
            program: &program,
            args: &spec.args,
            cwd: &cwd,
            env: &spec.env,
        };
        let events: Arc<dyn RankEvents> = Arc::new(AgentEvents {
            writer: self.writer.clone(),
            tx: Mutex::new(self.tx.clone()),
        });
        // Binding before exec, as --report-bindings shows it. This node's report lines and
        // notes go to the agent's stderr, which railrun forwards as "railrun: [HOST] ...".
        let plan = NodeRanks::plan(&cmd, &spec.ranks, &self.log.host);
        if spec.report_bindings {
            let text: String = plan.report.concat();
            let _ = write!(io::stderr(), "bindings:\n{text}");
        }
        for n in &plan.notes {
            let _ = writeln!(io::stderr(), "{n}");
        }
        let started = self.ranks.start(&cmd, &spec.ranks, &plan, &events);
        if let Some(stdin) = self.ranks.take_stdin() {
            if let Some(rx) = self.stdin_rx.take() {
                let _ = std::thread::Builder::new()
                    .name("rr-agent-stdin".into())
                    .spawn(move || feed_stdin(stdin, rx));
            }
        }
        if let Err(e) = started {
            self.log
                .v(&format!("rank {} failed to start: {}", e.rank, e.cause));
            return self.spawn_failed(&spec, e.index, e.message);
        }
        let pids = self.ranks.pids();
        self.log.v(&format!("started ranks {:?}", pids));
        let _ = self.writer.send(&Msg::Started { pids });
    }

    /// `SpawnFailed` for `spec.ranks[from]` (with `error`) and every rank after it.
    fn spawn_failed(&self, spec: &JobSpec, from: usize, error: String) {
        for (i, r) in spec.ranks.iter().enumerate().skip(from) {
            let e = if i == from {
                error.clone()
            } else {
                format!(
                    "not started: rank {} failed to start on this node",
                    spec.ranks[from].rank
                )
            };
            let _ = self.writer.send(&Msg::SpawnFailed {
                rank: r.rank,
                error: e,
            });
        }
    }

    /// The launcher's working directory, or `$HOME` (else `/`) when it does not exist here.
    fn working_dir(&self, cwd: &str) -> PathBuf {
        let dir = PathBuf::from(cwd);
        if dir.is_dir() {
            return dir;
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_dir())
            .unwrap_or_else(|| PathBuf::from("/"));
        self.log.say(&format!(
            "working directory {cwd} does not exist here; using {}",
            home.display()
        ));
        home
    }

    /// Wait until every started rank has been reaped (or `until`).
    fn wait_exits(&mut self, until: Instant) {
        while self.ranks.any_running() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(Ev::Exited(rank, exit)) => self.exited(rank, exit),
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Kill and reap everything of the job on this node; answer Bye when the launcher asked.
    fn shutdown(&mut self, bye: bool) -> i32 {
        if self.ranks.any_running() {
            self.ranks.signal(libc::SIGTERM, false);
            let grace = if bye {
                Duration::from_millis(500).min(self.grace)
            } else {
                self.grace
            };
            self.wait_exits(Instant::now() + grace);
        }
        // SIGKILL every rank's group, exited or not: it takes leftover descendants along.
        self.ranks.signal(libc::SIGKILL, true);
        self.wait_exits(Instant::now() + Duration::from_secs(5));
        let n = spawn::kill_orphans(&[]);
        if n > 0 {
            self.log.v(&format!("killed {n} leftover processes"));
        }
        sweep_segments(&self.log, self.job.as_deref());
        self.ranks.close_store();
        if bye {
            let _ = self.writer.send(&Msg::Bye);
        }
        self.writer.close();
        if bye {
            0
        } else {
            1
        }
    }
}

/// Remove the shared-memory segments a killed job left on this node (ranks killed while
/// starting up, before every local rank mapped its node's segment): every file of this job
/// (its processes here are dead), and those of other dead jobs.
fn sweep_segments(log: &Log, job: Option<&str>) {
    let n = railring::transport::shm::sweep_after_job(std::path::Path::new("/dev/shm"), job);
    if n > 0 {
        log.v(&format!("removed {n} stale shared-memory segment(s)"));
    }
}

/// Copy Stdin frames into rank 0's stdin; `None` (StdinEof) closes it.
fn feed_stdin(mut stdin: std::process::ChildStdin, rx: mpsc::Receiver<Option<Vec<u8>>>) {
    while let Ok(Some(data)) = rx.recv() {
        if stdin.write_all(&data).is_err() {
            // Rank 0 stopped reading: drain the rest silently.
            while let Ok(Some(_)) = rx.recv() {}
            return;
        }
    }
}
