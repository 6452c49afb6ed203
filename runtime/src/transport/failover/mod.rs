//! TCP links that survive a lost rail ([`RailLink`]): the executor's byte stream to one peer is
//! cut into frames that carry their stream offset, the receiver acknowledges what it has taken,
//! the sender keeps what is not acknowledged yet (in the caller's live buffer or, for a finished
//! send's short tail, a copy), and when the rail stops carrying packets the link moves to another
//! rail and resends from the offset the peer states — nothing lost, nothing taken twice.
//!
//! **Wire.** Every 16-byte frame header is `magic "RR" | kind | 0 | u32 | u64`:
//! `DATA len seq` (then `len` payload bytes, `seq` = stream offset of the first),
//! `ACK 0 upto` (the peer has taken every byte before `upto`), `RESUME gen consumed` (first frame
//! on a replacement connection: "I took every byte of yours before `consumed`"). Data frames are
//! at most [`FRAME_MAX`]; a small frame goes out with its header in one write. Acknowledgements
//! are sent per received chunk and at the end of every receive (the executor calls
//! [`Link::ack`]); they travel between the other direction's frames.
//!
//! **Failure.** A connection is given up when the interface of its rail is down on this host, when
//! it reports an unreachable network or host, when data has been outstanding with no
//! acknowledgement from the peer's *kernel* for `RAILRING_RAIL_TIMEOUT` (read from `TCP_INFO`,
//! so a peer process that is merely slow — its kernel still acknowledges and advertises a zero
//! window — never counts), or when it is reset while the peer's process is still listening. A
//! peer's orderly close, or a refused connection on every rail, means its process is gone: the
//! call fails naming it, as before.
//!
//! **Moving.** The side that notices connects on the next healthy rail (hello channel =
//! `chan | gen << 24`), sends `RESUME` and freezes the link. The peer picks the connection up on
//! its next touch of the link (any operation, or the executor's periodic service while it
//! waits), answers with its own `RESUME`, and both continue on the new connection from the stated
//! offsets: the retained copy first, then the live send rewinds ([`Link::rewound`]). When both
//! sides move at once, the lower rank's connection wins. One WARN per rail and peer host names
//! the host, the rail interface, the peer and the reason; the rail is marked dead for that peer
//! host so new links start elsewhere. Only when no rail is left does the call fail, naming both
//! hosts and every rail's reason.
//!
//! **Back.** A link off its home rail tries to return (the lower rank starts it) once the home
//! interface is up and the rail has been dead for [`retry_after`]: a background connect, then the
//! same `RESUME` exchange while the link waits on the peer — so calls use a rail again soon after
//! it comes back.
//!
//! **Closing.** A link dropped while the peer has not acknowledged everything (a communicator
//! freed right after its last call) lingers on the keeper until the peer has taken those bytes,
//! then closes after reading what is unread (see `LINGER`); the last link table of the
//! process waits for lingering links ([`settle`]).

//!
//! Files: this one (the pieces a link is made of, the handle [`RailLink`] and the rail keeper),
//! `wire.rs` (frames), `health.rs` (dead rails, interface state, `TCP_INFO`), `state.rs`
//! (connecting, the outgoing and incoming streams, the link operations), `moves.rs` (failures
//! and moves between rails).

mod health;
mod moves;
mod state;
mod wire;

pub use health::retry_after;
pub use wire::FRAME_MAX;
use wire::HDR;

use super::tcp::{self, TcpLink, TcpNet};
use super::{Link, LinkError, LinkId};
use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A finished send whose unacknowledged tail is at most this long is copied into the link and
/// finished at once; a longer one waits for acknowledgements.
pub const RETAIN_TAIL: usize = 64 << 10;
/// A lazy acknowledgement goes out when the receiver waits once it covers this much.
const ACK_IDLE: usize = 256 << 10;
/// Most bytes one link keeps copied for resending: how far a stream of small one-way sends runs
/// ahead of its receiver before it waits for acknowledgements — about what the kernel itself
/// buffers on such a connection (an autotuned send buffer grows to 4 MiB, `tcp_wmem`), as a
/// peer library's eager sends get.
const RETAIN_MAX: usize = 8 << 20;
/// Capacity the copy keeps once everything in it is acknowledged; a burst's larger buffer is
/// given back.
const RETAIN_KEEP: usize = 1 << 20;
/// Frames at most this long go out with their header in one write.
const SMALL: usize = 16 << 10;
const IBUF: usize = 4096;

