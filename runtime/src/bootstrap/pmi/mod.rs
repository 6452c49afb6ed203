//! Bootstrap through a PMI-1 server: a railring program started by MPICH's `mpiexec` (Hydra)
//! or anything else that pre-connects a PMI-1 socket (`PMI_FD`, with `PMI_RANK` and
//! `PMI_SIZE`) needs neither railrun nor the `mpi` feature.
//!
//! PMI carries only rank 0's offer of a bootstrap store ([`super::offer`]): rank 0 starts the
//! store and puts the offer (hex, cut into values the server accepts) into the job's key-value
//! space; every rank passes a PMI barrier, reads the offer and joins the store. Then the rank
//! says `finalize` to the PMI server (the launcher's bookkeeping stays clean) and never uses
//! PMI again: the data plane is railring's own. The protocol itself is in [`wire`].
//!
//! A program that also uses MPICH itself must not share the PMI connection with railring: build
//! railring with the `mpi` feature there (then `Communicator::init` bootstraps over MPI).

pub mod wire;

use super::offer::{self, StoreOffer};
use super::Rendezvous;
use crate::error::{Error, Result};
use crate::store::auth;
use std::io::{BufReader, Write};
use std::os::unix::io::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wire::Message;

/// The key holding the number of pieces of the offer; the pieces are `railring-offer-<i>`.
const OFFER_COUNT_KEY: &str = "railring-offer-n";
/// Most pieces an offer may be cut into (bounds what a rank reads).
const MAX_PIECES: usize = 256;

/// The PMI socket is this process's once: a second bootstrap must not read or close it again.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// A PMI-1 client over the launcher's pre-connected socket.
pub struct Client {
    r: BufReader<UnixStream>,
    w: UnixStream,
    fd: i32,
}

fn pmi_err(what: impl Into<String>) -> Error {
    Error::Invalid(format!("PMI bootstrap: {}", what.into()))
}

