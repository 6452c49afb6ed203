//! A failover link's state machine, part one: making the first connection, the outgoing
//! stream (control frames, data frames, resends from the retained copy), the incoming stream
//! (frame parsing, acknowledgements) and the link operations the handle forwards. Part two,
//! failures and moves between rails, is `moves.rs`.

use super::health::{mark_dead, rail_unusable, retry_after};
use super::wire::{decode, encode, Frame, FRAME_MAX, HDR};
use super::*;

/// Pause between tries of a last rail that has no route to the peer (see [`LinkState::connect`]).
const UNREACHABLE_RETRY: Duration = Duration::from_millis(100);

impl Pending {
    /// Read the peer's `RESUME` as far as it has come: `Ok(Some((gen, consumed)))` when whole.
    pub(super) fn poll(&mut self) -> io::Result<Option<(u32, u64)>> {
        while self.fill < HDR {
            let n = self.link.recv_raw(&mut self.hdr[self.fill..])?;
            if n == 0 {
                return Ok(None);
            }
            self.fill += n;
        }
        match decode(&self.hdr) {
            Ok(Frame::Resume { gen, consumed }) => Ok(Some((gen, consumed))),
            Ok(f) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected RESUME, got {f:?}"),
            )),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }
}

/// Write a whole (small) frame to a fresh connection, waiting briefly for room.
pub(super) fn write_all(l: &mut TcpLink, b: &[u8], timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut off = 0;
    while off < b.len() {
        off += l.send_raw(&b[off..])?;
        if off < b.len() {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no room for a 16-byte frame",
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

impl LinkState {
    /// Wrap `conn` (carried on local rail `rail`) as generation 0 of the link `ctx.id`.
    pub(super) fn new(ctx: RailCtx, conn: TcpLink, rail: usize) -> LinkState {
        let off_home =
            (rail != ctx.home || conn.rails().len() < ctx.spread.len()).then(Instant::now);
        LinkState {
            ctx,
            conn,
            rail,
            gen: 0,
            max_gen: 0,
            next: 0,
            wire: 0,
            acked: 0,
            ret: Vec::new(),
            ret_head: 0,
            ret_start: 0,
            ctl: Vec::with_capacity(64),
            ctl_off: 0,
            frame_left: 0,
            frame_src: Src::Caller,
            ack_sent: 0,
            owe_ack: false,
            ack_urgent: false,
            rewound: None,
            rcvd: 0,
            in_left: 0,
            ibuf: Box::new([0u8; IBUF]),
            ib_lo: 0,
            ib_hi: 0,
            suspect: None,
            // 0: the first look takes replacements that arrived before this side made the
            // link (the peer may have moved before this rank ever used it)
            arrivals_seen: 0,
            switching: None,
            incoming: Vec::new(),
            why_moving: String::new(),
            last_abort_check: Instant::now(),
            off_home_since: off_home,
            iface_down_since: None,
            back: None,
            last_back_try: None,
            dead: None,
            moves: 0,
            last_check: None,
        }
    }

    /// Make the first connection of a link as the connecting side: from the home rail unless it
    /// is down or known dead toward this peer host, else from the next rail that answers; the
    /// last rail left is tried until the connect timeout while it has no route to the peer.
    pub(super) fn connect(ctx: RailCtx) -> io::Result<LinkState> {
        let n = ctx.net.rails.len().max(1);
        let retry = retry_after(ctx.rail_timeout);
        let mut notes = Vec::new();
        let order: Vec<usize> = (0..n).map(|k| (ctx.home + k) % n).collect();
        for (k, &r) in order.iter().enumerate() {
            let last = k + 1 == order.len();
            let ifname = ctx.ifname(r);
            if !last && !ctx.peer_on(r) {
                continue;
            }
            if !last {
                if let Some(why) = rail_unusable(&ifname, &ctx.peer_key, retry) {
                    notes.push(format!("{ifname}: {why}"));
                    continue;
                }
            }
            let timeout = if last {
                ctx.connect_timeout
            } else {
                ctx.connect_timeout.min(ctx.rail_timeout)
            };
            let id = ctx.id;
            let rails = if r == ctx.home {
                ctx.home_rails(retry)
            } else {
                vec![r]
            };
            // the last rail left: one that is down (no route: its interface is down, or no
            // neighbour answers) may come back within the connect timeout, as a flapping link
            // does; keep trying it until then rather than end the job at once
            let since = std::time::Instant::now();
            let attempt = loop {
                match ctx
                    .net
                    .connect(id, &rails, &ctx.peer_addrs, timeout, ctx.streams)
                {
                    Err(e)
                        if last
                            && matches!(
                                e.kind(),
                                io::ErrorKind::NetworkUnreachable | io::ErrorKind::HostUnreachable
                            )
                            && since.elapsed() + UNREACHABLE_RETRY < ctx.connect_timeout =>
                    {
                        std::thread::sleep(UNREACHABLE_RETRY)
                    }
                    r => break r,
                }
            };
            match attempt {
                Ok(l) => {
                    if !notes.is_empty() {
                        tracing::warn!(target: "railring::net", "{}: starting on rail {ifname} ({}) instead of {} ({})", ctx.who(), l.describe(), ctx.ifname(ctx.home), notes.join("; "));
                    }
                    return Ok(LinkState::new(ctx, l, r));
                }
                Err(e) if last || e.kind() == io::ErrorKind::PermissionDenied => {
                    notes.push(format!("{ifname}: {e}"));
                    return Err(io::Error::new(e.kind(), notes.join("; ")));
                }
                Err(e) => {
                    mark_dead(&ifname, &ctx.peer_key, &format!("connect: {e}"));
                    notes.push(format!("{ifname}: {e}"));
                }
            }
        }
        Err(io::Error::other(notes.join("; ")))
    }

    /// The local rail a connection is on (by its local address; `fallback` when none matches).
    pub(super) fn rail_of(net: &TcpNet, l: &TcpLink, fallback: usize) -> usize {
        l.local_addr()
            .and_then(|a| match a.ip() {
                std::net::IpAddr::V4(ip) => net.rails.iter().position(|r| r.ip == ip),
                _ => None,
            })
            .unwrap_or(fallback)
    }

    /// Wrap an accepted first connection.
    pub(super) fn accepted(mut ctx: RailCtx, conn: TcpLink) -> LinkState {
        // the link's home is the rail the connecting side chose
        let rail = Self::rail_of(&ctx.net, &conn, ctx.home);
        ctx.home = rail;
        ctx.spread = conn.rails().to_vec();
        LinkState::new(ctx, conn, rail)
    }

    pub(super) fn fail_now(&mut self, why: &str) -> Result<(), LinkError> {
        if self.switching.is_some() || self.dead.is_some() {
            return Ok(());
        }
        self.fail_over(why.to_string(), false)
    }

    pub(super) fn ret_end(&self) -> u64 {
        self.ret_start + (self.ret.len() - self.ret_head) as u64
    }

    pub(super) fn protocol(&self, what: String) -> LinkError {
        LinkError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {}: {what}", self.ctx.who(), self.conn.describe()),
        ))
    }

    // ------------------------------------------------------------------ outgoing

    pub(super) fn push_frame(&mut self, f: Frame) {
        if self.ctl_off == self.ctl.len() {
            self.ctl.clear();
            self.ctl_off = 0;
        }
        self.ctl.extend_from_slice(&encode(f));
    }

    /// Write `ctl`; true when it is empty afterwards.
    pub(super) fn flush_ctl(&mut self) -> io::Result<bool> {
        while self.ctl_off < self.ctl.len() {
            let n = self.conn.send_raw(&self.ctl[self.ctl_off..])?;
            if n == 0 {
                return Ok(false);
            }
            self.ctl_off += n;
        }
        Ok(true)
    }

    /// Move bytes: control first, then the current frame, then resends from the retained copy,
    /// then new frames of `data` (the caller's next bytes). Returns how many of `data` were
    /// taken.
    pub(super) fn pump_out(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut taken = 0;
        loop {
            if !self.flush_ctl()? {
                break;
            }
            if self.frame_left > 0 {
                let n = match self.frame_src {
                    Src::Retained => {
                        let at = self.ret_head + (self.wire - self.ret_start) as usize;
                        let want = self.frame_left.min(self.ret.len() - at);
                        self.conn.send_raw(&self.ret[at..at + want])?
                    }
                    Src::Caller => {
                        let want = self.frame_left.min(data.len() - taken);
                        if want == 0 {
                            break;
                        }
                        let n = self.conn.send_raw(&data[taken..taken + want])?;
                        taken += n;
                        self.next += n as u64;
                        n
                    }
                };
                self.wire += n as u64;
                self.frame_left -= n;
                if n == 0 || self.frame_left > 0 {
                    break;
                }
                continue;
            }
            if self.owe_ack {
                // no flush yet: the acknowledgement shares the write of the frame that follows
                self.owe_ack = false;
                self.ack_urgent = false;
                self.ack_sent = self.rcvd;
                self.push_frame(Frame::Ack { upto: self.rcvd });
            }
            if self.wire < self.next {
                // resending what the peer has not taken, from the retained copy
                if self.wire < self.ret_start || self.next > self.ret_end() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "bytes {}..{} to resend are not retained ({}..{})",
                            self.wire,
                            self.next,
                            self.ret_start,
                            self.ret_end()
                        ),
                    ));
                }
                let len = ((self.next - self.wire) as usize).min(FRAME_MAX);
                self.push_frame(Frame::Data {
                    len: len as u32,
                    seq: self.wire,
                });
                self.frame_src = Src::Retained;
                self.frame_left = len;
                continue;
            }
            if taken < data.len() && self.rewound.is_none() {
                let len = (data.len() - taken).min(FRAME_MAX);
                self.push_frame(Frame::Data {
                    len: len as u32,
                    seq: self.wire,
                });
                if len <= SMALL {
                    // header and payload in one write (one packet for a small message)
                    self.ctl.extend_from_slice(&data[taken..taken + len]);
                    taken += len;
                    self.next += len as u64;
                    self.wire += len as u64;
                } else {
                    self.frame_src = Src::Caller;
                    self.frame_left = len;
                }
                continue;
            }
            if self.ctl_off < self.ctl.len() {
                continue; // an acknowledgement alone
            }
            break;
        }
        Ok(taken)
    }

    pub(super) fn on_ack(&mut self, upto: u64) -> Result<(), LinkError> {
        if upto > self.wire {
            return Err(self.protocol(format!(
                "acknowledgement of byte {upto}, but only {} were sent",
                self.wire
            )));
        }
        if upto > self.acked {
            self.acked = upto;
            self.drop_acked();
        }
        Ok(())
    }

    pub(super) fn drop_acked(&mut self) {
        if self.acked >= self.ret_end() {
            self.ret.clear();
            self.ret.shrink_to(RETAIN_KEEP);
            self.ret_head = 0;
            self.ret_start = self.acked;
        } else if self.acked > self.ret_start {
            self.ret_head += (self.acked - self.ret_start) as usize;
            self.ret_start = self.acked;
            if self.ret_head > self.ret.len() / 2 {
                self.ret.drain(..self.ret_head);
                self.ret_head = 0;
            }
        }
    }

    // ------------------------------------------------------------------ incoming

    /// The next frame header, if all of it has arrived.
    pub(super) fn next_frame(&mut self) -> Result<Option<Frame>, LinkError> {
        if self.ib_hi - self.ib_lo < HDR {
            if self.ib_lo > 0 {
                self.ibuf.copy_within(self.ib_lo..self.ib_hi, 0);
                self.ib_hi -= self.ib_lo;
                self.ib_lo = 0;
            }
            let r = self.conn.recv_raw(&mut self.ibuf[self.ib_hi..]);
            match r {
                Ok(n) => self.ib_hi += n,
                Err(e) => {
                    self.conn_error(e);
                    return Ok(None);
                }
            }
            if self.ib_hi - self.ib_lo < HDR {
                return Ok(None);
            }
        }
        let mut h = [0u8; HDR];
        h.copy_from_slice(&self.ibuf[self.ib_lo..self.ib_lo + HDR]);
        self.ib_lo += HDR;
        decode(&h).map(Some).map_err(|e| self.protocol(e))
    }

    /// Take control frames up to the next data payload (acknowledgements).
    pub(super) fn take_control(&mut self) -> Result<(), LinkError> {
        while self.in_left == 0 && self.switching.is_none() {
            match self.next_frame()? {
                None => break,
                Some(f) => self.on_frame(f)?,
            }
        }
        Ok(())
    }

    pub(super) fn on_frame(&mut self, f: Frame) -> Result<(), LinkError> {
        match f {
            Frame::Data { len, seq } => {
                if seq != self.rcvd {
                    return Err(self.protocol(format!(
                        "data frame for byte {seq}, expected byte {}",
                        self.rcvd
                    )));
                }
                self.in_left = len as usize;
                Ok(())
            }
            Frame::Ack { upto } => self.on_ack(upto),
            Frame::Resume { .. } => {
                Err(self.protocol("RESUME on an established connection".into()))
            }
        }
    }
}