/// A check the link runs while it waits on a peer that may be failing: `Some(first failure)`
/// once the job's abort record exists.
pub type AbortCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What a [`RailLink`] needs to know to reconnect.
pub struct RailCtx {
    pub net: Arc<TcpNet>,
    pub id: LinkId,
    /// This rank's own rail (index into `net.rails`).
    pub home: usize,
    /// The rails the link drives at home, `home` first (several when this node has fewer ranks
    /// than rails: the link's connections are striped over them).
    pub spread: Vec<usize>,
    pub peer_addrs: Vec<tcp::RailAddr>,
    pub my_host: String,
    pub peer_host: String,
    /// The peer's host identity (the health table's key).
    pub peer_key: String,
    pub streams: usize,
    pub rail_timeout: Duration,
    pub connect_timeout: Duration,
    pub abort: Option<AbortCheck>,
}

impl RailCtx {
    /// The home rails this link can use now (`home` first; the others of `spread` unless down
    /// or known dead toward the peer host).
    fn home_rails(&self, retry: Duration) -> Vec<usize> {
        let mut v = vec![self.home];
        for &r in &self.spread {
            if r != self.home
                && self.peer_on(r)
                && health::rail_unusable(&self.ifname(r), &self.peer_key, retry).is_none()
            {
                v.push(r);
            }
        }
        v
    }
    fn ifname(&self, rail: usize) -> String {
        self.net
            .rails
            .get(rail)
            .map(|r| r.ifname.clone())
            .unwrap_or_default()
    }
    fn who(&self) -> String {
        format!(
            "rank {} on {} -> rank {} on {} (channel {})",
            self.id.me, self.my_host, self.id.peer, self.peer_host, self.id.chan
        )
    }
    /// Whether the peer published an address on the subnet of our rail `rail`.
    fn peer_on(&self, rail: usize) -> bool {
        match self.net.rails.get(rail) {
            Some(r) => self.peer_addrs.iter().any(|a| r.same_subnet(a.rail.ip)),
            None => false,
        }
    }
    /// Connect to the peer from `rail` for generation `gen` (one try per connection).
    fn dial(&self, rail: usize, gen: u32, timeout: Duration) -> io::Result<TcpLink> {
        let id = LinkId {
            chan: self.id.chan | ((gen as usize) << 24),
            ..self.id
        };
        self.net
            .connect_once(id, &[rail], &self.peer_addrs, timeout, self.streams)
    }
}

/// A replacement connection waiting for the other side's `RESUME`.
struct Pending {
    link: TcpLink,
    gen: u32,
    rail: usize,
    hdr: [u8; HDR],
    fill: usize,
    /// When it was made (ours: the peer's answer is due within [`answer_within`]).
    since: Instant,
}

/// How long a move waits for the peer's `RESUME`. A live peer answers within a rail keeper's
/// tick or two (a new connection makes every link of its process look for it), so silence this
/// long means its process is stopped or its end of the link is closed — its communicator freed
/// while a transfer was in flight — and waiting for `RAILRING_TIMEOUT` would only hide that.
fn answer_within(rail_timeout: Duration) -> Duration {
    rail_timeout.max(Duration::from_secs(2))
}

/// Where the current data frame's payload comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    Caller,
    Retained,
}

/// A background connect toward the home rail.
type BackProbe = Arc<Mutex<Option<io::Result<TcpLink>>>>;

