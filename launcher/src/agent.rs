//! `railrun --agent`: the remote side, started by the launcher over SSH, one per node.
//!
//! It talks to the launcher only through its stdin/stdout (the SSH channel; see
//! [`crate::proto`]), never by opening a connection back: it greets with `Hello`, starts the ranks
//! of the `Spawn` it gets, forwards their output and exits, serves their bootstrap-store
//! connections on `127.0.0.1` with a relay that forwards every request as a `StoreReq` frame, and
//! kills its ranks on `Kill`. It kills and reaps every rank (and their leftovers) before it
//! answers `Bye`, and also when it loses the launcher (stdin closed or broken) or gets SIGTERM,
//! SIGINT or SIGHUP.

use crate::proto::{self, ExitKind, FrameWriter, JobSpec, Msg, Stream};
use crate::spawn::{self, Launch, RankEvents};
use railring::bootstrap::store::{self, Backend};
use railring::bootstrap::wire::{Request, Response};
use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::io::FromRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

type Writer = Arc<FrameWriter<File>>;

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

fn install_signal_handlers() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let sa = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        let _ = unsafe { sigaction(s, &sa) };
    }
}

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

/// The store relay: serves the node's ranks, forwarding each request to the launcher.
pub struct Relay {
    writer: Writer,
    pending: Mutex<HashMap<u64, mpsc::Sender<Vec<u8>>>>,
    next: AtomicU64,
    dead: AtomicBool,
}

thread_local! {
    static CONN_ID: Cell<u64> = const { Cell::new(0) };
}
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

impl Relay {
    fn new(writer: Writer) -> Arc<Relay> {
        Arc::new(Relay {
            writer,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            dead: AtomicBool::new(false),
        })
    }

    fn deliver(&self, id: u64, frame: Vec<u8>) {
        let tx = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(tx) = tx {
            let _ = tx.send(frame);
        }
    }

