//! The gate in front of every listener a stranger can reach (the bootstrap store, an agent's
//! relay, a rank's data ports): connections that have not proved the job secret yet are
//! *pending*, and a gate bounds what they can cost.
//!
//! - At most `max_pending` handshakes run at once (one thread each); when a new connection
//!   arrives at a full gate, the **oldest** pending one is cut. A real peer's handshake takes
//!   milliseconds and a slow loris takes seconds, so a flood evicts itself, not the job.
//! - The whole handshake (and whatever the protocol reads before it trusts the peer) has one
//!   deadline ([`Deadlined`]): trickling a byte now and then does not stretch it.
//! - Each rejected peer is reported where the user sees it (the `railring` log when one is set
//!   up, else stderr), once per source address per minute; the rest are counted.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default cap on handshakes in progress per listener.
pub const MAX_PENDING: usize = 64;
/// Default deadline for a whole handshake.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// A source is reported at most once per this long.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// Sources remembered for rate limiting (the map is cleared when full).
const MAX_SOURCES: usize = 4096;

/// The gate of one listener (see the module docs).
pub struct Gate {
    what: String,
    max_pending: usize,
    deadline: Duration,
    next: AtomicU64,
    pending: Mutex<VecDeque<(u64, TcpStream)>>,
    reports: Mutex<Reports>,
}

#[derive(Default)]
struct Reports {
    last: HashMap<IpAddr, (Instant, u64)>,
}

/// A pending handshake's place at the gate; dropping it leaves the gate.
pub struct Ticket {
    gate: Arc<Gate>,
    id: u64,
    /// When the handshake must be over.
    pub deadline: Instant,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut p = self.gate.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|(id, _)| *id != self.id);
    }
}

impl Gate {
    /// A gate for the listener `what` ("the bootstrap store on 127.0.0.1:4242", ...).
    pub fn new(what: impl Into<String>) -> Arc<Gate> {
        Gate::with_limits(what, MAX_PENDING, HANDSHAKE_DEADLINE)
    }

    pub fn with_limits(
        what: impl Into<String>,
        max_pending: usize,
        deadline: Duration,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            what: what.into(),
            max_pending: max_pending.max(1),
            deadline,
            next: AtomicU64::new(1),
            pending: Mutex::new(VecDeque::new()),
            reports: Mutex::new(Reports::default()),
        })
    }

    /// Admit a new connection as pending, cutting the oldest pending one when the gate is full.
    /// `None` when the connection cannot be tracked (it is then closed).
    pub fn admit(self: &Arc<Self>, s: &TcpStream) -> Option<Ticket> {
        let clone = s.try_clone().ok()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while p.len() >= self.max_pending {
            if let Some((_, old)) = p.pop_front() {
                // Its thread's next read fails at once and it leaves.
                let _ = old.shutdown(Shutdown::Both);
            }
        }
        p.push_back((id, clone));
        Some(Ticket {
            gate: self.clone(),
            id,
            deadline: Instant::now() + self.deadline,
        })
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Report a rejected peer: the first time per source (per minute) it is printed, later ones
    /// are counted and their number is given with the next report.
    pub fn reject(&self, peer: Option<SocketAddr>, why: &str) {
        let ip = peer.map(|p| p.ip());
        let line = {
            let mut r = self.reports.lock().unwrap_or_else(|e| e.into_inner());
            if r.last.len() >= MAX_SOURCES {
                r.last.clear();
            }
            let key = ip.unwrap_or(IpAddr::from([0, 0, 0, 0]));
            let now = Instant::now();
            match r.last.get_mut(&key) {
                Some((t, n)) if now.duration_since(*t) < REPORT_EVERY => {
                    *n += 1;
                    None
                }
                Some((t, n)) => {
                    let more = std::mem::take(n);
                    *t = now;
                    Some(more)
                }
                None => {
                    r.last.insert(key, (now, 0));
                    Some(0)
                }
            }
        };
        let Some(more) = line else { return };
        let from = peer.map(|p| p.to_string()).unwrap_or_else(|| "?".into());
        let more = if more > 0 {
            format!(" ({more} more from this address since the last report)")
        } else {
            String::new()
        };
        let msg = format!(
            "rejected a connection to {} from {from}: {why}{more}; further rejections from it are \
             reported at most once a minute",
            self.what
        );
        if tracing::dispatcher::has_been_set() {
            tracing::warn!(target: "railring::net", "{msg}");
        } else {
            eprintln!("railring: {msg}");
        }
    }
}

/// A stream whose every read and write ends by `deadline` (the socket's timeouts are set to
/// what is left before each call), so a peer trickling bytes cannot stretch an exchange.
pub struct Deadlined<'a> {
    pub s: &'a mut TcpStream,
    pub deadline: Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> io::Result<Duration> {
        let l = self.deadline.saturating_duration_since(Instant::now());
        if l.is_zero() {
            Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
        } else {
            Ok(l)
        }
    }
}

impl io::Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let l = self.left()?;
        self.s.set_read_timeout(Some(l))?;
        io::Read::read(self.s, buf)
    }
}

impl io::Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let l = self.left()?;
        self.s.set_write_timeout(Some(l))?;
        io::Write::write(self.s, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        io::Write::flush(self.s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn a_full_gate_cuts_the_oldest_pending_handshake() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let g = Gate::with_limits("test", 2, Duration::from_secs(5));
        let (_c1, mut s1) = pair(&l);
        let (_c2, s2) = pair(&l);
        let (_c3, s3) = pair(&l);
        let t1 = g.admit(&s1).unwrap();
        let _t2 = g.admit(&s2).unwrap();
        assert_eq!(g.pending(), 2);
        let _t3 = g.admit(&s3).unwrap();
        assert_eq!(g.pending(), 2);
        // the oldest was shut down: its read ends at once
        let mut b = [0u8; 1];
        assert_eq!(s1.read(&mut b).unwrap_or(0), 0);
        drop(t1);
        assert_eq!(g.pending(), 2);
    }

    #[test]
    fn the_deadline_bounds_a_trickle() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut c, mut s) = pair(&l);
        let t = std::thread::spawn(move || {
            for _ in 0..20 {
                if std::io::Write::write_all(&mut c, b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let start = Instant::now();
        let mut d = Deadlined {
            s: &mut s,
            deadline: Instant::now() + Duration::from_millis(350),
        };
        let mut buf = [0u8; 64];
        let r = d.read_exact(&mut buf);
        assert!(r.is_err());
        assert!(
            start.elapsed() < Duration::from_millis(900),
            "{:?}",
            start.elapsed()
        );
        drop(s);
        let _ = t.join();
    }

    #[test]
    fn reports_are_rate_limited_per_source() {
        let g = Gate::new("test");
        let a: SocketAddr = "127.0.0.9:1".parse().unwrap();
        for _ in 0..5 {
            g.reject(Some(a), "bad proof");
        }
        let r = g.reports.lock().unwrap();
        assert_eq!(r.last.get(&a.ip()).map(|x| x.1), Some(4));
    }
}
