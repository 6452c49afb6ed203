//! A failover link's state machine, part two: failures and moves between rails — telling a
//! lost rail from a gone peer, connecting elsewhere and sending `RESUME`, adopting the peer's
//! replacement connection (the lower rank's wins when both move), cutting over with the resend
//! offsets, noticing trouble (interface down, no acknowledgement from the peer's kernel) and
//! going back to the home rail once it works again.

use super::health::{health, iface_state, mark_dead, rail_unusable, retry_after, tcp_info};
use super::state::write_all;
use super::wire::{encode, Frame, HDR, MAX_GEN};
use super::*;

impl LinkState {
    // ------------------------------------------------------------------ failures and moves

    /// An error from the current connection: move to another rail when the rail may be at
    /// fault; else (the peer's process closed or reset it and listens no more, no rail left)
    /// remember why — it is reported when the link is needed ([`Self::dead_err`]), so a peer
    /// that finished and left after taking everything is no error.
    pub(super) fn conn_error(&mut self, e: io::Error) {
        if self.dead.is_some() {
            return;
        }
        let code = e.raw_os_error().unwrap_or(0);
        let rail_fault = matches!(
            code,
            libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::ENETDOWN
                | libc::EHOSTDOWN
                | libc::ETIMEDOUT
        );
        let reset = matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted
        );
        let r = if rail_fault || reset {
            match self.ctx.abort.as_ref().and_then(|a| a()) {
                Some(why) => Err(LinkError::PeerGone(format!(
                    "{}: {e}; the job is failing, first failure reported: {why}",
                    self.conn.describe()
                ))),
                None => {
                    let rail = self.conn.error_rail().unwrap_or(self.rail);
                    self.fail_over_rail(rail, format!("{e}"), reset)
                }
            }
        } else if e.kind() == io::ErrorKind::UnexpectedEof {
            // The peer closes a connection only after moving off it (then its RESUME is here)
            // or when its process ends or aborts.
            self.arrivals_seen = 0;
            self.collect_incoming();
            match self.try_incoming() {
                Ok(true) => Ok(()),
                Ok(false) => Err(LinkError::PeerGone(format!(
                    "{}: connection closed by peer",
                    self.conn.describe()
                ))),
                Err(e) => Err(e),
            }
        } else {
            Err(LinkError::Io(io::Error::new(
                e.kind(),
                format!("{}: {e}", self.conn.describe()),
            )))
        };
        if let Err(e) = r {
            self.dead = Some(match e {
                LinkError::PeerGone(s) => (true, s),
                LinkError::Io(e) => (false, e.to_string()),
            });
        }
    }

    /// The error a recorded failure becomes when the link is needed.
    pub(super) fn dead_err(&self) -> Option<LinkError> {
        self.dead.as_ref().map(|(gone, why)| {
            if *gone {
                LinkError::PeerGone(why.clone())
            } else {
                LinkError::Io(io::Error::new(io::ErrorKind::NotConnected, why.clone()))
            }
        })
    }

    /// Give up the current connection and start moving to another rail (see the module docs).
    /// `reset`: the connection was reset, so the rail itself carried the reset: try it first
    /// and do not mark it dead (a refusal there means the peer's process is gone).
    pub(super) fn fail_over(&mut self, why: String, reset: bool) -> Result<(), LinkError> {
        self.fail_over_rail(self.rail, why, reset)
    }

    /// [`Self::fail_over`] naming the rail that failed (one of the link's rails when it drives
    /// several): that rail is marked dead, the link moves to one rail that works.
    pub(super) fn fail_over_rail(
        &mut self,
        failed: usize,
        why: String,
        reset: bool,
    ) -> Result<(), LinkError> {
        let ifname = self.ctx.ifname(failed);
        let from = self.conn.describe();
        if !reset {
            mark_dead(&ifname, &self.ctx.peer_key, &why);
        }
        self.why_moving = format!("rail {ifname} ({from}) failed: {why}");
        self.suspect = None;
        self.back = None;
        self.start_move(&why, reset)
    }

    /// Connect on the next usable rail and send `RESUME` there; the link is frozen until the
    /// peer answers.
    pub(super) fn start_move(&mut self, why: &str, same_first: bool) -> Result<(), LinkError> {
        if self.max_gen >= MAX_GEN {
            return Err(LinkError::Io(io::Error::other(format!(
                "{}: link moved {MAX_GEN} times; giving up ({why})",
                self.ctx.who()
            ))));
        }
        let gen = self.max_gen + 1;
        let n = self.ctx.net.rails.len().max(1);
        let retry = retry_after(self.ctx.rail_timeout);
        let cur = self.switching.as_ref().map(|p| p.rail).unwrap_or(self.rail);
        let mut notes = vec![format!("{}: {why}", self.ctx.ifname(self.rail))];
        // other rails first, the one that failed last (a flap may have passed)
        let mut order: Vec<usize> = (1..=n).map(|k| (cur + k) % n).collect();
        if same_first {
            order.rotate_right(1);
        }
        for r in order {
            let ifname = self.ctx.ifname(r);
            if !self.ctx.peer_on(r) {
                notes.push(format!(
                    "{ifname}: {} has no address on its subnet",
                    self.ctx.peer_host
                ));
                continue;
            }
            if let Some(w) = rail_unusable(&ifname, &self.ctx.peer_key, retry) {
                if r != cur || iface_state(&ifname) == Some(false) {
                    if r != self.rail {
                        notes.push(format!("{ifname}: {w}"));
                    }
                    continue;
                }
            }
            let timeout = self.ctx.rail_timeout.min(self.ctx.connect_timeout);
            match self.ctx.dial(r, gen, timeout) {
                Ok(mut l) => {
                    let f = encode(Frame::Resume {
                        gen,
                        consumed: self.rcvd,
                    });
                    if let Err(e) = write_all(&mut l, &f, timeout) {
                        mark_dead(&ifname, &self.ctx.peer_key, &format!("{e}"));
                        notes.push(format!("{ifname}: {e}"));
                        continue;
                    }
                    self.max_gen = gen;
                    self.switching = Some(Pending {
                        link: l,
                        gen,
                        rail: r,
                        hdr: [0; HDR],
                        fill: 0,
                        since: Instant::now(),
                    });
                    self.last_abort_check = Instant::now();
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(LinkError::PeerGone(format!(
                        "{}: {why}; and no process listens for it on {ifname} any more ({e})",
                        self.conn.describe()
                    )));
                }
                Err(e) => {
                    mark_dead(&ifname, &self.ctx.peer_key, &format!("connect: {e}"));
                    notes.push(format!("{ifname}: connect: {e}"));
                }
            }
        }
        Err(LinkError::Io(io::Error::new(
            io::ErrorKind::NotConnected,
            format!(
                "no rail left between {} and {} ({}): {}",
                self.ctx.my_host,
                self.ctx.peer_host,
                self.ctx.who(),
                notes.join("; ")
            ),
        )))
    }

    /// Take the peer's replacement connections that have arrived.
    pub(super) fn collect_incoming(&mut self) {
        let now = tcp::arrivals();
        if now == self.arrivals_seen {
            return;
        }
        self.arrivals_seen = now;
        for (gen, link) in
            self.ctx
                .net
                .take_generations(self.ctx.id.comm, self.ctx.id.peer, self.ctx.id.chan)
        {
            if gen > self.gen {
                let rail = Self::rail_of(&self.ctx.net, &link, self.rail);
                self.incoming.push(Pending {
                    link,
                    gen,
                    rail,
                    hdr: [0; HDR],
                    fill: 0,
                    since: Instant::now(),
                });
            }
        }
    }

    /// Adopt a peer's replacement connection whose `RESUME` has arrived (unless ours wins).
    /// True when the link moved.
    pub(super) fn try_incoming(&mut self) -> Result<bool, LinkError> {
        let mut i = 0;
        while i < self.incoming.len() {
            let r = self.incoming[i].poll();
            match r {
                Ok(None) => i += 1,
                Err(_) => {
                    self.incoming.swap_remove(i);
                }
                Ok(Some((gen, consumed))) => {
                    if gen != self.incoming[i].gen || gen <= self.gen {
                        self.incoming.swap_remove(i);
                        continue;
                    }
                    if self.switching.is_some() && self.ctx.id.me < self.ctx.id.peer {
                        // both moved at once: the lower rank's connection wins; keep the peer's
                        // open until ours is taken (closing it would look like a failure there)
                        i += 1;
                        continue;
                    }
                    let mut p = self.incoming.swap_remove(i);
                    let f = encode(Frame::Resume {
                        gen,
                        consumed: self.rcvd,
                    });
                    if write_all(&mut p.link, &f, self.ctx.rail_timeout).is_err() {
                        continue;
                    }
                    self.switching = None;
                    let rail = p.rail;
                    self.cut_over(p.link, gen, rail, consumed, false)?;
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Our replacement connection: has the peer answered? Moves when it has.
    pub(super) fn try_switch(&mut self) -> Result<(), LinkError> {
        let Some(p) = self.switching.as_mut() else {
            return Ok(());
        };
        match p.poll() {
            Ok(None) => {
                let waited = p.since.elapsed();
                if waited > answer_within(self.ctx.rail_timeout) {
                    let ifname = self.ctx.ifname(p.rail);
                    self.switching = None;
                    let why = format!(
                        "{}: moving to rail {ifname}{}, no answer from rank {} on {} for {:.1} s: \
                         its process is stopped, or its end of this link is closed (its \
                         communicator freed while a transfer was in flight)",
                        self.ctx.who(),
                        if self.why_moving.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", self.why_moving)
                        },
                        self.ctx.id.peer,
                        self.ctx.peer_host,
                        waited.as_secs_f64()
                    );
                    self.dead = Some((true, why.clone()));
                    return Err(LinkError::PeerGone(why));
                }
                if self.last_abort_check.elapsed() > Duration::from_millis(500) {
                    self.last_abort_check = Instant::now();
                    if let Some(why) = self.ctx.abort.as_ref().and_then(|a| a()) {
                        return Err(LinkError::PeerGone(format!(
                            "{}: the job is failing while this link moves rails; first failure reported: {why}",
                            self.ctx.who()
                        )));
                    }
                }
                Ok(())
            }
            Ok(Some((gen, consumed))) => {
                let p = self.switching.take().expect("switching");
                if gen != p.gen {
                    return Err(self.protocol(format!(
                        "RESUME for generation {gen} on the connection of generation {}",
                        p.gen
                    )));
                }
                self.cut_over(p.link, gen, p.rail, consumed, true)
            }
            Err(e) => {
                // the peer may have taken its own replacement instead of ours
                self.arrivals_seen = 0;
                self.collect_incoming();
                let mine = self.switching.take().expect("switching");
                if self.try_incoming()? {
                    return Ok(());
                }
                let p = mine;
                let ifname = self.ctx.ifname(p.rail);
                mark_dead(&ifname, &self.ctx.peer_key, &format!("{e}"));
                self.start_move(
                    &format!("{e} on the replacement connection over {ifname}"),
                    false,
                )
            }
        }
    }

    /// Continue on `link` (generation `gen`, local rail `rail`); the peer took our bytes up to
    /// `consumed`.
    pub(super) fn cut_over(
        &mut self,
        link: TcpLink,
        gen: u32,
        rail: usize,
        consumed: u64,
        ours: bool,
    ) -> Result<(), LinkError> {
        if consumed < self.acked || consumed > self.next {
            return Err(self.protocol(format!(
                "peer resumes at byte {consumed}, outside {}..={}",
                self.acked, self.next
            )));
        }
        self.acked = consumed;
        self.drop_acked();
        if self.ret.len() > self.ret_head && self.ret_start > consumed {
            return Err(self.protocol(format!(
                "bytes {consumed}..{} are neither acknowledged nor retained",
                self.ret_start
            )));
        }
        let old = std::mem::replace(&mut self.conn, link);
        self.moves += 1;
        let from_rail = self.rail;
        self.rail = rail;
        self.gen = gen;
        self.max_gen = self.max_gen.max(gen);
        self.ctl.clear();
        self.ctl_off = 0;
        self.frame_left = 0;
        self.in_left = 0;
        self.ib_lo = 0;
        self.ib_hi = 0;
        self.ack_sent = self.rcvd;
        self.owe_ack = false;
        self.ack_urgent = false;
        self.suspect = None;
        self.wire = consumed;
        let resume_at = if self.ret.len() > self.ret_head {
            self.ret_end().max(consumed)
        } else {
            consumed
        };
        if resume_at < self.next {
            self.rewound = Some(resume_at);
        }
        let resent = self.next - consumed;
        self.next = resume_at;
        self.incoming.retain(|p| p.gen > gen);
        self.off_home_since = (!self.at_home()).then(Instant::now);
        let to = format!("{} ({})", self.ctx.ifname(rail), self.conn.describe());
        let home = self.ctx.ifname(self.ctx.home);
        if self.at_home() && (from_rail != rail || old.rails().len() < self.conn.rails().len()) {
            // One WARN when a rail toward a peer host comes back (after its WARN when it went),
            // from the side that moved; the other side says so at INFO.
            let key = (home.clone(), self.ctx.peer_key.clone());
            let was_down = health().warned.insert(key, false) == Some(true);
            if ours && was_down {
                tracing::warn!(target: "railring::net", "{}: rail {home} is back; link moved back to {to}", self.ctx.who());
            } else {
                tracing::info!(target: "railring::net", "{}: back on rail {to}", self.ctx.who());
            }
        } else {
            let why = if ours && !self.why_moving.is_empty() {
                std::mem::take(&mut self.why_moving)
            } else {
                format!(
                    "rail {} ({}) given up by the peer",
                    self.ctx.ifname(from_rail),
                    old.describe()
                )
            };
            // One WARN per lost rail and peer host, from the side that noticed (it knows why).
            let key = (self.ctx.ifname(from_rail), self.ctx.peer_key.clone());
            let first = health().warned.insert(key, true) != Some(true);
            if ours && first {
                tracing::warn!(target: "railring::net", "{}: {why}; link moved to rail {to}, resending {resent} bytes", self.ctx.who());
            } else {
                tracing::info!(target: "railring::net", "{}: {why}; link moved to rail {to}, resending {resent} bytes", self.ctx.who());
            }
        }
        drop(old);
        Ok(())
    }

    /// The other side's moves and our own pending one (cheap unless connections arrived).
    #[inline]
    pub(super) fn pre_op(&mut self) -> Result<(), LinkError> {
        if tcp::arrivals() != self.arrivals_seen {
            self.collect_incoming();
        }
        if !self.incoming.is_empty() {
            self.try_incoming()?;
        }
        if self.switching.is_some() {
            self.try_switch()?;
        }
        Ok(())
    }

    /// Why the current connection should be given up now, if it should.
    /// (The rail at fault, why.) A link striped over several rails checks each: its stalest
    /// connection with bytes outstanding decides.
    pub(super) fn trouble(&mut self) -> Option<(usize, String)> {
        let retry = retry_after(self.ctx.rail_timeout);
        let mut down = false;
        for &r in self.conn.rails() {
            let ifname = self.ctx.ifname(r);
            if iface_state(&ifname) == Some(false) {
                down = true;
                let since = *self.iface_down_since.get_or_insert_with(Instant::now);
                // Another rail to go to: move now. None: the interface may come back (a flap;
                // TCP retransmits meanwhile), so wait up to RAILRING_RAIL_TIMEOUT first.
                let elsewhere = (0..self.ctx.net.rails.len()).any(|o| {
                    o != r
                        && self.ctx.peer_on(o)
                        && iface_state(&self.ctx.ifname(o)) != Some(false)
                        && rail_unusable(&self.ctx.ifname(o), &self.ctx.peer_key, retry).is_none()
                });
                if elsewhere {
                    return Some((
                        r,
                        format!("interface {ifname} is down on {}", self.ctx.my_host),
                    ));
                }
                if since.elapsed() >= self.ctx.rail_timeout {
                    return Some((
                        r,
                        format!(
                            "interface {ifname} is down on {} for {:.1} s (RAILRING_RAIL_TIMEOUT={})",
                            self.ctx.my_host,
                            since.elapsed().as_secs_f64(),
                            self.ctx.rail_timeout.as_secs()
                        ),
                    ));
                }
            }
        }
        if down {
            return None;
        }
        self.iface_down_since = None;
        let mut outstanding = 0u32;
        let mut ack_age = 0u32;
        let mut stale_rail = self.rail;
        let mut retrans = 0u32;
        for (fd, r) in self.conn.fds_on_rails() {
            if let Some(ti) = tcp_info(fd) {
                if ti.unacked > 0 {
                    outstanding += ti.unacked;
                    if ti.last_ack_recv >= ack_age {
                        ack_age = ti.last_ack_recv;
                        stale_rail = r;
                    }
                    retrans += ti.retransmits as u32;
                }
            }
        }
        if outstanding == 0 {
            self.suspect = None;
            return None;
        }
        let age = Duration::from_millis(ack_age as u64);
        match self.suspect {
            Some(t0) if age >= t0.elapsed() => {
                if t0.elapsed() >= self.ctx.rail_timeout {
                    return Some((stale_rail, format!(
                        "no acknowledgement from {} for {:.1} s ({outstanding} packets outstanding, {retrans} retransmissions; RAILRING_RAIL_TIMEOUT={})",
                        self.ctx.peer_host,
                        t0.elapsed().as_secs_f64(),
                        self.ctx.rail_timeout.as_secs()
                    )));
                }
            }
            _ => self.suspect = Some(Instant::now()),
        }
        None
    }

    /// While off the home rail: try to go back once the home interface is up and the rail has
    /// been out for a while (the lower rank starts; a background connect, then `RESUME`).
    pub(super) fn maybe_go_home(&mut self) -> Result<(), LinkError> {
        if self.at_home() || self.ctx.id.me > self.ctx.id.peer {
            return Ok(());
        }
        let retry = retry_after(self.ctx.rail_timeout);
        if let Some((gen, probe)) = self.back.take() {
            let got = probe.lock().unwrap_or_else(|e| e.into_inner()).take();
            match got {
                None => self.back = Some((gen, probe)),
                Some(Ok(mut l)) if gen > self.gen && self.switching.is_none() => {
                    let f = encode(Frame::Resume {
                        gen,
                        consumed: self.rcvd,
                    });
                    if write_all(&mut l, &f, self.ctx.rail_timeout).is_ok() {
                        self.why_moving.clear();
                        self.switching = Some(Pending {
                            link: l,
                            gen,
                            rail: self.ctx.home,
                            hdr: [0; HDR],
                            fill: 0,
                            since: Instant::now(),
                        });
                        self.last_abort_check = Instant::now();
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    mark_dead(
                        &self.ctx.ifname(self.ctx.home),
                        &self.ctx.peer_key,
                        &format!("connect: {e}"),
                    );
                }
            }
            return Ok(());
        }
        let since_off = self.off_home_since.map(|t| t.elapsed()).unwrap_or_default();
        let since_try = self.last_back_try.map(|t| t.elapsed()).unwrap_or(retry);
        if since_off < retry || since_try < retry || self.switching.is_some() {
            return Ok(());
        }
        let home = self.ctx.ifname(self.ctx.home);
        if rail_unusable(&home, &self.ctx.peer_key, retry).is_some() || self.max_gen >= MAX_GEN {
            return Ok(());
        }
        // back onto every home rail (a link striped over several waits until all work again)
        let rails = self.ctx.home_rails(retry);
        if self.rail == self.ctx.home && rails.len() <= self.conn.rails().len() {
            return Ok(());
        }
        self.last_back_try = Some(Instant::now());
        let gen = self.max_gen + 1;
        self.max_gen = gen;
        let probe: BackProbe = Arc::new(Mutex::new(None));
        let (net, id, addrs, streams, timeout) = (
            self.ctx.net.clone(),
            LinkId {
                chan: self.ctx.id.chan | ((gen as usize) << 24),
                ..self.ctx.id
            },
            self.ctx.peer_addrs.clone(),
            self.ctx.streams,
            self.ctx.rail_timeout.min(self.ctx.connect_timeout),
        );
        let slot = probe.clone();
        let spawned = std::thread::Builder::new()
            .name("rr-rail-back".into())
            .spawn(move || {
                let r = net.connect_once(id, &rails, &addrs, timeout, streams);
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        if spawned.is_ok() {
            self.back = Some((gen, probe));
        }
        Ok(())
    }
}