    /// The launcher is gone: every waiting and future request fails.
    fn fail_all(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Backend for Relay {
    fn handle(&self, req: Request) -> Response {
        let lost =
            || Response::Error("the railrun agent lost its connection to the launcher".into());
        if self.dead.load(Ordering::SeqCst) {
            return lost();
        }
        // Each relay connection is served by its own thread: name it once.
        let conn = CONN_ID.with(|c| {
            if c.get() == 0 {
                c.set(NEXT_CONN.fetch_add(1, Ordering::Relaxed));
            }
            c.get()
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        if self.dead.load(Ordering::SeqCst) {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return lost();
        }
        if let Err(e) = self.writer.send(&Msg::StoreReq {
            conn,
            id,
            frame: req.encode(),
        }) {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            return Response::Error(format!(
                "railrun agent: cannot forward the store request: {e}"
            ));
        }
        match rx.recv() {
            Ok(f) => Response::decode(&f).unwrap_or_else(|e| Response::Error(e.to_string())),
            Err(_) => lost(),
        }
    }
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
    let (inp, mut out) = match take_stdio() {
        Ok(x) => x,
        Err(e) => {
            log.say(&format!("cannot set up the launcher channel: {e}"));
            return 1;
        }
    };
    spawn::become_subreaper();
    install_signal_handlers();
    let mut greeting = proto::MAGIC.to_vec();
    greeting.push(b'\n');
    if out.write_all(&greeting).and_then(|_| out.flush()).is_err() {
        return 1;
    }
    let writer: Writer = Arc::new(FrameWriter::new(out));
    let hello = Msg::Hello {
        hostname: host.clone(),
        pid: std::process::id(),
        free_port: free_port(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    if writer.send(&hello).is_err() {
        return 1;
    }
    log.v("connected");
    let relay = Relay::new(writer.clone());
    let (tx, rx) = mpsc::channel::<Ev>();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Option<Vec<u8>>>();
    {
        let relay = relay.clone();
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name("rr-agent-in".into())
            .spawn(move || {
                let mut r = BufReader::with_capacity(256 * 1024, inp);
                loop {
                    match proto::read_msg(&mut r) {
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
            });
        if spawned.is_err() {
            return 1;
        }
    }
    let mut st = AgentState {
        log,
        writer,
        relay,
        tx,
        rx,
        stdin_rx: Some(stdin_rx),
        ranks: HashMap::new(),
        grace: Duration::from_secs(3),
        spawned: false,
        _server: None,
    };
    st.main_loop()
}

struct AgentState {
    log: Log,
    writer: Writer,
    relay: Arc<Relay>,
    tx: mpsc::Sender<Ev>,
    rx: mpsc::Receiver<Ev>,
    stdin_rx: Option<mpsc::Receiver<Option<Vec<u8>>>>,
    /// rank -> (pid, exited)
    ranks: HashMap<u32, (u32, bool)>,
    grace: Duration,
    spawned: bool,
    _server: Option<store::ServerHandle>,
}

impl AgentState {
    fn main_loop(&mut self) -> i32 {
        loop {
            let sig = SIGNALLED.load(Ordering::SeqCst);
            if sig != 0 {
                self.log.say(&format!(
                    "got {}; killing this node's ranks",
                    proto::signal_name(sig)
                ));
                return self.shutdown(false);
            }
            let ev = match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(ev) => ev,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.shutdown(false),
            };
            match ev {
                Ev::Msg(Msg::Spawn(spec)) => {
                    if self.spawned {
                        self.log.say("ignoring a second Spawn");
                    } else {
                        self.spawned = true;
                        self.spawn(spec);
                    }
                }
                Ev::Msg(Msg::Kill { signal }) => {
                    self.log.v(&format!("Kill {}", proto::signal_name(signal)));
                    self.signal_all(signal, false);
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
                    if self.ranks.values().any(|r| !r.1) {
                        self.log.say(&format!("{why}; killing this node's ranks"));
                    }
                    return self.shutdown(false);
                }
            }
        }
    }

    fn exited(&mut self, rank: u32, exit: ExitKind) {
        if let Some(r) = self.ranks.get_mut(&rank) {
            if !r.1 {
                r.1 = true;
                let _ = self.writer.send(&Msg::RankExited { rank, exit });
            }
        }
    }

    fn spawn(&mut self, spec: JobSpec) {
        self.grace = Duration::from_millis(spec.kill_grace_ms.min(3_600_000));
        let fail_all = |this: &mut Self, from: usize, error: String| {
            for (i, r) in spec.ranks.iter().enumerate().skip(from) {
                let e = if i == from {
                    error.clone()
                } else {
                    format!(
                        "not started: rank {} failed to start on this node",
                        spec.ranks[from].rank
                    )
                };
                let _ = this.writer.send(&Msg::SpawnFailed {
                    rank: r.rank,
                    error: e,
                });
            }
        };
        // The relay for this node's ranks: 127.0.0.1 only, guarded by the job secret.
        let listener = match TcpListener::bind("127.0.0.1:0") {
            Ok(l) => l,
            Err(e) => {
                return fail_all(
                    self,
                    0,
                    format!("cannot open the store relay on 127.0.0.1: {e}"),
                )
            }
        };
        let server = match store::serve(listener, &spec.secret, self.relay.clone()) {
            Ok(s) => s,
            Err(e) => return fail_all(self, 0, format!("cannot serve the store relay: {e}")),
        };
        let extra = vec![
            ("RAILRING_STORE_ADDR".to_string(), server.addr.to_string()),
            ("RAILRING_JOB_SECRET".to_string(), spec.secret.clone()),
        ];
        self._server = Some(server);
        let mut cwd = PathBuf::from(&spec.cwd);
        if !cwd.is_dir() {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|h| h.is_dir())
                .unwrap_or_else(|| PathBuf::from("/"));
            self.log.say(&format!(
                "working directory {} does not exist here; using {}",
                spec.cwd,
                home.display()
            ));
            cwd = home;
        }
        let program = PathBuf::from(&spec.program);
        let launch = Launch {
            program: &program,
            args: &spec.args,
            cwd: &cwd,
            env: &spec.env,
        };
        let events: Arc<dyn RankEvents> = Arc::new(AgentEvents {
            writer: self.writer.clone(),
            tx: Mutex::new(self.tx.clone()),
        });
        let mut pids = Vec::new();
        for (i, r) in spec.ranks.iter().enumerate() {
            match spawn::spawn_rank(&launch, r, &extra, events.clone()) {
                Ok(p) => {
                    self.ranks.insert(p.rank, (p.pid, false));
                    pids.push((p.rank, p.pid));
                    if let Some(stdin) = p.stdin {
                        if let Some(rx) = self.stdin_rx.take() {
                            let _ = std::thread::Builder::new()
                                .name("rr-agent-stdin".into())
                                .spawn(move || feed_stdin(stdin, rx));
                        }
                    }
                }
                Err(e) => {
                    self.log.v(&format!("rank {} failed to start: {e}", r.rank));
                    return fail_all(self, i, format!("cannot start {}: {e}", spec.program));
                }
            }
        }
        self.log.v(&format!("started ranks {:?}", pids));
        let _ = self.writer.send(&Msg::Started { pids });
    }

    fn signal_all(&self, sig: i32, include_exited: bool) {
        for &(pid, exited) in self.ranks.values() {
            if include_exited || !exited {
                spawn::kill_group(pid, sig);
            }
        }
    }

    /// Wait until every started rank has been reaped (or `until`).
    fn wait_exits(&mut self, until: Instant) {
        while self.ranks.values().any(|r| !r.1) {
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
        if self.ranks.values().any(|r| !r.1) {
            self.signal_all(libc::SIGTERM, false);
            let grace = if bye {
                Duration::from_millis(500).min(self.grace)
            } else {
                self.grace
            };
            self.wait_exits(Instant::now() + grace);
        }
        // SIGKILL every rank's group, exited or not: it takes leftover descendants along.
        self.signal_all(libc::SIGKILL, true);
        self.wait_exits(Instant::now() + Duration::from_secs(5));
        let n = spawn::kill_orphans(&[]);
        if n > 0 {
            self.log.v(&format!("killed {n} leftover processes"));
        }
        self._server = None;
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
