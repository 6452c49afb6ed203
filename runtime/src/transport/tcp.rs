//! TCP between nodes, multi-rail. Each rank listens on every rail interface; a rank connects
//! from its own rail (the socket is bound to that NIC's address before connecting) to the peer's
//! address on the same subnet, so rails are matched across nodes by subnet. Every connection
//! proves the job secret (HMAC handshake) and says which communicator, rank and channel it
//! carries before any data flows. Which interfaces are rails: `rails.rs`.

use super::{Link, LinkError, LinkId};
use crate::store::auth;
use crate::store::gate::{Deadlined, Gate, Ticket};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use super::rails::{discover_rails, IfFilter, Rail};

/// A rail address as published in the bootstrap store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RailAddr {
    pub rail: Rail,
    pub port: u16,
}

/// What a connecting rank says right after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Hello {
    comm: u64,
    from: u32,
    chan: u32,
    /// This connection's index among its link's connections, and their count (the connecting
    /// side decides; the acceptor follows).
    index: u32,
    count: u32,
}

const HELLO: usize = 24;

impl Hello {
    fn bytes(&self) -> [u8; HELLO] {
        let mut b = [0u8; HELLO];
        b[..8].copy_from_slice(&self.comm.to_le_bytes());
        b[8..12].copy_from_slice(&self.from.to_le_bytes());
        b[12..16].copy_from_slice(&self.chan.to_le_bytes());
        b[16..20].copy_from_slice(&self.index.to_le_bytes());
        b[20..24].copy_from_slice(&self.count.to_le_bytes());
        b
    }
    /// A stream count the link may have and an index inside it.
    fn valid(&self) -> bool {
        self.count > 0 && self.count as usize <= MAX_STREAMS && self.index < self.count
    }

    fn parse(b: &[u8; HELLO]) -> Hello {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Hello {
            comm: u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            from: u32_at(8),
            chan: u32_at(12),
            index: u32_at(16),
            count: u32_at(20),
        }
    }
}

/// A connector's hello as the acceptor reads it (after the handshake): `(communicator, rank,
/// channel, index, count)` when it is well formed and would be filed under a link, `None` when
/// it would be dropped. Public for the fuzz harness (`tests/fuzz`).
#[doc(hidden)]
pub fn parse_hello(b: &[u8]) -> Option<(u64, u32, u32, u32, u32)> {
    let h = Hello::parse(b.get(..HELLO)?.try_into().ok()?);
    h.valid()
        .then_some((h.comm, h.from, h.chan, h.index, h.count))
}

/// Most TCP connections one link may stripe over (`RAILRING_NET_STREAMS`).
pub use crate::config::MAX_STREAMS;
/// Bytes sent on one connection before the next takes over, when a link has several.
const STRIPE: u64 = 64 << 10;

/// Connections of one link that have arrived so far, keyed by (comm, from, channel).
struct Arrivals {
    slots: Vec<Option<TcpStream>>,
}

type Pending = Arc<(Mutex<HashMap<(u64, u32, u32), Arrivals>>, Condvar)>;

/// File an accepted connection under its link; a connection whose hello is inconsistent with
/// its link's earlier ones (count, index) is dropped.
fn file_arrival(pending: &Pending, h: &Hello, s: TcpStream) {
    let chan = h.chan;
    let (index, count) = (h.index as usize, h.count as usize);
    if !h.valid() {
        return;
    }
    let (m, cv) = &**pending;
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    let a = g.entry((h.comm, h.from, chan)).or_insert_with(|| Arrivals {
        slots: (0..count).map(|_| None).collect(),
    });
    if a.slots.len() != count || a.slots[index].is_some() {
        return;
    }
    a.slots[index] = Some(s);
    ARRIVALS.fetch_add(1, std::sync::atomic::Ordering::Release);
    cv.notify_all();
}

/// Connections filed so far by any endpoint of this process: links that fail over watch it to
/// notice a peer's replacement connection with one load (`transport::failover`).
static ARRIVALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many connections have arrived so far (see `ARRIVALS`).
pub fn arrivals() -> u64 {
    ARRIVALS.load(std::sync::atomic::Ordering::Acquire)
}

/// This process's TCP endpoint: listeners on every rail and the connections that arrived.
pub struct TcpNet {
    pub rails: Vec<Rail>,
    pub addrs: Vec<RailAddr>,
    pending: Pending,
    secret: Vec<u8>,
}

