//! railrun's PMI-1 server: MPICH-family programs (MPICH, mpi4py built against it, anything
//! speaking PMI-1 like Hydra's clients) run under railrun as one job, not N singletons.
//!
//! Every rank gets one end of a socket pair as `PMI_FD` (with `PMI_RANK` and `PMI_SIZE`), set
//! up by the process that spawns it ([`crate::node_ranks`]: railrun for its own machine, each
//! agent for its node); the other end is served here, one thread per rank, speaking the wire
//! protocol of [`railring::bootstrap::pmi::wire`] (Flux RFC 13; what MPICH's Hydra serves). The
//! key-value space lives in the job's own authenticated store: `put` is a store `set` under
//! `pmi/kv/`, `get` a `get` that does not wait, and `barrier_in` a counter plus a release key —
//! through railrun's store on its own node and through the agent's relay (over its SSH
//! channel) on every other node, so ranks on different nodes read each other's business
//! cards. The launcher puts `PMI_process_mapping` (which ranks share a node) before any rank
//! starts ([`process_mapping`]).
//!
//! `abort` (`MPI_Abort`) is said on the rank's stderr and ends the job, as under Hydra: the
//! server kills the aborting rank's process group (MPICH's client waits for its process manager
//! to do so), and its exit is reported as a failure with the abort's error code (1 for code 0;
//! [`AbortAware`]), which ends every other rank. Dynamic processes (`spawn`, name publishing)
//! are refused with an error code.