/// The state of one [`RailLink`] (shared with the rail keeper thread).
struct LinkState {
    ctx: RailCtx,
    conn: TcpLink,
    rail: usize,
    gen: u32,
    max_gen: u32,
    // ---- outgoing
    /// Stream offset of the next byte the caller hands over.
    next: u64,
    /// Stream offset of the next byte written to `conn` (below `next` while resending).
    wire: u64,
    acked: u64,
    ret: Vec<u8>,
    ret_head: usize,
    /// Stream offset of `ret[ret_head]`.
    ret_start: u64,
    /// Bytes to write before anything else (headers, acknowledgements, small payloads).
    ctl: Vec<u8>,
    ctl_off: usize,
    frame_left: usize,
    frame_src: Src,
    ack_sent: u64,
    owe_ack: bool,
    /// The owed acknowledgement was asked for urgently (`Link::ack(true)`) and could not be
    /// written yet: every visit retries it.
    ack_urgent: bool,
    rewound: Option<u64>,
    // ---- incoming
    rcvd: u64,
    in_left: usize,
    ibuf: Box<[u8; IBUF]>,
    ib_lo: usize,
    ib_hi: usize,
    // ---- health
    suspect: Option<Instant>,
    arrivals_seen: u64,
    switching: Option<Pending>,
    incoming: Vec<Pending>,
    why_moving: String,
    last_abort_check: Instant,
    off_home_since: Option<Instant>,
    /// Since when an interface of the current connection has been seen down while no other
    /// rail could take the link (a flap shorter than `RAILRING_RAIL_TIMEOUT` is waited out).
    iface_down_since: Option<Instant>,
    back: Option<(u32, BackProbe)>,
    last_back_try: Option<Instant>,
    /// Set when the connection failed and could not be replaced (the peer's process is gone,
    /// or no rail is left): (the peer is gone, why). Reported when the link is needed.
    dead: Option<(bool, String)>,
    /// Times this link moved to another connection.
    moves: u32,
    /// When [`LinkState::heal`] last ran the health checks.
    last_check: Option<Instant>,
}

/// A TCP link that moves to another rail when its own stops carrying packets (see the module
/// docs). A handle: the state sits behind a lock shared with this process's rail keeper, a
/// thread that — every [`KEEPER_TICK`] — services links with unacknowledged bytes or a move in
/// progress while their owner is busy elsewhere (an in-node step, its own computation): a peer
/// waiting for a resend, or for an answer to its move, never waits for this rank's next call.
pub struct RailLink {
    st: Arc<Mutex<LinkState>>,
}

/// How often the rail keeper looks at links.
pub const KEEPER_TICK: Duration = Duration::from_millis(25);

type Shared = Arc<Mutex<LinkState>>;

fn keeper_register(st: &Shared) {
    static LINKS: OnceLock<Mutex<Vec<std::sync::Weak<Mutex<LinkState>>>>> = OnceLock::new();
    static STARTED: std::sync::Once = std::sync::Once::new();
    let links = LINKS.get_or_init(Default::default);
    links
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(st));
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("rr-rail-keeper".into())
            .spawn(move || loop {
                std::thread::sleep(KEEPER_TICK);
                let live: Vec<Shared> = {
                    let mut g = links.lock().unwrap_or_else(|e| e.into_inner());
                    g.retain(|w| w.strong_count() > 0);
                    g.iter().filter_map(|w| w.upgrade()).collect()
                };
                for l in live {
                    // a link its owner is using right now is looked after by the owner
                    if let Ok(mut g) = l.try_lock() {
                        if g.busy() {
                            let _ = g.heal(false);
                        }
                    }
                }
                linger_round();
            });
    });
}

/// Links dropped while the peer had not yet acknowledged all they sent (a communicator freed
/// right after its last call: a finished send's tail is only retained, not yet taken), each
/// with its deadline. They are serviced — resends, the peer's acknowledgements read — until
/// the peer has taken everything, the link failed for good or the deadline passed, and only
/// then closed: closing at once would lose that tail, and a socket closed with unread bytes
/// (the peer's acknowledgements) is reset, which the peer takes for a failing rail.
static LINGER: Mutex<Vec<(Shared, Instant)>> = Mutex::new(Vec::new());

/// One visit to every lingering link (see [`LINGER`]): true when none is left.
fn linger_round() -> bool {
    let mut l = LINGER.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    l.retain(|(st, deadline)| match st.try_lock() {
        Ok(mut g) => !g.linger() && now < *deadline,
        Err(_) => true,
    });
    l.is_empty()
}