/// What every connection of one outgoing link shares: the link's identity (communicator, our
/// rank, channel), the rail we connect from, the peer's published addresses and the timeout.
struct Dial<'a> {
    comm: u64,
    me: usize,
    chan: usize,
    /// Connection k of the link goes out on rail `rails[k % rails.len()]` (one entry: every
    /// connection on that rail).
    rails: &'a [usize],
    peer_addrs: &'a [RailAddr],
    timeout: Duration,
    /// Keep trying a refused connect until the timeout (first connects: the peer may not be
    /// listening yet); a failover connect takes a refusal as the peer's process being gone.
    retry_refused: bool,
}

impl TcpNet {
    /// Listen on every rail (and fallback address) and accept authenticated data connections
    /// in the background. `rails` of the result are the rails proper; `addrs`, which a rank
    /// publishes, hold the fallbacks too (after the rails).
    pub fn start(all: Vec<Rail>, secret: &str) -> io::Result<Arc<TcpNet>> {
        let pending: Pending = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
        let mut addrs = Vec::new();
        let rails: Vec<Rail> = all.iter().filter(|r| !r.fallback).cloned().collect();
        for rail in &all {
            let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(rail.ip), 0))?;
            addrs.push(RailAddr {
                rail: rail.clone(),
                port: l.local_addr()?.port(),
            });
            let pending = pending.clone();
            let secret = secret.as_bytes().to_vec();
            let gate = Gate::new(format!("the data port on {}", l.local_addr()?));
            std::thread::Builder::new()
                .name("rr-tcp-accept".into())
                .spawn(move || {
                    for s in l.incoming() {
                        let Ok(s) = s else {
                            // Out of descriptors or memory: do not spin.
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        };
                        // Handshake off the accept thread, behind the gate: a slow or hostile
                        // client can neither block others nor hold more than the gate's threads.
                        let Some(ticket) = gate.admit(&s) else {
                            continue;
                        };
                        let pending = pending.clone();
                        let secret = secret.clone();
                        let gate = gate.clone();
                        let _ =
                            std::thread::Builder::new()
                                .name("rr-tcp-hs".into())
                                .spawn(move || {
                                    let peer = s.peer_addr().ok();
                                    match accept_one(s, &secret, ticket) {
                                        Ok((h, s)) => file_arrival(&pending, &h, s),
                                        Err(e) => gate.reject(peer, &e.to_string()),
                                    }
                                });
                    }
                })?;
        }
        Ok(Arc::new(TcpNet {
            rails,
            addrs,
            pending,
            secret: secret.as_bytes().to_vec(),
        }))
    }

    /// Connect to `peer` (comm rank `peer_rank`) for channel `chan` with `streams` connections
    /// striped into one link, connection k from rail `rails[k % rails.len()]` (several rails: one
    /// link drives them all; `streams` is rounded up to a multiple of their number so each rail
    /// carries the same share). Each connection goes to the peer's address on the same subnet as
    /// its rail (else the peer's rail with the same index).
    pub fn connect(
        &self,
        id: LinkId,
        rails: &[usize],
        peer_addrs: &[RailAddr],
        timeout: Duration,
        streams: usize,
    ) -> io::Result<TcpLink> {
        self.dial_link(id, rails, peer_addrs, (timeout, true), streams)
    }

    /// [`Self::connect`] for a link moving to another rail (`transport::failover`): one try per
    /// connection, a refusal is an error at once.
    pub fn connect_once(
        &self,
        id: LinkId,
        rails: &[usize],
        peer_addrs: &[RailAddr],
        timeout: Duration,
        streams: usize,
    ) -> io::Result<TcpLink> {
        self.dial_link(id, rails, peer_addrs, (timeout, false), streams)
    }

    /// [`Self::connect`] and [`Self::connect_once`]: `retry_refused` says whether a refused
    /// connect is tried again until the timeout.
    fn dial_link(
        &self,
        id: LinkId,
        rails: &[usize],
        peer_addrs: &[RailAddr],
        (timeout, retry_refused): (Duration, bool),
        streams: usize,
    ) -> io::Result<TcpLink> {
        let dial = Dial {
            comm: id.comm,
            me: id.me,
            chan: id.chan,
            rails,
            peer_addrs,
            timeout,
            retry_refused,
        };
        self.dial(&dial, streams)
    }

    fn dial(&self, dial: &Dial<'_>, streams: usize) -> io::Result<TcpLink> {
        let per = dial.rails.len().max(1);
        let streams = streams.clamp(1, MAX_STREAMS).div_ceil(per) * per;
        let streams = if streams > MAX_STREAMS { per } else { streams };
        let mut socks = Vec::with_capacity(streams);
        let mut on = Vec::with_capacity(streams);
        let mut descs: Vec<String> = Vec::new();
        for index in 0..streams {
            let (s, d) = self.connect_one(dial, (index, streams))?;
            socks.push(s);
            on.push(dial.rails.get(index % per).copied().unwrap_or(0));
            if !descs.contains(&d) {
                descs.push(d);
            }
        }
        let mut desc = descs.join(" + ");
        if streams > 1 {
            desc.push_str(&format!(" x{streams} streams"));
        }
        TcpLink::new(socks, on, desc)
    }

    /// The rail each connection is on, by its local address (`fallback` where none matches).
    fn rails_of(&self, socks: &[TcpStream], fallback: usize) -> Vec<usize> {
        socks
            .iter()
            .map(|s| {
                s.local_addr()
                    .ok()
                    .and_then(|a| match a.ip() {
                        IpAddr::V4(ip) => self.rails.iter().position(|r| r.ip == ip),
                        _ => None,
                    })
                    .unwrap_or(fallback)
            })
            .collect()
    }

    /// Make connection `index` of a link's `streams` (see [`Self::connect`]).
    fn connect_one(
        &self,
        dial: &Dial<'_>,
        (index, streams): (usize, usize),
    ) -> io::Result<(TcpStream, String)> {
        let &Dial {
            comm,
            me,
            chan,
            rails,
            peer_addrs,
            timeout,
            retry_refused,
        } = dial;
        let my_rail = rails.get(index % rails.len().max(1)).copied().unwrap_or(0);
        let rail = self.rails.get(my_rail % self.rails.len().max(1)).cloned();
        let target = rail
            .as_ref()
            .and_then(|r| peer_addrs.iter().find(|a| r.same_subnet(a.rail.ip)))
            .or_else(|| peer_addrs.get(my_rail % peer_addrs.len().max(1)))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "peer published no address"))?
            .clone();
        let dest = SocketAddr::new(IpAddr::V4(target.rail.ip), target.port);
        let deadline = Instant::now() + timeout;
        let s = loop {
            let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            if let Some(r) = &rail {
                if r.same_subnet(target.rail.ip) && !r.ip.is_loopback() {
                    sock.bind(&SockAddr::from(SocketAddr::new(IpAddr::V4(r.ip), 0)))?;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match sock.connect_timeout(&SockAddr::from(dest), left.max(Duration::from_millis(50))) {
                Ok(()) => break TcpStream::from(sock),
                Err(e)
                    if retry_refused
                        && Instant::now() < deadline
                        && e.kind() == io::ErrorKind::ConnectionRefused =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(io::Error::new(e.kind(), format!("connect to {dest}: {e}"))),
            }
        };
        let mut s = s;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        auth::client_handshake(&mut s, &self.secret, "data")
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))?;
        s.write_all(
            &Hello {
                comm,
                from: me as u32,
                chan: chan as u32,
                index: index as u32,
                count: streams as u32,
            }
            .bytes(),
        )?;
        let desc = format!(
            "tcp {} {} -> {}",
            rail.map(|r| r.ifname).unwrap_or_default(),
            local_ip(&self.rails, my_rail),
            dest
        );
        Ok((s, desc))
    }

    /// Wait for `peer` to connect to us for (comm, chan).
    pub fn accept(
        &self,
        comm: u64,
        peer: usize,
        chan: usize,
        timeout: Duration,
    ) -> io::Result<Option<TcpLink>> {
        let key = (comm, peer as u32, chan as u32);
        let (m, cv) = &*self.pending;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let complete = g
                .get(&key)
                .is_some_and(|a| a.slots.iter().all(|s| s.is_some()));
            if let Some(a) = complete.then(|| g.remove(&key)).flatten() {
                let socks: Vec<TcpStream> = a.slots.into_iter().flatten().collect();
                let mut desc = format!(
                    "tcp {} <- {}",
                    socks[0]
                        .local_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    socks[0]
                        .peer_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                );
                if socks.len() > 1 {
                    desc.push_str(&format!(" x{} streams", socks.len()));
                }
                let on = self.rails_of(&socks, 0);
                return TcpLink::new(socks, on, desc).map(Some);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            g = cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl TcpNet {
    /// Take every complete link from rank `from` of `comm` whose channel is `chan` with a
    /// nonzero generation in its top byte — the replacement connections of a link that moves
    /// to another rail (`transport::failover`) — with that generation. Never waits.
    pub fn take_generations(&self, comm: u64, from: usize, chan: usize) -> Vec<(u32, TcpLink)> {
        let (m, _) = &*self.pending;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<(u64, u32, u32)> = g
            .iter()
            .filter(|(k, a)| {
                k.0 == comm
                    && k.1 == from as u32
                    && k.2 & 0x00ff_ffff == chan as u32
                    && k.2 >> 24 != 0
                    && a.slots.iter().all(|s| s.is_some())
            })
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::new();
        for k in keys {
            if let Some(a) = g.remove(&k) {
                let socks: Vec<TcpStream> = a.slots.into_iter().flatten().collect();
                let desc = format!(
                    "tcp {} <- {}",
                    socks[0]
                        .local_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    socks[0]
                        .peer_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                );
                let on = self.rails_of(&socks, 0);
                if let Ok(l) = TcpLink::new(socks, on, desc) {
                    out.push((k.2 >> 24, l));
                }
            }
        }
        out
    }
}

fn local_ip(rails: &[Rail], r: usize) -> String {
    rails
        .get(r % rails.len().max(1))
        .map(|x| x.ip.to_string())
        .unwrap_or_default()
}

/// The acceptor's side of a data connection: the handshake and the hello, within the ticket's
/// one deadline.
fn accept_one(mut s: TcpStream, secret: &[u8], ticket: Ticket) -> io::Result<(Hello, TcpStream)> {
    s.set_nodelay(true)?;
    let mut d = Deadlined {
        s: &mut s,
        deadline: ticket.deadline,
    };
    auth::server_handshake(&mut d, secret, Some("data"))
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))?;
    let mut b = [0u8; HELLO];
    d.read_exact(&mut b)?;
    drop(ticket);
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok((Hello::parse(&b), s))
}