impl Client {
    /// Take over the socket `PMI_FD` names (once per process). It must be an open socket; it
    /// is made close-on-exec so the program's children do not inherit it.
    pub fn from_fd(fd: i32, timeout: Duration) -> Result<Client> {
        let env_err = |why: String| Error::Env {
            var: "PMI_FD".into(),
            value: fd.to_string(),
            why,
        };
        if fd < 0 {
            return Err(env_err("not a file descriptor".into()));
        }
        // SAFETY: fstat on any number only fills `st`; a closed fd is EBADF.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(env_err(format!("not an open file descriptor here ({e})")));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(env_err(
                "not a socket: the PMI server must pre-connect one".into(),
            ));
        }
        if TAKEN.swap(true, Ordering::SeqCst) {
            return Err(env_err(
                "this process already bootstrapped through PMI once (PMI is used once per process; keep the first communicator, split() makes sub-groups)"
                    .into(),
            ));
        }
        // SAFETY: fd is an open socket inherited from the launcher that nothing else in this
        // process owns (guarded by TAKEN); from here on the UnixStream owns it.
        let s = unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            UnixStream::from_raw_fd(fd)
        };
        let io = |e: std::io::Error| env_err(format!("cannot use the PMI socket: {e}"));
        s.set_read_timeout(Some(timeout.max(Duration::from_secs(1))))
            .map_err(io)?;
        let w = s.try_clone().map_err(io)?;
        Ok(Client {
            r: BufReader::new(s),
            w,
            fd,
        })
    }

    /// Send `req` and read its response, which must be `expect` with `rc` 0.
    fn call(&mut self, req: Message, expect: &str) -> Result<Message> {
        let line = req.encode();
        self.w.write_all(line.as_bytes()).map_err(|e| {
            pmi_err(format!(
                "sending {} on PMI_FD={}: {e} (did the launcher end?)",
                req.cmd, self.fd
            ))
        })?;
        let resp = match wire::read_line(&mut self.r) {
            Ok(Some(l)) => Message::parse(&l).map_err(|e| {
                pmi_err(format!(
                    "the PMI server answered {} with {e} (is it a PMI-1 server? PMI-2 and PMIx are not spoken here)",
                    req.cmd
                ))
            })?,
            Ok(None) => {
                return Err(pmi_err(format!(
                    "the PMI server closed PMI_FD={} instead of answering {}",
                    self.fd, req.cmd
                )))
            }
            Err(wire::WireError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(pmi_err(format!(
                    "no answer to {} from the PMI server within RAILRING_CONNECT_TIMEOUT (did every rank start?)",
                    req.cmd
                )))
            }
            Err(e) => return Err(pmi_err(format!("reading the answer to {}: {e}", req.cmd))),
        };
        if resp.cmd != expect {
            return Err(pmi_err(format!(
                "the PMI server answered {} with cmd={} (expected {expect})",
                req.cmd, resp.cmd
            )));
        }
        if resp.rc() != 0 {
            return Err(pmi_err(format!(
                "the PMI server refused {} (rc={}): {}",
                req.cmd,
                resp.get("rc").unwrap_or("?"),
                resp.get("msg").unwrap_or("no message")
            )));
        }
        Ok(resp)
    }

    /// `init` (PMI 1.1), then the server's limits: (key length, value length) with the
    /// terminating NUL PMI counts; and the job's key-value space name.
    pub fn init(&mut self) -> Result<(usize, usize, String)> {
        self.call(
            Message::new("init")
                .with("pmi_version", wire::VERSION)
                .with("pmi_subversion", wire::SUBVERSION),
            "response_to_init",
        )?;
        let m = self.call(Message::new("get_maxes"), "maxes")?;
        let num = |k: &str| -> Result<usize> {
            m.get(k)
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n >= 8)
                .ok_or_else(|| pmi_err(format!("maxes without a usable {k}")))
        };
        let (keylen, vallen) = (num("keylen_max")?, num("vallen_max")?);
        let k = self.call(Message::new("get_my_kvsname"), "my_kvsname")?;
        let kvs = k
            .get("kvsname")
            .filter(|s| wire::is_word(s, wire::KVSNAME_MAX))
            .ok_or_else(|| pmi_err("my_kvsname without a usable kvsname"))?
            .to_string();
        Ok((keylen, vallen, kvs))
    }

    pub fn put(&mut self, kvs: &str, key: &str, value: &str) -> Result<()> {
        self.call(
            Message::new("put")
                .with("kvsname", kvs)
                .with("key", key)
                .with("value", value),
            "put_result",
        )
        .map(|_| ())
    }

    pub fn get(&mut self, kvs: &str, key: &str) -> Result<String> {
        let m = self.call(
            Message::new("get").with("kvsname", kvs).with("key", key),
            "get_result",
        )?;
        m.get("value")
            .map(str::to_string)
            .ok_or_else(|| pmi_err(format!("get_result for {key} without a value")))
    }

    pub fn barrier(&mut self) -> Result<()> {
        self.call(Message::new("barrier_in"), "barrier_out")
            .map(|_| ())
    }

    pub fn finalize(&mut self) -> Result<()> {
        self.call(Message::new("finalize"), "finalize_ack")
            .map(|_| ())
    }
}

