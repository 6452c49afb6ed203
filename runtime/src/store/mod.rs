//! The bootstrap key-value store: set / get / wait / add / check, gated by the job secret.
//!
//! [`Store`] is the state; [`serve`] accepts TCP clients for any [`Backend`] (the launcher serves
//! its own [`Store`]; a railrun agent serves a relay that forwards over its SSH channel; under
//! srun or torchrun-style env, rank 0 serves one); [`StoreClient`] is what ranks use.

pub mod auth;
pub mod gate;
pub mod wire;

use gate::{Deadlined, Gate, Ticket};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wire::{Request, Response};

/// Anything that answers store requests.
pub trait Backend: Send + Sync + 'static {
    fn handle(&self, req: Request) -> Response;
}

/// The longest a `Get` or `Wait` may wait (a longer timeout from the wire is cut to this).
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 86400);

/// Upper bound on the bytes held by one store (keys + values).
pub const MAX_STORE_BYTES: usize = 1 << 30;

/// Keys to values, and the bytes they hold.
type Entries = (HashMap<Vec<u8>, Vec<u8>>, usize);

/// The store's state.
#[derive(Default)]
pub struct Store {
    map: Mutex<Entries>,
    cv: Condvar,
}

impl Store {
    pub fn new() -> Arc<Store> {
        Arc::new(Store::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, key: Vec<u8>, value: Vec<u8>) -> Response {
        let mut g = self.lock();
        let old = g.0.get(&key).map(|v| v.len() + key.len()).unwrap_or(0);
        let new_total = g.1 - old + key.len() + value.len();
        if new_total > MAX_STORE_BYTES {
            return Response::Error(format!("store full ({MAX_STORE_BYTES} bytes)"));
        }
        g.1 = new_total;
        g.0.insert(key, value);
        drop(g);
        self.cv.notify_all();
        Response::Ok
    }

    fn wait_keys(&self, keys: &[Vec<u8>], timeout: Duration) -> Result<(), Vec<Vec<u8>>> {
        // The timeout comes off the wire: bound it before adding it to a clock.
        let deadline = Instant::now() + timeout.min(MAX_WAIT);
        let mut g = self.lock();
        loop {
            let missing: Vec<Vec<u8>> = keys
                .iter()
                .filter(|k| !g.0.contains_key(*k))
                .cloned()
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(missing);
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Backend for Store {
    fn handle(&self, req: Request) -> Response {
        match req {
            Request::Set { key, value } => self.insert(key, value),
            Request::Get { key, timeout } => {
                match self.wait_keys(std::slice::from_ref(&key), timeout) {
                    Ok(()) => Response::Value(self.lock().0.get(&key).cloned().unwrap_or_default()),
                    Err(m) => Response::Timeout(m),
                }
            }
            Request::Wait { keys, timeout } => match self.wait_keys(&keys, timeout) {
                Ok(()) => Response::Ok,
                Err(m) => Response::Timeout(m),
            },
            Request::Add { key, delta } => {
                let mut g = self.lock();
                let cur = match g.0.get(&key) {
                    None => 0i64,
                    Some(v) => match std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                    {
                        Some(x) => x,
                        None => {
                            return Response::Error(
                                "add on a key that does not hold an integer".into(),
                            )
                        }
                    },
                };
                let n = cur.wrapping_add(delta);
                let old = g.0.get(&key).map(|v| v.len() + key.len()).unwrap_or(0);
                let val = n.to_string().into_bytes();
                g.1 = g.1 - old + key.len() + val.len();
                g.0.insert(key, val);
                drop(g);
                self.cv.notify_all();
                Response::Int(n)
            }
            Request::Check { keys } => {
                let g = self.lock();
                Response::Present(keys.iter().map(|k| g.0.contains_key(k)).collect())
            }
        }
    }
}

/// A running store server. Dropping it stops accepting (existing connections end with their peers).
pub struct ServerHandle {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl ServerHandle {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serve `backend` on `listener`: one thread per client; each client must pass the handshake
/// first, within one deadline, behind a [`Gate`] that bounds pending handshakes and reports
/// rejected peers.
pub fn serve(
    listener: TcpListener,
    secret: &str,
    backend: Arc<dyn Backend>,
) -> io::Result<ServerHandle> {
    let addr = listener.local_addr()?;
    let gate = Gate::new(format!("the bootstrap store on {addr}"));
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let secret = secret.as_bytes().to_vec();
    std::thread::Builder::new()
        .name("rr-store-accept".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let s = match conn {
                    Ok(s) => s,
                    Err(_) => {
                        // Out of descriptors or memory: do not spin.
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                let Some(ticket) = gate.admit(&s) else {
                    continue;
                };
                let backend = backend.clone();
                let secret = secret.clone();
                let gate = gate.clone();
                let _ = std::thread::Builder::new()
                    .name("rr-store-conn".into())
                    .spawn(move || {
                        let _ = serve_conn(s, &secret, &*backend, ticket, &gate);
                    });
            }
        })?;
    Ok(ServerHandle { addr, stop })
}

fn serve_conn(
    mut s: TcpStream,
    secret: &[u8],
    backend: &dyn Backend,
    ticket: Ticket,
    gate: &Gate,
) -> io::Result<()> {
    s.set_nodelay(true)?;
    let peer = s.peer_addr().ok();
    let mut d = Deadlined {
        s: &mut s,
        deadline: ticket.deadline,
    };
    let r = auth::server_handshake(&mut d, secret, Some("store"));
    drop(ticket);
    if let Err(e) = r {
        gate.reject(peer, &e.to_string());
        return Ok(());
    }
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    while let Some(frame) = wire::read_frame(&mut s)? {
        let resp = match Request::decode(&frame) {
            Ok(req) => backend.handle(req),
            Err(e) => Response::Error(e.to_string()),
        };
        wire::write_frame(&mut s, &resp.encode())?;
    }
    Ok(())
}

/// Errors a store client reports.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot reach the bootstrap store at {addr}: {err} (is the launcher still running? check RAILRING_STORE_ADDR)")]
    Connect { addr: String, err: io::Error },
    #[error("bootstrap store at {addr} refused us: {err}")]
    Auth { addr: String, err: auth::AuthError },
    #[error("bootstrap store connection lost: {0}")]
    Io(#[from] io::Error),
    #[error("timed out after {timeout:?} waiting for store keys {missing:?}")]
    Timeout {
        missing: Vec<String>,
        timeout: Duration,
    },
    #[error("store error: {0}")]
    Remote(String),
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    #[error("the bootstrap store at {addr} did not answer within {limit:?} (its host unreachable or hung?); this connection is no longer used")]
    NoReply { addr: String, limit: Duration },
}

/// How long a store request may wait for its answer beyond the wait it asks the store for
/// (`Get`/`Wait` timeouts): a store that says nothing for this long is lost.
pub const REPLY_LIMIT: Duration = Duration::from_secs(60);

/// A client of the bootstrap store. Every request has a deadline: the wait it asks for plus
/// [`REPLY_LIMIT`], or the caller's limit (`*_within`, for failure paths, which must never wait
/// long on a store that may be gone). A request that misses its deadline breaks the connection
/// for good (a late answer would be taken for the next one's): later requests fail at once.
pub struct StoreClient {
    s: Mutex<TcpStream>,
    addr: String,
    broken: AtomicBool,
}

impl StoreClient {
    /// Connect (retrying until `connect_timeout`: the server may still be starting) and prove the secret.
    pub fn connect(
        addr: &str,
        secret: &str,
        connect_timeout: Duration,
    ) -> Result<StoreClient, StoreError> {
        let deadline = Instant::now() + connect_timeout;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address did not resolve");
        loop {
            let addrs: Vec<SocketAddr> = match addr.to_socket_addrs() {
                Ok(a) => a.collect(),
                Err(e) => {
                    last = e;
                    Vec::new()
                }
            };
            for a in &addrs {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(100));
                match TcpStream::connect_timeout(a, left.min(Duration::from_secs(5))) {
                    Ok(mut s) => {
                        s.set_nodelay(true)?;
                        s.set_read_timeout(Some(Duration::from_secs(30)))?;
                        auth::client_handshake(&mut s, secret.as_bytes(), "store").map_err(
                            |err| StoreError::Auth {
                                addr: addr.to_string(),
                                err,
                            },
                        )?;
                        s.set_read_timeout(None)?;
                        return Ok(StoreClient {
                            s: Mutex::new(s),
                            addr: addr.to_string(),
                            broken: AtomicBool::new(false),
                        });
                    }
                    Err(e) => last = e,
                }
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Connect {
                    addr: addr.to_string(),
                    err: last,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn call(&self, req: &Request) -> Result<Response, StoreError> {
        let wait = match req {
            Request::Get { timeout, .. } | Request::Wait { timeout, .. } => *timeout,
            _ => Duration::ZERO,
        };
        self.call_within(req, wait.saturating_add(REPLY_LIMIT))
    }

    /// One request, answered within `limit` (the lock, the write and the answer together) or
    /// [`StoreError::NoReply`], after which the connection is not used again.
    fn call_within(&self, req: &Request, limit: Duration) -> Result<Response, StoreError> {
        let deadline = Instant::now() + limit.min(MAX_WAIT + REPLY_LIMIT);
        let no_reply = || StoreError::NoReply {
            addr: self.addr.clone(),
            limit,
        };
        if self.broken.load(Ordering::SeqCst) {
            return Err(no_reply());
        }
        // Another thread may hold the connection (a request of its own): wait for it only
        // until our deadline.
        let mut s = loop {
            match self.s.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if Instant::now() >= deadline || self.broken.load(Ordering::SeqCst) {
                        return Err(no_reply());
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        let mut d = Deadlined {
            s: &mut s,
            deadline,
        };
        let r = wire::write_frame(&mut d, &req.encode()).and_then(|_| wire::read_frame(&mut d));
        let f = match r {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.broken.store(true, Ordering::SeqCst);
                return Err(StoreError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "store closed the connection",
                )));
            }
            Err(e) => {
                self.broken.store(true, Ordering::SeqCst);
                return Err(match e.kind() {
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => no_reply(),
                    _ => StoreError::Io(e),
                });
            }
        };
        match Response::decode(&f) {
            Ok(Response::Error(e)) => Err(StoreError::Remote(e)),
            Ok(r) => Ok(r),
            Err(e) => Err(StoreError::Protocol(e.to_string())),
        }
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        match self.call(&Request::Set {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
        })? {
            Response::Ok => Ok(()),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }

    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        match self.call(&Request::Get {
            key: key.as_bytes().to_vec(),
            timeout,
        })? {
            Response::Value(v) => Ok(v),
            Response::Timeout(m) => Err(timeout_err(m, timeout)),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }

    pub fn wait(&self, keys: &[String], timeout: Duration) -> Result<(), StoreError> {
        let keys = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        match self.call(&Request::Wait { keys, timeout })? {
            Response::Ok => Ok(()),
            Response::Timeout(m) => Err(timeout_err(m, timeout)),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }

    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        match self.call(&Request::Add {
            key: key.as_bytes().to_vec(),
            delta,
        })? {
            Response::Int(i) => Ok(i),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }

    pub fn check(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        self.check_within(keys, REPLY_LIMIT)
    }

    /// [`Self::check`], answered within `limit` (failure paths).
    pub fn check_within(&self, keys: &[String], limit: Duration) -> Result<Vec<bool>, StoreError> {
        let keys = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        match self.call_within(&Request::Check { keys }, limit)? {
            Response::Present(p) => Ok(p),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }

    /// [`Self::set`], answered within `limit` (failure paths).
    pub fn set_within(&self, key: &str, value: &[u8], limit: Duration) -> Result<(), StoreError> {
        let req = Request::Set {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
        };
        match self.call_within(&req, limit)? {
            Response::Ok => Ok(()),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }

    /// [`Self::get`] of a key that should already be there, answered within `limit` (failure
    /// paths): the store waits at most `limit` for the key, and the answer must come within
    /// twice that.
    pub fn get_within(&self, key: &str, limit: Duration) -> Result<Vec<u8>, StoreError> {
        let req = Request::Get {
            key: key.as_bytes().to_vec(),
            timeout: limit,
        };
        match self.call_within(&req, limit.saturating_mul(2))? {
            Response::Value(v) => Ok(v),
            Response::Timeout(m) => Err(timeout_err(m, limit)),
            r => Err(StoreError::Protocol(format!("{r:?}"))),
        }
    }
}

fn timeout_err(m: Vec<Vec<u8>>, timeout: Duration) -> StoreError {
    StoreError::Timeout {
        missing: m
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect(),
        timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(secret: &str) -> (ServerHandle, Arc<Store>) {
        let st = Store::new();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        (serve(l, secret, st.clone()).unwrap(), st)
    }

    #[test]
    fn set_get_wait_add_check() {
        let (h, _st) = server("s3cret");
        let addr = h.addr.to_string();
        let c = StoreClient::connect(&addr, "s3cret", Duration::from_secs(2)).unwrap();
        c.set("a", b"1").unwrap();
        assert_eq!(c.get("a", Duration::from_secs(1)).unwrap(), b"1");
        assert_eq!(
            c.check(&["a".into(), "b".into()]).unwrap(),
            vec![true, false]
        );
        let addr2 = addr.clone();
        let t = std::thread::spawn(move || {
            let c2 = StoreClient::connect(&addr2, "s3cret", Duration::from_secs(2)).unwrap();
            c2.get("late", Duration::from_secs(5)).unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        c.set("late", b"here").unwrap();
        assert_eq!(t.join().unwrap(), b"here");
        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(c.add("n", -2).unwrap(), 3);
        match c.wait(&["never".into()], Duration::from_millis(50)) {
            Err(StoreError::Timeout { missing, .. }) => {
                assert_eq!(missing, vec!["never".to_string()])
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.add("a", 1), Ok(2)));
        c.set("txt", b"x").unwrap();
        assert!(matches!(c.add("txt", 1), Err(StoreError::Remote(_))));
    }

    /// Timeouts come off the wire: the largest one a frame can carry is answered, not a panic
    /// (`Instant + Duration` panics on overflow; the server bounds the wait first).
    #[test]
    fn the_largest_wire_timeout_is_bounded() {
        let st = Store::new();
        st.handle(Request::Set {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        });
        let forever = Duration::from_millis(u64::MAX);
        let r = st.handle(Request::Get {
            key: b"k".to_vec(),
            timeout: forever,
        });
        assert_eq!(r, Response::Value(b"v".to_vec()));
        let r = st.handle(Request::Wait {
            keys: vec![b"k".to_vec()],
            timeout: forever,
        });
        assert_eq!(r, Response::Ok);
    }

    #[test]
    fn wrong_secret_is_refused() {
        let (h, st) = server("right");
        let r = StoreClient::connect(&h.addr.to_string(), "wrong", Duration::from_secs(2));
        assert!(matches!(r, Err(StoreError::Auth { .. })), "{:?}", r.err());
        assert!(st.lock().0.is_empty());
    }

    /// A store that takes the handshake and then never answers (its host cut off behind a
    /// relay): failure-path requests end within their limit, and the connection is not reused.
    #[test]
    fn failure_path_requests_end_when_the_store_never_answers() {
        struct Mute(Mutex<()>, Condvar);
        impl Backend for Mute {
            fn handle(&self, _: Request) -> Response {
                let g = self.0.lock().unwrap();
                let _ = self.1.wait_timeout(g, Duration::from_secs(30));
                Response::Ok
            }
        }
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h = serve(l, "k", Arc::new(Mute(Mutex::new(()), Condvar::new()))).unwrap();
        let c = StoreClient::connect(&h.addr.to_string(), "k", Duration::from_secs(2)).unwrap();
        let t = Instant::now();
        let r = c.check_within(&["c0/abort".into()], Duration::from_millis(300));
        assert!(matches!(r, Err(StoreError::NoReply { .. })), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(r.unwrap_err().to_string().contains("did not answer"));
        let t = Instant::now();
        assert!(c.set_within("k", b"v", Duration::from_secs(5)).is_err());
        assert!(c.get_within("k", Duration::from_secs(5)).is_err());
        assert!(c.get("k", Duration::from_secs(5)).is_err());
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "a broken client fails at once"
        );
    }

    #[test]
    fn unreachable_store_is_named() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        match StoreClient::connect(&addr, "x", Duration::from_millis(300)) {
            Err(e @ StoreError::Connect { .. }) => assert!(e.to_string().contains(&addr)),
            other => panic!("{:?}", other.err()),
        }
    }
}