/// A TCP link to one peer, non-blocking: one connection, or several with the byte stream cut
/// into 64 KiB stripes dealt round-robin (stripe k travels on connection k mod n), so each
/// connection has its own window while both sides agree on the order with no framing.
pub struct TcpLink {
    s: Vec<TcpStream>,
    /// The rail (index into [`TcpNet::rails`]) each connection is on.
    on: Vec<usize>,
    /// The rails of `on`, each once, in connection order.
    distinct: Vec<usize>,
    desc: String,
    sent: u64,
    received: u64,
    /// The rail of the connection that last reported an error.
    err_rail: Option<usize>,
}

impl TcpLink {
    fn new(s: Vec<TcpStream>, on: Vec<usize>, desc: String) -> io::Result<TcpLink> {
        if s.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no connection"));
        }
        for c in &s {
            c.set_read_timeout(None)?;
            c.set_nonblocking(true)?;
        }
        let mut distinct: Vec<usize> = Vec::new();
        for &r in &on {
            if !distinct.contains(&r) {
                distinct.push(r);
            }
        }
        Ok(TcpLink {
            s,
            on,
            distinct,
            desc,
            sent: 0,
            received: 0,
            err_rail: None,
        })
    }

    /// The connection carrying byte `off` of the stream, and how many bytes from `off` on it
    /// may take before the next stripe.
    fn route(&self, off: u64) -> (usize, u64) {
        if self.s.len() == 1 {
            return (0, u64::MAX);
        }
        (
            ((off / STRIPE) % self.s.len() as u64) as usize,
            STRIPE - off % STRIPE,
        )
    }
}