use crate::proto::{ExitKind, Stream};
use crate::spawn::RankEvents;
use railring::bootstrap::pmi::wire::{self, Message, WireError};
use railring::store::wire::{Request, Response};
use railring::store::Backend;
use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Store keys of the key-value space (the store is the job's own: no job prefix needed).
const KV_PREFIX: &str = "pmi/kv/";
const BARRIER_PREFIX: &str = "pmi/barrier/";
/// Longest wait for a barrier's release in one store request (it is asked again after).
const BARRIER_WAIT: Duration = Duration::from_secs(3600);
/// Most lines of one multi-line (spawn) request read before giving up on it.
const MAX_MCMD_LINES: usize = 4096;

/// The key-value space's name for job `job_id`.
pub fn kvsname(job_id: &str) -> String {
    format!("railrun_{job_id}")
}

/// `PMI_process_mapping` for ranks placed on nodes `node_of[rank]`: the Flux RFC 13 vector of
/// (first node, node count, ranks per node) blocks, one per run of consecutive ranks on one
/// node, merged where neighbouring nodes take the same number. Empty (mapping unknown, MPICH
/// then exchanges host names) when it does not fit in a value.
pub fn process_mapping(node_of: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (node, ranks)
    for &n in node_of {
        match runs.last_mut() {
            Some((m, c)) if *m == n => *c += 1,
            _ => runs.push((n, 1)),
        }
    }
    let mut blocks: Vec<(usize, usize, usize)> = Vec::new(); // (first node, nodes, per node)
    for (n, c) in runs {
        match blocks.last_mut() {
            Some((first, count, per)) if *per == c && *first + *count == n => *count += 1,
            _ => blocks.push((n, 1, c)),
        }
    }
    let body: Vec<String> = blocks
        .iter()
        .map(|(a, b, c)| format!("({a},{b},{c})"))
        .collect();
    let v = format!("(vector,{})", body.join(","));
    if v.len() < wire::VALLEN_MAX {
        v
    } else {
        String::new()
    }
}

/// The store entry the launcher puts before starting ranks: the mapping under its PMI key.
pub fn mapping_request(node_of: &[usize]) -> Request {
    Request::Set {
        key: format!("{KV_PREFIX}PMI_process_mapping").into_bytes(),
        value: process_mapping(node_of).into_bytes(),
    }
}

/// One node's PMI-1 service for one job.
pub struct PmiService {
    backend: Arc<dyn Backend>,
    kvs: String,
    size: u32,
    /// Ranks that called abort, with their exit code.
    aborts: Mutex<HashMap<u32, i32>>,
    /// The ranks' pids (process group leaders), once started.
    pids: Mutex<HashMap<u32, u32>>,
}

impl PmiService {
    /// The service for job `job_id` of `size` ranks over the job's store (or a relay to it).
    pub fn new(backend: Arc<dyn Backend>, job_id: &str, size: u32) -> Arc<PmiService> {
        Arc::new(PmiService {
            backend,
            kvs: kvsname(job_id),
            size,
            aborts: Mutex::new(HashMap::new()),
            pids: Mutex::new(HashMap::new()),
        })
    }

    /// `rank` runs as process group `pid` (a rank that aborted already is killed now).
    pub fn started(&self, rank: u32, pid: u32) {
        self.pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(rank, pid);
        if self.abort_code(rank).is_some() {
            crate::spawn::kill_group(pid, libc::SIGKILL);
        }
    }

    /// A connection for `rank`: the end to hand the rank (close-on-exec here; the spawner
    /// clears that in the child only), the other end served on a thread of its own. Protocol
    /// errors and aborts are said on the rank's stderr through `events`.
    pub fn connect(
        self: &Arc<Self>,
        rank: u32,
        events: Arc<dyn RankEvents>,
    ) -> io::Result<OwnedFd> {
        // std's UnixStream::pair sets close-on-exec on both ends.
        let (ours, theirs) = UnixStream::pair()?;
        let me = self.clone();
        std::thread::Builder::new()
            .name(format!("rr-pmi-{rank}"))
            .spawn(move || me.serve(rank, ours, &*events))?;
        Ok(OwnedFd::from(theirs))
    }

    /// The exit code `rank` gave to abort, if it called abort.
    pub fn abort_code(&self, rank: u32) -> Option<i32> {
        self.aborts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&rank)
            .copied()
    }

    fn say(&self, events: &dyn RankEvents, rank: u32, text: &str) {
        events.output(
            rank,
            Stream::Stderr,
            format!("railrun: {text}\n").as_bytes(),
        );
    }

    fn serve(&self, rank: u32, s: UnixStream, events: &dyn RankEvents) {
        let Ok(w) = s.try_clone() else { return };
        let mut w = w;
        let mut r = BufReader::new(s);
        let mut epoch = 0u64;
        loop {
            let line = match wire::read_line(&mut r) {
                Ok(Some(l)) => l,
                Ok(None) => return,
                Err(WireError::Io(_)) => return,
                Err(e) => {
                    self.say(
                        events,
                        rank,
                        &format!(
                            "rank {rank}: PMI protocol error ({e}); closing its PMI connection"
                        ),
                    );
                    return;
                }
            };
            let msg = match Message::parse(&line) {
                Ok(m) => m,
                Err(e) => {
                    self.say(
                        events,
                        rank,
                        &format!(
                            "rank {rank}: PMI protocol error ({e}); closing its PMI connection"
                        ),
                    );
                    return;
                }
            };
            let resp = if msg.multi {
                self.skip_mcmd(&mut r);
                Some(refuse(
                    "spawn_result",
                    "railrun does not start processes for MPI_Comm_spawn",
                ))
            } else {
                self.answer(rank, &msg, &mut epoch, events)
            };
            let Some(resp) = resp else {
                return; // abort: the rank exits; nothing is answered
            };
            if w.write_all(resp.encode().as_bytes()).is_err() {
                return;
            }
        }
    }

    /// Read and drop the rest of a multi-line request (up to `endcmd`).
    fn skip_mcmd<R: io::BufRead>(&self, r: &mut R) {
        for _ in 0..MAX_MCMD_LINES {
            match wire::read_line(r) {
                Ok(Some(l)) if l.trim_ascii() == b"endcmd" => return,
                Ok(Some(_)) => {}
                _ => return,
            }
        }
    }

    /// The response to one request; `None` after abort.
    fn answer(
        &self,
        rank: u32,
        m: &Message,
        epoch: &mut u64,
        events: &dyn RankEvents,
    ) -> Option<Message> {
        let ok = |cmd: &str| Message::new(cmd).with("rc", 0);
        Some(match m.cmd.as_str() {
            "init" => {
                if m.get("pmi_version").map(str::trim) == Some("1") {
                    ok("response_to_init")
                        .with("pmi_version", wire::VERSION)
                        .with("pmi_subversion", wire::SUBVERSION)
                } else {
                    self.say(
                        events,
                        rank,
                        &format!(
                            "rank {rank} asked for PMI version {}; railrun serves PMI-1 (MPICH's default)",
                            m.get("pmi_version").unwrap_or("?")
                        ),
                    );
                    refuse("response_to_init", "railrun serves PMI version 1 only")
                        .with("pmi_version", wire::VERSION)
                        .with("pmi_subversion", wire::SUBVERSION)
                }
            }
            "get_maxes" => ok("maxes")
                .with("kvsname_max", wire::KVSNAME_MAX)
                .with("keylen_max", wire::KEYLEN_MAX)
                .with("vallen_max", wire::VALLEN_MAX),
            "get_appnum" => ok("appnum").with("appnum", 0),
            "get_universe_size" => ok("universe_size").with("size", self.size),
            "get_my_kvsname" => ok("my_kvsname").with("kvsname", &self.kvs),
            "put" => self.put(m),
            "get" => self.get(m),
            "barrier_in" => {
                let r = self.barrier(*epoch);
                *epoch += 1;
                r
            }
            "finalize" => ok("finalize_ack"),
            "abort" => {
                let code = m
                    .get("exitcode")
                    .and_then(|c| c.trim().parse::<i32>().ok())
                    .unwrap_or(1);
                self.aborts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(rank, code);
                let why = m
                    .get("message")
                    .map(|t| format!(": {t}"))
                    .unwrap_or_default();
                self.say(
                    events,
                    rank,
                    &format!("rank {rank} called MPI_Abort (PMI abort) with error code {code}{why}; ending the job"),
                );
                let pid = self
                    .pids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&rank)
                    .copied();
                if let Some(pid) = pid {
                    crate::spawn::kill_group(pid, libc::SIGKILL);
                }
                return None;
            }
            "publish_name" => refuse("publish_result", "name publishing is not supported"),
            "unpublish_name" => refuse("unpublish_result", "name publishing is not supported"),
            "lookup_name" => refuse("lookup_result", "name publishing is not supported"),
            other => {
                self.say(
                    events,
                    rank,
                    &format!("rank {rank}: unknown PMI-1 command {other:?} refused"),
                );
                refuse(&format!("{other}_result"), "unknown command")
            }
        })
    }

    /// The kvsname the request names must be this job's.
    fn check_kvs(&self, m: &Message, resp: &str) -> Result<(), Message> {
        match m.get("kvsname") {
            None => Ok(()),
            Some(k) if k == self.kvs => Ok(()),
            Some(k) => Err(refuse(resp, &format!("unknown kvsname {k}"))),
        }
    }

    fn put(&self, m: &Message) -> Message {
        if let Err(r) = self.check_kvs(m, "put_result") {
            return r;
        }
        let (Some(key), Some(value)) = (m.get("key"), m.get("value")) else {
            return refuse("put_result", "put needs key and value");
        };
        if !wire::is_word(key, wire::KEYLEN_MAX) {
            return refuse("put_result", "invalid key");
        }
        if !wire::is_value(value, wire::VALLEN_MAX) {
            return refuse("put_result", "invalid value");
        }
        match self.backend.handle(Request::Set {
            key: format!("{KV_PREFIX}{key}").into_bytes(),
            value: value.as_bytes().to_vec(),
        }) {
            Response::Ok => Message::new("put_result").with("rc", 0),
            other => refuse("put_result", &store_failure(&other)),
        }
    }

    fn get(&self, m: &Message) -> Message {
        if let Err(r) = self.check_kvs(m, "get_result") {
            return r;
        }
        let Some(key) = m.get("key") else {
            return refuse("get_result", "get needs a key");
        };
        if !wire::is_word(key, wire::KEYLEN_MAX) {
            return refuse("get_result", "invalid key");
        }
        match self.backend.handle(Request::Get {
            key: format!("{KV_PREFIX}{key}").into_bytes(),
            timeout: Duration::ZERO,
        }) {
            Response::Value(v) => match String::from_utf8(v) {
                Ok(v) => Message::new("get_result").with("rc", 0).with("value", v),
                Err(_) => refuse("get_result", "stored value is not text"),
            },
            Response::Timeout(_) => refuse("get_result", &format!("key {key} not found")),
            other => refuse("get_result", &store_failure(&other)),
        }
    }

    /// Barrier number `epoch` (every rank passes the same barriers in the same order): count in,
    /// the last one in releases everyone.
    fn barrier(&self, epoch: u64) -> Message {
        let count = format!("{BARRIER_PREFIX}{epoch}");
        let out = format!("{BARRIER_PREFIX}{epoch}/out");
        match self.backend.handle(Request::Add {
            key: count.into_bytes(),
            delta: 1,
        }) {
            Response::Int(n) if n == self.size as i64 => {
                if let r @ (Response::Error(_) | Response::Timeout(_)) =
                    self.backend.handle(Request::Set {
                        key: out.clone().into_bytes(),
                        value: b"1".to_vec(),
                    })
                {
                    return refuse("barrier_out", &store_failure(&r));
                }
            }
            Response::Int(_) => {}
            other => return refuse("barrier_out", &store_failure(&other)),
        }
        loop {
            match self.backend.handle(Request::Wait {
                keys: vec![out.clone().into_bytes()],
                timeout: BARRIER_WAIT,
            }) {
                Response::Ok => return Message::new("barrier_out").with("rc", 0),
                Response::Timeout(_) => continue,
                other => return refuse("barrier_out", &store_failure(&other)),
            }
        }
    }
}