/// The link operations, under the link's lock (see [`RailLink`]'s `Link` implementation).
impl LinkState {
    /// On the home rail with every rail of the link's spread that it had at the start.
    pub(super) fn at_home(&self) -> bool {
        self.rail == self.ctx.home && self.conn.rails().len() >= self.ctx.spread.len()
    }

    pub(super) fn describe(&self) -> String {
        if self.at_home() {
            self.conn.describe()
        } else {
            format!(
                "{} (moved off rail {})",
                self.conn.describe(),
                self.ctx.ifname(self.ctx.home)
            )
        }
    }

    pub(super) fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        self.pre_op()?;
        if self.dead.is_some() {
            return match self.dead_err() {
                Some(e) if !data.is_empty() => Err(e),
                _ => Ok(0),
            };
        }
        if self.switching.is_some() || self.rewound.is_some() {
            return Ok(0);
        }
        match self.pump_out(data) {
            Ok(n) => Ok(n),
            Err(e) => {
                self.conn_error(e);
                Ok(0)
            }
        }
    }

    pub(super) fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        self.pre_op()?;
        if self.switching.is_some() {
            return Ok(0);
        }
        let mut done = 0;
        while done < buf.len() {
            if self.in_left > 0 {
                let want = self.in_left.min(buf.len() - done);
                let n = if self.ib_hi > self.ib_lo {
                    let n = want.min(self.ib_hi - self.ib_lo);
                    buf[done..done + n].copy_from_slice(&self.ibuf[self.ib_lo..self.ib_lo + n]);
                    self.ib_lo += n;
                    n
                } else if self.dead.is_some() {
                    0
                } else {
                    match self.conn.recv_raw(&mut buf[done..done + want]) {
                        Ok(n) => n,
                        Err(e) => {
                            self.conn_error(e);
                            0
                        }
                    }
                };
                if n == 0 {
                    break;
                }
                done += n;
                self.in_left -= n;
                self.rcvd += n as u64;
                continue;
            }
            if self.dead.is_some() && self.ib_hi - self.ib_lo < HDR {
                break;
            }
            match self.next_frame()? {
                None => break,
                Some(f) => self.on_frame(f)?,
            }
            if self.switching.is_some() {
                break;
            }
        }
        if done == 0 && !buf.is_empty() {
            if let Some(e) = self.dead_err() {
                return Err(e);
            }
            // waiting for data: send what is pending, and a lazy acknowledgement once it
            // covers enough that the sender's copy would fill (small ones ride on our next
            // frame or the keeper's tick — an extra packet per message costs more than it saves)
            let owed = self.rcvd - self.ack_sent >= ACK_IDLE as u64;
            if (self.owe_ack && owed) || self.ctl_off < self.ctl.len() {
                if let Err(e) = self.pump_out(&[]) {
                    self.conn_error(e);
                }
            }
        }
        Ok(done)
    }

    pub(super) fn poll_fd_for(&self, send: bool) -> Option<RawFd> {
        match &self.switching {
            Some(p) => p.link.poll_fd_for(false),
            None => self.conn.poll_fd_for(send),
        }
    }

    pub(super) fn poll_events(&self, send: bool) -> Option<(RawFd, i16)> {
        if let Some(p) = &self.switching {
            return p.link.poll_fd_for(false).map(|fd| (fd, libc::POLLIN));
        }
        if send && self.ctl_off == self.ctl.len() && self.frame_left == 0 && self.wire == self.next
        {
            // nothing of ours is waiting to be written: a sender that waits, waits for acks
            return self.conn.poll_fd_for(false).map(|fd| (fd, libc::POLLIN));
        }
        self.conn
            .poll_fd_for(send)
            .map(|fd| (fd, if send { libc::POLLOUT } else { libc::POLLIN }))
    }

    pub(super) fn poll_acks(&mut self) -> Result<u64, LinkError> {
        self.pre_op()?;
        if self.switching.is_none() && self.dead.is_none() {
            if let Err(e) = self.pump_out(&[]) {
                self.conn_error(e);
            }
            self.take_control()?;
        }
        Ok(self.acked)
    }

    pub(super) fn retain(&mut self, start: u64, parts: &[&[u8]]) -> bool {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let end = start + total as u64;
        if end != self.next {
            return false;
        }
        let from = self.acked.max(start);
        if from >= end {
            return true;
        }
        let have = self.ret.len() - self.ret_head;
        if have == 0 {
            self.ret.clear();
            self.ret_head = 0;
            self.ret_start = from;
        } else if self.ret_end() != from {
            return false;
        }
        if have + (end - from) as usize > RETAIN_MAX {
            return false;
        }
        let mut off = start;
        for p in parts {
            let p_end = off + p.len() as u64;
            if p_end > from {
                let skip = from.saturating_sub(off) as usize;
                self.ret.extend_from_slice(&p[skip..]);
            }
            off = p_end;
        }
        true
    }

    pub(super) fn ack(&mut self, urgent: bool) -> Result<(), LinkError> {
        if self.rcvd > self.ack_sent {
            self.owe_ack = true;
        }
        // a lazy acknowledgement rides on this side's next frame, or goes out when this side
        // waits for data (`try_recv` finding none) or within a keeper tick
        if urgent
            && self.switching.is_none()
            && self.dead.is_none()
            && (self.owe_ack || self.ctl_off < self.ctl.len())
        {
            self.ack_urgent = true;
            if let Err(e) = self.pump_out(&[]) {
                self.conn_error(e);
            }
        }
        Ok(())
    }

    /// Bytes of ours that the peer has not acknowledged, or that are not written yet (a link
    /// that failed for good owes nothing: it cannot deliver).
    pub(super) fn owes(&self) -> bool {
        self.dead.is_none()
            && (self.acked < self.next
                || self.wire < self.next
                || self.frame_left > 0
                || self.ctl_off < self.ctl.len())
    }

    /// Read and drop whatever the peer sent (taking its acknowledgements on the way).
    fn discard_incoming(&mut self) {
        let mut sink = [0u8; 4096];
        while let Ok(n) = self.try_recv(&mut sink) {
            if n == 0 {
                break;
            }
        }
    }

    /// One visit to a dropped link that still owes the peer bytes ([`Self::owes`]): write
    /// them (resending after a move), read the peer's acknowledgements. True when done: it
    /// owes nothing now and is closed.
    pub(super) fn linger(&mut self) -> bool {
        let _ = self.heal(false);
        if self.switching.is_none() && self.dead.is_none() {
            self.discard_incoming();
        }
        if self.owes() {
            return false;
        }
        self.close();
        true
    }

    /// Before the connection closes: acknowledge what we took (the peer lets go of its copy)
    /// and read what is unread — a socket closed with unread bytes is reset, and a reset
    /// connection whose peer still listens looks like a failing rail to the peer.
    pub(super) fn close(&mut self) {
        if self.dead.is_some() || self.switching.is_some() {
            return;
        }
        if self.rcvd > self.ack_sent {
            self.owe_ack = true;
            if self.pump_out(&[]).is_err() {
                return;
            }
        }
        // raw reads: an error now (the peer reset or left) is no reason to move rails
        let mut sink = [0u8; 4096];
        while let Ok(n) = self.conn.recv_raw(&mut sink) {
            if n == 0 {
                break;
            }
        }
    }

    pub(super) fn busy(&self) -> bool {
        // bytes the peer has not confirmed are watched until it does: a finished send whose
        // tail sits in a dead rail's socket must be noticed here, not by the waiting peer
        self.dead.is_none()
            && (self.switching.is_some()
                || !self.incoming.is_empty()
                || self.back.is_some()
                || self.acked < self.next
                || !self.at_home()
                || tcp::arrivals() != self.arrivals_seen
                || self.owe_ack
                || self.ctl_off < self.ctl.len())
    }

    pub(super) fn heal(&mut self, needed: bool) -> Result<(), LinkError> {
        self.pre_op()?;
        if let Some(e) = self.dead_err() {
            return if needed { Err(e) } else { Ok(()) };
        }
        if self.switching.is_some() {
            return Ok(());
        }
        // Resends, control frames and large owed acknowledgements go out at every visit. A
        // small owed acknowledgement does not on the executor's visits (`needed`: one per wait,
        // so one packet per received message in a stream of small ones, doubling the kernel's
        // work per call): it rides on our next frame, goes out once it covers ACK_IDLE when we
        // wait for data, or at the keeper's tick (`!needed`) — as the lazy acknowledgement of a
        // receive is meant to ([`Self::ack`]).
        let hold = needed
            && self.owe_ack
            && !self.ack_urgent
            && self.rcvd - self.ack_sent < ACK_IDLE as u64;
        self.owe_ack &= !hold;
        let out = self.pump_out(&[]);
        self.owe_ack |= hold;
        if let Err(e) = out {
            self.conn_error(e);
            return Ok(());
        }
        // the health checks cost syscalls: at most every 20 ms per link
        if self
            .last_check
            .is_some_and(|t| t.elapsed() < Duration::from_millis(20))
        {
            return Ok(());
        }
        self.last_check = Some(Instant::now());
        if let Some((rail, why)) = self.trouble() {
            if let Err(e) = self.fail_over_rail(rail, why, false) {
                self.dead = Some(match e {
                    LinkError::PeerGone(s) => (true, s),
                    LinkError::Io(e) => (false, e.to_string()),
                });
                return match self.dead_err() {
                    Some(e) if needed => Err(e),
                    _ => Ok(()),
                };
            }
            return Ok(());
        }
        self.maybe_go_home()
    }
}
