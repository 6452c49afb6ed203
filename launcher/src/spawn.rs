//! Starting and watching one rank process on this machine, and the process-tree rules around
//! it ([`crate::node_ranks`] starts a node's ranks with this).
//!
//! Every rank starts in its own session and process group (`setsid`), with
//! `PR_SET_PDEATHSIG = SIGKILL`, so it dies when the thread that forked it (the job's spawning
//! thread, which lives as long as the job) dies. Killing a rank signals its whole group.
//! Before exec the rank is bound to its CPUs and keeps its PMI socket open ([`RankSetup`]).

use crate::proto::{ExitKind, RankSpec, Stream};
use crate::stdio::for_each_line;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long, after a rank exited, its output is still drained before its exit is reported
/// (a descendant holding the pipes open must not hold up the job).
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Receives what the ranks do. Called from the ranks' reader/waiter threads.
pub trait RankEvents: Send + Sync + 'static {
    /// One line (with its `\n`, except a last incomplete line).
    fn output(&self, rank: u32, stream: Stream, line: &[u8]);
    /// The rank ended; called after all its output (within [`DRAIN_AFTER_EXIT`]).
    fn exited(&self, rank: u32, exit: ExitKind);
}

/// The command every rank of a node runs: program, arguments, working directory and the job's
/// variables (a rank's own variables come with its [`RankSpec`]).
pub struct RankCommand<'a> {
    pub program: &'a Path,
    pub args: &'a [String],
    pub cwd: &'a Path,
    /// Added over the inherited environment, before the rank's own variables.
    pub env: &'a [(String, String)],
}

/// What the spawner sets up for one rank besides its variables (see [`crate::node_ranks`]).
#[derive(Default)]
pub struct RankSetup {
    /// Variables over the rank's own (binding, PMI).
    pub env: Vec<(String, String)>,
    /// CPUs to bind the rank to before exec (`None`: affinity left alone).
    pub cpus: Option<libc::cpu_set_t>,
    /// A descriptor the rank inherits (its PMI socket); closed here once the rank started.
    pub keep_fd: Option<OwnedFd>,
}

/// A started rank.
pub struct RankProc {
    pub rank: u32,
    pub pid: u32,
    /// Rank 0's stdin (when it reads railrun's stdin).
    pub stdin: Option<ChildStdin>,
}

/// Start one rank and its reader and waiter threads. Must be called from the thread that lives
/// for the whole job (PDEATHSIG follows the forking thread).
pub fn spawn_rank(
    l: &RankCommand<'_>,
    rank: &RankSpec,
    extra_env: &[(String, String)],
    setup: RankSetup,
    events: Arc<dyn RankEvents>,
) -> io::Result<RankProc> {
    let mut child = rank_process(l, rank, extra_env, &setup).spawn()?;
    // The rank has its copy of the PMI socket; ours closes here.
    drop(setup.keep_fd);
    let pid = child.id();
    let r = rank.rank;
    let stdin = child.stdin.take();
    watch(child, r, events)?;
    Ok(RankProc {
        rank: r,
        pid,
        stdin,
    })
}