/// A failed response: `rc=-1` and the reason (PMI values hold no spaces).
fn refuse(cmd: &str, why: &str) -> Message {
    Message::new(cmd)
        .with("rc", -1)
        .with("msg", why.replace(|c: char| !c.is_ascii_graphic(), "_"))
}

fn store_failure(r: &Response) -> String {
    match r {
        Response::Error(e) => format!("store: {e}"),
        Response::Timeout(_) => "store: timed out".into(),
        other => format!("store: unexpected answer {other:?}"),
    }
}

/// The node's [`RankEvents`] with aborts taken into account: a rank that called abort ends the
/// job, so its exit (the server killed it) is reported as the abort's error code, 1 for 0.
pub struct AbortAware {
    pub inner: Arc<dyn RankEvents>,
    pub pmi: Arc<PmiService>,
}

impl RankEvents for AbortAware {
    fn output(&self, rank: u32, stream: Stream, line: &[u8]) {
        self.inner.output(rank, stream, line);
    }
    fn exited(&self, rank: u32, exit: ExitKind) {
        let exit = match self.pmi.abort_code(rank) {
            Some(code) => ExitKind::Code(if code != 0 { code } else { 1 }),
            None => exit,
        };
        self.inner.exited(rank, exit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railring::store::Store;
    use std::io::{BufRead, Read};
    use std::os::unix::net::UnixStream as Us;

    #[test]
    fn mappings() {
        assert_eq!(process_mapping(&[0, 0, 1, 1]), "(vector,(0,2,2))");
        assert_eq!(process_mapping(&[0, 1, 0, 1]), "(vector,(0,2,1),(0,2,1))");
        assert_eq!(
            process_mapping(&[0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]),
            "(vector,(0,2,2),(2,2,4))"
        );
        assert_eq!(process_mapping(&[0]), "(vector,(0,1,1))");
        let cyclic: Vec<usize> = (0..4096).map(|r| r % 512).collect();
        assert_eq!(process_mapping(&cyclic).matches("(0,512,1)").count(), 8);
        let scattered: Vec<usize> = (0..4096).map(|r| (r * 7919) % 509).collect();
        assert_eq!(process_mapping(&scattered), "");
    }

    struct Sink(Mutex<Vec<String>>);
    impl RankEvents for Sink {
        fn output(&self, rank: u32, _s: Stream, line: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{rank}:{}", String::from_utf8_lossy(line)));
        }
        fn exited(&self, _r: u32, _e: ExitKind) {}
    }

    fn talk(c: &mut (BufReader<Us>, Us), line: &str) -> Message {
        c.1.write_all(line.as_bytes()).unwrap();
        c.1.write_all(b"\n").unwrap();
        let mut s = String::new();
        c.0.read_line(&mut s).unwrap();
        Message::parse(s.as_bytes()).unwrap()
    }

    fn client(svc: &Arc<PmiService>, rank: u32, ev: &Arc<Sink>) -> (BufReader<Us>, Us) {
        let fd = svc.connect(rank, ev.clone()).unwrap();
        let s = Us::from(fd);
        (BufReader::new(s.try_clone().unwrap()), s)
    }

    /// Two ranks through the real store: init, put, barrier, get each other's value, missing
    /// keys, bad input, abort.
    #[test]
    fn a_job_of_two_through_the_store() {
        let store = Store::new();
        store.handle(mapping_request(&[0, 1]));
        let svc = PmiService::new(store, "j1", 2);
        let ev = Arc::new(Sink(Mutex::new(Vec::new())));
        let mut c0 = client(&svc, 0, &ev);
        let mut c1 = client(&svc, 1, &ev);
        let r = talk(&mut c0, "cmd=init pmi_version=1 pmi_subversion=1");
        assert_eq!((r.cmd.as_str(), r.rc()), ("response_to_init", 0));
        let r = talk(&mut c1, "cmd=get_maxes");
        assert_eq!(r.get("vallen_max"), Some("1024"));
        let r = talk(&mut c1, "cmd=get_my_kvsname");
        assert_eq!(r.get("kvsname"), Some("railrun_j1"));
        assert_eq!(
            talk(&mut c0, "cmd=put kvsname=railrun_j1 key=card-0 value=AB").rc(),
            0
        );
        assert_eq!(
            talk(&mut c1, "cmd=put kvsname=railrun_j1 key=card-1 value=CD").rc(),
            0
        );
        // The barrier releases only when both are in.
        let t = std::thread::spawn(move || {
            let r = talk(&mut c1, "cmd=barrier_in");
            (r, c1)
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "barrier released with one rank in");
        assert_eq!(talk(&mut c0, "cmd=barrier_in").cmd, "barrier_out");
        let (r, mut c1) = t.join().unwrap();
        assert_eq!((r.cmd.as_str(), r.rc()), ("barrier_out", 0));
        let r = talk(&mut c0, "cmd=get kvsname=railrun_j1 key=card-1");
        assert_eq!(r.get("value"), Some("CD"));
        let r = talk(
            &mut c1,
            "cmd=get kvsname=railrun_j1 key=PMI_process_mapping",
        );
        assert_eq!(r.get("value"), Some("(vector,(0,2,1))"));
        let r = talk(&mut c1, "cmd=get kvsname=railrun_j1 key=nothing");
        assert!(r.rc() != 0 && r.cmd == "get_result", "{r:?}");
        assert!(talk(&mut c1, "cmd=get kvsname=other key=card-0").rc() != 0);
        assert!(talk(&mut c1, "cmd=put kvsname=railrun_j1 key=a=b value=x").rc() != 0);
        let big = "x".repeat(wire::VALLEN_MAX + 1);
        assert!(talk(&mut c1, &format!("cmd=put key=k value={big}")).rc() != 0);
        assert!(talk(&mut c1, "cmd=lookup_name service=s").rc() != 0);
        assert_eq!(talk(&mut c1, "cmd=finalize").cmd, "finalize_ack");
        // abort: said on the rank's stderr, no answer, the connection ends.
        c0.1.write_all(b"cmd=abort exitcode=7\n").unwrap();
        let mut rest = String::new();
        c0.0.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "");
        assert_eq!(svc.abort_code(0), Some(7));
        assert_eq!(svc.abort_code(1), None);
        let said = ev.0.lock().unwrap().join("");
        assert!(
            said.contains("0:railrun: rank 0 called MPI_Abort (PMI abort) with error code 7"),
            "{said}"
        );
    }

    #[test]
    fn garbage_closes_the_connection_with_a_note() {
        let svc = PmiService::new(Store::new(), "j", 1);
        let ev = Arc::new(Sink(Mutex::new(Vec::new())));
        let mut c = client(&svc, 0, &ev);
        c.1.write_all(b"hello there\n").unwrap();
        let mut rest = String::new();
        c.0.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "");
        let said = ev.0.lock().unwrap().join("");
        assert!(said.contains("PMI protocol error"), "{said}");
        // A spawn request is read to its end and refused; the connection lives on.
        let mut c = client(&svc, 0, &ev);
        c.1.write_all(b"mcmd=spawn\nnprocs=1\nexecname=x\nendcmd\n")
            .unwrap();
        let mut s = String::new();
        c.0.read_line(&mut s).unwrap();
        let m = Message::parse(s.as_bytes()).unwrap();
        assert!(m.cmd == "spawn_result" && m.rc() != 0);
        assert_eq!(talk(&mut c, "cmd=get_appnum").get("appnum"), Some("0"));
    }

    #[test]
    fn an_abort_with_code_zero_is_still_a_failure() {
        struct Exits(Mutex<Vec<(u32, ExitKind)>>);
        impl RankEvents for Exits {
            fn output(&self, _: u32, _: Stream, _: &[u8]) {}
            fn exited(&self, r: u32, e: ExitKind) {
                self.0.lock().unwrap().push((r, e));
            }
        }
        let svc = PmiService::new(Store::new(), "j", 3);
        svc.aborts.lock().unwrap().insert(1, 0);
        svc.aborts.lock().unwrap().insert(2, 5);
        let inner = Arc::new(Exits(Mutex::new(Vec::new())));
        let a = AbortAware {
            inner: inner.clone(),
            pmi: svc,
        };
        a.exited(0, ExitKind::Code(0));
        a.exited(1, ExitKind::Code(0));
        a.exited(2, ExitKind::Signal(9));
        assert_eq!(
            *inner.0.lock().unwrap(),
            vec![
                (0, ExitKind::Code(0)),
                (1, ExitKind::Code(1)),
                (2, ExitKind::Code(5))
            ]
        );
    }
}