/// Wait until every dropped link has delivered what it owed its peer (see `LINGER`; each
/// link gives up at its own deadline). The last communicator of a process calls this as it is
/// dropped, so a program that returns right after its last call loses nothing in flight.
pub fn settle() {
    while !linger_round() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Drop for RailLink {
    fn drop(&mut self) {
        let mut g = self.lock();
        if g.owes() {
            let deadline = Instant::now() + g.ctx.connect_timeout.max(g.ctx.rail_timeout);
            drop(g);
            LINGER
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((self.st.clone(), deadline));
        } else {
            g.close();
        }
    }
}

impl RailLink {
    fn wrap(s: LinkState) -> RailLink {
        let st = Arc::new(Mutex::new(s));
        keeper_register(&st);
        RailLink { st }
    }

    /// Make the first connection of a link as the connecting side: from the home rail unless it
    /// is down or known dead toward this peer host, else from the next rail that answers.
    pub fn connect(ctx: RailCtx) -> io::Result<RailLink> {
        LinkState::connect(ctx).map(Self::wrap)
    }

    /// Wrap an accepted first connection.
    pub fn accepted(ctx: RailCtx, conn: TcpLink) -> RailLink {
        Self::wrap(LinkState::accepted(ctx, conn))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The rail this link's connection uses now.
    pub fn rail(&self) -> usize {
        self.lock().rail
    }

    /// How many times the link moved to another connection.
    pub fn moves(&self) -> u32 {
        self.lock().moves
    }

    /// Give up the current connection now, as if its rail had failed (tests drive moves with
    /// it; data in flight is resent as after a real failure).
    pub fn fail_now(&self, why: &str) -> Result<(), LinkError> {
        self.lock().fail_now(why)
    }
}

impl Link for RailLink {
    fn early_sends(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        self.lock().describe()
    }
    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        self.lock().try_send(data)
    }
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        self.lock().try_recv(buf)
    }
    fn poll_fd(&self) -> Option<RawFd> {
        self.lock().poll_fd_for(false)
    }
    fn poll_fd_for(&self, send: bool) -> Option<RawFd> {
        self.lock().poll_fd_for(send)
    }
    fn poll_events(&self, send: bool) -> Option<(RawFd, i16)> {
        self.lock().poll_events(send)
    }
    fn bytes_sent(&self) -> u64 {
        self.lock().next
    }
    fn acked(&self) -> u64 {
        self.lock().acked
    }
    fn poll_acks(&mut self) -> Result<u64, LinkError> {
        self.lock().poll_acks()
    }
    fn retain(&mut self, start: u64, parts: &[&[u8]]) -> bool {
        self.lock().retain(start, parts)
    }
    fn ack(&mut self, urgent: bool) -> Result<(), LinkError> {
        self.lock().ack(urgent)
    }
    fn rewound(&mut self) -> Option<u64> {
        self.lock().rewound.take()
    }
    fn busy(&self) -> bool {
        self.lock().busy()
    }
    fn heal(&mut self, needed: bool) -> Result<(), LinkError> {
        self.lock().heal(needed)
    }
    fn abandon(&mut self) {
        // failed for good: it owes nothing, so its drop closes it at once
        self.lock()
            .dead
            .get_or_insert_with(|| (false, "the communicator aborted".into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rails::Rail;
    use std::net::Ipv4Addr;

    /// Link `comm` between two endpoints on loopback, rank `me`'s side (host names `{tag}0` and
    /// `{tag}1`: the rail health table is the process's, so tests keep their peers apart).
    fn ctx(net: &Arc<TcpNet>, peer: &Arc<TcpNet>, me: usize, comm: u64, tag: &str) -> RailCtx {
        RailCtx {
            net: net.clone(),
            id: LinkId {
                comm,
                me,
                peer: 1 - me,
                chan: 0,
            },
            home: 0,
            spread: vec![0],
            peer_addrs: peer.addrs.clone(),
            my_host: format!("{tag}{me}"),
            peer_host: format!("{tag}{}", 1 - me),
            peer_key: format!("{tag}{}", 1 - me),
            streams: 1,
            rail_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            abort: None,
        }
    }

    /// Both sides of a link over loopback.
    fn pair(comm: u64, tag: &str) -> (RailLink, RailLink) {
        let lo = vec![Rail::new("lo", Ipv4Addr::LOCALHOST, 8)];
        let na = TcpNet::start(lo.clone(), "s").unwrap();
        let nb = TcpNet::start(lo, "s").unwrap();
        let a = RailLink::connect(ctx(&na, &nb, 0, comm, tag)).unwrap();
        let conn = nb
            .accept(comm, 0, 0, Duration::from_secs(5))
            .unwrap()
            .expect("accepted");
        (a, RailLink::accepted(ctx(&nb, &na, 1, comm, tag), conn))
    }

    /// An aborting communicator's links close at once, owed bytes or not: its peers are to
    /// notice now, not once their acknowledgements are in.
    #[test]
    fn an_abandoned_link_does_not_linger() {
        let (mut a, _b) = pair(0x13, "x");
        while a.try_send(&[5u8; 1000]).unwrap() < 1000 {}
        assert!(a.retain(0, &[&[5u8; 1000]]));
        assert!(a.acked() < 1000, "the peer read nothing yet");
        let state = Arc::downgrade(&a.st);
        a.abandon();
        drop(a);
        assert!(state.upgrade().is_none(), "the link lingers");
    }

    /// A move that the peer never answers (its end of the link closed: no link of its process
    /// takes the replacement connection) fails the link after `answer_within`, naming the peer,
    /// instead of waiting for RAILRING_TIMEOUT.
    #[test]
    fn a_move_nobody_answers_fails_naming_the_peer() {
        let (mut a, b) = pair(0x12, "m");
        drop(b);
        a.fail_now("a test").unwrap();
        let t0 = Instant::now();
        let mut buf = [0u8; 8];
        let err = loop {
            match a.try_recv(&mut buf) {
                Ok(0) => {
                    assert!(t0.elapsed() < Duration::from_secs(10), "still waiting");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(n) => panic!("{n} bytes from a closed link"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(
            t0.elapsed() >= Duration::from_secs(2),
            "gave up after {:?}",
            t0.elapsed()
        );
        assert!(
            err.contains("no answer from rank 1 on m1")
                && err.contains("its end of this link is closed"),
            "{err}"
        );
        // the failure stays: the link is not used again as if nothing happened
        assert!(a.try_send(&[1]).is_err());
    }

    /// A communicator freed right after its last call drops links whose last sends the peer
    /// has not taken yet (finished, their tail only retained). Those bytes must still arrive,
    /// and the connection must not be reset: closed with the peer's unread acknowledgements in
    /// it, it was, the kernel threw away what it still held, and the peer — reset while this
    /// process still listened — took it for a failing rail and waited for a move nobody
    /// answered (a soak's reduce on a freshly split communicator hung that way).
    #[test]
    fn a_dropped_link_delivers_what_it_owes_without_a_reset() {
        let (mut a, mut b) = pair(0x11, "h");
        // bytes to `a` that it never reads
        let mut off = 0;
        while off < 100 {
            off += b.try_send(&[7u8; 100][off..]).unwrap();
        }
        // `a` sends until the kernel holds no more (b reads nothing yet), each finished send
        // retained as the executor does
        let piece: Vec<u8> = (0..16 << 10).map(|i| (i * 13 + i / 251) as u8).collect();
        let mut sent = 0usize;
        'fill: while sent < 6 << 20 {
            let start = a.bytes_sent();
            let mut taken = 0;
            let mut idle = Instant::now();
            while taken < piece.len() {
                let n = a.try_send(&piece[taken..]).unwrap();
                taken += n;
                if n > 0 {
                    idle = Instant::now();
                } else if idle.elapsed() > Duration::from_millis(50) {
                    assert!(a.retain(start, &[&piece[..taken]]));
                    sent += taken;
                    break 'fill;
                }
            }
            assert!(a.retain(start, &[&piece]));
            sent += taken;
        }
        assert!(a.acked() < sent as u64, "the peer read nothing yet");
        let state = Arc::downgrade(&a.st);
        drop(a);
        assert!(state.upgrade().is_some(), "the dropped link lingers");
        // `b` now reads everything `a` sent, in order
        let mut got = vec![0u8; sent];
        let mut have = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while have < sent && Instant::now() < deadline {
            match b.try_recv(&mut got[have..]) {
                Ok(0) => std::thread::sleep(Duration::from_millis(1)),
                Ok(n) => {
                    have += n;
                    b.ack(false).unwrap();
                }
                Err(e) => panic!("after {have} of {sent} bytes: {e}"),
            }
        }
        assert_eq!(have, sent, "bytes lost");
        assert!(
            (0..sent).all(|i| got[i] == piece[i % piece.len()]),
            "bytes out of order"
        );
        assert_eq!(b.moves(), 0, "the peer took the close for a failing rail");
    }
}