/// Cut `hex` into pieces of at most `max` characters.
fn pieces(hex: &str, max: usize) -> Vec<&str> {
    let max = max.max(1);
    (0..hex.len().div_ceil(max))
        .map(|i| &hex[i * max..((i + 1) * max).min(hex.len())])
        .collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// The rendezvous of `rank` of `size` through the PMI server on `fd`: rank 0 offers a store in
/// the key-value space, everyone reads it after a barrier and joins (see the module docs).
pub fn rendezvous(
    rank: usize,
    size: usize,
    fd: i32,
    connect_timeout: Duration,
) -> Result<Rendezvous> {
    let mut c = Client::from_fd(fd, connect_timeout)?;
    let (_keylen, vallen, kvs) = c.init()?;
    let mut server = None;
    if rank == 0 {
        let (rec, s) = offer::host();
        server = s;
        let hex = auth::hex(&rec.encode());
        // PMI counts the terminating NUL in vallen_max.
        let parts = pieces(&hex, vallen.saturating_sub(1).min(wire::VALLEN_MAX));
        if parts.len() > MAX_PIECES {
            return Err(pmi_err(format!(
                "rank 0's offer needs {} values of {} bytes (more than {MAX_PIECES})",
                parts.len(),
                vallen
            )));
        }
        for (i, p) in parts.iter().enumerate() {
            c.put(&kvs, &format!("railring-offer-{i}"), p)?;
        }
        c.put(&kvs, OFFER_COUNT_KEY, &parts.len().to_string())?;
    }
    c.barrier()?;
    let n: usize = c
        .get(&kvs, OFFER_COUNT_KEY)?
        .trim()
        .parse()
        .ok()
        .filter(|&n| (1..=MAX_PIECES).contains(&n))
        .ok_or_else(|| pmi_err("rank 0's offer has no usable piece count"))?;
    let mut hex = String::new();
    for i in 0..n {
        hex.push_str(&c.get(&kvs, &format!("railring-offer-{i}"))?);
    }
    let bytes = unhex(&hex).ok_or_else(|| pmi_err("rank 0's offer is not hex"))?;
    let rec = StoreOffer::decode(&bytes, "PMI")?;
    // PMI's part is over: the store carries everything from here on.
    c.finalize()?;
    drop(c);
    offer::join(rank, size, rec, server, connect_timeout, "PMI")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_and_hex() {
        assert_eq!(pieces("abcdef", 4), vec!["abcd", "ef"]);
        assert_eq!(pieces("abcd", 4), vec!["abcd"]);
        assert!(pieces("", 4).is_empty());
        assert_eq!(unhex(&auth::hex(b"\x00\xffhi")).unwrap(), b"\x00\xffhi");
        assert!(unhex("abc").is_none() && unhex("zz").is_none());
    }

    /// A one-rank job through a PMI-1 server speaking the wire protocol on a socket pair: the
    /// offer goes through put / barrier / get, the store it names works, and the socket cannot
    /// be taken twice.
    #[test]
    fn a_rendezvous_through_a_pmi_server() {
        use std::collections::HashMap;
        use std::io::BufRead;
        use std::os::unix::io::IntoRawFd;
        let (client, server) = UnixStream::pair().unwrap();
        let seen = std::thread::spawn(move || {
            let mut r = BufReader::new(server.try_clone().unwrap());
            let mut w = server;
            let mut kv: HashMap<String, String> = HashMap::new();
            let mut cmds = Vec::new();
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap() == 0 {
                    return cmds;
                }
                let m = Message::parse(l.as_bytes()).unwrap();
                cmds.push(m.cmd.clone());
                let resp = match m.cmd.as_str() {
                    "init" => Message::new("response_to_init").with("rc", 0),
                    "get_maxes" => Message::new("maxes")
                        .with("kvsname_max", 256)
                        .with("keylen_max", 64)
                        .with("vallen_max", 40),
                    "get_my_kvsname" => Message::new("my_kvsname").with("kvsname", "k"),
                    "put" => {
                        kv.insert(m.get("key").unwrap().into(), m.get("value").unwrap().into());
                        Message::new("put_result").with("rc", 0)
                    }
                    "get" => match kv.get(m.get("key").unwrap()) {
                        Some(v) => Message::new("get_result").with("rc", 0).with("value", v),
                        None => Message::new("get_result").with("rc", -1),
                    },
                    "barrier_in" => Message::new("barrier_out"),
                    "finalize" => Message::new("finalize_ack"),
                    _ => Message::new("x").with("rc", -1),
                };
                w.write_all(resp.encode().as_bytes()).unwrap();
            }
        });
        let fd = client.into_raw_fd();
        let rv = rendezvous(0, 1, fd, Duration::from_secs(10)).expect("rendezvous");
        assert_eq!((rv.rank, rv.size), (0, 1));
        rv.store.set("k", b"v").unwrap();
        assert_eq!(rv.store.get("k", Duration::from_secs(1)).unwrap(), b"v");
        assert!(rv.server.is_some());
        let cmds = seen.join().unwrap();
        // The offer (hundreds of hex digits) was cut into values of at most 39.
        assert!(cmds.iter().filter(|c| *c == "put").count() > 3, "{cmds:?}");
        assert_eq!(cmds.last().map(String::as_str), Some("finalize"));
        // Once per process.
        let (a, _b) = UnixStream::pair().unwrap();
        let e = Client::from_fd(a.into_raw_fd(), Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("already bootstrapped"), "{e}");
    }

    /// A server that answers with something else than PMI-1: an error that says so, no hang.
    #[test]
    fn a_server_that_is_not_pmi_1_is_an_error() {
        let (client, server) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut w = server;
            w.write_all(b"\x00\x00\x00\x05hello\n").unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let mut c = Client {
            r: BufReader::new(client.try_clone().unwrap()),
            w: client,
            fd: -1,
        };
        let e = c.init().unwrap_err().to_string();
        assert!(e.contains("PMI-1"), "{e}");
        t.join().unwrap();
    }

    #[test]
    fn not_a_socket_is_an_error_naming_pmi_fd() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::unix::io::AsRawFd;
        let e = Client::from_fd(f.as_raw_fd(), Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("PMI_FD"), "{e}");
        assert!(Client::from_fd(-1, Duration::from_secs(1)).is_err());
        assert!(Client::from_fd(987_654, Duration::from_secs(1)).is_err());
    }
}