fn gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

impl TcpLink {
    /// Write as much of `data` as the connections take now (0 when none has room); errors as
    /// the socket reports them (the failover layer tells a lost rail from a gone peer).
    pub fn send_raw(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < data.len() {
            let (k, room) = self.route(self.sent);
            let want = (data.len() - done).min(usize::try_from(room).unwrap_or(usize::MAX));
            match self.s[k].write(&data[done..done + want]) {
                Ok(n) => {
                    self.sent += n as u64;
                    done += n;
                    if n < want {
                        break; // this connection's buffer is full
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    break
                }
                Err(e) => {
                    self.err_rail = self.on.get(k).copied();
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Read what has arrived into `buf` (0: nothing now); the peer's orderly close is an
    /// `UnexpectedEof` error.
    pub fn recv_raw(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let (k, room) = self.route(self.received);
            let want = (buf.len() - done).min(usize::try_from(room).unwrap_or(usize::MAX));
            match self.s[k].read(&mut buf[done..done + want]) {
                Ok(0) => {
                    self.err_rail = self.on.get(k).copied();
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed by peer",
                    ));
                }
                Ok(n) => {
                    self.received += n as u64;
                    done += n;
                    if n < want {
                        break; // nothing more on this connection yet
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    break
                }
                Err(e) => {
                    self.err_rail = self.on.get(k).copied();
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Every connection's descriptor (for `TCP_INFO` and interface checks).
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.s.iter().map(|c| c.as_raw_fd())
    }

    /// Every connection's descriptor with the rail it is on.
    pub fn fds_on_rails(&self) -> impl Iterator<Item = (RawFd, usize)> + '_ {
        self.s
            .iter()
            .zip(&self.on)
            .map(|(c, &r)| (c.as_raw_fd(), r))
    }

    /// The rails this link's connections are on, each once, in connection order.
    pub fn rails(&self) -> &[usize] {
        &self.distinct
    }

    /// The rail of the connection that last reported an error (a link over several rails).
    pub fn error_rail(&self) -> Option<usize> {
        self.err_rail
    }

    /// This link's local address (of its first connection).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.s[0].local_addr().ok()
    }

    /// The peer's address (of its first connection).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.s[0].peer_addr().ok()
    }

    fn link_err(&self, e: io::Error) -> LinkError {
        if gone(&e) {
            LinkError::PeerGone(format!("{}: {e}", self.desc))
        } else {
            LinkError::Io(e)
        }
    }
}

impl Link for TcpLink {
    fn early_sends(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.desc.clone()
    }
    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        self.send_raw(data).map_err(|e| self.link_err(e))
    }
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        self.recv_raw(buf).map_err(|e| self.link_err(e))
    }
    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.s[self.route(self.received).0].as_raw_fd())
    }
    fn poll_fd_for(&self, send: bool) -> Option<RawFd> {
        let off = if send { self.sent } else { self.received };
        Some(self.s[self.route(off).0].as_raw_fd())
    }
    fn bytes_sent(&self) -> u64 {
        self.sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn striped_links_keep_the_byte_order_in_both_directions() {
        let lo = vec![Rail::new("lo", Ipv4Addr::LOCALHOST, 8)];
        let a = TcpNet::start(lo.clone(), "s").unwrap();
        let b = TcpNet::start(lo, "s").unwrap();
        for streams in [1usize, 2, 3] {
            let chan = 4 + streams;
            let mut l1 = a
                .connect(
                    LinkId {
                        comm: 9,
                        me: 0,
                        peer: 1,
                        chan,
                    },
                    &[0],
                    &b.addrs,
                    Duration::from_secs(2),
                    streams,
                )
                .unwrap();
            // the acceptor learns the count from the connector's hellos
            let mut l2 = b
                .accept(9, 0, chan, Duration::from_secs(2))
                .unwrap()
                .expect("accepted");
            assert_eq!((l1.s.len(), l2.s.len()), (streams, streams));
            // 1 MiB + 17 bytes of a pattern that repeats with no stripe's period, in uneven
            // pieces, both directions at once
            let n = (1 << 20) + 17;
            let data: Vec<u8> = (0..n).map(|i| (i * 31 + i / 7) as u8).collect();
            let (mut got1, mut got2) = (vec![0u8; n], vec![0u8; n]);
            let (mut s1, mut s2, mut r1, mut r2) = (0, 0, 0, 0);
            let mut step = 1usize;
            while r1 < n || r2 < n {
                step = step * 7 % 100_003 + 1;
                if s1 < n {
                    s1 += l1.try_send(&data[s1..n.min(s1 + step)]).unwrap();
                }
                if s2 < n {
                    s2 += l2.try_send(&data[s2..n.min(s2 + step / 2 + 1)]).unwrap();
                }
                r2 += l2.try_recv(&mut got2[r2..n.min(r2 + step + 5)]).unwrap();
                r1 += l1.try_recv(&mut got1[r1..]).unwrap();
            }
            assert!(got2 == data, "{streams} streams: 1 -> 2 reordered");
            assert!(got1 == data, "{streams} streams: 2 -> 1 reordered");
            assert!(l1.poll_fd_for(true).is_some() && l2.poll_fd_for(false).is_some());
        }
    }

    #[test]
    fn links_on_channels_that_differ_only_above_16_bits_stay_apart() {
        // the point-to-point channel is 1 << 16: its connections must not be taken for channel
        // 0's (a 16-bit channel field once merged them and dropped one set)
        let lo = vec![Rail::new("lo", Ipv4Addr::LOCALHOST, 8)];
        let a = TcpNet::start(lo.clone(), "s").unwrap();
        let b = TcpNet::start(lo, "s").unwrap();
        let t = Duration::from_secs(2);
        let mut c0 = a
            .connect(
                LinkId {
                    comm: 3,
                    me: 0,
                    peer: 1,
                    chan: 0,
                },
                &[0],
                &b.addrs,
                t,
                3,
            )
            .unwrap();
        let mut c1 = a
            .connect(
                LinkId {
                    comm: 3,
                    me: 0,
                    peer: 1,
                    chan: 1 << 16,
                },
                &[0],
                &b.addrs,
                t,
                3,
            )
            .unwrap();
        let mut r1 = b.accept(3, 0, 1 << 16, t).unwrap().expect("p2p link");
        let mut r0 = b.accept(3, 0, 0, t).unwrap().expect("channel 0 link");
        assert_eq!(c0.try_send(&[7u8; 3]).unwrap(), 3);
        assert_eq!(c1.try_send(&[9u8; 3]).unwrap(), 3);
        let (mut g0, mut g1) = ([0u8; 3], [0u8; 3]);
        let (mut n0, mut n1) = (0, 0);
        let deadline = Instant::now() + t;
        while (n0 < 3 || n1 < 3) && Instant::now() < deadline {
            n0 += r0.try_recv(&mut g0[n0..]).unwrap();
            n1 += r1.try_recv(&mut g1[n1..]).unwrap();
        }
        assert_eq!((g0, g1), ([7u8; 3], [9u8; 3]));
    }

    #[test]
    fn authenticated_link_moves_bytes_and_wrong_secret_is_refused() {
        let lo = vec![Rail::new("lo", Ipv4Addr::LOCALHOST, 8)];
        let a = TcpNet::start(lo.clone(), "s").unwrap();
        let b = TcpNet::start(lo.clone(), "s").unwrap();
        let mut l1 = a
            .connect(
                LinkId {
                    comm: 7,
                    me: 0,
                    peer: 1,
                    chan: 1,
                },
                &[0],
                &b.addrs,
                Duration::from_secs(2),
                1,
            )
            .unwrap();
        let mut l2 = b
            .accept(7, 0, 1, Duration::from_secs(2))
            .unwrap()
            .expect("accepted");
        let mut sent = 0;
        let data = vec![5u8; 1 << 20];
        let mut got = vec![0u8; 1 << 20];
        let mut rcv = 0;
        while rcv < got.len() {
            if sent < data.len() {
                sent += l1.try_send(&data[sent..]).unwrap();
            }
            rcv += l2.try_recv(&mut got[rcv..]).unwrap();
        }
        assert!(got.iter().all(|&x| x == 5));
        let evil = TcpNet::start(lo, "other").unwrap();
        assert!(evil
            .connect(
                LinkId {
                    comm: 7,
                    me: 3,
                    peer: 1,
                    chan: 0
                },
                &[0],
                &b.addrs,
                Duration::from_secs(2),
                1
            )
            .is_err());
        assert!(b
            .accept(7, 3, 0, Duration::from_millis(200))
            .unwrap()
            .is_none());
        drop(l1);
        let mut buf = [0u8; 4];
        let mut r = Ok(0);
        for _ in 0..100 {
            r = l2.try_recv(&mut buf);
            if r.is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(matches!(r, Err(LinkError::PeerGone(_))));
    }
}