/// The rank's command: the node's command line, the job's variables, then the rank's own, then
/// `extra_env`, then the setup's; stdout and stderr piped, stdin piped for rank 0 only; its own
/// session, killed with its parent, bound to its CPUs, its PMI socket inherited.
fn rank_process(
    l: &RankCommand<'_>,
    rank: &RankSpec,
    extra_env: &[(String, String)],
    setup: &RankSetup,
) -> Command {
    let mut cmd = Command::new(l.program);
    cmd.args(l.args).current_dir(l.cwd);
    for (k, v) in l
        .env
        .iter()
        .chain(rank.env.iter())
        .chain(extra_env.iter())
        .chain(setup.env.iter())
    {
        cmd.env(k, v);
    }
    let cpus = setup.cpus;
    let keep_fd = setup.keep_fd.as_ref().map(|f| f.as_raw_fd());
    cmd.stdin(if rank.stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: getpid is async-signal-safe and called here, before the fork.
    let parent = unsafe { libc::getpid() };
    // SAFETY: only async-signal-safe calls (setsid, prctl, getppid, _exit, fcntl,
    // sched_setaffinity on a set built before the fork) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent died between fork and prctl: do not outlive it.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            // The PMI socket is close-on-exec in the spawner; the rank keeps its copy.
            if let Some(fd) = keep_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(set) = cpus.as_ref() {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}

/// One thread per output pipe, forwarding lines to `events`, and one waiting for the rank's
/// end, which is reported once its output is drained (at most [`DRAIN_AFTER_EXIT`] later).
fn watch(mut child: Child, r: u32, events: Arc<dyn RankEvents>) -> io::Result<()> {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut readers = 0;
    for (pipe, stream, name) in [
        (
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            Stream::Stdout,
            "out",
        ),
        (
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            Stream::Stderr,
            "err",
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        readers += 1;
        let ev = events.clone();
        let tx = done_tx.clone();
        std::thread::Builder::new()
            .name(format!("rr-{name}-{r}"))
            .spawn(move || {
                for_each_line(pipe, |line| {
                    ev.output(r, stream, line);
                    true
                });
                let _ = tx.send(());
            })?;
    }
    drop(done_tx);
    std::thread::Builder::new()
        .name(format!("rr-wait-{r}"))
        .spawn(move || {
            let exit = match child.wait() {
                Ok(st) => ExitKind::from_status(st),
                Err(_) => ExitKind::Code(1),
            };
            let deadline = Instant::now() + DRAIN_AFTER_EXIT;
            for _ in 0..readers {
                let left = deadline.saturating_duration_since(Instant::now());
                if done_rx.recv_timeout(left).is_err() {
                    break;
                }
            }
            events.exited(r, exit);
        })?;
    Ok(())
}

/// Send `sig` to the process group of the rank whose leader is `pid`.
pub fn kill_group(pid: u32, sig: i32) {
    if pid > 1 && pid <= i32::MAX as u32 {
        // SAFETY: plain syscall; a negative pid names the process group.
        unsafe {
            libc::kill(-(pid as i32), sig);
        }
    }
}

/// Make this process the reaper of orphaned descendants, so ranks' children that escape their
/// process group are re-parented to us and can be found by [`kill_orphans`].
pub fn become_subreaper() {
    // SAFETY: plain prctl.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Our direct children (pids), read from /proc.
pub fn children() -> Vec<u32> {
    let me = std::process::id();
    let mut v = Vec::new();
    // /proc/self/task/*/children lists children per thread; reading every task covers all.
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                v.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
            }
        }
    }
    if v.is_empty() {
        // Kernels without CONFIG_PROC_CHILDREN: scan /proc/*/stat for our pid as parent.
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                    continue;
                };
                // pid (comm) state ppid ...: comm may hold spaces/parens; split after the last ')'.
                let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else {
                    continue;
                };
                let ppid = rest
                    .split_whitespace()
                    .nth(1)
                    .and_then(|x| x.parse::<u32>().ok());
                if ppid == Some(me) {
                    v.push(pid);
                }
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// SIGKILL and reap every remaining child of this process except `keep`: the last sweep before
/// railrun or an agent exits (leftover descendants of ranks, re-parented to us as subreaper).
/// Returns how many were killed.
pub fn kill_orphans(keep: &[u32]) -> usize {
    let mut n = 0;
    for _ in 0..3 {
        let kids: Vec<u32> = children()
            .into_iter()
            .filter(|p| !keep.contains(p))
            .collect();
        if kids.is_empty() {
            break;
        }
        for &p in &kids {
            // SAFETY: plain syscall on our own child.
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
            }
            n += 1;
        }
        // Reap them, bounded: a process stuck in the kernel must not hang us.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut left = kids;
        while !left.is_empty() && Instant::now() < deadline {
            left.retain(|&p| {
                let mut st = 0;
                // SAFETY: plain syscall on our own child.
                let r = unsafe { libc::waitpid(p as i32, &mut st, libc::WNOHANG) };
                r == 0
            });
            if !left.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    n
}
